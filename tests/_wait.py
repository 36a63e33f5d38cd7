"""The one helper tests use to wait for something that happens elsewhere (another task, another
process): poll a condition under a deadline, never a fixed sleep.

    await until(lambda: rec.map("m").get("k") == 1, "the write to arrive")
    await until(fetch_and_check, "the server to answer")     # a coroutine function works too
    assert await elapsed(lambda: seen(), "the wake-up") < 3.0  # the seconds it took
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import Any

import anyio

DEADLINE = 30.0
FIRST_POLL = 0.001
LAST_POLL = 0.01  # polls back off to this: quick enough for timing tests, cheap on 2 cores


async def until(
    predicate: Callable[[], Any], what: str = "condition", deadline: float = DEADLINE
) -> Any:
    """Poll ``predicate`` (a function or a coroutine function) until it returns a true value;
    return that value. Raises ``TimeoutError`` naming ``what`` after ``deadline`` seconds."""
    try:
        with anyio.fail_after(deadline):
            delay = FIRST_POLL
            while True:
                value = predicate()
                if inspect.isawaitable(value):
                    value = await value
                if value:
                    return value
                await anyio.sleep(delay)
                delay = min(delay * 2, LAST_POLL)
    except TimeoutError:
        raise TimeoutError(f"timed out after {deadline} s waiting for {what}") from None


async def elapsed(
    predicate: Callable[[], Any], what: str = "condition", deadline: float = DEADLINE
) -> float:
    """:func:`until`, returning the seconds it took."""
    start = time.monotonic()
    await until(predicate, what, deadline)
    return time.monotonic() - start
