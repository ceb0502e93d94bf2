"""The import structure docs/architecture.md states: no cycles, and no module importing a higher layer.

Imports are read from the source (module-level and inside functions, not ``TYPE_CHECKING``
blocks), so a lazy import that would form a cycle or reach upwards fails here too; every module
is then imported for real in a fresh interpreter. Keep LAYERS and the doc's table in step.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"agentrl": "agentrl", "environments": "agentrl.environments", "tools": "agentrl.tools"}

# Lowest first. A module may import its own layer and the layers below it. Longest prefix wins.
LAYERS: list[tuple[str, list[str]]] = [
    ("foundation", ["agentrl.strict", "agentrl.loading", "agentrl.models", "agentrl.bundled", "agentrl.logprobs", "agentrl.head_tiles", "agentrl.compile_layers",
                    "agentrl.losses", "agentrl.checkpoint", "agentrl.optim_offload", "agentrl.optim_8bit", "agentrl.plot", "agentrl.config_help",
                    "agentrl.reference"]),
    ("tools and chat formats", ["agentrl.tool", "agentrl.tool_threads", "agentrl.sandbox", "agentrl.replay", "agentrl.dispatch", "agentrl.chat"]),
    ("environments", ["agentrl.trajectory", "agentrl.env", "agentrl.sync", "agentrl.registry", "agentrl.check", "agentrl.tools", "agentrl.environments"]),
    ("generators", ["agentrl.generators"]),
    ("rollout", ["agentrl.rollout", "agentrl.guidance", "agentrl.rewards", "agentrl.evaluation", "agentrl.observe"]),
    ("config", ["agentrl.config", "agentrl.train_config", "agentrl.validate", "agentrl.group_selection", "agentrl.curriculum"]),
    ("commands", ["agentrl.trainer", "agentrl.group_draw", "agentrl.interrupt", "agentrl.distributed", "agentrl.sharded", "agentrl.rollout_ahead", "agentrl.batch", "agentrl.learner", "agentrl.train_setup", "agentrl.train_state", "agentrl.warm_start", "agentrl.curve", "agentrl.doctor", "agentrl.viewer", "agentrl.viewer_html", "agentrl.viewer_cli",
                  "agentrl.generators.vllm_serve"]),
    ("entry points", ["agentrl.cli", "agentrl"]),
]
# Environments and tools know nothing of tokens, models or training: only these (and each other).
ENV_SIDE = ("agentrl.environments", "agentrl.tools")
ENV_SIDE_MAY_IMPORT = ("agentrl.env", "agentrl.tool", "agentrl.dispatch", "agentrl.chat.types", "agentrl.strict", "agentrl.sync", "agentrl.sandbox", *ENV_SIDE)


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


def layer_of(name: str) -> int:
    best, level = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, level = len(prefix), i
    return level


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


def test_every_module_has_a_layer():
    assert [m for m in modules() if layer_of(m) < 0] == []


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_no_module_imports_a_higher_layer():
    bad = [
        f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"
        for a, targets in sorted(graph().items())
        for b in sorted(targets)
        if layer_of(b) > layer_of(a)
    ]
    assert bad == []


def test_environments_and_tools_import_only_the_environment_layer():
    bad = [
        f"{a} imports {b}"
        for a, targets in sorted(graph().items())
        if a.startswith(ENV_SIDE)
        for b in sorted(targets)
        if not any(b == p or b.startswith(p + ".") for p in ENV_SIDE_MAY_IMPORT)
    ]
    assert bad == []


def test_the_checker_catches_what_it_should():
    """The analysis itself: a lazy upward import and a two-module cycle are both found."""
    g = {"agentrl.trajectory": {"agentrl.trainer"}, "agentrl.trainer": {"agentrl.trajectory"}}
    assert cycles(g) == [["agentrl.trainer", "agentrl.trajectory"]]
    assert layer_of("agentrl.trainer") > layer_of("agentrl.trajectory")
    assert layer_of("agentrl.generators.vllm_serve") > layer_of("agentrl.generators.base")


def test_every_module_imports():
    """Each module imports in a fresh interpreter (vLLM and the servers' web stack are imported lazily)."""
    names = sorted(modules())
    code = "import importlib, sys\nfor n in sys.argv[1:]:\n    importlib.import_module(n)\n"
    proc = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("doc", ["docs/architecture.md"])
def test_doc_names_every_layer(doc):
    text = (ROOT / doc).read_text()
    assert all(f"**{name}**" in text for name, _ in LAYERS)
