"""Who wrote character i of a text: ``text.provenance(i)`` against reading it from
``text.authorship()`` (issue 19 part 3).

    python bench/text_provenance.py            # 10k characters, 1,000 lookups
    python bench/text_provenance.py --quick    # 10k characters, 200 lookups

A text of about 10,000 characters written by three records of one ``memory://`` store in
about 1,000 inserts of 10 characters at random places (so about 2,000 spans), each record
also writing a map entry between its edits; once all ASCII, once with one character in
five non-ASCII (é, €, 😀: the slower, exact path). Timed, CPU time per lookup at random
positions: ``provenance(i)``; ``authorship(i, i + 1)`` (the span API asked for one
character); and the baseline, ``authorship()`` of the whole text, the linear scan a
lookup needed before. Target: a lookup under 1 ms, under 1/20 of the scan.
"""

from __future__ import annotations

import argparse
import random
import time

import anyio
from _common import Result, fmt, header, table

import crdtstore

TARGET_MS = 1.0
TARGET_RATIO = 1 / 20


async def _text(
    store: crdtstore.Store, run: str, chars: str, inserts: int
) -> list[crdtstore.Record]:
    rng = random.Random(7)
    recs = [await store.open_record(run=run, agent=f"agent-{i}").start() for i in range(3)]
    for n in range(inserts):
        rec = recs[n % 3]
        t = rec.text("t")
        piece = "".join(rng.choice(chars) for _ in range(10))
        await t.insert(rng.randint(0, len(t)), piece)
        await rec.map("m").set(f"k{n % 7}", n)
        if n % 10 == 9:
            for r in recs:
                await r.flush()
            for r in recs:
                await r.sync()
    for r in recs:
        await r.flush()
    for r in recs:
        await r.sync()
    return recs


def _cpu(fn: object, args: list[int]) -> float:
    c0 = time.process_time()
    for i in args:
        fn(i)  # type: ignore[operator]
    return (time.process_time() - c0) / len(args)


async def main_async(args: argparse.Namespace) -> None:
    results = []
    rows = []
    async with crdtstore.open_store("memory://bench-text") as store:
        for label, chars in (("ASCII", "abcdefghij klmnop"), ("1 in 5 non-ASCII", "abcdéfgh€ij😀")):
            recs = await _text(store, label.replace(" ", "-"), chars, args.inserts)
            t = recs[0].text("t")
            spans = t.authorship()
            rng = random.Random(11)
            at = [rng.randrange(len(t)) for _ in range(args.lookups)]
            for i in at[:20]:  # the two agree
                assert t.provenance(i) == t.authorship(i, i + 1)[0].provenance
            c0 = time.process_time()
            for _ in range(3):
                t.authorship()
            scan = (time.process_time() - c0) / 3
            one = _cpu(t.provenance, at)
            part = _cpu(lambda i, t=t: t.authorship(i, i + 1), at[: max(10, len(at) // 10)])
            figures = [fmt(one * 1e3, "ms"), fmt(part * 1e3, "ms"), fmt(scan * 1e3, "ms")]
            rows.append([label, f"{len(t):,}", f"{len(spans):,}", *figures, fmt(one / scan, "x")])
            met = one * 1e3 < TARGET_MS and one / scan < TARGET_RATIO
            results.append(Result("text_provenance", f"text.provenance(i), {label}", one * 1e3,
                                  "ms", scan * 1e3, one / scan,
                                  f"< {TARGET_MS:g} ms and < 1/20 of the scan", met))  # fmt: skip
            for r in recs:
                await r.aclose()
    print()
    print(f"who wrote character i, memory://, {args.inserts:,} inserts of 10 characters by"
          f" 3 records, {args.lookups:,} lookups at random positions; CPU per lookup")  # fmt: skip
    table(["text", "characters", "spans", "provenance(i)", "authorship(i, i+1)",
           "authorship() (baseline)", "ratio"], rows)  # fmt: skip
    for r in results:
        r.emit()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--inserts", type=int, default=1_000)
    p.add_argument("--lookups", type=int, default=None)
    args = p.parse_args()
    if args.lookups is None:
        args.lookups = 200 if args.quick else 1_000
    header("text_provenance: who wrote character i", args)
    anyio.run(main_async, args)


if __name__ == "__main__":
    main()
