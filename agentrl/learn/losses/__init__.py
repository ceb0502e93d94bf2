"""Policy losses of the GRPO family, advantages and their helpers: pure tensor functions.

Formulas, normalisers and papers: ``docs/losses.md``. Entry points: :func:`policy_loss` per
micro-batch; :func:`compute_advantages` (or :func:`group_advantages` / :func:`turn_level_advantages`)
once per generation batch.
"""

from agentrl.learn.advantages import (
    combine_rewards,
    group_advantages,
    rewards_tensor,
)
from agentrl.learn.credit import AdvantageMode, compute_advantages, turn_level_advantages, turns_to_tokens
from agentrl.learn.losses import objectives as _objectives  # noqa: F401  (registers the built-in losses)
from agentrl.learn.losses.aggregation import AGGREGATIONS, StepCounts, local_counts, register_aggregation
from agentrl.learn.losses.config import LossConfig, LossConfigError
from agentrl.learn.losses.inputs import LossInputs
from agentrl.learn.losses.policy import count_active_tokens, policy_loss
from agentrl.learn.losses.ratios import k3_kl, log_ratio, masked_seq_mean, sampler_weight
from agentrl.learn.losses.registry import LOSSES, LossFn, LossSpec, UnknownLoss, loss_names, register_loss, resolve_loss

__all__ = [
    "AGGREGATIONS",
    "AdvantageMode",
    "LOSSES",
    "LossConfig",
    "LossConfigError",
    "LossFn",
    "LossInputs",
    "LossSpec",
    "StepCounts",
    "UnknownLoss",
    "combine_rewards",
    "compute_advantages",
    "count_active_tokens",
    "group_advantages",
    "k3_kl",
    "local_counts",
    "log_ratio",
    "loss_names",
    "masked_seq_mean",
    "policy_loss",
    "register_aggregation",
    "register_loss",
    "resolve_loss",
    "rewards_tensor",
    "sampler_weight",
    "turn_level_advantages",
    "turns_to_tokens",
]
