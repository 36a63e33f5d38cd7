"""Retention that runs by itself: a store's background task that calls ``Store.sweep`` every
``sweep_interval`` seconds (``open_store(..., sweep_interval=60)``).

Each deleted run is logged (logger ``crdtstore.retention``, INFO) with its tenant; a sweep
that fails (the backend is away for a moment) is logged as a warning and tried again at the
next interval: retention must never take the store down. The task lives in the store's task
group, so it stops when the store closes. Whether a run is due is decided again by the
backend atomically with its deletion (``JournalBackend.delete_run_if_due``), so a sweep that
races writers or a ``set_retention`` deletes nothing that is not expired.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio

from ._errors import CrdtStoreError, InvalidValue

log = logging.getLogger("crdtstore.retention")

DEFAULT_SWEEP_INTERVAL = 60.0
"""Seconds between retention sweeps of the hub and ``crdtstore serve`` (library stores sweep
only when asked: ``open_store(..., sweep_interval=...)``)."""


def check_sweep_interval(value: object) -> float | None:
    """``value`` as a sweep interval: a positive number of seconds, or None (off).

    Raises:
        InvalidValue: anything else.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not (value > 0):
        raise InvalidValue(
            f"sweep_interval must be a positive number of seconds or None, not {value!r}"
        )
    if value == float("inf"):
        raise InvalidValue("sweep_interval must be finite (None turns sweeping off)")
    return float(value)


async def sweep_forever(
    tenant: str, sweep: Callable[[], Awaitable[list[str]]], interval: float
) -> None:
    """Run ``sweep`` now and then every ``interval`` seconds until cancelled; log what it
    deleted."""
    while True:
        try:
            deleted = await sweep()
        except CrdtStoreError as exc:
            log.warning("retention sweep of tenant %s failed: %s", tenant, exc)
        except Exception:  # a bug must not stop retention for good, nor the store
            log.exception("retention sweep of tenant %s crashed", tenant)
        else:
            for run in deleted:
                log.info("retention: deleted run %s/%s (its deadline passed)", tenant, run)
        await anyio.sleep(interval)
