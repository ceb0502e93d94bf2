"""agentrl eval: estimators, outputs, and agreement with the gym-style example loop."""

from __future__ import annotations

import json
import runpy
from math import comb
from pathlib import Path

import pytest

from agentrl.cli.main import main
from agentrl.core.trajectory import read_jsonl
from agentrl.rollout.evaluation import pass_at_k, pass_hat_k

ROOT = Path(__file__).resolve().parents[1]


def test_unbiased_estimators():
    assert pass_at_k(4, 0, 1) == 0.0 and pass_at_k(4, 4, 4) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - comb(3, 2) / comb(5, 2))
    assert pass_hat_k(5, 2, 2) == pytest.approx(comb(2, 2) / comb(5, 2))
    assert pass_hat_k(4, 3, 4) == 0.0
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_eval_cli_writes_results_and_agrees_with_gym_loop(tmp_path, capsys):
    n = 24
    out = tmp_path / "eval"
    assert main(["eval", "env=calculator", "model=default", f"n={n}", "sampling.temperature=0", f"output={out}"]) == 0
    printed = capsys.readouterr().out
    assert "pass@1" in printed and "well-formed calls" in printed
    summary = json.loads((out / "summary.json").read_text())
    trajs = read_jsonl(out / "results.jsonl")
    assert len(trajs) == n and summary["tasks"] == n
    engine_scores = [t.rewards["correct"] for t in sorted(trajs, key=lambda t: t.group)]

    gym = runpy.run_path(str(ROOT / "examples" / "evaluate_gym.py"))["run"]("calculator", "default", "test", n)
    # Both run greedy decoding over the same tasks; batching differs, so allow one float-noise flip.
    disagree = sum(a != b for a, b in zip(engine_scores, gym["scores"]))
    assert disagree <= 1, (engine_scores, gym["scores"])
    assert summary["pass@1"] == pytest.approx(sum(engine_scores) / n)


def test_eval_k_samples_and_bad_input(tmp_path, capsys):
    out = tmp_path / "k"
    assert main(["eval", "model=default", "n=4", "k=3", "sampling.temperature=1.0", "sampling.seed=5", f"output={out}"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 12 and "pass@3" in summary and "pass^3" in summary
    assert summary["pass^3"] <= summary["pass@1"] <= summary["pass@3"]
    assert main(["eval", "k=2", "sampling.temperature=0"]) == 2
    assert "k > 1 with sampling.temperature=0" in capsys.readouterr().err
    assert main(["eval", "nn=3"]) == 2
    assert main(["eval", "env=nope"]) == 2
