"""examples/openai_agent: an unmodified openai-client agent trained and evaluated by the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from agentrl.cli.main import main
from agentrl.tools.calculator import Calculator

ROOT = Path(__file__).resolve().parent.parent
SPEC = f"env={ROOT}/examples/openai_agent/harness_env.py:CalculatorAgentEnv"


def test_the_agent_shows_the_model_the_calculator_environments_tool():
    import importlib.util

    spec = importlib.util.spec_from_file_location("agent", ROOT / "examples/openai_agent/agent.py")
    agent = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent)
    assert agent.TOOLS == [Calculator(max_ops=1).schema]  # the same prompt tokens as env=calculator
    assert (
        agent.calculator("13 + 45") == "58"
        and agent.calculator("7 / 2") == "3.5"
        and agent.calculator("2 + 3 * 4").startswith("Error")
    )


def test_agentrl_check_passes_on_the_harness_environment():
    assert main(["check", SPEC]) == 0


def test_example_trains_two_steps_and_evaluates(tmp_path, capsys):
    run = tmp_path / "run"
    code = main(
        ["train", SPEC, "max_steps=2", "prompts_per_step=4", "num_generations=4", f"output_dir={run}", "save_every=2"]
    )
    assert code == 0, capsys.readouterr().err
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
    assert all(math.isfinite(s["loss/loss"]) for s in steps)
    assert all(s["rollout/episodes"] == 16 and s["rollout/episodes/errors"] == 0 for s in steps), steps
    out = tmp_path / "eval"
    final = run / "checkpoints" / "step-000002"
    assert main(["eval", SPEC, f"model={final}", "n=8", "sampling.temperature=0", f"output={out}"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 8 and summary["errors"] == 0, summary
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert all(r["samples"] and r["samples"][0]["loss_mask"] for r in rows)
    assert all(r["messages"][0] == {"role": "user", "content": r["task"]["question"]} for r in rows)


@pytest.mark.slow
def test_the_harness_agents_reward_rises(tmp_path):
    """Held-out greedy accuracy of the harness agent before and after 45 steps of the calculator's
    recipe before guidance (16 tasks x 8 episodes, per-turn credit), which gained 12-16 points as
    ``env=calculator`` (tests/test_learning.py). Guidance needs demonstrations a harness does not have.
    Smaller batches did not rise: at 8 x 4 and learning_rate=5e-4 both this agent and ``env=calculator``
    (guidance off) fell from 0.625 mean training reward at step 1 to 0 by step 6; at 1e-4 this agent's
    held-out greedy accuracy went 0.27 -> 0.19 in 20 steps (benchmarks/RESULTS.md, issue 46).
    Not run to the end on the shared 2-core machine (about 3 min a step under its load).
    """
    from agentrl.core.overrides import build, parse_overrides
    from agentrl.train.config import TrainConfig
    from agentrl.train.trainer import Trainer

    steps, tasks = 45, 300
    keys = [SPEC, f"max_steps={steps}", f"eval_every={steps}", f"eval_tasks={tasks}", "seed=0", "advantage=turn", f"output_dir={tmp_path}"]
    trainer = Trainer(build(TrainConfig, parse_overrides(keys)))
    trainer.train()
    before, after = trainer.eval_results[0], trainer.eval_results[steps]
    acc = lambda rewards: sum((r or 0) >= 1 for r in rewards) / tasks  # noqa: E731
    print(f"harness agent: greedy accuracy {acc(before):.3f} -> {acc(after):.3f}")
    assert acc(after) >= acc(before) + 0.05, (acc(before), acc(after))
