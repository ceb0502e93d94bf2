"""README's code must run as written, and its two commands must be the ones CI uses."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)


def test_python_examples_run(tmp_path, monkeypatch):
    """In a fresh folder, as a new user runs them (a run folder such as runs/readme belongs to one run)."""
    monkeypatch.chdir(tmp_path)
    for code in blocks("python"):
        exec(compile(code, "README.md", "exec"), {"__name__": "readme"})


def test_ci_runs_the_readme_test_command():
    test_command = next(b.strip() for b in blocks("bash") if b.strip().endswith("pytest"))
    assert test_command in (ROOT / ".ci" / "run").read_text()
    assert "pip install torch==2.13.0" in blocks("bash")[0]


def test_transformers_is_bounded_to_the_tested_range():
    """Issue 17: pyproject allowed any transformers>=5.0 while a used API is removed in 5.40. The
    requirement must have an upper bound, and the suite must run on a version inside it."""
    from importlib.metadata import version

    import pytest
    from packaging.requirements import Requirement  # a dependency of transformers

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (req,) = [Requirement(d) for d in deps if Requirement(d).name == "transformers"]
    assert any(s.operator in ("<", "<=", "~=", "==") for s in req.specifier), req
    assert req.specifier.contains(version("transformers")), (str(req), version("transformers"))
