"""Give freed heap memory back to the operating system after a big, short-lived allocation.

Applying a snapshot (one update of many MB) makes yrs decode the whole update before it
integrates it; the decoded form is freed afterwards, but glibc's allocator keeps the pages in
its arenas, so the process's resident memory stays well above what the document needs (the
figures: bench/memory.py). ``malloc_trim(0)`` returns those pages, cheaply.

Only glibc has it: elsewhere (musl, macOS, Windows) :func:`release_free_memory` does nothing.
"""

from __future__ import annotations

import ctypes
import logging
import sys
from collections.abc import Callable

log = logging.getLogger("crdtstore.heap")

_trim: Callable[[int], int] | None = None
_looked = False


def _malloc_trim() -> Callable[[int], int] | None:
    global _trim, _looked
    if not _looked:
        _looked = True
        if sys.platform.startswith("linux"):
            try:
                # the process's own symbols (libc among them), not find_library: that runs
                # ldconfig in a subprocess and leaves its objects among a load's freed ones
                func = ctypes.CDLL(None).malloc_trim  # AttributeError: not glibc
            except (OSError, AttributeError):
                func = None
            if func is not None:
                func.argtypes = [ctypes.c_size_t]
                func.restype = ctypes.c_int
                _trim = func
    return _trim


def release_free_memory() -> bool:
    """Return the allocator's free pages to the operating system; True if it could be asked
    (glibc), False where there is no such call."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
