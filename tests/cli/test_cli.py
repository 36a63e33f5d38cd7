"""The ``crdtstore`` command, run as a real subprocess: the multi-process demo, and journal,
inspect, history and compact against the store the demo wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import crdtstore
from crdtstore import _demo, blocking

AGENTS = [f"agent-{i}" for i in (1, 2, 3)]
WRITES = 10
RUN = "cli-test"


def _command() -> list[str]:
    script = Path(sys.executable).parent / ("crdtstore.exe" if os.name == "nt" else "crdtstore")
    return [str(script)] if script.exists() else [sys.executable, "-m", "crdtstore.cli"]


def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run(
        [*_command(), *(str(a) for a in args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )


def cli_json(*args: str | Path) -> Any:
    out = cli(*args, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def read_acks(db: Path) -> list[dict[str, Any]]:
    """The acknowledgements the demo saved beside the store."""
    lines = (db.parent / f"{RUN}.acks.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The demo's store file and the demo's output (the demo runs once for this module)."""
    db = tmp_path_factory.mktemp("demo") / "store.db"
    out = cli("demo", "--agents", "3", "--writes", str(WRITES), "--store", db, "--run", RUN)
    return db, out


def test_help_lists_the_commands() -> None:
    out = cli("--help")
    assert out.returncode == 0, out.stderr
    for command in ("demo", "journal", "inspect", "history", "compact"):
        assert command in out.stdout


def test_demo_acknowledged_writes_are_all_there(
    demo: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    db, out = demo
    assert out.returncode == 0, out.stdout + out.stderr
    # each agent: 3 findings, 3 updates of its 2 own keys, 2 shared writes, 2 note lines
    acked = len(AGENTS) * (3 + 3 * 2 + 2 + 2)
    assert f"VERIFIED: all {acked} acknowledged writes are present" in out.stdout
    assert "converged: 3 agent processes hold the same record" in out.stdout
    assert "replaying the journal from scratch rebuilds the same record" in out.stdout
    acks = read_acks(db)
    assert len(acks) == acked
    assert {a["agent"] for a in acks} == set(AGENTS)


def test_demo_batched_flushes_before_acknowledging(tmp_path: Path) -> None:
    out = cli("demo", "-n", "2", "-w", "6", "--durability", "batched", "--store", tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "batched" in out.stdout
    # each agent: 2 findings, 2 updates of its 2 own keys, 1 shared write, 1 note line
    assert "VERIFIED: all 16 acknowledged writes are present" in out.stdout
    assert (tmp_path / "store.db").is_file()


def test_demo_refuses_an_existing_run(demo: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    db, _ = demo
    out = cli("demo", "--agents", "1", "--writes", "1", "--store", db, "--run", RUN)
    assert out.returncode == 2
    assert "already exists" in out.stderr


def test_journal_lists_every_agents_entries(
    demo: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    db, _ = demo
    url = f"sqlite:///{db}"
    data = cli_json("journal", url, "--run", RUN)
    entries = data["entries"]
    assert data["run"] == RUN and data["head"] == len(entries) == len(AGENTS) * WRITES
    assert [e["seq"] for e in entries] == list(range(1, len(entries) + 1))
    assert {e["agent"] for e in entries} == set(AGENTS)
    for agent in AGENTS:
        mine = [e for e in entries if e["agent"] == agent]
        assert len(mine) == WRITES
        assert {op[0] for e in mine for op in e["effect"]} == {"list", "map", "text"}
    assert all(e["source"] == "model" and e["size"] > 0 and e["summary"] for e in entries)

    page = cli_json("journal", db, "--run", RUN, "--after", "10", "--limit", "5")
    assert [e["seq"] for e in page["entries"]] == [11, 12, 13, 14, 15]

    table = cli("journal", db, "--run", RUN, "--limit", "3")
    assert table.returncode == 0, table.stderr
    assert f"Journal of run '{RUN}'" in table.stdout and "more: --after 3" in table.stdout
    runs = cli_json("journal", db)
    assert [r["run"] for r in runs] == [RUN]


def test_inspect_shows_the_record_with_provenance(
    demo: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    db, _ = demo
    data = cli_json("inspect", db, "--run", RUN)
    assert data["run"] == RUN and data["agents"] == AGENTS
    cols = data["collections"]
    assert {name: c["kind"] for name, c in cols.items()} == {
        "findings": "list",
        "notes": "text",
        "shared": "map",
        "status": "map",
    }
    assert sorted(f["agent"] for f in cols["findings"]["items"]) == sorted(AGENTS * 3)
    status = cols["status"]["entries"]
    assert sorted(status) == sorted(f"{a}:{k}" for a in AGENTS for k in ("last", "progress"))
    for key, entry in status.items():
        assert entry["provenance"]["agent"] == key.split(":")[0]
        assert entry["provenance"]["seq"] >= 1
    for key, entry in cols["shared"]["entries"].items():
        assert key in _demo.SHARED_KEYS
        assert entry["provenance"]["agent"] == entry["value"]["agent"]
    lines = cols["notes"]["text"].splitlines()
    for agent in AGENTS:
        assert sum(1 for line in lines if line.startswith(f"- [{agent}] ")) == 2

    tree = cli("inspect", db, "--run", RUN)
    assert tree.returncode == 0, tree.stderr
    assert "status" in tree.stdout and "agent-2 (model)" in tree.stdout


def test_history_of_a_contested_key_lists_every_agent(
    demo: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    db, _ = demo
    key = _demo.SHARED_KEYS[0]  # each agent's first shared write
    data = cli_json("history", db, "--run", RUN, "--collection", _demo.SHARED, "--key", key)
    assert (data["run"], data["collection"], data["key"]) == (RUN, _demo.SHARED, key)
    entries = data["entries"]
    assert sorted(e["agent"] for e in entries) == AGENTS
    seqs = [e["seq"] for e in entries]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    for e in entries:
        assert e["value"]["agent"] == e["agent"] and e["source"] == "model" and e["run"] == RUN
        assert not e["deleted"] and not e["redacted"] and e["wall_time"] > 0
    current = cli_json("inspect", db, "--run", RUN)["collections"][_demo.SHARED]["entries"][key]
    # the current value is one of the journaled writes, and its provenance names that write
    # (not necessarily the last one: concurrent writes are won by the higher client id)
    by_seq = {e["seq"]: e for e in entries}
    winner = by_seq[current["provenance"]["seq"]]
    assert current["value"] == winner["value"]
    assert current["provenance"]["agent"] == winner["agent"]

    table = cli("history", f"sqlite:///{db}", "-r", RUN, "-c", _demo.SHARED, "-k", key)
    assert table.returncode == 0, table.stderr
    assert f"History of {_demo.SHARED}['{key}'] in run '{RUN}' (3 writes by 3 agents)" in (
        table.stdout
    )
    for agent in AGENTS:
        assert agent in table.stdout


def test_history_shows_deletes_and_redactions_and_fits_the_terminal(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    with blocking.open_store(f"sqlite:///{db}") as store:
        for agent, value in (("alice", "x" * 500), ("bob", {"short": True})):
            with store.open_record(run="r", agent=agent, source="tool") as rec:
                rec.map("m").set("k", value)
                rec.flush()
        with store.open_record(run="r", agent="carol", source="user") as rec:
            rec.map("m").delete("k")
            rec.flush()
        table = cli("history", db, "--run", "r", "--collection", "m", "--key", "k")
        assert table.returncode == 0, table.stderr
        lines = table.stdout.splitlines()
        assert all(len(line) <= 200 for line in lines)  # COLUMNS=200: the long value is cut
        assert "…" in table.stdout and "x" * 500 not in table.stdout
        assert [w for w in ("alice", "bob", "carol") if w in table.stdout] == [
            "alice",
            "bob",
            "carol",
        ]
        assert "deleted" in next(line for line in lines if "carol" in line)
        narrow = subprocess.run(
            [*_command(), "history", str(db), "--run", "r", "--collection", "m", "--key", "k"],
            capture_output=True,
            text=True,
            env={**os.environ, "COLUMNS": "80", "NO_COLOR": "1"},
            timeout=180,
        )
        assert narrow.returncode == 0, narrow.stderr
        assert all(len(line) <= 80 for line in narrow.stdout.splitlines())
        assert "alice" in narrow.stdout and "carol" in narrow.stdout

        store.redact("r", "m", "k", agent="admin", reason="secret")
    entries = cli_json("history", db, "--run", "r", "--collection", "m", "--key", "k")["entries"]
    assert entries[-1]["redacted"] and entries[-1]["value"] is None
    assert "redacted" in cli("history", db, "--run", "r", "-c", "m", "-k", "k").stdout
    empty = cli_json("history", db, "--run", "r", "--collection", "m", "--key", "other")
    assert empty["entries"] == []
    none = cli("history", db, "--run", "r", "--collection", "m", "--key", "other")
    assert none.returncode == 0 and "no journaled writes to m['other'] in run 'r'" in none.stdout


def test_compact_keeps_the_record_and_the_journal(
    demo: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    db, _ = demo
    before = cli_json("inspect", db, "--run", RUN)
    out = cli("compact", db, "--run", RUN)
    assert out.returncode == 0, out.stderr
    assert f"compacted run '{RUN}': snapshot at position {len(AGENTS) * WRITES}" in out.stdout
    after = cli_json("inspect", db, "--run", RUN)
    assert after["snapshot_seq"] == len(AGENTS) * WRITES
    assert after["collections"] == before["collections"]
    assert len(cli_json("journal", db, "--run", RUN)["entries"]) == len(AGENTS) * WRITES


def test_compact_drop_journal(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    with (
        blocking.open_store(f"sqlite:///{db}") as store,
        store.open_record(run="r", agent="a", source="tool") as rec,
    ):
        for i in range(5):
            rec.map("m").set(f"k{i}", i)
        rec.flush()
    result = cli_json("compact", db, "--run", "r", "--drop-journal")
    assert (result["seq"], result["entries"], result["journal_dropped"]) == (5, 5, True)
    assert cli_json("journal", db, "--run", "r")["entries"] == []
    assert "compacted away" in cli("journal", db, "--run", "r").stdout
    entries = cli_json("inspect", db, "--run", "r")["collections"]["m"]["entries"]
    assert {k: e["value"] for k, e in entries.items()} == {f"k{i}": i for i in range(5)}
    assert entries["k4"]["provenance"]["agent"] == "a"


def test_errors_are_messages_not_tracebacks(
    demo: tuple[Path, subprocess.CompletedProcess[str]],
    tmp_path: Path,
) -> None:
    db, _ = demo
    out = cli("inspect", db, "--run", "nope")
    assert out.returncode == 1
    assert "unknown run 'nope'" in out.stderr and "Traceback" not in out.stderr
    out = cli("history", db, "--run", "nope", "--collection", "shared", "--key", "hypothesis")
    assert out.returncode == 1 and out.stdout == ""
    assert len(out.stderr.splitlines()) == 1  # one line, no traceback
    assert out.stderr.startswith("error: unknown run 'nope'")
    missing = tmp_path / "missing.db"
    out = cli("journal", missing, "--run", RUN)
    assert out.returncode == 1 and "no store at" in out.stderr
    assert not missing.exists()


@pytest.mark.anyio
async def test_verify_reports_a_lost_write(
    demo: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    """The demo's check is not vacuous: writes that were acknowledged but are not in the
    record are reported."""
    db, _ = demo
    acks = read_acks(db)
    fake: list[dict[str, Any]] = [
        {"agent": "agent-1", "kind": "finding", "n": 99, "text": "never written"},
        {"agent": "agent-2", "kind": "shared", "key": "hypothesis", "value": {"n": -1}},
        {"agent": "agent-3", "kind": "note", "line": "- [agent-3] never written"},
        {"agent": "agent-3", "kind": "own", "key": "agent-3:progress", "value": "11/10"},
    ]
    async with (
        crdtstore.open_store(f"sqlite:///{db}") as store,
        store.open_record(RUN, "checker", "system", create=False) as rec,
    ):
        good = await _demo.verify(store, rec, acks)
        assert good.ok and good.total == len(acks) and good.lost == []
        bad = await _demo.verify(store, rec, acks + fake)
    assert not bad.ok and len(bad.lost) == len(fake)
    assert "finding #99" in bad.lost[0] and "hypothesis" in bad.lost[1]
