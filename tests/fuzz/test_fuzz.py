"""The fuzz targets (tests/fuzz/, atheris) run for a short budget each with no crash, from
their committed seed corpus; and that corpus holds every seed ``tests/fuzz/seeds.py`` makes.

CI's budget is ``CRDTSTORE_FUZZ_BUDGET`` seconds a target (default 10: two cores); long
runs: ``python -m tests.fuzz run --budget 600`` (see tests/fuzz/__main__.py).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from tests.fuzz import seeds
from tests.fuzz.__main__ import TARGETS, run_target
from tests.fuzz._harness import CORPUS_DIR

BUDGET = float(os.environ.get("CRDTSTORE_FUZZ_BUDGET", "10"))


def test_every_target_has_seeds() -> None:
    assert sorted(seeds.TARGETS) == TARGETS


@pytest.mark.parametrize("target", TARGETS)
def test_the_corpus_holds_the_seeds(target: str) -> None:
    folder = CORPUS_DIR / target
    missing = [data for data in seeds.TARGETS[target]() if not (folder / _name(data)).is_file()]
    assert not missing, f"run `python -m tests.fuzz seed`: {len(missing)} seeds missing"
    assert 5 <= len(list(folder.iterdir())) <= 400, "a few dozen small files per target"


def _name(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()[:16]


@pytest.mark.timeout(BUDGET * 6 + 60)
@pytest.mark.parametrize("target", TARGETS)
def test_target_runs_its_budget_without_a_crash(target: str, tmp_path: Path) -> None:
    result = run_target(target, BUDGET, tmp_path)
    assert result.ok, f"{target}: crashes {result.crashes}\n{result.output[-3000:]}"
    assert result.runs > 0 and result.cov > 0, result.output[-3000:]


_OVER_LONG_CHECK = """        if c < 0x80:  # two bytes
            if c == 0:
                raise CodecError("over-long varUint")
"""


def test_a_planted_bug_is_found_within_the_budget(tmp_path: Path) -> None:
    """The harness reaches the code: in a scratch copy of the library whose varUint reader
    accepts an over-long two-byte varUint (the check planted out), fuzz_v1_update finds an
    input breaking its round-trip property within the budget (a few seconds from the
    corpus; libFuzzer's seed fixed)."""
    import shutil
    import subprocess
    import sys

    from tests.fuzz._harness import ROOT

    skip = shutil.ignore_patterns("__pycache__", "node_modules", "*.db*")
    for part in ("crdtstore", "sync"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=skip)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "__init__.py").write_text("")
    shutil.copytree(ROOT / "tests" / "fuzz", tmp_path / "tests" / "fuzz", ignore=skip)
    lib0 = tmp_path / "crdtstore" / "codec" / "_lib0.py"
    source = lib0.read_text()
    assert _OVER_LONG_CHECK in source, "the planted check moved: update this test"
    lib0.write_text(source.replace(_OVER_LONG_CHECK, "        if c < 0x80:  # two bytes\n"))
    scratch = tmp_path / "found"
    scratch.mkdir()
    proc = subprocess.run(
        [
            sys.executable,
            str(tmp_path / "tests" / "fuzz" / "fuzz_v1_update.py"),
            str(scratch),
            str(tmp_path / "tests" / "fuzz" / "corpus" / "v1_update"),
            "-seed=1",
            f"-max_total_time={int(max(BUDGET, 10) * 3)}",
            f"-artifact_prefix={tmp_path}/",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=BUDGET * 6 + 60,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Test unit written" in out, out[-3000:]
    assert "AssertionError" in out, out[-3000:]
