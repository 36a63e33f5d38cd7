"""Who wrote character i of a text (``TextCollection.provenance(i)``, issue 19 part 3): the
journal entry that inserted it, exactly, for texts edited by several records with multi-byte
characters and other writes between the edits (pycrdt's sticky clocks run ahead after a
non-ASCII character of a block, and two blocks of one client with such a gap between read
as one), the same as ``authorship`` says of the span holding it, and through resume and a
compaction that drops the journal. Every insert writes one character of its own, so the
entry that wrote each character is known from the journal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import crdtstore
from crdtstore import InvalidValue

pytestmark = pytest.mark.anyio

# one character per insert: ASCII, 2-, 3- and 4-byte UTF-8 (the last two UTF-16 units)
POOL = "abcdéfüghßijΩklm€nop😀qrs中tuv𝄞wxyzЖЩ"
SETTINGS = settings(
    max_examples=max(8, settings.default.max_examples // 4),
    suppress_health_check=[HealthCheck.too_slow],
    deadline=None,
)
# (writer, what, position, count): an insert of count copies of the next character of the
# pool, a map write (a clock gap in that writer's text blocks), a delete, or a sync of all
STEPS = st.lists(
    st.tuples(
        st.integers(0, 2),
        st.sampled_from(["ins", "ins", "ins", "map", "del", "sync"]),
        st.integers(0, 50),
        st.integers(1, 3),
    ),
    max_size=len(POOL),
)


async def _written_by(store: crdtstore.Store) -> dict[str, tuple[int, str]]:
    """Character -> (seq, agent) of the journal entry that inserted it."""
    out: dict[str, tuple[int, str]] = {}
    for e in await store.journal("r", limit=100_000):
        for op in e.effect:
            if op[0] == "text" and op[2] == "ins":
                out[op[4][0]] = (e.seq, e.agent)
    return out


def _check(rec: crdtstore.Record, truth: dict[str, tuple[int, str]]) -> None:
    t = rec.text("t")
    text = str(t)
    spans = t.authorship()
    assert "".join(s.text for s in spans) == text
    for s in spans:
        for i in range(s.start, s.end):
            p = t.provenance(i)
            assert p is not None and s.provenance is not None
            assert (p.seq, p.agent) == truth[text[i]], (text, i)
            assert p == s.provenance
    for start in range(len(text)):  # a part of it, starting inside a block
        part = t.authorship(start, start + 3)
        assert "".join(s.text for s in part) == text[start : start + 3]
        for s in part:
            assert s.provenance is not None
            assert {truth[c] for c in s.text} == {(s.provenance.seq, s.provenance.agent)}


async def _play(recs: list[crdtstore.Record], steps: list[Any]) -> None:
    chars = iter(POOL)
    for who, what, pos, count in steps:
        rec = recs[who]
        t = rec.text("t")
        n = len(str(t))
        if what == "ins":
            await t.insert(pos % (n + 1), next(chars) * count)
        elif what == "map":
            await rec.map("m").set(f"k{pos}", pos)
        elif what == "del" and n:
            await t.delete(pos % n, 1)
        elif what == "sync":
            for r in recs:
                await r.flush()
            for r in recs:
                await r.sync()
    for r in recs:
        await r.flush()
    for r in recs:
        await r.sync()


@SETTINGS
@given(steps=STEPS)
async def test_each_character_names_the_entry_that_wrote_it(steps: list[Any]) -> None:
    async with crdtstore.open_store("memory://") as store:
        recs = [await store.open_record(run="r", agent=f"a{i}").start() for i in range(3)]
        try:
            await _play(recs, steps)
            truth = await _written_by(store)
            texts = {str(r.text("t")) for r in recs}
            assert len(texts) == 1
            for r in recs:
                _check(r, truth)
            async with store.open_record(run="r", agent="reader") as resumed:
                _check(resumed, truth)
            await store.compact("r", drop_journal=True)
            async with store.open_record(run="r", agent="reader") as compacted:
                _check(compacted, truth)
        finally:
            for r in recs:
                await r.aclose()


async def test_a_gap_as_wide_as_a_multibyte_character_is_two_blocks(tmp_path: Path) -> None:
    """ "é" (2 UTF-8 bytes, 1 clock), one map write (1 clock), then "ab": pycrdt names "a" at
    the clock that follows "é" by bytes, so the two blocks read as one; "a" and "b" are the
    third entry's, not the first's, from a position inside the text too."""
    async with crdtstore.open_store(f"sqlite:///{tmp_path / 's.db'}") as store:
        async with store.open_record(run="r", agent="w") as rec:
            t = rec.text("t")
            await rec.map("m").set("k", 0)  # (the map registered first: one clock below)
            await t.append("é")
            await rec.map("m").set("k", 1)
            await t.append("ab")
            await rec.flush()
            truth = await _written_by(store)
            assert [t.provenance(i).seq for i in range(3)] == [  # type: ignore[union-attr]
                truth["é"][0],
                truth["a"][0],
                truth["a"][0],
            ]
            assert truth["a"][0] > truth["é"][0] + 1
            assert [(s.text, s.provenance.seq) for s in t.authorship()] == [  # type: ignore[union-attr]
                ("é", truth["é"][0]),
                ("ab", truth["a"][0]),
            ]
            assert t.authorship(1, 3)[0].provenance == t.provenance(1)
            assert t.provenance(-1) == t.provenance(2)


async def test_bad_indexes_are_refused() -> None:
    async with crdtstore.open_store("memory://") as store:
        async with store.open_record(run="r", agent="w") as rec:
            t = rec.text("t")
            with pytest.raises(IndexError):
                t.provenance(0)
            await t.append("héllo")
            for bad in (5, -6, 100):
                with pytest.raises(IndexError):
                    t.provenance(bad)
            with pytest.raises(InvalidValue):
                t.provenance("1")  # type: ignore[arg-type]
            assert t.provenance(4) is not None and t.provenance(4).agent == "w"  # type: ignore[union-attr]


def test_another_clients_character_that_lines_the_clocks_up_again_is_not_a_block_start() -> None:
    """ "x" (client 1, clock 0), a map write (clock 1), "c" of client 2 after it, then "yéé"
    (one block from clock 2): counted back from the second "é" (named clock 5 by pycrdt,
    exactly 4), "x" reads as of the same block, so the bisection for the block's start
    stops there; the chain from it breaks at "c", and the walk back finds "y"."""
    from pycrdt import Doc, Map, Text

    from crdtstore.record._text_ids import char_id

    def sync(src: Doc, dst: Doc) -> None:
        dst.apply_update(src.get_update(dst.get_state()))

    a, b = Doc(client_id=1), Doc(client_id=2)
    ta, tb = a.get("t", type=Text), b.get("t", type=Text)
    tb.insert(0, "zzzz")
    sync(b, a)
    ta.insert(4, "x")
    a.get("m", type=Map)["k"] = 1
    sync(a, b)
    tb.insert(5, "c")
    sync(b, a)
    ta.insert(6, "yéé")
    text = str(ta)
    assert text == "zzzzxcyéé"
    ids = [char_id(ta, text, i) for i in range(len(text))]
    assert ids == [(2, 0), (2, 1), (2, 2), (2, 3), (1, 0), (2, 4), (1, 2), (1, 3), (1, 4)]
