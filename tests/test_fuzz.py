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
