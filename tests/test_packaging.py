"""The wheel holds every file of the source packages (agentrl.doctor was once left out): built here
without build isolation (no index needed), then checked by the same script CI uses. The full
install-and-run check from outside the repository is scripts/ci_wheel.sh, run by .ci/run."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_ships_every_subpackage_and_data_file(tmp_path):
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 69:
        pytest.skip(f"setuptools {setuptools.__version__} < 69 (pyproject's build requirement)")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = tmp_path.glob("agentrl-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in ("agentrl/doctor/__init__.py", "agentrl/environments/calculator.py", "agentrl/tools/calculator.py",
                     "agentrl/bundled/default_model/model.safetensors", "agentrl/chat/templates/chatml_tools.jinja"):
        assert required in names, required
    assert not any(n.startswith(("environments/", "tools/", "tests/")) for n in names)  # no stray top-level packages
    check = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_wheel.py"), str(wheel), str(ROOT)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
