"""The Python training API, the one reward path for extra rewards, and set-up order (environment before model)."""

from __future__ import annotations

import json

import pytest
from datasets import Dataset

import agentrl
from agentrl import TrainConfig, Trainer
from agentrl.core.strict import ConfigError
from agentrl.environments.calculator import CalculatorEnv

SMALL = dict(prompts_per_step=2, num_generations=4, micro_batch_size=4, **{"rollout.max_tokens_per_turn": 32, "rollout.max_completion_tokens": 160})


class MarkedCalculator(CalculatorEnv):
    """The calculator with something in the episode state, for rewards that ask for ``state``."""

    async def reset(self, task=None, seed=None):
        messages, info = await super().reset(task=task, seed=seed)
        self.episode["state"]["answer_seen"] = info["task"]["answer"]
        return messages, info


REWARD_FILE = '''
from agentrl.core.records import ToolRecord

def saw_state(state, task, tool_records):
    """1 when the reward got the real episode: its state and typed tool records."""
    return float(state.get("answer_seen") == task["answer"] and all(isinstance(r, ToolRecord) for r in tool_records))
'''


def test_five_line_training_on_the_bundled_model(tmp_path):
    from agentrl import Trainer

    trainer = Trainer(env="calculator", model="default", max_steps=2, output_dir=str(tmp_path), **SMALL)
    last = trainer.train()
    assert last["step"] == 2 and 0.0 <= last["reward/mean"] <= 1.0
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2]
    assert (tmp_path / "checkpoints" / "step-000002" / "model.safetensors").is_file()
    assert trainer.cfg.model.path == "default" and trainer.cfg.rollout.max_tokens_per_turn == 32  # the CLI's keys and shortcuts


def test_environment_instance_and_extra_reward_get_the_real_episode_state(tmp_path):
    reward = tmp_path / "state_reward.py"
    reward.write_text(REWARD_FILE)
    env = MarkedCalculator(num_train=64, num_test=8)
    trainer = Trainer(env=env, max_steps=1, output_dir=str(tmp_path / "run"), extra_rewards=[{"fn": f"{reward}:saw_state", "weight": 0.0}], **SMALL)
    assert trainer.cfg.env.endswith(":MarkedCalculator")
    trainer.train()
    metrics = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["reward/saw_state"] == 1.0  # with state={} (the old path) this was 0
    assert "reward/correct" in metrics


def test_config_object_with_keyword_overrides(tmp_path):
    cfg = TrainConfig(max_steps=5, seed=3)
    from agentrl.train.build import config_from

    merged = config_from(cfg, "calculator", {"max_steps": 2, "loss.beta": 0.1})
    assert (merged.max_steps, merged.seed, merged.loss.beta, merged.env) == (2, 3, 0.1, "calculator")
    with pytest.raises(ConfigError, match="learning_rat: unknown key"):
        config_from(None, None, {"learning_rat": 1e-3})
    with pytest.raises(ConfigError, match="env_args: only for an environment given by name"):
        config_from(None, CalculatorEnv(num_train=4, num_test=4), {"env_args": {"seed": 1}})


@pytest.fixture
def no_model_load(monkeypatch):
    """Fail loudly if a model would be loaded."""
    import agentrl.train.trainer as trainer_module

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the environment was checked")

    monkeypatch.setattr(trainer_module, "load_planned", refuse)
    monkeypatch.setattr("agentrl.compute.models.load_tokenizer", refuse)


def test_empty_dataset_is_one_clear_error_before_the_model_loads(tmp_path, no_model_load):
    env = agentrl.ToolEnvironment(datasets={"train": Dataset.from_list([]), "test": Dataset.from_list([])})
    with pytest.raises(ConfigError, match="the 'train' split has no tasks"):
        Trainer(env=env, output_dir=str(tmp_path))


def test_environment_errors_come_before_the_model_loads(tmp_path, no_model_load):
    broken = tmp_path / "broken_env.py"
    broken.write_text("class Broken:\n    def __init__(self):\n        raise RuntimeError('no database')\n")
    with pytest.raises(ConfigError, match="constructing it with env_args=.* raised RuntimeError: no database"):
        Trainer(env=f"{broken}:Broken", output_dir=str(tmp_path / "a"))
    with pytest.raises(agentrl.env.registry.UnknownEnvironment):
        Trainer(env="no-such-env", output_dir=str(tmp_path / "b"))
    with pytest.raises(ConfigError, match="extra_rewards"):
        Trainer(env="calculator", output_dir=str(tmp_path / "c"), extra_rewards=[{"fn": f"{tmp_path}/missing.py:f"}])
    no_test = agentrl.ToolEnvironment(datasets={"train": Dataset.from_list([{"question": "hi"}])})
    with pytest.raises(ConfigError, match="reading its 'test' split raised"):
        Trainer(env=no_test, output_dir=str(tmp_path / "d"), eval_every=1)


def test_extra_rewards_need_an_environment_that_exposes_its_episode():
    class Bare(agentrl.Environment):
        pass

    with pytest.raises(agentrl.EnvError, match="reward_context"):
        Bare().with_rewards([agentrl.Reward(lambda completion: 1.0, name="x")])
    env = CalculatorEnv(num_train=4, num_test=4)
    with pytest.raises(agentrl.EnvError, match="already used"):
        env.with_rewards([agentrl.Reward(lambda completion: 1.0, name="correct")])
    plus = env.with_rewards([agentrl.Reward(lambda completion: 1.0, name="extra")])
    assert [r.name for r in plus.rewards][-1] == "extra" and [r.name for r in env.rewards] == ["correct", "format", "progress"]


def test_a_reward_that_raises_is_named_in_one_line(tmp_path, capsys):
    from agentrl.cli.main import main

    boom = tmp_path / "boom.py"
    boom.write_text("def boom(completion):\n    raise ValueError('reward exploded')\n")
    args = ["max_steps=1", "prompts_per_step=2", "num_generations=2", "rollout.max_tokens_per_turn=24", "rollout.max_completion_tokens=96",
            f"output_dir={tmp_path / 'run'}", f'extra_rewards=[{{"fn": "{boom}:boom"}}]']
    assert main(["train", *args]) == 2  # a user error: the reward's own bug stops the run by name (issue 41)
    err = capsys.readouterr().err
    ours = [line for line in err.splitlines() if line.startswith("agentrl train:")]
    assert ours == ["agentrl train: reward 'boom' raised ValueError: reward exploded"], err
    assert "Traceback" not in err


def test_reward_objects_in_extra_rewards_from_python(tmp_path):
    """A Reward object (e.g. RewardModel(...).as_reward()) or a plain function in extra_rewards: it
    was turned into its repr by json.dumps(default=str) and refused as a 'module:function' spec."""
    from agentrl.env.environment import Reward

    def short_answer(completion):
        return float(len(completion) < 40)

    def group_size(completions, **kwargs):  # TRL's batched signature: once per group
        return [float(len(completions))] * len(completions)

    run = tmp_path / "run"
    trainer = Trainer(env="calculator", max_steps=1, output_dir=str(run), **SMALL,
                      extra_rewards=[Reward(short_answer, weight=0.0, name="short"), group_size, {"fn": "agentrl.environments.calculator:correct", "name": "again", "weight": 0.0}])  # fmt: skip
    trainer.train()
    row = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert "reward/short" in row and row["reward/group_size"] == 4.0 and "reward/again" in row
    saved = json.loads((run / "config.json").read_text())
    assert [r["name"] for r in saved["extra_rewards"]] == ["again"]  # the objects stay out of config.json
