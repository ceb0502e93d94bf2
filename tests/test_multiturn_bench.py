"""benchmarks/multiturn_bench.py gives agentrl and TRL the same multi-turn work: the same tasks in
the same order, the same levels, the same turn limit, no demonstrations on one side only."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import multiturn_bench as mb  # noqa: E402

from agentrl.core.overrides import build, parse_overrides  # noqa: E402
from agentrl.train.config import TrainConfig  # noqa: E402
from agentrl.train.state import TrainState  # noqa: E402


def agentrl_config(P: int = 4, G: int = 2, steps: int = 3) -> TrainConfig:
    return build(TrainConfig, parse_overrides(mb.agentrl_args("unused", P, G, steps)))


def test_agentrl_side_does_not_inherit_the_calculators_training_defaults():
    """CalculatorEnv.train_defaults add one-call tasks to the train split and a demonstration per
    group; TRL's side has neither, so the benchmark pins both (it did not, from 4bc038c on)."""
    cfg = agentrl_config()
    assert cfg.guidance.enabled is False
    assert cfg.env_args["train_difficulty"] == cfg.env_args["difficulty"] == mb.DIFFICULTY
    assert cfg.rollout.max_turns == mb.MAX_TURNS


def test_trl_side_gets_agentrls_tasks_in_agentrls_order_and_turn_limit():
    pytest.importorskip("trl")
    P, G, steps = 4, 2, 3
    cfg = agentrl_config(P, G, steps)
    config, data, _, _ = mb.trl_setup("unused", P, G, steps)
    train = mb.make_env().dataset("train")
    drawn = TrainState.start(len(train), cfg.seed).next_tasks(train, P * steps)
    assert list(data["answer"]) == [t["answer"] for t in drawn]
    assert [m["content"] for m in data[0]["prompt"] if m["role"] == "user"][-1] == drawn[0]["question"]
    assert config.shuffle_dataset is False
    assert config.max_tool_calling_iterations + 1 == cfg.rollout.max_turns  # TRL: a first turn, then one per tool round
