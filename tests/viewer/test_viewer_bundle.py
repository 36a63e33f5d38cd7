"""The viewer's JavaScript bundle (sync/viewer_static/viewer.js) is what its build command
makes from viewer/ (pinned by viewer/package-lock.json): rebuilt here, byte for byte."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VIEWER = ROOT / "viewer"
BUNDLE = ROOT / "sync" / "viewer_static" / "viewer.js"


def test_the_committed_bundle_is_what_the_build_makes(tmp_path: Path) -> None:
    node = shutil.which("node")
    assert node is not None, "node is needed to rebuild the viewer bundle (apt-get install nodejs)"
    assert (VIEWER / "node_modules" / "esbuild").is_dir(), (
        "the viewer's npm packages are missing: run `npm ci --prefix viewer`"
    )
    out = tmp_path / "viewer.js"
    subprocess.run([node, str(VIEWER / "build.mjs"), str(out)], check=True, timeout=120)
    assert out.read_bytes() == BUNDLE.read_bytes(), (
        "sync/viewer_static/viewer.js is not what viewer/src builds: "
        "run `npm run build --prefix viewer` and commit the result"
    )


def test_the_lock_file_pins_every_package() -> None:
    lock = (VIEWER / "package-lock.json").read_text()
    for name in ("esbuild", "yjs", "y-websocket", "y-protocols", "lib0"):
        assert f'"node_modules/{name}"' in lock, name
