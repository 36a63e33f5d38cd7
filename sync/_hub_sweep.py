"""The hub's retention sweep: every ``HubLimits.sweep_interval`` seconds it deletes the runs
whose retention deadline passed, in every tenant of its store (``JournalBackend.tenants``;
where a backend cannot list them, every tenant the hub has served since it started, and
``default``), and logs each deletion (logger ``sync.hub.retention``, with tenant and run).

It goes through the hub's own per-tenant stores (loading one for the sweep if no run of the
tenant is loaded), so a swept run that is loaded in the hub has its record closed by the
same store that deletes it. The backend decides whether a run is due atomically with its
deletion (``Store.sweep``): a sweep racing writers or a ``set_retention`` deletes nothing
that is not expired. A failed sweep is logged and tried again at the next interval.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable

import anyio

from crdtstore import CrdtStoreError, Store

log = logging.getLogger("sync.hub.retention")


async def sweep_once(
    tenants: Iterable[str],
    store: Callable[[str], Awaitable[Store]],
    unstore: Callable[[str], None],
) -> dict[str, list[str]]:
    """Sweep each tenant through the hub's stores; return the deleted runs by tenant."""
    out: dict[str, list[str]] = {}
    for tenant in sorted(set(tenants)):
        try:
            held = await store(tenant)
        except CrdtStoreError as exc:
            log.warning("retention sweep: cannot open the store of tenant %s: %s", tenant, exc)
            continue
        try:
            deleted = await held.sweep()
        except CrdtStoreError as exc:
            log.warning("retention sweep of tenant %s failed: %s", tenant, exc)
            continue
        finally:
            unstore(tenant)
        for run in deleted:
            log.info(
                "retention: deleted run %s/%s (its deadline passed)",
                tenant,
                run,
                extra={"tenant": tenant, "run": run},
            )
        if deleted:
            out[tenant] = deleted
    return out


async def sweep_forever(
    interval: float,
    tenants: Callable[[], Iterable[str]],
    store: Callable[[str], Awaitable[Store]],
    unstore: Callable[[str], None],
) -> None:
    """Sweep every ``interval`` seconds (the first one an interval after the start), until
    cancelled."""
    while True:
        await anyio.sleep(interval)
        try:
            await sweep_once([*tenants(), *await _listed(store, unstore)], store, unstore)
        except Exception:  # a bug must not stop the hub
            log.exception("retention sweep crashed")


async def _listed(
    store: Callable[[str], Awaitable[Store]], unstore: Callable[[str], None]
) -> list[str]:
    """Every tenant of the hub's backend (a run of a tenant no client has opened since the
    hub started expires too); [] when the backend cannot list them."""
    try:
        held = await store("default")
    except CrdtStoreError as exc:
        log.warning("retention sweep: cannot open the store to list tenants: %s", exc)
        return []
    try:
        return list(await held.backend.tenants() or [])
    except CrdtStoreError as exc:
        log.warning("retention sweep: cannot list the tenants: %s", exc)
        return []
    finally:
        unstore("default")
