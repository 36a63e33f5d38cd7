"""The one helper tests use to wait for something that happens elsewhere (another task, another
process): poll a condition under a deadline, never a fixed sleep.

    await until(lambda: rec.map("m").get("k") == 1, "the write to arrive")
    await until_async(fetch_and_check, "the server to answer")
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

DEADLINE = 30.0


async def until(
    predicate: Callable[[], Any], what: str = "condition", deadline: float = DEADLINE
) -> Any:
    """Poll ``predicate`` (a function, or a coroutine function) until it returns a true value;
    return that value. Raises ``TimeoutError`` naming ``what`` after ``deadline`` seconds."""
    try:
        with anyio.fail_after(deadline):
            delay = 0.002
            while True:
                value = predicate()
                if inspect.isawaitable(value):
                    value = await value
                if value:
                    return value
                await anyio.sleep(delay)
                delay = min(delay * 2, 0.05)
    except TimeoutError:
        raise TimeoutError(f"timed out after {deadline} s waiting for {what}") from None


async def until_async(
    predicate: Callable[[], Awaitable[Any]], what: str = "condition", deadline: float = DEADLINE
) -> Any:
    """:func:`until` for a coroutine function (kept for readability at call sites)."""
    return await until(predicate, what, deadline)
