"""Fuzz target: the y-protocols session state machine, server side (sync._session,
sync._messages): a sequence of frames received by a ``ServerSession``
over a replica. See ``tests/fuzz/_session_target.py`` for the properties checked.
Bit 1 of the first byte makes the session read-only.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.fuzz._harness import instrumented, main

with instrumented():
    from tests.fuzz._session_target import check_session


def check(data: bytes) -> None:
    check_session(data, server=True)


if __name__ == "__main__":
    main(check)
