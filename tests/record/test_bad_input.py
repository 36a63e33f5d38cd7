"""I10: bad update bytes are refused with a typed error; the record and the journal are left
byte-for-byte unchanged.

Garbage and truncated updates must be refused. A bit-flipped update may decode as a valid
(corrupted) one and be accepted (PYCRDT-NOTES hazard 8); then it must at least not break the
record. No exception other than a ``CrdtStoreError`` may ever escape: pycrdt raises
``ValueError``, ``RuntimeError`` and panics (``BaseException``), all of which the boundary must
translate.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from pycrdt import Array, Doc, Map, Text

import crdtstore
from crdtstore import (
    CrdtStoreError,
    InvalidUpdate,
    JournalCorrupt,
    PayloadTooLarge,
    Replica,
    tree_merge,
)
from crdtstore._journal import Row, checksum
from crdtstore.record._document import REGISTRY

pytestmark = pytest.mark.anyio

RUN = "r"
RECORD_SETTINGS = settings(
    suppress_health_check=[
        *settings.default.suppress_health_check,
        HealthCheck.function_scoped_fixture,
    ],
    max_examples=max(10, settings.default.max_examples // 2),
)


def foreign_update(text: str = "hello wörld", client_id: int = 4242) -> bytes:
    """A valid update from another document writing a map, a list and a text the way
    crdtstore does (registry included). Deterministic bytes: fixed client id."""
    doc = Doc(client_id=client_id)
    registry = doc.get(REGISTRY, type=Map)
    facts, log, notes = (
        doc.get("facts", type=Map),
        doc.get("log", type=Array),
        doc.get("notes", type=Text),
    )
    with doc.transaction():
        registry["facts"], registry["log"], registry["notes"] = "map", "list", "text"
        facts["k"] = {"x": [1, 2.5, "é"], "ok": True}
        log.extend(["a", 2, None])
        notes.insert(0, text)
    return doc.get_update()


VALID = foreign_update()


def typed(fn: Callable[[], Any]) -> CrdtStoreError | None:
    """Run ``fn``; return the crdtstore error it raised, or None. Anything else is a failure."""
    try:
        fn()
    except CrdtStoreError as exc:
        return exc
    except BaseException as exc:  # pycrdt panics are BaseException
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        raise AssertionError(f"untyped {type(exc).__name__} escaped: {exc!r}") from None
    return None


async def atyped(fn: Callable[[], Awaitable[Any]]) -> CrdtStoreError | None:
    try:
        await fn()
    except CrdtStoreError as exc:
        return exc
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        raise AssertionError(f"untyped {type(exc).__name__} escaped: {exc!r}") from None
    return None


# -- pure replicas ---------------------------------------------------------------------------------


def replica_with_content(max_update: int = 16 * 1024 * 1024) -> Replica:
    replica = Replica(max_update=max_update)
    replica.apply_update(foreign_update("existing text", client_id=1))
    return replica


def replica_state(replica: Replica) -> tuple[Any, ...]:
    out: list[Any] = []
    err = typed(lambda: out.append((replica.to_dict(), replica.collections())))
    assert err is None, f"reading the replica raised {err!r}"
    # The full update's bytes are not compared: pycrdt may encode the same blocks in another
    # order (seen to vary between runs); the state vector and a rebuild from it are compared.
    rebuilt = Replica()
    rebuilt.apply_update(replica.doc.get_update())
    return (*out[0], replica.doc.get_state(), rebuilt.to_dict())


def check_refused_or_accepted(replica: Replica, update: Any) -> CrdtStoreError | None:
    before = replica_state(replica)
    err = typed(lambda: replica.apply_update(update))
    after = replica_state(replica)  # must be readable either way
    if err is not None:
        assert isinstance(err, InvalidUpdate | PayloadTooLarge), repr(err)
        assert after == before, "a refused update changed the replica"
    return err


def garbage_corpus() -> list[bytes]:
    rnd = random.Random(0)
    corpus = [b"", b"\x00", b"\x01", b"\xff" * 12, b"\x80" * 20, b"\x01\x80\x80\x80\x80\x80"]
    corpus += [rnd.randbytes(rnd.randrange(1, 200)) for _ in range(150)]
    # never the empty update (b"\x00\x00...", valid) by accident
    return [g for g in corpus if not g.startswith(b"\x00\x00")]


def test_replica_refuses_garbage() -> None:
    replica = replica_with_content()
    for junk in garbage_corpus():
        assert isinstance(check_refused_or_accepted(replica, junk), InvalidUpdate), junk


BOMB_PROBE = """
import sys
from crdtstore import InvalidUpdate, Replica

def peak_kib():  # VmHWM: this process's own peak (ru_maxrss would include the parent's)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))

replica = Replica()
before = peak_kib()
try:
    replica.apply_update(bytes.fromhex(sys.argv[1]))
except InvalidUpdate:
    pass
print((peak_kib() - before) // 1024)
"""


def test_tiny_update_with_a_huge_count_is_refused_cheaply() -> None:
    """Fails today: 4 bytes announcing 2**28 clients make pycrdt's decoder allocate ~500 MiB
    (and take ~0.7 s) before it fails; ``max_update`` does not bound that, so a peer could
    send a stream of these. Measured in a fresh process, as the growth of its peak RSS."""
    bomb = b"\xff\xff\xff\x7f"
    out = subprocess.run(
        [sys.executable, "-c", BOMB_PROBE, bomb.hex()],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "RUST_BACKTRACE": "0"},
    )
    grown_mib = int(out.stdout.strip().splitlines()[-1])
    assert grown_mib < 64, f"refusing {len(bomb)} bytes raised the peak RSS by {grown_mib} MiB"


def test_replica_refuses_every_truncation() -> None:
    replica = replica_with_content()
    for cut in range(len(VALID)):
        err = check_refused_or_accepted(replica, VALID[:cut])
        assert isinstance(err, InvalidUpdate), f"prefix of {cut}/{len(VALID)} bytes accepted"


def test_replica_every_single_bit_flip_is_refused_or_harmless() -> None:
    """Exhaustive: each of the 8 * len(VALID) single-bit flips, on a fresh replica."""
    outcomes = {"refused": 0, "accepted": 0}
    broken = []
    for pos in range(len(VALID)):
        for bit in range(8):
            mutated = bytearray(VALID)
            mutated[pos] ^= 1 << bit
            replica = replica_with_content()
            try:
                err = check_refused_or_accepted(replica, bytes(mutated))
            except AssertionError as exc:
                broken.append((pos, bit, str(exc)))
                continue
            outcomes["refused" if err is not None else "accepted"] += 1
    print(f"single-bit flips of a {len(VALID)}-byte update: {outcomes}, broke {len(broken)}")
    assert outcomes["refused"] > 0
    assert not broken, f"{len(broken)} accepted flips broke the replica, e.g. {broken[:3]}"


def test_replica_refuses_non_bytes_and_oversize() -> None:
    replica = replica_with_content(max_update=1000)
    for bad in ["text", None, 12, [1, 2]]:
        assert isinstance(check_refused_or_accepted(replica, bad), InvalidUpdate), bad
    big = foreign_update("x" * 1500, client_id=77)
    assert len(big) > 1000
    err = check_refused_or_accepted(replica, big)
    assert isinstance(err, PayloadTooLarge)
    assert (err.size, err.limit, err.code) == (len(big), 1000, "PAYLOAD_TOO_LARGE")
    # the size is checked before decoding: oversize garbage is "too large", not "invalid"
    assert isinstance(check_refused_or_accepted(replica, b"\x01" * 5000), PayloadTooLarge)
    # the limit is inclusive
    fits = foreign_update("y" * 10, client_id=78)
    exact = Replica(max_update=len(fits))
    assert check_refused_or_accepted(exact, fits) is None
    assert exact.to_dict()["notes"] == "y" * 10
    assert isinstance(
        typed(lambda: Replica(max_update=len(fits) - 1).apply_update(fits)), PayloadTooLarge
    )


def test_replica_skips_journal_rows_that_fail_their_checksum_or_do_not_decode() -> None:
    """A corrupt or torn journal entry is skipped (and reported), the others applied (I4)."""
    first, second = foreign_update("one ", client_id=11), foreign_update("two", client_id=12)
    flipped = bytearray(VALID)
    flipped[len(flipped) // 2] ^= 0x10
    torn = VALID[: len(VALID) // 2]
    rows = [
        Row(1, "a", "tool", 11, 0.0, first, [], checksum(first)),
        Row(2, "b", "tool", 4242, 0.0, bytes(flipped), [], checksum(VALID)),  # bit rot
        Row(3, "b", "tool", 4242, 0.0, torn, [], checksum(torn)),  # torn before the crc
        Row(4, "c", "tool", 12, 0.0, second, [], checksum(second)),
    ]
    expected = Replica()
    expected.apply_update(tree_merge([first, second]))
    replica = Replica()
    assert typed(lambda: replica.apply_rows(rows, RUN)) is None
    assert [(e.seq, e.code, type(e)) for e in replica.skipped] == [
        (2, "JOURNAL_CORRUPT", JournalCorrupt),
        (3, "JOURNAL_CORRUPT", JournalCorrupt),
    ]
    assert replica_state(replica) == replica_state(expected)


@given(junk=st.binary(max_size=300))
def test_replica_garbage_property(junk: bytes) -> None:
    err = check_refused_or_accepted(replica_with_content(), junk)
    event("refused" if err is not None else "accepted")


# -- live records ----------------------------------------------------------------------------------


async def record_state(store: crdtstore.Store, rec: crdtstore.Record) -> tuple[Any, ...]:
    await rec.flush()
    out: list[Any] = []
    err = typed(lambda: out.append(rec.to_dict()))
    assert err is None, f"reading the record raised {err!r}"
    journal = [e.model_dump() for e in await store.journal(RUN, limit=1_000_000)]
    return out[0], rec.replica.doc.get_state(), journal


async def feed(store: crdtstore.Store, rec: crdtstore.Record, update: Any) -> CrdtStoreError | None:
    """``rec.apply_update(update)``: a typed error and nothing changed, or accepted."""
    before = await record_state(store, rec)
    err = await atyped(lambda: rec.apply_update(update))
    after = await record_state(store, rec)
    if err is not None:
        assert isinstance(err, InvalidUpdate | PayloadTooLarge), repr(err)
        assert err.to_dict()["code"] == err.code
        assert after == before, "a refused update changed the record or its journal"
    return err


class Target:
    """A store with one record that already holds content of its own."""

    def __init__(self, url: str, max_update: int = 16 * 1024 * 1024) -> None:
        self.url = url
        self.max_update = max_update

    async def __aenter__(self) -> tuple[crdtstore.Store, crdtstore.Record]:
        self.store = await crdtstore.open_store(self.url, max_update=self.max_update).start()
        self.rec = await self.store.open_record(run=RUN, agent="a", source="tool").start()
        await self.rec.map("facts").set("existing", {"v": 1})
        await self.rec.list("log").append("first")
        await self.rec.text("notes").edit("some notes")
        await self.rec.flush()
        return self.store, self.rec

    async def __aexit__(self, *exc: object) -> None:
        await self.rec.aclose()
        await self.store.aclose()


@pytest.fixture(params=["memory", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/store.db"


async def test_record_refuses_garbage_and_truncations(url: str) -> None:
    # every truncation is checked on a replica above; here a spread of them, and the last ones
    cuts = [*range(0, len(VALID), 9), *range(len(VALID) - 4, len(VALID))]
    async with Target(url) as (store, rec):
        for junk in [*garbage_corpus()[:30], *(VALID[:cut] for cut in cuts)]:
            assert isinstance(await feed(store, rec, junk), InvalidUpdate), junk
        for bad in ["text", None, 12]:
            assert isinstance(await feed(store, rec, bad), InvalidUpdate)
        # the record still works, and its journal still resumes
        await rec.map("facts").set("after", True)
        expected = await record_state(store, rec)
        async with store.open_record(run=RUN, agent="b") as again:
            assert again.to_dict() == expected[0]


async def test_record_refuses_oversize(url: str) -> None:
    async with Target(url, max_update=1000) as (store, rec):
        big = foreign_update("x" * 1500, client_id=77)
        err = await feed(store, rec, big)
        assert isinstance(err, PayloadTooLarge) and (err.size, err.limit) == (len(big), 1000)
        assert isinstance(await feed(store, rec, b"\x01" * 1001), PayloadTooLarge)
        small = foreign_update("y" * 10, client_id=78)
        head = len(await store.journal(RUN))
        assert await feed(store, rec, small) is None
        assert "y" * 10 in rec.text("notes").read()
        assert len(await store.journal(RUN)) == head + 1


@RECORD_SETTINGS
@given(junk=st.binary(max_size=300))
async def test_record_garbage_property(anyio_backend: str, junk: bytes) -> None:
    async with Target("memory://") as (store, rec):
        err = await feed(store, rec, junk)
        event("refused" if err is not None else "accepted")


@RECORD_SETTINGS
@given(
    flips=st.lists(
        st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 7)), min_size=1, max_size=3
    )
)
@example(flips=[(4, 0)])  # the first clock: 0 -> 1 (see test_apply_update_is_journaled_as_...)
@example(flips=[(40, 0)])  # the registry's "map" -> "lap"
async def test_record_bit_flips_are_refused_or_harmless(
    anyio_backend: str, flips: list[tuple[int, int]]
) -> None:
    mutated = bytearray(VALID)
    for pos, bit in flips:
        mutated[pos] ^= 1 << bit
    async with Target("memory://") as (store, rec):
        err = await feed(store, rec, bytes(mutated))
        event("refused" if err is not None else "accepted")
        # accepted or not, the run must still resume from its journal
        live = (await record_state(store, rec))[0]
        async with store.open_record(run=RUN, agent="b") as again:
            out: list[Any] = []
            assert typed(lambda: out.append(again.to_dict())) is None
            assert out[0] == live
