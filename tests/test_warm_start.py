"""Warm start: supervised steps on the environment's demonstrations before RL, through the trainer."""

from __future__ import annotations

import json
import math

import pytest

from agentrl.core.overrides import build, parse_overrides
from agentrl.core.strict import ConfigError
from agentrl.environments.calculator import CalculatorEnv
from agentrl.train.checkpoint import checkpoint_dir
from agentrl.train.config import TrainConfig
from agentrl.train.trainer import Trainer
from agentrl.train.warm_start import WarmStartError

SMALL = {"prompts_per_step": 2, "num_generations": 2, "micro_batch_size": 8, "rollout.max_tokens_per_turn": 32, "rollout.max_completion_tokens": 160}


class HalfBroken(CalculatorEnv):
    """Demonstrations that raise on one-call tasks; the others are the calculator's own."""

    async def demonstrate(self):
        if self.episode["task"]["difficulty"] == 1:
            raise RuntimeError("the expert crashed")
        return await super().demonstrate()


class Broken(CalculatorEnv):
    async def demonstrate(self):
        raise RuntimeError("the expert crashed")


def test_warm_start_lowers_the_demonstrations_nll_then_rl_runs(tmp_path):
    """The same eight demonstrations every step (batch = the whole train split): their NLL must fall
    (at 2e-4 on the bundled model; a fresh AdamW at 2e-3 overshoots it: 0.21 -> 1.11)."""
    env = CalculatorEnv(num_train=8, num_test=8, difficulty=(1, 2))
    trainer = Trainer(
        env=env, **SMALL, max_steps=1, seed=0, output_dir=str(tmp_path), save_every=1,
        **{"warm_start.steps": 4, "warm_start.batch_size": 8, "warm_start.learning_rate": 2e-4},
    )
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "warm_start.jsonl").read_text().splitlines()]
    assert [r["warm_start/step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["warm_start/demonstrations"] == 8 and r["warm_start/failed"] == 0 and r["warm_start/lr"] == 2e-4 for r in rows)
    nll = [r["warm_start/nll"] for r in rows]
    assert all(math.isfinite(x) for x in nll) and nll[-1] < 0.8 * nll[0], nll
    assert trainer.warm_start_history == rows
    assert (checkpoint_dir(tmp_path, 0) / "trainer_state.json").is_file(), "save_every also keeps the warm-started model, as step 0"
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1]


def test_failed_demonstrations_are_counted_and_left_out(tmp_path):
    env = HalfBroken(num_train=16, num_test=8, difficulty=(1, 2))
    trainer = Trainer(env=env, **SMALL, max_steps=1, output_dir=str(tmp_path), **{"warm_start.steps": 1, "warm_start.batch_size": 16})
    trainer.train()
    (row,) = trainer.warm_start_history
    ones = sum(1 for t in env.dataset("train") if t["difficulty"] == 1)
    assert row["warm_start/failed"] == ones > 0 and row["warm_start/demonstrations"] == 16 - ones


def test_a_step_whose_demonstrations_all_fail_stops_with_the_first_error(tmp_path):
    trainer = Trainer(env=Broken(num_train=8, num_test=8), **SMALL, max_steps=1, output_dir=str(tmp_path), **{"warm_start.steps": 1, "warm_start.batch_size": 4})
    with pytest.raises(WarmStartError, match="all 4 demonstrations failed; first error: RuntimeError: the expert crashed"):
        trainer.train()


def test_warm_start_needs_an_environment_that_demonstrates(tmp_path):
    cfg = build(TrainConfig, parse_overrides(["env=math_python", "warm_start.steps=2", f"output_dir={tmp_path}"]))
    with pytest.raises(ConfigError, match=r"warm_start.steps: env=math_python .* has no demonstrations"):
        Trainer(cfg)


def test_warm_start_is_off_by_default_and_checked():
    assert build(TrainConfig, {}).warm_start.steps == 0
    with pytest.raises(ConfigError, match="warm_start.batch_size"):
        build(TrainConfig, parse_overrides(["warm_start.batch_size=0"]))
    with pytest.raises(ConfigError, match="warm_start.steps with max_staleness > 0"):
        build(TrainConfig, parse_overrides(["warm_start.steps=2", "max_staleness=1", "loss.sampler_is_mode=truncate"]))
    with pytest.raises(ConfigError, match="warm_start.steps with distributed.strategy=fsdp"):
        build(TrainConfig, parse_overrides(["warm_start.steps=2", "distributed.strategy=fsdp"]))
