"""Pausing Python's cyclic garbage collector while a bulk read builds many small objects.

Reading thousands of journal rows creates tens of thousands of tuples, lists and models, none
of them in a reference cycle. On a small heap each allocation burst triggers collector passes
over every object alive, which can cost as much as the read itself and can free nothing of
what is built. The pause is for one synchronous step (no other task of the thread runs in it);
if the collector is already paused (by the caller, or by another thread's bulk read) it is
left as it is, so the step that paused it is the one that resumes it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """Run the block with the cyclic collector off, unless it already is."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
