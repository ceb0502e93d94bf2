"""Policy ratios (token or GSPO sequence level), the sampler-vs-trainer weight, and the k3 KL.

All functions take [B, T] tensors and a mask of active tokens; inactive positions may hold any
finite or infinite junk (padding), which is why masking uses ``torch.where`` and not multiplication.
"""

from __future__ import annotations

import torch

from agentrl.learn.losses.config import SamplerLevel, SamplerMode


def masked_seq_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B] sum of ``x`` over each row's active tokens."""
    return torch.where(mask > 0, x, 0.0).sum(-1)


def masked_seq_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B] mean of ``x`` over each row's active tokens (0 for rows without any)."""
    return masked_seq_sum(x, mask) / mask.sum(-1).clamp(min=1)


def log_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor | None, mask: torch.Tensor, level: str = "token"
) -> torch.Tensor:
    """Log of the PPO ratio, [B, T], differentiable through ``logprobs``.

    ``old_logprobs=None`` is on-policy: the old policy is the current one detached, so the ratio's
    value is exactly 1 and its gradient is the plain policy gradient. ``level="sequence"`` is GSPO:
    every token's value is the sequence's length-normalised log ratio ``mean_t(logp - old)``, and
    its gradient flows per token (GSPO-token): ``sg(seq) + logp - sg(logp)``.
    """
    old = logprobs.detach() if old_logprobs is None else old_logprobs.detach()
    token = torch.where(mask > 0, logprobs - old, 0.0)
    if level == "token":
        return token
    if level == "sequence":
        seq = masked_seq_mean(token, mask).detach()
        return seq[:, None] + torch.where(mask > 0, logprobs - logprobs.detach(), 0.0)
    raise ValueError(f"importance_sampling_level must be 'token' or 'sequence', got {level!r}")


def sampler_weight(
    old_logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: SamplerLevel = "token",
    mode: SamplerMode = "truncate",
    cap: float = 2.0,
    lower: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Detached importance weight correcting for sampling with a different engine than the trainer.

    ``w = exp(old - sampler)`` per token; ``"sequence"`` uses the product over the sequence
    (``exp(sum)``), ``"geometric"`` its length-normalised form (``exp(mean)``), broadcast to tokens.
    ``truncate`` clamps ``w`` into ``[lower, cap]``; ``mask`` zeroes weights outside ``[lower, cap]``.
    A sampler log-prob that is not finite (NaN: the engine did not report it) says nothing about the
    sampler: its token's log-weight is 0 (no correction), so it can never make the loss non-finite.
    Returns (weight applied [B, T], raw weight [B, T], changed [B, T] bool, non-finite [B, T] bool).
    """
    active = mask > 0
    nonfinite = active & ~torch.isfinite(sampler_logprobs)
    diff = torch.where(active & ~nonfinite, old_logprobs.detach() - sampler_logprobs.detach(), 0.0)
    if level == "token":
        log_w = diff
    elif level == "sequence":
        log_w = masked_seq_sum(diff, mask)[:, None].expand_as(diff)
    elif level == "geometric":
        log_w = masked_seq_mean(diff, mask)[:, None].expand_as(diff)
    else:
        raise ValueError(f"sampler_is_level must be 'token', 'sequence' or 'geometric', got {level!r}")
    raw = torch.exp(log_w)
    changed = (raw > cap) | (raw < lower)
    if mode == "truncate":
        applied = torch.clamp(raw, min=lower, max=cap)
    elif mode == "mask":
        applied = torch.where(changed, 0.0, raw)
    else:
        raise ValueError(f"sampler_is_mode must be 'truncate' or 'mask', got {mode!r}")
    return applied, raw, changed, nonfinite


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || ref): ``exp(ref - logp) - (ref - logp) - 1`` (>= 0, unbiased)."""
    d = torch.where(mask > 0, ref_logprobs.detach() - logprobs, 0.0)
    return torch.exp(d) - d - 1


def kl_weight(logprobs: torch.Tensor, old_logprobs: torch.Tensor | None, mask: torch.Tensor, level: str) -> torch.Tensor:
    """The policy ratio that weights the KL term (``kl_ratio_weighted``), with gradient, [B, T].

    Token level: ``exp(logp - old)``. Sequence level: ``exp(mean_t(logp - old))`` broadcast to the
    tokens, its gradient through the mean (the ratio of the sequence, as TRL's bias-corrected KL).
    """
    old = logprobs.detach() if old_logprobs is None else old_logprobs.detach()
    token = torch.where(mask > 0, logprobs - old, 0.0)
    if level == "sequence":
        return torch.exp(masked_seq_mean(token, mask))[:, None].expand_as(token)
    return torch.exp(token)
