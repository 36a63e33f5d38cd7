"""Head pushes sent from the hub's group commit (``sync._ops_push._hook_commits``).

- Through a real hub: entries appended by a ``ws://`` writer are pushed from the commit that
  journaled them, without the hub reading them back, and every pushed row is, field by field,
  what ``journal.read`` answers for that position afterwards.
- The pieces: a push from a commit goes out only when it continues exactly where the pushes
  stopped (a hole, a leader reading, too many entries: left to the leader, nothing sent);
  readers get a push before the connections waiting for their own append; one WebSocket
  frame is built for every writable connection, a busy one queues the message in order.

No sleep waits for sync: every wait is on a condition under a deadline.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from crdtstore import open_store
from crdtstore._journal import NewEntry, Row
from sync import Push, decode
from sync._hub_conn import _wire
from sync._ops_push import MAX_PUSH_ROWS, _committed_push, _RunPushes, row_to_json
from tests.network.test_sync_client import FAST, RUN, TENANT, running_hub, sqlite_store, token
from tests.network.test_sync_push import _hub_pushes, reader, until


@pytest.mark.anyio
async def test_appends_are_pushed_from_their_commit_as_the_journal_reads_them(
    tmp_path: Path,
) -> None:
    async with running_hub(tmp_path) as hub:
        async with open_store(hub.url(), token=token("w"), poll_interval=60.0, **FAST) as wstore:
            async with wstore.open_record(RUN, "w") as writer:
                await writer.map("m").set("start", 0)
                await writer.flush()
                async with reader(hub.url(), "r1") as (r1, j1):
                    await until(lambda: r1.map("m").get("start") == 0)
                    await writer.map("m").set("warm", 1)
                    await until(lambda: r1.map("m").get("warm") == 1)
                    link = j1._links[RUN]
                    seen: list[Any] = []
                    pushed = link.pushed_rows

                    def keep(seq: int, items: list[Any] | None) -> None:
                        seen.extend(items or [])
                        pushed(seq, items)

                    link.pushed_rows = keep  # type: ignore[method-assign]
                    pushes = _hub_pushes(hub)
                    reads, direct = pushes.reads, pushes.direct
                    n = 12
                    for i in range(n):
                        await writer.map("m").set(f"k{i}", {"v": [i, 0.5, None, "é"]})
                        await writer.flush()
                        await until(lambda i=i: r1.map("m").get(f"k{i}") is not None)
                    assert pushes.direct - direct >= n - 2, (pushes.direct, direct)
                    assert pushes.reads - reads <= 2, "the hub read back what it just committed"
        async with sqlite_store(hub) as store:
            rows = await store.backend.read(TENANT, RUN, 0, 1000)
    journaled = {r.seq: row_to_json(r) for r in rows}
    assert len(seen) >= n
    for item in seen:  # as journal.read answers it, through the same encoding
        assert item == decode_row(journaled[item[0]])
    assert r1.map("m").to_dict()["k11"] == {"v": [11, 0.5, None, "é"]}


def decode_row(item: list[Any]) -> list[Any]:
    from sync import encode

    message = decode(encode(Push(push="head", seq=item[0], rows=[item])))
    assert isinstance(message, Push) and message.rows
    return list(message.rows[0])


class _FakeConn:
    def __init__(self, name: str, log: list[tuple[str, str, bytes]], writable: bool = True):
        self.name, self.log, self._writable = name, log, writable

    def writable(self) -> bool:
        return self._writable

    def write_now(self, wire: bytes) -> None:
        self.log.append((self.name, "wire", wire))

    def send(self, frame: bytes) -> None:
        self.log.append((self.name, "queued", frame))


def _state(*conns: Any) -> _RunPushes:
    state = _RunPushes()
    for c in conns:
        state.conns[c] = None
    return state


def _entry(i: int) -> NewEntry:
    return NewEntry("a", "model", 3, 1000.0 + i, bytes([i, 1]), [("map", "m", "set", f"k{i}", i)],
                    i * 7, "", "call" if i % 2 else "")  # fmt: skip


def test_readers_first_one_wire_frame_and_a_busy_connection_queues() -> None:
    log: list[tuple[str, str, bytes]] = []
    w, r1, r2 = _FakeConn("w", log), _FakeConn("r1", log), _FakeConn("r2", log, writable=False)
    state = _state(w, r1, r2)
    state.appending[w] = 1  # w waits for its own append's answer
    state.send(b"frame")
    assert [(n, how) for n, how, _ in log] == [("r1", "wire"), ("r2", "queued"), ("w", "wire")]
    assert log[0][2] == log[2][2] == _wire(b"frame") and log[1][2] == b"frame"
    log.clear()
    del state.appending[w]
    state.send(b"next")  # nobody appending: joining order
    assert [n for n, _, _ in log] == ["w", "r1", "r2"]


def test_a_commit_is_pushed_only_where_the_pushes_stopped() -> None:
    log: list[tuple[str, str, bytes]] = []
    state = _state(_FakeConn("r", log, writable=False))  # (gets the message itself)
    entries = [_entry(1), _entry(2)]
    _committed_push(state, [1, 2], entries)  # not started (last < 0): the leader tells
    state.last = 4
    _committed_push(state, [6, 7], entries)  # a hole (5: another writer's): the leader reads
    _committed_push(state, [4, 5], entries)  # behind
    state.busy = True
    _committed_push(state, [5, 6], entries)  # the leader is reading
    state.busy = False
    many = [_entry(i % 200) for i in range(MAX_PUSH_ROWS + 1)]
    _committed_push(state, list(range(5, 6 + MAX_PUSH_ROWS)), many)  # too many: head only
    assert log == [] and state.last == 4 and state.direct == 0
    _committed_push(state, [5, 6], entries)
    assert state.last == 6 and state.direct == 1
    ((_, _, frame),) = log
    push = decode(frame)
    assert isinstance(push, Push) and push.seq == 6 and push.rows is not None
    stored = [e._replace(effect=json.loads(json.dumps(e.effect))) for e in entries]  # as kept
    want = [row_to_json(Row(s, *e)) for s, e in zip([5, 6], stored, strict=True)]
    assert [list(r) for r in push.rows] == [decode_row(r) for r in want]
    assert push.rows[0][-1] == "call" and len(push.rows[1]) == 9  # (no call: 9 items)
