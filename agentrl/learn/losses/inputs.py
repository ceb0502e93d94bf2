"""``LossInputs``: what a registered loss function receives, prepared by ``policy_loss``."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentrl.learn.losses.config import LossConfig


@dataclass
class LossInputs:
    """All [B, T] and aligned; ``mask`` is float 0/1 and final (truncated rows already zeroed).

    ``policy_loss`` applies the sampler weight, the KL term, the mask and the aggregation to the
    per-token loss a loss function returns, so a loss function is only its objective.
    """

    logprobs: torch.Tensor  # current policy, with grad
    log_ratio: torch.Tensor  # log of the PPO ratio at the configured level, with grad
    advantages: torch.Tensor  # [B, T], no grad, 0 outside the mask
    mask: torch.Tensor
    cfg: LossConfig

    @property
    def ratio(self) -> torch.Tensor:
        return torch.exp(self.log_ratio)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over active positions (0 when none): for loss metrics."""
    return torch.where(mask > 0, x, 0.0).sum() / mask.sum().clamp(min=1)
