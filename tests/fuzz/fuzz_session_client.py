"""Fuzz target: the y-protocols session state machine, client side (sync._session,
sync._messages): a sequence of frames received by a ``ClientSession``
over a replica. See ``tests/fuzz/_session_target.py`` for the properties checked.
Requests 1 and 2 are pending when the frames arrive.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.fuzz._harness import instrumented, main

with instrumented():
    from tests.fuzz._session_target import check_session


def check(data: bytes) -> None:
    check_session(data, server=False)


if __name__ == "__main__":
    main(check)
