"""The folder rule docs/architecture.md states: each folder of agentrl is one side of the system, and
a side imports only the sides below it; no import cycles; every module is listed in the doc.

Imports are read from the source (module-level and inside functions, not ``TYPE_CHECKING``
blocks), so a lazy import that reaches across a side or forms a cycle fails here too; every module
is then imported for real in a fresh interpreter. Keep MAY_IMPORT and the doc's table in step.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"agentrl": "agentrl", "environments": "agentrl.environments", "tools": "agentrl.tools"}

BELOW_TRAIN = {"core", "env", "chat", "compute", "generators", "rollout", "learn", "observe", "bundled"}
# side -> the other sides it may import. A module may always import its own side.
MAY_IMPORT: dict[str, set[str]] = {
    "core": set(),
    "bundled": set(),
    "env": {"core"},
    "chat": {"core"},
    "compute": {"core", "bundled"},
    "generators": {"core", "compute", "bundled"},
    "rollout": {"core", "env", "chat", "compute", "generators", "bundled"},
    "learn": {"core", "compute"},
    "observe": {"core", "compute", "bundled"},
    "train": BELOW_TRAIN,
    "doctor": BELOW_TRAIN | {"train"},
    "cli": BELOW_TRAIN | {"train", "doctor"},
    "trl": BELOW_TRAIN | {"train"},
    "environments": {"core", "env", "tools"},
    "tools": {"core", "env"},
    "": BELOW_TRAIN | {"train", "doctor", "cli", "trl"},  # the package itself (public API) and __main__
}


def side(module: str) -> str:
    """``agentrl.train.trainer`` -> ``train``; ``agentrl`` and ``agentrl.__main__`` -> ``""``."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "__main__":
        return ""
    return parts[1]


def modules() -> dict[str, Path]:
    found = {}
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The agentrl modules ``name`` imports; ``from pkg import sub`` counts as importing ``pkg.sub``."""
    tree = ast.parse(path.read_text(), str(path))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found.add(sub if sub in known else module)
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_every_module_is_in_a_side():
    assert sorted(m for m in modules() if side(m) not in MAY_IMPORT) == []


def test_the_package_top_holds_only_the_public_api():
    top = sorted(p.name for p in (ROOT / "agentrl").glob("*.py"))
    assert top == ["__init__.py", "__main__.py"]


def test_every_side_says_what_it_is():
    """Each subpackage's __init__ opens with a docstring."""
    missing = [str(p.relative_to(ROOT)) for p in (ROOT / "agentrl").rglob("__init__.py") if ast.get_docstring(ast.parse(p.read_text())) is None]
    assert missing == []


def test_no_import_cycles():
    assert cycles(graph()) == []


def crossings(g: dict[str, set[str]]) -> list[str]:
    return [
        f"{a} ({side(a) or 'agentrl'}) imports {b} ({side(b) or 'agentrl'})"
        for a, targets in sorted(g.items())
        for b in sorted(targets)
        if side(b) != side(a) and side(b) not in MAY_IMPORT.get(side(a), set())
    ]


def test_no_module_imports_across_the_folder_rule():
    assert crossings(graph()) == []


def test_the_checker_catches_what_it_should():
    """The analysis itself: an import across sides and a two-module cycle are both found."""
    g = {"agentrl.core.trajectory": {"agentrl.train.trainer"}, "agentrl.train.trainer": {"agentrl.core.trajectory"}}
    assert cycles(g) == [["agentrl.core.trajectory", "agentrl.train.trainer"]]
    assert crossings(g) == ["agentrl.core.trajectory (core) imports agentrl.train.trainer (train)"]
    assert crossings({"agentrl.env.dispatch": {"agentrl.chat.base"}}) == ["agentrl.env.dispatch (env) imports agentrl.chat.base (chat)"]
    assert crossings({"agentrl.learn.learner": {"agentrl.rollout.engine"}}) != []
    assert crossings({"agentrl.environments.calculator": {"agentrl.generators.protocol"}}) != []
    assert crossings({"agentrl.rollout.engine": {"agentrl.generators.protocol", "agentrl.env.dispatch", "agentrl.core.records"}}) == []


def test_every_module_imports():
    """Each module imports in a fresh interpreter (vLLM and the servers' web stack are imported lazily)."""
    names = sorted(modules())
    code = "import importlib, sys\nfor n in sys.argv[1:]:\n    importlib.import_module(n)\n"
    proc = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


DOC = ROOT / "docs" / "architecture.md"


def documented_modules() -> set[str]:
    """Every ``agentrl/...py`` path in the doc's module table, as a module name."""
    text = DOC.read_text()
    table = text[text.index("## Modules"):text.index("## Contracts")]
    return {p.removesuffix(".py").removesuffix("/__init__").replace("/", ".") for p in re.findall(r"`(agentrl/[\w/]+\.py)`", table)}


def test_the_doc_lists_every_module_and_no_other():
    actual = {m for m in modules() if m.startswith("agentrl") and not m.startswith(("agentrl.environments", "agentrl.tools"))}
    listed = documented_modules()
    assert sorted(actual - listed) == [], "modules missing from docs/architecture.md"
    assert sorted(listed - actual) == [], "docs/architecture.md lists modules that do not exist"


def test_the_doc_states_the_rule_of_every_side():
    text = DOC.read_text()
    assert all(f"**{name}/**" in text for name in MAY_IMPORT if name and name not in ("environments", "tools"))
