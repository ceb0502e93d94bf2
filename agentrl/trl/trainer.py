"""``GRPOTrainer``: TRL's constructor over agentrl's ``Trainer``, so a TRL GRPO script ports by its import.

The dataset, the reward functions, ``tools`` and ``environment_factory`` become an ordinary agentrl
environment (``ToolEnvironment``, or ``FactoryEnvironment`` for a factory): the same rollout engine,
token path, losses and checkpoints as ``agentrl train``. TRL's batched reward functions are called
once per GRPO group (``agentrl.env.batched``); a reward given as a model path or a
sequence-classification model object scores each conversation through ``RewardModel``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from agentrl.core.errors import ConfigError
from agentrl.env.batched import BatchedReward
from agentrl.env.environment import Environment, Reward, ToolEnvironment, as_reward
from agentrl.env.factory import FactoryEnvironment
from agentrl.trl.config import GRPOConfig

_UNSUPPORTED = {
    "callbacks": "agentrl has no transformers callbacks; metrics go to report_to trackers and the run folder's metrics.jsonl",
    "optimizers": "agentrl builds AdamW from the config (learning_rate, adam_betas, optimizer, lr_scheduler)",
    "rollout_func": "write the episode as an agentrl Environment (docs/environments.md) or a harness (docs/harness.md)",
    "reward_processing_classes": "a reward model given by path loads its own tokenizer; give a RewardModel(model, tokenizer).as_reward() for another",
    "quantization_config": "not supported here yet: the base model loads in model.dtype",
}


class GRPOTrainer:
    """TRL's ``GRPOTrainer(model, reward_funcs, args, train_dataset, ...)`` on agentrl.

    Args:
        model: a folder, a hub id, or a loaded model object (with ``processing_class``).
        reward_funcs: one or a list of: TRL-style batched functions (``prompts``, ``completions``,
            ``completion_ids``, columns as lists; sync or async; None entries do not apply), agentrl
            ``Reward`` objects or per-episode functions, or a reward model (path or object).
        args: a :class:`GRPOConfig` (TRL's names or agentrl keys).
        train_dataset / eval_dataset: ``datasets.Dataset`` with a ``prompt`` column (text or
            messages); the other columns reach the rewards. The eval split runs with ``eval_steps``.
        processing_class: the tokenizer of a model object.
        peft_config: a ``peft.LoraConfig`` (or agentrl's ``peft`` dict).
        tools: functions the model may call (multi-turn until it answers without a call).
        environment_factory: TRL's factory: a fresh object per episode, its public methods the
            tools; ``get_reward()`` on it, when present, is a reward named after its class.
        **keys: further agentrl keys (``rollout.max_context=2048`` as ``**{"rollout.max_context": 2048}``).
    """

    def __init__(
        self,
        model: Any,
        reward_funcs: Any = None,
        args: GRPOConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        peft_config: Any = None,
        tools: Sequence[Callable[..., Any]] | None = None,
        environment_factory: Callable[[], Any] | None = None,
        **keys: Any,
    ) -> None:
        from agentrl.train.trainer import Trainer

        for name, why in _UNSUPPORTED.items():
            if keys.get(name) not in (None, [], (), (None, None)):
                raise ConfigError(f"GRPOTrainer: {name} has no agentrl equivalent: {why}")
            keys.pop(name, None)
        args = args if args is not None else GRPOConfig()
        if not isinstance(args, GRPOConfig):
            raise ConfigError(f"GRPOTrainer: args must be an agentrl.trl.GRPOConfig, got {type(args).__name__} (change the import: from agentrl.trl import GRPOConfig)")
        if train_dataset is None:
            raise ConfigError("GRPOTrainer: train_dataset is required (a factory's reset() may add to each prompt, as in TRL, but the tasks come from the dataset)")
        if isinstance(eval_dataset, dict):
            raise ConfigError("GRPOTrainer: eval_dataset must be one Dataset (agentrl evaluates one test split)")
        rewards = _rewards(reward_funcs, args.get("reward_weights"))
        splits = {"train": train_dataset, **({"test": eval_dataset} if eval_dataset is not None else {})}
        self.env = _environment(splits, rewards, tools, environment_factory)
        num_tasks = len(train_dataset) if hasattr(train_dataset, "__len__") else None
        settings = args.to_keys(num_tasks)
        if "eval_every" in settings and eval_dataset is None and settings["eval_every"]:
            raise ConfigError("GRPOTrainer: eval_strategy/eval_steps is set but eval_dataset is not")
        settings.update(keys)
        if peft_config is not None:
            settings["peft"] = peft_config
        if processing_class is not None:
            settings["tokenizer"] = processing_class
        self.args = args
        self.trainer = Trainer(env=self.env, model=model, **settings)

    @property
    def cfg(self) -> Any:
        """The agentrl ``TrainConfig`` this run uses (written to the run folder's config.json)."""
        return self.trainer.cfg

    @property
    def model(self) -> Any:
        """The policy being trained (the PEFT model under LoRA), as TRL's ``trainer.model``."""
        return self.trainer._module()

    @property
    def processing_class(self) -> Any:
        """The tokenizer, as TRL's ``trainer.processing_class``."""
        return self.trainer.tokenizer

    def push_to_hub(self, *args: Any, **kwargs: Any) -> None:
        """Not done here: one clear line instead of an AttributeError."""
        raise ConfigError("GRPOTrainer.push_to_hub: agentrl does not upload; save_model(path) and push the folder with huggingface_hub.upload_folder")

    def train(self) -> dict[str, Any]:
        """Train; returns the last step's metrics (the run folder holds every step's)."""
        return self.trainer.train()

    def evaluate(self, num_tasks: int | None = None) -> dict[str, float]:
        """Mean reward (``eval/reward``, and each reward's mean) of the policy on the first
        ``num_tasks`` tasks of ``eval_dataset`` (default ``eval_tasks``), one greedy episode each
        (``eval_temperature``), as TRL's ``evaluate()`` after or during training."""
        if "test" not in self.env.__dict__.get("_datasets", {}):
            raise ConfigError("GRPOTrainer.evaluate: no eval_dataset was given")
        return self.trainer.evaluate(num_tasks or self.cfg.eval_tasks)

    def save_model(self, output_dir: str | None = None, merged: bool = False) -> Any:
        """The model (LoRA: the adapter folder, or with ``merged=True`` the base with the adapter
        folded in) to ``output_dir``, as TRL's (default: the run's ``output_dir``)."""
        return self.trainer.save_model(output_dir or self.trainer.run_dir, merged=merged)


def _rewards(funcs: Any, weights: Sequence[float] | None) -> list[Reward | BatchedReward]:
    funcs = [] if funcs is None else list(funcs) if isinstance(funcs, list | tuple) else [funcs]
    if weights is not None and len(weights) != len(funcs):
        raise ConfigError(f"GRPOConfig: reward_weights has {len(weights)} values for {len(funcs)} reward functions (TRL requires the same)")
    out: list[Reward | BatchedReward] = []
    for i, fn in enumerate(funcs):
        weight = 1.0 if weights is None else float(weights[i])
        out.append(_reward(fn, weight, i))
    names = [r.name for r in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"GRPOTrainer: two reward functions are named {dup[0]!r}; rename one (the metrics are logged by name)")
    return out


def _reward(fn: Any, weight: float, i: int) -> Reward | BatchedReward:
    import dataclasses

    if isinstance(fn, Reward | BatchedReward):
        return dataclasses.replace(fn, weight=weight * fn.weight)
    if isinstance(fn, str) or _is_module(fn):  # a reward model, as TRL loads it (sequence classification, logit 0)
        from agentrl.rollout.rewards.reward_model import RewardModel

        name = fn.rstrip("/").split("/")[-1] if isinstance(fn, str) else type(fn).__name__
        model = RewardModel(fn) if isinstance(fn, str) else _model_reward(fn)
        return dataclasses.replace(model.as_reward(name=name), weight=weight)
    if not callable(fn):
        raise ConfigError(f"GRPOTrainer: reward_funcs[{i}] is a {type(fn).__name__}, not a function, a reward model or a path")
    return as_reward((fn, weight))


def _is_module(obj: Any) -> bool:
    try:
        import torch

        return isinstance(obj, torch.nn.Module)
    except ImportError:  # pragma: no cover - torch is a dependency
        return False


def _model_reward(model: Any) -> Any:
    from transformers import AutoTokenizer

    from agentrl.rollout.rewards.reward_model import RewardModel

    path = getattr(model, "name_or_path", None) or getattr(getattr(model, "config", None), "_name_or_path", None)
    if not path:
        raise ConfigError("GRPOTrainer: a reward model object needs its tokenizer: pass RewardModel(model, tokenizer).as_reward()")
    return RewardModel(model, AutoTokenizer.from_pretrained(path))


def _environment(splits: dict[str, Any], rewards: list[Any], tools: Sequence[Callable[..., Any]] | None, factory: Callable[[], Any] | None) -> Environment:
    if factory is not None:
        if isinstance(factory, dict):
            raise ConfigError("GRPOTrainer: a dict of environment factories is not supported; one factory per run")
        probe = factory()
        if callable(getattr(probe, "get_reward", None)):
            name = type(probe).__name__
            rewards = [*rewards, Reward(lambda environment: environment.get_reward(), name=name)]
        if not rewards:
            raise ConfigError("GRPOTrainer: no reward: pass reward_funcs, or an environment_factory whose objects have get_reward()")
        return FactoryEnvironment(factory, datasets=splits, rewards=rewards, tools=list(tools or ()))
    if not rewards:
        raise ConfigError("GRPOTrainer: reward_funcs is required (one function, a list, or a reward model)")
    return ToolEnvironment(tools=list(tools or ()), rewards=rewards, datasets=splits)
