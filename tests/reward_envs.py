"""Calculator environments with rewards that are wrong in the ways users get them wrong (issue 41)."""

from __future__ import annotations

from typing import Any

from datasets import Dataset

from agentrl import Reward
from agentrl.environments.calculator import CalculatorEnv


def needs_missing_column(completion: str, reference: str) -> float:
    """Asks for a column the calculator's tasks do not have."""
    return float(completion == reference)


def trl_format_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """TRL's batched signature: lists in, a list out."""
    return [0.0 for _ in completions]


def kwargs_and_missing(reference: str, **kwargs: Any) -> float:
    """``**kwargs`` must not hide a missing named argument."""
    return 0.0


def flaky(completion: str) -> float:
    """Raises on some episodes (a bug in the user's reward)."""
    if len(completion) % 2 == 0:
        raise ValueError("cannot parse the answer")
    return 1.0


def uses_completion(completion: str) -> float:
    return float(bool(completion))


def constant(completion: str) -> float:
    return 0.5


CONSTANT = Reward(constant, weight=0.25, name="half")  # a Reward object, as RewardModel(...).as_reward() gives


class _With(CalculatorEnv):
    reward_fn: Any = None

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(num_train=50, num_test=10, **kwargs)
        self.rewards = [*self.rewards, Reward(type(self).reward_fn)]


class MissingColumnEnv(_With):
    reward_fn = staticmethod(needs_missing_column)


class TrlRewardEnv(_With):
    reward_fn = staticmethod(trl_format_reward)


class KwargsEnv(_With):
    reward_fn = staticmethod(kwargs_and_missing)


class FlakyEnv(_With):
    reward_fn = staticmethod(flaky)


class CompletionColumnEnv(_With):
    """A prompt-completion dataset: its ``completion`` column collides with the episode's argument."""

    reward_fn = staticmethod(uses_completion)

    def load_dataset(self, split: str) -> Dataset:
        rows = [dict(r) | {"completion": "The answer is 1."} for r in super().load_dataset(split)]
        return Dataset.from_list(rows)
