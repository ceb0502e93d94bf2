"""Fail when a built wheel lacks a file of the source packages (a forgotten subpackage or data file).

usage: python scripts/check_wheel.py dist/agentrl-*.whl [repo root]
Source folders map to wheel paths as setup.py installs them: agentrl/ -> agentrl/,
environments/ -> agentrl/environments/, tools/ -> agentrl/tools/.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

MAPPING = {"agentrl": "agentrl", "environments": "agentrl/environments", "tools": "agentrl/tools"}


def expected_files(root: Path) -> set[str]:
    files = set()
    for folder, target in MAPPING.items():
        for path in (root / folder).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                files.add(f"{target}/{path.relative_to(root / folder).as_posix()}")
    return files


def main(wheel: str, root: str = ".") -> int:
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(expected_files(Path(root)) - names)
    if missing:
        print(f"{wheel}: {len(missing)} source files are not in the wheel: {', '.join(missing[:20])}", file=sys.stderr)
        return 1
    print(f"{wheel}: all {len(expected_files(Path(root)))} package files present")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
