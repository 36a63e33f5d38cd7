"""The fast paths of an uncontended acquire+release against the general ones.

``Table.request_alone`` (a request on an empty table) and ``Table.release_only`` (the release
of the only grant) skip the reap, the key lookup and the grant rule. Hypothesis drives random
sequences of requests, releases (also with forged tokens and owners), time passing past TTLs,
holder deaths and reboots through the SQLite backend's transitions (which take the fast paths
where they apply) and through the general ones, on two tables from the same start, and
asserts identical outcomes (states, tokens, errors, wake-ups) and rows after every step.
The SQLite row of a grant without a key has an INSERT of its own: every pattern of NULL
columns is written and read back, with and without the data_version condition.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from crdtstore._backends.sqlite import SQLiteJournal, SQLiteLeases
from crdtstore._backends.sqlite._lease_rows import _CREATE, _INSERT_GRANT, _insert_args, load_table
from crdtstore._leases import FakeClock, Proc, _engine
from crdtstore._leases._backend import TableBackend
from crdtstore._leases._conformance import FakeProbe
from crdtstore._leases._engine import Req, Table

TENANTS = ("t", "u")
FILES = ("f1", "f2", "f3")
PIDS = (101, 102)

request_op = st.tuples(
    st.just("request"),
    st.sampled_from(TENANTS),
    st.sampled_from("AB"),
    st.sets(st.sampled_from(FILES), min_size=1, max_size=2).map(lambda s: tuple(sorted(s))),
    st.sampled_from([0.3, 1.0, 5.0]),
    st.none() | st.tuples(st.sampled_from(["s1", "s2"]), st.integers(1, 2)),
    st.sampled_from(PIDS),
    st.booleans(),
)
release_op = st.tuples(
    st.just("release"),
    st.sampled_from([1, 1, 1, 2, 4]),  # how far back among the leases handed out (1: the last)
    st.sampled_from(["right", "right", "none", "forged"]),  # the token passed
    st.sampled_from([False, False, False, True]),  # by another owner
    st.sampled_from([False, False, False, True]),  # in another tenant
)
# odd steps and TTLs: a deadline read back as now + ttl - now is not always ttl
time_op = st.tuples(st.just("advance"), st.sampled_from([0.1, 0.7, 2.0, 6.0]))
death_op = st.tuples(st.just("die"), st.sampled_from(PIDS))
reboot_op = st.tuples(st.just("reboot"))
ops = st.lists(
    st.one_of(request_op, request_op, release_op, release_op, time_op, death_op, reboot_op),
    max_size=40,
)


def _backend(tmp_path: Any) -> tuple[SQLiteLeases, FakeClock, FakeProbe]:
    clock, probe = FakeClock(), FakeProbe()
    # never opened: only its transitions run, on tables held here
    journal = SQLiteJournal(f"sqlite:///{tmp_path}/unused.db")
    return SQLiteLeases(journal, clock=clock, probe=probe), clock, probe


def _rows(t: Table) -> dict[str, object]:
    return {
        "reqs": {k: dataclasses.asdict(v) for k, v in t.reqs.items()},
        "order": list(t.reqs),
        "counters": (t.next_rank, t.next_token),
        "changes": (set(t.dirty), set(t.removed), t.meta_dirty),
    }


def _outcome(out: tuple[Any, Any, bool]) -> tuple[object, ...]:
    value, error, wake = out
    return (
        None if value is None else value.model_dump(),
        None if error is None else (type(error).__name__, str(error)),
        wake,
    )


@settings(max_examples=5 * settings().max_examples)
@given(steps=ops)
def test_the_fast_paths_decide_as_the_general_transitions(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[Any, ...]]
) -> None:
    b, clock, probe = _backend(tmp_path_factory.mktemp("fast"))
    fast, slow = Table(), Table()
    handed: list[tuple[str, str, str, int | None]] = []  # (tenant, owner, lease id, token)
    for i, step in enumerate(steps):
        kind = step[0]
        if kind == "request":
            _, tenant, owner, res, ttl, key, pid, wait = step
            args = (tenant, owner, res, ttl, key, Proc("h", "b", pid, 1), wait, 1e9 + i)
            if not fast.reqs:
                event("request on an empty table")
            _engine._ids.seed(i)  # the same lease id on both sides
            got = b._request_tx(fast, args)
            _engine._ids.seed(i)
            want = TableBackend._request_tx(b, slow, args)
            if got[0] is not None:
                handed.append((tenant, owner, got[0].lease_id, got[0].token))
        elif kind == "release":
            if not handed:
                continue
            _, back, tok, other_owner, other_tenant = step
            tenant, owner, lease_id, token = handed[-min(back, len(handed))]
            token = {"right": token, "none": None, "forged": (token or 0) + 7}[tok]
            if other_owner:
                owner += "-other"
            if other_tenant:
                tenant = "u" if tenant == "t" else "t"
            rel = (tenant, lease_id, owner, token)
            if len(fast.reqs) == 1:
                event("release on a table of one request")
            got = b._release_tx(fast, rel)
            want = TableBackend._release_tx(b, slow, rel)
        elif kind == "advance":
            clock.advance(step[1])
            continue
        elif kind == "die":
            probe.dead.add(step[1])
            continue
        else:
            clock.reboot()
            continue
        assert _outcome(got) == _outcome(want), step
        assert _rows(fast) == _rows(slow), step
        fast.clean()
        slow.clean()


def test_an_uncontended_pair_takes_both_fast_paths(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    b, _, _ = _backend(tmp_path)
    t = Table()

    def general(*args: object) -> None:
        raise AssertionError("took the general path")

    monkeypatch.setattr(TableBackend, "_request_tx", general)
    monkeypatch.setattr(TableBackend, "_release_tx", general)
    for _ in range(2):
        state, error, wake = b._request_tx(t, ("t", "A", ("f1",), 5.0, None, Proc("h", "b", 1, 1),
                                               True, 0.0))  # fmt: skip
        assert (state.state, error, wake) == ("granted", None, False)
        assert b._release_tx(t, ("t", state.lease_id, "A", state.token)) == (None, None, False)
        assert not t.reqs
    assert (t.next_rank, t.next_token) == (3, 3)


row_req = st.builds(
    Req,
    rank=st.integers(1, 1000),
    id=st.text("0123456789abcdef", min_size=16, max_size=16),
    tenant=st.sampled_from(TENANTS),
    owner=st.sampled_from("AB"),
    step=st.none() | st.just("s1"),
    attempt=st.none() | st.integers(1, 3),
    resources=st.just(("f1", "f2")),
    state=st.sampled_from(["granted", "waiting"]),
    token=st.none() | st.integers(1, 1000),
    ttl=st.just(5.0),
    proc=st.none() | st.just(Proc("h", "b", 7, 3)),
    acked=st.booleans(),
    created=st.floats(0, 1e9),
    clock_boot=st.just("b"),
    requested=st.floats(0, 1e6),
    granted_at=st.none() | st.floats(0, 1e6),
    expires=st.floats(0, 1e6),
)


@given(r=row_req, checked=st.sampled_from(["no", "current", "stale"]), grant=st.booleans())
def test_every_row_pattern_is_written_as_it_is_read_back(r: Req, checked: str, grant: bool) -> None:
    if grant:  # the pattern of an uncontended grant, half the time
        r = dataclasses.replace(
            r, step=None, attempt=None, token=r.token or 1, proc=Proc("h", "b", 7, 3),
            granted_at=r.requested,
        )  # fmt: skip
    db = sqlite3.connect(":memory:", isolation_level=None)
    db.execute(_CREATE)
    dv = db.execute("PRAGMA data_version").fetchone()[0]
    t = Table({r.rank: r}, next_rank=r.rank + 1, next_token=(r.token or 0) + 1)
    sql, args = _insert_args(r, t, {"no": None, "current": dv, "stale": dv + 1}[checked])
    if sql is _INSERT_GRANT:
        event("the INSERT of a grant without a key")
    written = db.execute(sql, args).rowcount
    back = load_table(db)
    if checked == "stale":
        assert (written, back.reqs) == (0, {})
    else:
        assert written == 1
        assert back.reqs == {r.rank: r}
        assert (back.next_rank, back.next_token) == (t.next_rank, t.next_token)
