"""The ``ws://`` client's state-vector exchange on every reconnect (``sync._client``,
``journal.state`` in ``sync._ops_journal``): nothing is lost when the hub lost entries.

- A hub process whose store is restored from a backup (and then reuses the lost journal
  positions for a third writer's entries): the two clients that had taken the lost entries
  in send back what the hub lacks (as their token's writes) and read the journal again from
  the last entry they share with the hub, so the journal holds every value again, every
  client converges, a fresh reader too, and nothing written after the restore is skipped.
- A normal reconnect (the hub lost nothing) sends nothing more than the one exchange
  request: no append, no journal entry.
- A malformed ``journal.state`` request is refused with a typed error.

The clients run on the test's anyio backend, behind TCP relays
(``tests/network/test_sync_client_faults.py``) that keep them offline while the hub is
restored. No sleep waits for sync: every wait is on a condition under a deadline.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import crdtstore
from crdtstore import InvalidValue, Record
from tests._wait import until
from tests.network.test_sync_client import FAST, HubThread, running_hub
from tests.network.test_sync_client import token as thread_token
from tests.network.test_sync_client_faults import relay_to
from tests.network.test_sync_processes import RUN, TENANT, fleet, stop_hub, token

pytestmark = pytest.mark.anyio

DEADLINE = 60.0  # a whole phase on a loaded 2-core machine; about a second when idle


def _url(port: int) -> str:
    return f"ws://127.0.0.1:{port}/{TENANT}"


def _values(rec: Record) -> dict[str, Any]:
    return dict(rec.map("m").to_dict())


async def _journal_len(db: Path) -> int:
    async with crdtstore.open_store(f"sqlite:///{db}", tenant=TENANT) as store:
        return len(await store.journal(RUN, limit=10_000))


def _backup(db: Path, to: Path) -> None:
    src, dst = sqlite3.connect(db), sqlite3.connect(to)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()


def _restore(backup: Path, db: Path) -> None:
    for extra in ("-wal", "-shm"):
        db.with_name(db.name + extra).unlink(missing_ok=True)
    shutil.copyfile(backup, db)


@pytest.mark.parametrize("alice_marks", ["kept", "forgotten"])
async def test_a_hub_restored_from_a_backup_gets_back_what_its_clients_had(
    tmp_path: Path, anyio_backend: str, alice_marks: str
) -> None:
    """``forgotten``: alice's link knows no entry it shares with the hub (as when the loss
    is older than the positions it keeps): she tells the loss by state vector, takes in
    what the hub holds that she lacks and reads on from where the hub's record is."""
    db, backup = tmp_path / "store.db", tmp_path / "backup.db"
    async with fleet(tmp_path, anyio_backend) as f:
        hub = await f.hub()
        assert hub.port is not None
        port = hub.port
        async with (
            relay_to(port) as relay_a,
            relay_to(port) as relay_b,
            crdtstore.open_store(_url(relay_a.port), token=token("alice"), **FAST) as sa,
            crdtstore.open_store(_url(relay_b.port), token=token("bob"), **FAST) as sb,
            sa.open_record(RUN, "ignored") as a,
            sb.open_record(RUN, "ignored") as b,
        ):
            ja: Any = sa._backend
            jb: Any = sb._backend
            for i in range(5):
                await a.map("m").set(f"a{i}", i)
            for i in range(3):
                await b.map("m").set(f"b{i}", i)
            await a.flush()
            await b.flush()
            await until(lambda: len(_values(a)) == len(_values(b)) == 8, "first entries seen")
            _backup(db, backup)

            for i in range(5, 10):  # lost with the backup
                await a.map("m").set(f"a{i}", i)
            await b.map("m").set("b3", 3)  # lost too
            await a.flush()
            await b.flush()
            await until(lambda: len(_values(a)) == len(_values(b)) == 14, "all entries seen")
            seen = _values(a)
            assert _values(b) == seen
            lost_at = a.applied_seq

            # both clients offline; the hub stops, its store is restored, it starts again
            relay_a.down = relay_b.down = True
            relay_a.cut()
            relay_b.cut()
            await stop_hub(hub)
            _restore(backup, db)
            hub = await f.hub(port)

            # a third writer reuses the lost positions, more of them than were lost (the
            # journal head alone would not tell the clients that anything was lost)
            async with (
                crdtstore.open_store(_url(port), token=token("carol"), **FAST) as sc,
                sc.open_record(RUN, "ignored") as c,
            ):
                assert c.applied_seq < lost_at
                for i in range(12):
                    await c.map("m").set(f"c{i}", i)
                await c.flush()
                assert c.applied_seq >= lost_at
                assert "a9" not in _values(c)

                if alice_marks == "forgotten":
                    ja._links[RUN].marks.clear()
                relay_a.down = False  # alice comes back first, then bob
                await until(lambda: ja.losses == 1 and ja._links[RUN].synced, "alice resynced")
                assert ja.resent == 1
                relay_b.down = False
                await until(lambda: jb.losses == 1 and jb._links[RUN].synced, "bob resynced")
                # alice sent every insert the hub lacked, bob's lost entry included; bob
                # sends his deletes (a state vector does not tell which the hub holds)
                assert jb.resent == 1

                full = {**seen, **{f"c{i}": i for i in range(12)}}
                await until(lambda: _values(a) == _values(b) == _values(c) == full, "all converged")

                # written after the restore: seen everywhere, no position skipped
                await a.map("m").set("after_a", 1)
                await c.map("m").set("after_c", 2)
                await a.flush()
                await c.flush()
                full |= {"after_a": 1, "after_c": 2}
                await until(
                    lambda: _values(a) == _values(b) == _values(c) == full, "later writes seen"
                )
                assert ja.losses == jb.losses == 1  # no more exchanges found a loss

        await stop_hub(hub)
        async with crdtstore.open_store(f"sqlite:///{db}", tenant=TENANT) as store:
            async with store.open_record(RUN, "reader") as fresh:
                assert _values(fresh) == full
            replayed = dict((await store.replay(RUN)).to_dict()["m"])
            assert {k: int(v) for k, v in replayed.items()} == full
            for key in ("a0", "b0", "b2"):  # in the backup: as written
                (entry,) = await store.history(RUN, "m", key)
                assert entry.provenance.agent == ("alice" if key[0] == "a" else "bob")
            for key in ("a5", "a9"):  # alice's lost writes: sent back by alice
                (entry,) = await store.history(RUN, "m", key)
                assert entry.provenance.agent == "alice"
            (entry,) = await store.history(RUN, "m", "b3")  # bob's: alice sent it first
            assert entry.provenance.agent == "alice"
            (entry,) = await store.history(RUN, "m", "c11")
            assert entry.provenance.agent == "carol"


_OP = st.tuples(st.sampled_from("ab"), st.sampled_from(["set", "del"]), st.sampled_from("vwxyz"))


async def _restore_program(
    hub: HubThread, run_dir: Path, before: list[Any], after: list[Any], carol: int
) -> None:
    """``before``: writes of alice and bob in the backup; ``after``: theirs that the
    restore loses; then ``carol`` entries of a third writer, racing their reconnects."""
    db, backup = Path(hub.store_url.removeprefix("sqlite:///")), run_dir / "backup.db"
    async with (
        crdtstore.open_store(hub.url(), token=thread_token("alice"), **FAST) as sa,
        crdtstore.open_store(hub.url(), token=thread_token("bob"), **FAST) as sb,
        sa.open_record(RUN, "ignored") as a,
        sb.open_record(RUN, "ignored") as b,
    ):
        recs = {"a": a, "b": b}
        value = 0
        for phase in (before, after):
            for who, kind, key in phase:
                value += 1
                if kind == "set":
                    await recs[who].map("m").set(key, value)
                else:
                    await recs[who].map("m").delete(key)
            await a.flush()
            await b.flush()
            head = (await sa.run_info(RUN)).head
            await until(lambda h=head: a.applied_seq >= h and b.applied_seq >= h, "caught up")
            await until(lambda: _values(a) == _values(b), "a and b agree")
            if phase is before:
                await anyio.to_thread.run_sync(_backup, db, backup)
        seen = _values(a)
        await hub.stop()
        _restore(backup, db)
        await hub.start()
        async with (
            crdtstore.open_store(hub.url(), token=thread_token("carol"), **FAST) as sc,
            sc.open_record(RUN, "ignored") as c,
        ):
            for i in range(carol):
                await c.map("m").set(f"c{i}", i)
            await c.flush()
            full = {**seen, **{f"c{i}": i for i in range(carol)}}
            await until(lambda: _values(a) == _values(b) == _values(c) == full, "converged")
    async with crdtstore.open_store(hub.store_url, tenant=TENANT) as store:
        async with store.open_record(RUN, "reader") as fresh:
            assert _values(fresh) == full


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_any_loss_comes_back_whatever_the_order_of_reconnects(
    tmp_path_factory: pytest.TempPathFactory, backend: str
) -> None:
    @settings(max_examples=8, deadline=None)
    @given(
        st.lists(_OP, min_size=1, max_size=6),
        st.lists(_OP, min_size=1, max_size=8),
        st.integers(0, 12),
    )
    def check(before: list[Any], after: list[Any], carol: int) -> None:
        run_dir = tmp_path_factory.mktemp("restore")
        hub = HubThread(f"sqlite:///{run_dir / 'store.db'}")
        hub._start()
        try:
            anyio.run(_restore_program, hub, run_dir, before, after, carol, backend=backend)
        finally:
            hub._stop()

    check()


async def test_a_normal_reconnect_sends_nothing_more(tmp_path: Path, anyio_backend: str) -> None:
    async with (
        running_hub(tmp_path) as hub,
        relay_to(hub.port) as relay,
        crdtstore.open_store(_url(relay.port), token=thread_token("alice"), **FAST) as sa,
        sa.open_record(RUN, "ignored") as a,
    ):
        ja: Any = sa._backend
        for i in range(20):
            await a.map("m").set(f"k{i}", i)
        await a.map("m").delete("k0")  # a delete set: never "lacking" by state vector
        await a.flush()
        before = await _journal_len(tmp_path / "store.db")
        link = ja._links[RUN]
        for cut in range(1, 4):
            relay.cut()
            await until(lambda n=cut + 1: link.connects == n and link.synced)
            assert ja.exchanges == cut  # one journal.state request per reconnect...
            assert ja.losses == ja.resent == 0  # ... and no append
        assert await _journal_len(tmp_path / "store.db") == before
        await a.map("m").set("after", 1)
        await a.flush()
        assert await _journal_len(tmp_path / "store.db") == before + 1


@pytest.mark.parametrize(
    "params",
    [
        {"state": "not base64!"},
        {"state": "AAAA/w=="},  # base64, not a state vector
        {"at": "1"},
        {"marks": [[1]]},
        {"marks": [[0, 5]]},
        {"marks": [[s, 1] for s in range(1, 300)]},
    ],
)
async def test_a_malformed_state_request_is_refused(
    tmp_path: Path, anyio_backend: str, params: dict[str, Any]
) -> None:
    async with (
        running_hub(tmp_path) as hub,
        crdtstore.open_store(hub.url(), token=thread_token("alice"), **FAST) as sa,
        sa.open_record(RUN, "ignored") as a,
    ):
        await a.map("m").set("k", 1)
        await a.flush()
        ja: Any = sa._backend
        with pytest.raises(InvalidValue):
            await ja.call(RUN, "journal.state", params)
        got = await ja.call(RUN, "journal.state", {"at": a.applied_seq, "marks": [[1, 0]]})
        assert got["head"] == a.applied_seq
        assert isinstance(got["at_checksum"], int)
        assert got["match"] == -1


async def test_a_ws_record_attaches_itself(tmp_path: Path, anyio_backend: str) -> None:
    async with (
        running_hub(tmp_path) as hub,
        crdtstore.open_store(hub.url(), token=thread_token("alice"), **FAST) as sa,
        sa.open_record(RUN, "ignored") as a,
    ):
        assert a in sa._backend._attached.get(RUN, [])  # type: ignore[attr-defined]
