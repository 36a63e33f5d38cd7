"""Where one write's latency goes, for ``ws_propagation.py --stages`` (asyncio only).

:func:`install` wraps a few functions of the process it runs in (the writer, a reader, the
hub) so that each call appends ``<monotonic_ns> <stage>`` to ``DIR/<pid>-<role>.txt``; a
function the code under test does not have (an older version) is left out. :func:`report`
takes, for every write ``i`` after the warm-up, the first event of each stage in each process
between the writer's stamp of write ``i`` and that of write ``i + 1`` (writes are paced far
apart: one write in flight), and prints the median time of each stage after the stamp.
The wrappers cost a few microseconds per event: compare runs traced alike.
"""

from __future__ import annotations

import importlib
import os
import statistics
import time
from pathlib import Path
from typing import Any

# (role, module, class or "", function, stage): in the order of a write's way
_POINTS: list[tuple[str, str, str, str, str]] = [
    ("writer", "crdtstore.record._maps", "MapCollection", "set", "writer: set"),
    ("writer", "sync._client", "", "append_chunk", "writer: append (committer)"),
    ("writer", "asyncio.selector_events", "_SelectorSocketTransport", "write", "writer: sent"),
    ("hub", "websockets.asyncio.connection", "Connection", "data_received", "hub: received"),
    ("hub", "sync._hub", "", "dispatch", "hub: dispatch"),
    ("hub", "crdtstore.record._foreign", "ForeignWrites", "_append_fast", "hub: apply"),
    ("hub", "crdtstore.record._loop_commit", "LoopCommit", "_commit_now", "hub: commit"),
    ("hub", "sync._ops_push", "_RunPushes", "send", "hub: push"),
    ("reader", "websockets.asyncio.connection", "Connection", "data_received", "reader: received"),
    ("reader", "sync._link", "_Link", "pushed_rows", "reader: push decoded"),
    ("reader", "sync._link", "_Link", "pushed", "reader: push decoded"),
    ("reader", "crdtstore.record._journal_link", "JournalLink", "_apply_now", "reader: apply"),
    ("writer", "websockets.asyncio.connection", "Connection", "data_received", "writer: back"),
]
_ENDS = {"hub: commit", "reader: apply", "writer: append (committer)"}  # also when they return


def install(role: str, folder: str) -> None:
    """Log this process's stages (``role``: writer, reader or hub) into ``folder``."""
    out = open(Path(folder) / f"{os.getpid()}-{role}.txt", "w", buffering=1)  # noqa: SIM115
    now = time.monotonic_ns

    def wrap(owner: Any, name: str, stage: str) -> None:
        inner = getattr(owner, name)
        end = stage in _ENDS
        if hasattr(inner, "__code__") and inner.__code__.co_flags & 0x80:  # a coroutine

            async def traced_async(*args: Any, **kwargs: Any) -> Any:
                out.write(f"{now()} {stage}\n")
                try:
                    return await inner(*args, **kwargs)
                finally:
                    if end:
                        out.write(f"{now()} {stage}: done\n")

            setattr(owner, name, traced_async)
            return

        def traced(*args: Any, **kwargs: Any) -> Any:
            out.write(f"{now()} {stage}\n")
            try:
                return inner(*args, **kwargs)
            finally:
                if end:
                    out.write(f"{now()} {stage}: done\n")

        setattr(owner, name, traced)

    done: set[str] = set()
    for who, module, cls, name, stage in _POINTS:
        if who != role or stage in done:
            continue
        try:
            owner: Any = importlib.import_module(module)
            if cls:
                owner = getattr(owner, cls)
            if name not in vars(owner):
                continue
        except (ImportError, AttributeError):
            continue
        wrap(owner, name, stage)
        done.add(stage)


def _stages() -> list[str]:
    names: list[str] = []
    for _, _, _, _, stage in _POINTS:
        for s in (stage, f"{stage}: done") if stage in _ENDS else (stage,):
            if s not in names:
                names.append(s)
    return names


def report(folder: Path, run: str, sent: list[int], arrivals: list[int], skip: int) -> None:
    """Print the median time (us) after the writer's stamp of each stage of the writes of
    ``run`` (the hub's log in ``folder``, the agents' in ``folder / run``; one reader's)."""
    events: list[tuple[int, str]] = []
    readers = sorted((folder / run).glob("*-reader.txt"))[:1]
    for path in [*folder.glob("*-hub.txt"), *(folder / run).glob("*-writer.txt"), *readers]:
        for line in path.read_text().splitlines():
            t, _, stage = line.partition(" ")
            events.append((int(t), stage))
    events.sort()
    by: dict[str, list[float]] = {name: [] for name in [*_stages(), "reader: arrival"]}
    at = 0
    for i in range(skip, len(sent) - 1):
        lo, hi = sent[i], sent[i + 1]
        while at < len(events) and events[at][0] < lo:
            at += 1
        first: dict[str, int] = {}
        j = at
        while j < len(events) and events[j][0] < hi:
            first.setdefault(events[j][1], events[j][0])
            j += 1
        for name, t in first.items():
            by[name].append((t - lo) / 1e3)
        if lo <= arrivals[i]:
            by["reader: arrival"].append((arrivals[i] - lo) / 1e3)
    print(f"\n{run}: stages of a write, median us after the writer's stamp (one reader)")
    rows = [(statistics.median(v), k, len(v)) for k, v in by.items() if v]
    for t, name, count in sorted(rows):
        print(f"  {t:8.0f}  {name}  ({count} writes)")
