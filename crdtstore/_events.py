"""The cheapest event for the running event loop: made once per wake-up on hot paths (a
journal watch per wake-up, a change stream per change)."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import anyio


def event_factory() -> Callable[[], anyio.Event]:
    """``asyncio.Event`` on asyncio (a tenth of the cost of an ``anyio.Event``, which asks
    sniffio for the loop each time it is made), else ``anyio.Event`` (trio). Typed as
    ``anyio.Event``: its users call ``wait()``, ``set()`` and ``is_set()`` only, which both
    have. Call it on the loop the events will be awaited on."""
    try:
        import asyncio

        asyncio.get_running_loop()
    except RuntimeError:
        return anyio.Event
    return cast("Callable[[], anyio.Event]", asyncio.Event)
