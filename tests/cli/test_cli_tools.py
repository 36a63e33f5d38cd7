"""The shell commands over the agent tools (``crdtstore get|put|append|edit|changes|claim``),
run as real processes: each prints the very JSON of its tool and exits 0, or 3 with the error
JSON for a refusal; usage errors exit 2. Also: ``claim`` holding a claim while a command runs,
the commands through a hub, and ``crdtstore mcp`` without the MCP SDK installed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest

import crdtstore
from crdtstore.tools import Toolset
from tests._wait import until

RUN = "r1"
SECRET = "cli-tools-test-secret-0123456789"


def _crdtstore() -> list[str]:
    script = Path(sys.executable).parent / ("crdtstore.exe" if os.name == "nt" else "crdtstore")
    return [str(script)] if script.exists() else [sys.executable, "-m", "crdtstore.cli"]


def cli(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_crdtstore(), *(str(a) for a in args)],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1", **(env or {})},
        timeout=120,
    )


def tool(db: Path, command: str, *args: str, agent: str = "sh-agent") -> tuple[int, Any]:
    """``crdtstore COMMAND DB --run r1 --agent AGENT ARGS``: its exit status and its JSON
    (standard output holds one JSON object and nothing else)."""
    out = cli(command, db, "--run", RUN, "--agent", agent, *args)
    assert out.returncode in (0, 3), out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 1, out.stdout
    return out.returncode, json.loads(lines[0])


async def in_process(db: Path, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """What the tool returns, called in this process on the same store."""
    async with (
        crdtstore.open_store(f"sqlite:///{db}") as store,
        store.open_record(RUN, "checker") as rec,
        Toolset(rec) as tools,
    ):
        return await tools.call(name, arguments)


def test_each_command_prints_its_tools_json_and_exits_0(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    code, put = tool(db, "put", "findings", "f1", '{"text": "the cache is cold"}')
    assert code == 0
    assert put == {
        "ok": True, "collection": "findings", "key": "f1", "version": 1, "collection_version": 1
    }  # fmt: skip
    code, got = tool(db, "get", "findings", "f1")
    assert code == 0
    assert got == anyio.run(in_process, db, "store_get", {"collection": "findings", "key": "f1"})
    assert got["value"] == {"text": "the cache is cold"}
    assert got["provenance"]["agent"] == "sh-agent" and got["provenance"]["source"] == "model"
    code, page = tool(db, "get", "findings")
    assert code == 0 and [e["key"] for e in page["entries"]] == ["f1"]

    assert tool(db, "append", "log", '"looked at the cache"')[1]["ok"] is True
    code, appended = tool(db, "append", "log", '{"step": 2}', "--source", "tool")
    assert code == 0 and appended["ok"] is True
    code, log = tool(db, "get", "log")
    assert [i["value"] for i in log["items"]] == ["looked at the cache", {"step": 2}]

    assert tool(db, "edit", "notes", "--at", "0", "--insert", "cache: cold\nnext: warm it")[0] == 0
    code, edited = tool(db, "edit", "notes", "--find", "cold", "--replace", "warm")
    assert code == 0 and edited["edits"] == 1
    edits = json.dumps([{"find": "next: warm it", "replace": "done"}, {"at": 0, "insert": "# "}])
    assert tool(db, "edit", "notes", "--edits", edits)[0] == 0
    assert tool(db, "get", "notes")[1]["text"] == "# cache: warm\ndone"

    code, changes = tool(db, "changes", "1")
    assert code == 0
    assert changes == anyio.run(in_process, db, "store_changes", {"since_version": 1})
    assert [c["collection"] for c in changes["changes"]][:2] == ["log", "log"]
    sources = {c["source"] for c in changes["changes"]}
    assert sources == {"model", "tool"}


def test_a_refusal_exits_3_with_the_error_json_so_a_script_can_branch(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    assert tool(db, "put", "plan", "owner", '"alice"', "--expected-version", "0")[0] == 0
    code, stale = tool(db, "put", "plan", "owner", '"bob"', "--expected-version", "0")
    assert code == 3
    assert stale["error"]["code"] == "STALE_VERSION"
    assert stale["error"]["current"] == {"version": 1, "value": "alice"}

    # a shell agent's retry loop: branch on 3, take the current version, write again
    current = 'import json, sys; print(json.load(sys.stdin)["error"]["current"]["version"])'
    script = textwrap.dedent(
        """\
        set -u
        version=0
        for attempt in 1 2 3; do
            out=$("$@" put "$DB" --run r1 --agent bob plan owner '"bob"' \\
                  --expected-version "$version")
            case $? in
                0) echo "written on attempt $attempt"; exit 0 ;;
                3) version=$(printf '%s' "$out" | "$PY" -c "$CURRENT_VERSION") ;;
                *) exit 1 ;;
            esac
        done
        exit 1
        """
    )
    out = subprocess.run(
        ["sh", "-c", script, "sh", *_crdtstore()],
        capture_output=True,
        text=True,
        env={**os.environ, "DB": str(db), "PY": sys.executable, "CURRENT_VERSION": current},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "written on attempt 2"
    assert tool(db, "get", "plan", "owner")[1]["value"] == "bob"

    code, refused = tool(db, "edit", "plan_text", "--find", "absent", "--replace", "x")
    assert code == 3 and refused["error"]["code"] == "EDIT_REFUSED"
    code, wrong_kind = tool(db, "append", "plan", "1")  # a map, not a list
    assert code == 3 and "error" in wrong_kind


USAGE_ERRORS = {
    "bad JSON": ("put", "DB", "--run", RUN, "--agent", "a", "m", "k", "not json"),
    "no --agent on SQLite": ("put", "DB", "--run", RUN, "m", "k", "1"),
    "two edit forms": ("edit", "DB", "--run", RUN, "--agent", "a", "t", "--find", "x", "--at", "0"),
    "--find alone": ("edit", "DB", "--run", RUN, "--agent", "a", "t", "--find", "x"),
    "negative version": ("changes", "DB", "--run", RUN, "--agent", "a", "-1"),
    "--result and a command": (
        "claim", "DB", "--run", RUN, "--agent", "a", "c", "i", "--result", "1", "--", "true"
    ),
}  # fmt: skip


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # it waits on processes
async def test_usage_errors_exit_2_and_write_nothing(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    await in_process(db, "store_put", {"collection": "m", "key": "k", "value": 0})

    async def usage_error(what: str, args: tuple[str, ...]) -> None:
        argv = [*_crdtstore(), *(str(db) if a == "DB" else a for a in args)]
        out = await anyio.run_process(argv, check=False)
        assert (out.returncode, out.stdout) == (2, b""), (what, out.stderr)

    async with anyio.create_task_group() as tg:  # the commands run side by side
        for what, args in USAGE_ERRORS.items():
            tg.start_soon(usage_error, what, args)
    assert (await in_process(db, "store_changes", {"since_version": 1}))["changes"] == []


def test_get_and_changes_refuse_a_missing_store_file(tmp_path: Path) -> None:
    out = cli("get", tmp_path / "typo.db", "--run", RUN, "--agent", "a", "m")
    assert out.returncode == 1 and "no store at" in out.stderr
    assert not (tmp_path / "typo.db").exists()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # it waits on processes
async def test_claim_holds_the_claim_while_its_command_runs(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    started, go = tmp_path / "started", tmp_path / "go"
    # the command says it started, then waits for the test's word (polling a file)
    wait = f"touch {started}; while [ ! -e {go} ]; do sleep 0.02; done; echo working; echo done"
    argv = [*_crdtstore(), "claim", str(db), "--run", RUN, "--agent", "worker", "tasks", "t1"]
    async with await anyio.open_process([*argv, "--ttl", "5", "--", "sh", "-c", wait]) as holder:
        await until(started.exists, "the claimed command to start")
        code, other = await anyio.to_thread.run_sync(
            lambda: tool(db, "claim", "tasks", "t1", "--result", '"mine"', agent="rival")
        )
        assert code == 3 and other["error"]["code"] == "LEASE_HELD"
        assert "worker" in json.dumps(other["error"])
        go.touch()
        streams: dict[str, bytes] = {}

        async def read(name: str, stream: Any) -> None:
            streams[name] = b"".join([chunk async for chunk in stream])

        async with anyio.create_task_group() as tg:
            tg.start_soon(read, "out", holder.stdout)
            tg.start_soon(read, "err", holder.stderr)
        await holder.wait()
    out, err = streams["out"].decode(), streams["err"]
    assert holder.returncode == 0, err
    assert json.loads(out) == {"ok": True, "collection": "tasks", "item": "t1", "state": "done"}
    assert b"working" in err  # the command's output went to standard error
    claims = await in_process(db, "store_get", {"collection": "claims", "key": "tasks/t1"})
    assert claims["value"]["state"] == "done"
    assert claims["value"]["result"] == {"exit": 0, "tail": "working\ndone"}
    assert claims["value"]["claimer"] == "worker"

    # a failing command: the claim is released (someone else may take the item), its status
    # is the command's; without a command the item is claimed and completed at once
    fail = [*argv[:-1], "t2", "--", "sh", "-c", "echo broken >&2; exit 7"]
    failed = await anyio.run_process(fail, check=False)
    assert failed.returncode == 7
    assert json.loads(failed.stdout)["state"] == "released"
    code, taken = await anyio.to_thread.run_sync(
        lambda: tool(db, "claim", "tasks", "t2", "--result", '{"fixed": true}', agent="rival")
    )
    assert code == 0 and taken["state"] == "done"
    done = await in_process(db, "store_get", {"collection": "claims", "key": "tasks/t2"})
    assert done["value"]["result"] == {"fixed": True} and done["value"]["claimer"] == "rival"
    code, again = await anyio.to_thread.run_sync(
        lambda: tool(db, "claim", "tasks", "t1", "--result", "1", agent="rival")
    )
    assert code == 3 and again["error"]["code"] == "LEASE_HELD"  # done: not claimed again
    missing = await anyio.run_process([*argv[:-1], "t3", "--", "no-such-command-xyz"], check=False)
    assert missing.returncode == 127
    assert json.loads(missing.stdout)["state"] == "released"


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # it waits on processes
async def test_through_a_hub_the_commands_write_as_the_tokens_agent(tmp_path: Path) -> None:
    db = tmp_path / "hub.db"
    env = {**os.environ, "CRDTSTORE_SECRET": SECRET}
    argv = [*_crdtstore(), "serve", "--store", f"sqlite:///{db}", "--port", "0"]
    async with await anyio.open_process(argv, stderr=subprocess.PIPE, env=env) as hub:
        try:
            seen = b""
            assert hub.stderr is not None
            with anyio.fail_after(60):
                while (m := re.search(rb"listening on ws://127\.0\.0\.1:(\d+)", seen)) is None:
                    seen += await hub.stderr.receive()
            url = f"ws://127.0.0.1:{m.group(1).decode()}/t1"

            def commands() -> list[subprocess.CompletedProcess[str]]:
                minted = []
                for mode in ("--rw", "--ro"):
                    out = cli(
                        "token", "--tenant", "t1", "--run", RUN, "--agent", "dana", mode, env=env
                    )
                    minted.append(out.stdout.strip().splitlines()[-1])
                rw, ro = minted
                base = ("--run", RUN, "--token")
                return [
                    cli("put", url, *base, rw, "findings", "k", '"by dana"'),  # no --agent
                    cli("get", url, *base, rw, "findings", "k", "--agent", "ignored"),
                    cli("put", url, *base, ro, "findings", "k", '"read-only"'),
                ]

            put, got, refused = await anyio.to_thread.run_sync(commands)
        finally:
            hub.terminate()
            await hub.wait()
    assert put.returncode == 0, put.stderr
    assert got.returncode == 0, got.stderr
    entry = json.loads(got.stdout)
    assert entry["value"] == "by dana" and entry["provenance"]["agent"] == "dana"
    assert refused.returncode == 3, refused.stderr
    assert json.loads(refused.stdout)["error"]["code"] == "READ_ONLY"
    async with crdtstore.open_store(f"sqlite:///{db}", tenant="t1") as store:
        assert {e.agent for e in await store.journal(RUN)} == {"dana"}


def test_mcp_without_the_sdk_says_how_to_install_it(tmp_path: Path) -> None:
    # the SDK made unimportable in the child process, as if it were not installed
    code = (
        "import sys; sys.modules['mcp'] = None; from crdtstore.cli import main; "
        f"sys.argv = ['crdtstore', 'mcp', '--store', {str(tmp_path / 's.db')!r}, "
        "'--run', 'r', '--agent', 'a']; main()"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "pip install 'crdtstore[mcp]'" in out.stderr
    assert out.stdout == ""
    assert not (tmp_path / "s.db").exists()


def test_a_script_step_environment_names_the_run_agent_and_call(tmp_path: Path) -> None:
    """What a kernel's ``script`` step is given ($CRDTSTORE_RUN, _AGENT, _CALL) is enough:
    no --run or --agent, and every write carries the step's call id."""
    db = tmp_path / "s.db"
    env = {
        "CRDTSTORE_RUN": RUN,
        "CRDTSTORE_AGENT": "step-agent",
        "CRDTSTORE_SOURCE": "tool",
        "CRDTSTORE_CALL": "r1:lint#2",
    }
    out = cli("put", db, "notes", "k", '{"ok": true}', env=env)
    assert out.returncode == 0, out.stderr
    out = cli("append", db, "log", '"linted"', env=env)
    assert out.returncode == 0, out.stderr
    hist = anyio.run(in_process, db, "store_history", {"collection": "notes", "key": "k"})
    (entry,) = hist["entries"]
    assert (entry["agent"], entry["source"], entry["call"]) == ("step-agent", "tool", "r1:lint#2")

    async def calls() -> list[str]:
        async with crdtstore.open_store(f"sqlite:///{db}") as store:
            async with store.open_record(RUN, "checker") as rec:
                return [e.call for e in await rec.journal()]

    assert anyio.run(calls) == ["r1:lint#2", "r1:lint#2"]
    # an explicit option still wins over the environment
    out = cli("get", db, "notes", "k", "--run", "other", env=env)
    assert out.returncode == 0 and json.loads(out.stdout)["exists"] is False
