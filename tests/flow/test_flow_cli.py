"""``crdtstore flow run`` and ``crdtstore flow status`` as commands: exit statuses, JSON,
the tree, ``--allow-changed``, ``--watch``, and SIGTERM stopping a kernel cleanly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

import crdtstore
from crdtstore.flow import flow_status
from tests._wait import until

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "crdtstore.cli", "flow"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def flow(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=ROOT, env=ENV,
                          timeout=120)  # fmt: skip


def popen(args: list[str], **options: Any) -> subprocess.Popen[Any]:
    return subprocess.Popen([*CLI, *args], cwd=ROOT, env=ENV, **options)


SPEC = """
name: checks
steps:
  - id: edit
    executor: {kind: python, call: "tests._flow_steps:work"}
    inputs: {log: LOG}
    owned_files: ["src/auth.rs"]
  - id: verify
    executor:
      kind: parallel
      join: all
      max_concurrency: 2
      branches:
        - {id: lint, kind: script, run: "echo lint ok"}
        - {id: unit, kind: script, run: "echo unit $CRDTSTORE_STEP"}
"""


def spec_file(tmp: Path, text: str = SPEC) -> Path:
    p = tmp / "flow.yaml"
    p.write_text(text.replace("LOG", str(tmp / "steps.log")))
    return p


def test_run_then_status(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    spec = spec_file(tmp_path)
    out = flow("run", str(spec), "--store", url, "--run", "r1", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["state"] == "done"
    assert data["result"]["verify"]["results"]["unit"]["stdout"] == "unit verify/unit"
    table = flow("status", "--store", url, "--run", "r1")
    assert table.returncode == 0, table.stderr
    for word in ("checks", "edit", "verify", "lint", "unit", "done", "all", "attempt 1"):
        assert word in table.stdout, table.stdout
    js = json.loads(flow("status", "--store", url, "--run", "r1", "--json").stdout)
    assert js["run"]["state"] == "done" and js["run"]["name"] == "checks"
    assert [s["entry"]["path"] for s in js["steps"]] == ["edit", "verify", "verify/lint",
                                                         "verify/unit"]  # fmt: skip
    assert [s["depth"] for s in js["steps"]] == [0, 0, 1, 1]
    # again: nothing runs, the recorded result is printed
    again = flow("run", str(spec), "--store", url, "--run", "r1", "--json")
    assert json.loads(again.stdout) == data
    assert (tmp_path / "steps.log").read_text().count("start") == 1


def test_exit_statuses(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    bad = spec_file(tmp_path, "name: w\nsteps:\n  - {id: s, kind: nope}\n")
    out = flow("run", str(bad), "--store", url, "--run", "r1")
    assert out.returncode == 2 and "steps[0].executor" in out.stderr
    failing = spec_file(tmp_path, "name: w\nsteps:\n  - {id: s, kind: script, run: 'exit 4'}\n")
    out = flow("run", str(failing), "--store", url, "--run", "r1", "--json")
    assert out.returncode == 1 and "exit status 4" in out.stderr
    assert json.loads(out.stdout)["error"]["code"] == "STEP_FAILED"
    table = flow("status", "--store", url, "--run", "r1").stdout
    assert "failed" in table and "EXIT_STATUS" in table
    fixed = spec_file(tmp_path, "name: w\nsteps:\n  - {id: s, kind: script, run: 'exit 0'}\n")
    out = flow("run", str(fixed), "--store", url, "--run", "r1")
    assert out.returncode == 2 and "SPEC" not in out.stderr and "--allow-changed" in out.stderr
    out = flow("run", str(fixed), "--store", url, "--run", "r1", "--allow-changed")
    assert out.returncode == 0, out.stderr
    missing = flow("status", "--store", url, "--run", "nope")
    assert missing.returncode == 1 and "unknown run" in missing.stderr


async def test_watch_follows_a_run_to_its_end_and_sigterm_cancels(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    gate = tmp_path / "gate"
    spec = spec_file(tmp_path, f"""
name: w
steps:
  - id: slow
    executor: {{kind: python, call: "tests._flow_steps:work"}}
    inputs: {{log: {tmp_path / "steps.log"}, gate: {gate}}}
    owned_files: [src/a.py]
""")  # fmt: skip
    with (tmp_path / "kernel.stderr").open("w") as err:
        kernel = popen(["run", str(spec), "--store", url, "--run", "r1"], stderr=err)
    try:
        async with crdtstore.open_store(url) as store:

            async def running() -> bool:
                try:
                    s = (await flow_status(store, "r1")).step("slow")
                except crdtstore.UnknownRun:
                    return False
                return s is not None and s.entry.state == "running"

            await until(running, "the step to run", 60)
            watch = popen(["status", "--store", url, "--run", "r1", "--watch"],
                          stdout=subprocess.PIPE, text=True)  # fmt: skip
            kernel.send_signal(signal.SIGTERM)
            assert await anyio.to_thread.run_sync(kernel.wait, 60) == 130
            shown, _ = watch.communicate(timeout=60)
            assert watch.returncode == 0  # --watch ends with the run
            assert "cancelled" in shown
            st = await flow_status(store, "r1")
            assert st.run is not None and st.run.state == "cancelled"
            assert st.step("slow").entry.state == "cancelled"  # type: ignore[union-attr]
            status = await store.leases.status()
            assert not status.holders and not status.waiters  # released on the way out
    finally:
        for p in (kernel,):
            if p.poll() is None:
                p.kill()
            p.wait(30)
