"""What every fuzz target shares: instrumenting crdtstore and sync for atheris, running the
target, and the framing that turns one fuzzer input into several frames.

A target is a script ``tests/fuzz/fuzz_<name>.py`` with ``check(data: bytes) -> None``: it
feeds ``data`` to one part of the library and raises (``AssertionError``, or whatever
untyped exception the library let out) when a property fails; the library's typed errors
(``CrdtStoreError`` subclasses) are caught inside ``check``. Run as a script, it hands
``check`` to atheris (``sys.argv`` are libFuzzer's: corpus directories, ``-runs=N``,
``-max_total_time=S``; see ``python -m tests.fuzz run --help``).

The library must be imported inside :func:`instrumented` (before anything else imports it),
so that atheris' coverage counters reach its code: a target's own imports of crdtstore and
sync go in ``with instrumented(): ...`` at the top of the script.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FUZZ_DIR = Path(__file__).resolve().parent
CORPUS_DIR = FUZZ_DIR / "corpus"
INSTRUMENTED = ("crdtstore", "sync")


def instrumented() -> AbstractContextManager[object]:
    """Import crdtstore and sync inside this block: atheris instruments them (coverage). Off
    when the target is imported by a test (``CRDTSTORE_FUZZ_PLAIN=1``) rather than run."""
    if os.environ.get("CRDTSTORE_FUZZ_PLAIN") == "1":
        return nullcontext()
    import atheris

    return atheris.instrument_imports(include=list(INSTRUMENTED))  # type: ignore[no-any-return]


def main(check: Callable[[bytes], None]) -> None:
    """Fuzz ``check`` with atheris, with ``sys.argv`` as libFuzzer's arguments."""
    import atheris

    atheris.Setup(sys.argv, check)
    atheris.Fuzz()


def frames(data: bytes, limit: int = 64) -> Iterator[bytes]:
    """Split one input into frames: each is a length byte (0-254; 255 means the next two
    bytes are a big-endian length) followed by that many bytes (fewer at the end). At most
    ``limit`` frames."""
    pos, end = 0, len(data)
    for _ in range(limit):
        if pos >= end:
            return
        n = data[pos]
        pos += 1
        if n == 255:
            n = int.from_bytes(data[pos : pos + 2], "big")
            pos += 2
        yield data[pos : pos + n]
        pos += n


def join_frames(parts: list[bytes]) -> bytes:
    """The input that :func:`frames` splits into ``parts`` (for seeds)."""
    out = bytearray()
    for part in parts:
        if len(part) < 255:
            out.append(len(part))
        else:
            out.append(255)
            out += len(part).to_bytes(2, "big")
        out += part
    return bytes(out)
