#!/usr/bin/env python3
"""Set up the project in .venv and run it. Needs only python3.

    python3 dev.py demo [ARGS...]   set up, then run `crdtstore demo` (agent processes sharing a record)
    python3 dev.py test [ARGS...]   set up, then lint and check formatting (ruff), type-check
                                    (mypy) and run pytest; without test paths, the whole
                                    suite runs twice at once: as users run it and with
                                    pycrdt's internals off (installs tests/interop's and
                                    viewer's npm packages first if missing)
    python3 dev.py setup            only set up .venv
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / "python"


def run(*cmd: str | Path) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], cwd=ROOT, check=True)


def setup(extras: str) -> None:
    stamp = VENV / f".installed-{extras}"
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text() == digest and PY.exists():
        return
    if not PY.exists():
        print(f"+ creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True, clear=False).create(VENV)
    run(PY, "-m", "pip", "install", "-q", "--upgrade", "pip")
    run(PY, "-m", "pip", "install", "-q", "-e", f".[{extras}]")
    stamp.write_text(digest)


def interop_packages() -> None:
    """Install the npm packages of the JavaScript interop tests (tests/interop) and of the
    viewer's bundle build (viewer/) if missing.

    Without npm nothing is installed: those tests then fail, saying what to run.
    """
    npm = shutil.which("npm")
    for folder in (ROOT / "tests" / "interop", ROOT / "viewer"):
        if npm is None or (folder / "node_modules").is_dir():
            continue
        run(npm, "ci", "--prefix", folder, "--no-audit", "--no-fund", "--loglevel=error")


# The whole suite a second time, with pycrdt's internals turned off (crdtstore/record/_pycrdt.py),
# so the public-API path every shortcut falls back to stays correct. It runs beside the first
# run (the suite waits on processes and sockets much of the time, so the two share 2 cores well);
# its output goes to a log that is printed when it ends.
def tests_twice(args: list[str]) -> int:
    env = {**os.environ, "CRDTSTORE_PYCRDT_INTERNALS": "0"}
    fallback = [str(PY), "-m", "pytest", "-p", "no:cacheprovider", *args]
    with tempfile.TemporaryFile("w+") as log:
        print("+ CRDTSTORE_PYCRDT_INTERNALS=0", " ".join(fallback), "(beside the next run)", flush=True)
        second = subprocess.Popen(fallback, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            print("+", str(PY), "-m pytest", " ".join(args), flush=True)
            first = subprocess.run([str(PY), "-m", "pytest", *args], cwd=ROOT).returncode
            second_rc = second.wait()
        finally:
            if second.poll() is None:
                second.kill()
        log.seek(0)
        print("+ the run with pycrdt's internals off (CRDTSTORE_PYCRDT_INTERNALS=0):", flush=True)
        sys.stdout.write(log.read())
    return first or second_rc


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("demo", "test", "setup"):
        print(__doc__)
        return 2
    cmd, rest = argv[0], argv[1:]
    try:
        if cmd == "setup":
            setup("dev")
        elif cmd == "demo":
            setup("dev")
            run(BIN / "crdtstore", "demo", *rest)
        else:
            setup("dev")
            interop_packages()
            run(PY, "-m", "ruff", "check", "crdtstore", "sync", "tests", "bench")
            run(PY, "-m", "ruff", "format", "--check", "crdtstore", "sync", "tests", "bench")
            run(PY, "-m", "mypy")
            if all(arg.startswith("-") for arg in rest):  # (the whole suite was asked for)
                return tests_twice(rest)
            run(PY, "-m", "pytest", *rest)
    except subprocess.CalledProcessError as exc:
        return exc.returncode or 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
