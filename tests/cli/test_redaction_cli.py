"""``crdtstore journal`` and ``crdtstore history`` (real subprocesses) after a redaction that
keeps the audit trail: every entry still listed with its agent, the value replaced by the
redaction marker (who redacted, why), the value's bytes in none of the output."""

from __future__ import annotations

from pathlib import Path

from crdtstore import blocking
from tests.cli.test_cli import cli, cli_json

SECRET = "CLI-SECRET-5150"


def test_journal_and_history_show_redacted_writes_and_their_agents(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    with blocking.open_store(f"sqlite:///{db}") as store:
        for agent in ("alice", "bob"):
            with store.open_record(run="r", agent=agent, source="tool") as rec:
                rec.map("m").set("k", f"{SECRET}-{agent}")
                rec.text("t").edit(f"note {SECRET} end")
                rec.flush()
        store.redact("r", "m", "k", agent="dpo", reason="erasure")
        store.redact("r", "t", span=(5, 5 + len(SECRET)), agent="dpo", reason="erasure")
    data = cli_json("journal", db, "--run", "r")
    entries = data["entries"]
    # alice's set and text edit, bob's set (his edit changed nothing), then per redaction
    # the delete and the redact entry
    assert [e["agent"] for e in entries] == ["alice", "alice", "bob", *["dpo"] * 4]
    assert SECRET not in str(entries)
    sets = [op for e in entries for op in e["effect"] if op[:3] == ["map", "m", "set"]]
    assert [op[4]["$redacted"]["agent"] for op in sets] == ["dpo", "dpo"]
    summaries = [e["summary"] for e in entries]
    assert "<redacted by dpo: erasure>" in summaries[0] and "<redacted" in summaries[1]
    assert "redact m['k'] (erasure)" in summaries[4]
    table = cli("journal", db, "--run", "r")
    assert table.returncode == 0, table.stderr
    assert SECRET not in table.stdout and "alice" in table.stdout and "bob" in table.stdout
    history = cli_json("history", db, "--run", "r", "--collection", "m", "--key", "k")
    rows = history["entries"]
    assert [(r["agent"] if "agent" in r else r["provenance"]["agent"]) for r in rows] == [
        "alice",
        "bob",
        "dpo",
        "dpo",
    ]
    assert [r["redacted"] for r in rows] == [True, True, False, True]
    assert SECRET not in str(history)
