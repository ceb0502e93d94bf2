"""Reward mistakes are user errors: caught before the model loads, or stopping the run by name (issue 41).

Before: a missing column failed after the model load and a rollout (exit 1, "no episode ... has a
sampled token"); ``**kwargs`` skipped the check; a column named ``completion`` was shadowed; a
raising reward silently dropped episodes (exit 0); ``extra_rewards`` could not take a ``Reward``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl import Trainer
from agentrl.cli.main import main
from agentrl.core.errors import ConfigError

HERE = Path(__file__).resolve().parent
ENVS = str(HERE / "reward_envs.py")
SMALL = ["model=default", "max_steps=1", "prompts_per_step=2", "num_generations=4", "save_final=false"]


@pytest.mark.parametrize(
    "env,expected",
    [
        ("MissingColumnEnv", "reward 'needs_missing_column' asks for ['reference'], which neither the episode"),
        ("TrlRewardEnv", "reward 'trl_format_reward' asks for ['completions']"),
        ("KwargsEnv", "reward 'kwargs_and_missing' asks for ['reference']"),
        (
            "CompletionColumnEnv",
            "reward 'correct' asks for 'completion', which is both a column of the tasks and the episode's 'completion'",
        ),
    ],
)
@pytest.mark.parametrize("command", ["train", "eval"])
def test_a_wrong_reward_argument_is_one_line_before_the_model_loads(command, env, expected, tmp_path, capsys):
    out = tmp_path / "out"
    where = f"output_dir={out}" if command == "train" else f"output={out}"
    assert main([command, f"env={ENVS}:{env}", "model=default", where]) == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1
    assert not out.exists()  # stopped before the run folder (and the model)


def test_the_python_trainer_runs_the_same_pre_checks(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match="model.path=.*no such folder"):
        Trainer(env="calculator", model=str(tmp_path / "nope"), output_dir=str(out))
    assert not out.exists()


def test_a_raising_reward_stops_the_run_with_its_name(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", f"env={ENVS}:FlakyEnv", *SMALL, f"output_dir={out}"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == "agentrl train: reward 'flaky' raised ValueError: cannot parse the answer"


def test_with_reward_errors_drop_the_episodes_are_counted_on_the_step_line(tmp_path, capsys):
    out = tmp_path / "run"
    assert (
        main(
            [
                "train",
                f"env={ENVS}:FlakyEnv",
                *SMALL,
                "num_generations=8",
                "rollout.reward_errors=drop",
                f"output_dir={out}",
            ]
        )
        == 0
    )
    [row] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    dropped = row["rollout/episodes/reward_errors"]
    assert 0 < dropped < 16 and row["rollout/episodes/errors"] == dropped
    assert f"reward errors={dropped}" in capsys.readouterr().out


def test_a_reward_object_in_extra_rewards(tmp_path):
    out = tmp_path / "run"
    extra = f"extra_rewards=[{{fn: '{ENVS}:CONSTANT'}}]"
    assert main(["train", "env=calculator", *SMALL, extra, f"output_dir={out}"]) == 0
    [row] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert row["reward/half"] == 0.5
    config = json.loads((out / "config.json").read_text())
    assert config["extra_rewards"][0]["fn"].endswith("reward_envs.py:CONSTANT")
