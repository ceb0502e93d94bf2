"""The example third-party package installs with pip and ``agentrl.make`` finds it by entry point."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "examples" / "agentrl-example-env"


def test_pip_install_registers_the_entry_point(tmp_path: Path) -> None:
    """pip installs the example (offline, into a fresh folder); a new interpreter that sees it finds it by name."""
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target), str(PACKAGE)],
        check=True, capture_output=True,
    )  # fmt: skip
    assert list(target.glob("agentrl_example_env-0.1.0.dist-info/entry_points.txt"))
    code = (
        "import agentrl\n"
        "assert 'unit_convert' in agentrl.registered(), agentrl.registered()\n"
        "env = agentrl.make('unit_convert')\n"
        "agentrl.check_env(env)\n"
        "print(type(env).__module__, len(env.dataset('test')))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env).stdout
    assert out.split() == ["agentrl_example_env", "20"]
    # Without the install the name is unknown: the entry point is what registered it.
    missing = subprocess.run([sys.executable, "-c", "import agentrl; print('unit_convert' in agentrl.registered())"], capture_output=True, text=True)
    assert missing.stdout.strip() == "False"
