"""scripts/train_default_model.py --env sokoban: a short SFT on scripted transcripts gives a model that
plays Sokoban through the real rollout engine with well-formed ``move`` calls (tiny sizes, CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agentrl.cli.main import main
from agentrl.core.trajectory import read_jsonl
from agentrl.environments.sokoban import MOVES

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "train_default_model.py"


def test_sokoban_sft_model_calls_move_well_formed(tmp_path: Path) -> None:
    out = tmp_path / "start"
    tiny = ["--examples", "64", "--steps", "60", "--batch-size", "8", "--lr", "3e-3", "--warmup", "5"]
    tiny += ["--hidden-size", "64", "--layers", "2", "--vocab-size", "400", "--max-turns", "3", "--threads", "1"]
    done = subprocess.run([sys.executable, str(SCRIPT), "--env", "sokoban", "--out", str(out), *tiny], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    build = json.loads((out / "agentrl_build.json").read_text())
    assert build["env"] == "sokoban" and build["steps"] == 60 and build["reference_prob"] == 0.5

    evals = tmp_path / "eval"
    args = ["eval", "env=sokoban", f"model={out}", "n=6", "sampling.temperature=0", "rollout.max_turns=2", f"output={evals}"]
    assert main(args) == 0
    episodes = read_jsonl(evals / "results.jsonl")
    assert len(episodes) == 6 and not any(e.error for e in episodes)
    turns = [t for e in episodes for t in e.turns]
    assert turns
    for turn in turns:
        # Every assistant turn is exactly one parsed `move` call with a legal direction, run by the tool.
        calls = turn.message.get("tool_calls") or []
        assert not turn.parse_issues, turn.parse_issues
        assert len(calls) == 1, turn.message
        function = calls[0]["function"]
        arguments = function["arguments"]
        if isinstance(arguments, str):
            arguments = json.loads(arguments)
        assert function["name"] == "move" and arguments["direction"] in MOVES, function
        assert [r.kind for r in turn.tool_records] == ["ok"]
    summary = json.loads((evals / "summary.json").read_text())
    assert summary["well_formed_call_rate"] == 1.0


def test_sokoban_options_are_checked() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--env", "sokoban"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--out is required" in done.stderr
    done = subprocess.run([sys.executable, str(SCRIPT), "--env", "sokoban", "--out", "x", "--reference-prob", "1.5"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--reference-prob" in done.stderr
