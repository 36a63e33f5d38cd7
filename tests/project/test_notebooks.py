"""Every notebook under notebooks/ executes without a failing cell (nbclient, the venv's
interpreter as the kernel, a timeout per cell); each stays well under a minute."""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
PATHS = sorted(NOTEBOOKS.glob("*.ipynb"))
CELL_TIMEOUT = 60
BUDGET = 60.0  # seconds per notebook

# jupyter_client leaves zmq sockets to the garbage collector; collected inside the test
pytestmark = [
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


def kernel_manager(root: Path) -> KernelManager:
    """A kernel running this interpreter (the venv's, with crdtstore installed), whatever
    kernelspecs the machine has."""
    spec = root / "kernels" / "crdtstore-venv"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "Python 3", "language": "python"})
    )
    ksm = KernelSpecManager(kernel_dirs=[str(root / "kernels")])
    return KernelManager(kernel_name="crdtstore-venv", kernel_spec_manager=ksm)


def test_there_are_notebooks() -> None:
    names = [p.stem for p in PATHS]
    assert {"01_merge_basics", "02_conflict_policies", "03_partitions_and_resume"} <= set(names)


@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_notebook_executes(path: Path, tmp_path: Path) -> None:
    committed = nbformat.read(path, as_version=4)
    # committed with outputs, so that they read well on a code host
    code = [c for c in committed.cells if c.cell_type == "code"]
    assert code and all(c.get("execution_count") for c in code), "commit executed notebooks"
    assert not any(o.get("output_type") == "error" for c in code for o in c.get("outputs", []))
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        km=kernel_manager(tmp_path),
        timeout=CELL_TIMEOUT,
        resources={"metadata": {"path": str(NOTEBOOKS)}},
    )
    start = time.perf_counter()
    try:
        client.execute()  # raises CellExecutionError on the first failing cell
    finally:
        del client
        gc.collect()
    elapsed = time.perf_counter() - start
    assert elapsed < BUDGET, f"{path.name} took {elapsed:.1f}s"
