"""Policy losses of the GRPO family, advantages and their helpers: pure tensor functions.

Formulas, normalisers and papers: ``docs/losses.md``. Entry points: :func:`policy_loss` per
micro-batch, :func:`group_advantages` / :func:`turn_advantages` once per generation batch.
"""

from agentrl.losses.advantages import (
    combine_rewards,
    group_advantages,
    per_token_returns,
    rewards_tensor,
    turn_advantages,
)
from agentrl.losses.config import LossConfig, LossConfigError
from agentrl.losses.policy import count_active_tokens, policy_loss
from agentrl.losses.registry import LOSSES, LossFn, LossInputs, register_loss
from agentrl.losses.weights import k3_kl, log_ratio, masked_seq_mean, sampler_weight

__all__ = [
    "LOSSES",
    "LossConfig",
    "LossConfigError",
    "LossFn",
    "LossInputs",
    "combine_rewards",
    "count_active_tokens",
    "group_advantages",
    "k3_kl",
    "log_ratio",
    "masked_seq_mean",
    "per_token_returns",
    "policy_loss",
    "register_loss",
    "rewards_tensor",
    "sampler_weight",
    "turn_advantages",
]
