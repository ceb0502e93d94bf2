"""The built-in objectives, one function each; each declares its default aggregation (TRL's).

A function returns the per-token loss (minus the objective) and its metrics; ``policy_loss``
weights, masks and aggregates it. Papers and formulas: docs/losses.md.
"""

from __future__ import annotations

import torch

from agentrl.learn.losses.inputs import LossInputs, masked_mean
from agentrl.learn.losses.registry import Metrics, register_loss


def _clipped(inp: LossInputs) -> tuple[torch.Tensor, Metrics]:
    """PPO clip-higher surrogate ``-min(r A, clip(r, 1-eps, 1+eps_high) A)`` with optional delta bound."""
    cfg, r, adv = inp.cfg, inp.ratio, inp.advantages
    lo, hi = 1 - cfg.eps_low, 1 + cfg.eps_high
    unclipped = r if cfg.delta is None else torch.clamp(r, max=cfg.delta)
    objective = torch.minimum(unclipped * adv, torch.clamp(r, lo, hi) * adv)
    low = (r < lo) & (adv < 0)
    high = (r > hi) & (adv > 0)
    metrics = {
        "clip_ratio/low": masked_mean(low.float(), inp.mask),
        "clip_ratio/high": masked_mean(high.float(), inp.mask),
        "clip_ratio/region": masked_mean((low | high).float(), inp.mask),
    }
    if cfg.delta is not None:
        metrics["clip_ratio/delta"] = masked_mean(((r > cfg.delta) & (adv < 0)).float(), inp.mask)
    return -objective, metrics


@register_loss("grpo", aggregation="sequence_mean")
def grpo_loss(inp: LossInputs) -> tuple[torch.Tensor, Metrics]:
    """GRPO (DeepSeekMath): clipped surrogate; each sequence's token mean, then the mean over sequences."""
    return _clipped(inp)


@register_loss("bnpo", aggregation="local_token_mean")
def bnpo_loss(inp: LossInputs) -> tuple[torch.Tensor, Metrics]:
    """BNPO: clipped surrogate; token mean of each micro-batch, averaged over micro-batches (as TRL)."""
    return _clipped(inp)


@register_loss("dr_grpo", aggregation="constant_sum")
def dr_grpo_loss(inp: LossInputs) -> tuple[torch.Tensor, Metrics]:
    """Dr. GRPO: clipped surrogate; token sum / (sequences x max_completion_length), free of lengths."""
    return _clipped(inp)


@register_loss("dapo", aggregation="token_mean")
def dapo_loss(inp: LossInputs) -> tuple[torch.Tensor, Metrics]:
    """DAPO token-level loss: clipped surrogate; token sum / active tokens of the optimizer step."""
    return _clipped(inp)


@register_loss("cispo", aggregation="token_mean")
def cispo_loss(inp: LossInputs) -> tuple[torch.Tensor, Metrics]:
    """CISPO (MiniMax-M1): ``-sg(min(r, 1+eps_high)) * A * logp``; every token keeps a gradient."""
    cap = 1 + inp.cfg.eps_high
    r = inp.ratio.detach()
    loss = -torch.clamp(r, max=cap) * inp.advantages * inp.logprobs
    capped = masked_mean((r > cap).float(), inp.mask)
    zero = torch.zeros((), device=r.device)
    return loss, {"clip_ratio/low": zero, "clip_ratio/high": capped, "clip_ratio/region": capped}


@register_loss("sapo", aggregation="sequence_mean")
def sapo_loss(inp: LossInputs) -> tuple[torch.Tensor, Metrics]:
    """SAPO: soft gate ``-(4/tau) sigmoid(tau (r - 1)) A``, tau by the advantage's sign; no hard clip.

    Sequence mean as in the SAPO paper and TRL.
    """
    cfg, r, adv = inp.cfg, inp.ratio, inp.advantages
    tau = torch.where(adv > 0, cfg.sapo_temperature_pos, cfg.sapo_temperature_neg).to(r.dtype)
    gate = torch.sigmoid(tau * (r - 1))
    # d objective / d log r = 4 s(1-s) r A: report the first factor, the gradient's soft trust weight.
    zero = torch.zeros((), device=r.device)
    metrics = {
        "clip_ratio/low": zero,
        "clip_ratio/high": zero,
        "clip_ratio/region": zero,
        "sapo/gate_weight_mean": masked_mean((4 * gate * (1 - gate)).detach(), inp.mask),
    }
    return -gate * (4.0 / tau) * adv, metrics
