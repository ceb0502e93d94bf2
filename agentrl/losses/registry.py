"""One function per loss type, looked up by name in ``LOSSES``.

Every loss function receives the prepared :class:`LossInputs` (ratios already at the configured
level, truncated rows already removed from the mask, sampler weights and KL already computed) and
returns the scalar loss plus its own tensor metrics. Adding a loss is one decorated function.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from agentrl.losses.config import LossConfig

Metrics = dict[str, torch.Tensor]
LossFn = Callable[["LossInputs"], tuple[torch.Tensor, Metrics]]

LOSSES: dict[str, LossFn] = {}


def register_loss(name: str) -> Callable[[LossFn], LossFn]:
    """Decorator: make ``fn`` available as ``LossConfig(loss_type=name)``."""

    def deco(fn: LossFn) -> LossFn:
        if name in LOSSES and LOSSES[name] is not fn:
            raise ValueError(f"loss {name!r} is already registered")
        LOSSES[name] = fn
        return fn

    return deco


@dataclass
class LossInputs:
    """Everything a loss needs, all [B, T] and aligned; ``mask`` is float 0/1 and final."""

    logprobs: torch.Tensor  # current policy, with grad
    log_ratio: torch.Tensor  # log of the PPO ratio at the configured level, with grad
    advantages: torch.Tensor  # [B, T], no grad
    mask: torch.Tensor  # active tokens (truncated rows already zeroed)
    cfg: LossConfig
    is_weight: torch.Tensor | None = None  # detached sampler-vs-trainer weight, already capped/masked
    kl: torch.Tensor | None = None  # per-token k3 KL to the reference, with grad
    num_items_in_batch: float | torch.Tensor | None = None
    max_completion_length: int | None = None

    @property
    def ratio(self) -> torch.Tensor:
        return torch.exp(self.log_ratio)


# ---- per-token pieces ---------------------------------------------------------------------------


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask > 0, x, 0.0).sum() / mask.sum().clamp(min=1)


def _finish(objective: torch.Tensor, inp: LossInputs) -> torch.Tensor:
    """Per-token loss: minus the objective, weighted by the sampler correction, plus beta * KL."""
    loss = -objective
    if inp.is_weight is not None:
        loss = loss * inp.is_weight
    if inp.kl is not None and inp.cfg.beta != 0.0:
        loss = loss + inp.cfg.beta * inp.kl
    return torch.where(inp.mask > 0, loss, 0.0)


def _clipped_objective(inp: LossInputs) -> tuple[torch.Tensor, Metrics]:
    """PPO clip-higher surrogate ``min(r A, clip(r, 1-eps, 1+eps_high) A)`` with optional delta bound."""
    cfg, r, adv = inp.cfg, inp.ratio, inp.advantages
    lo, hi = 1 - cfg.eps_low, 1 + cfg.eps_high
    unclipped = r if cfg.delta is None else torch.clamp(r, max=cfg.delta)
    objective = torch.minimum(unclipped * adv, torch.clamp(r, lo, hi) * adv)
    low = (r < lo) & (adv < 0)
    high = (r > hi) & (adv > 0)
    metrics = {
        "clip_ratio/low": _masked_mean(low.float(), inp.mask),
        "clip_ratio/high": _masked_mean(high.float(), inp.mask),
        "clip_ratio/region": _masked_mean((low | high).float(), inp.mask),
    }
    if cfg.delta is not None:
        metrics["clip_ratio/delta"] = _masked_mean(((r > cfg.delta) & (adv < 0)).float(), inp.mask)
    return objective, metrics


# ---- normalisers --------------------------------------------------------------------------------


def _sequence_mean(loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over each sequence's active tokens, then over sequences that have any."""
    lengths = mask.sum(-1)
    has = lengths > 0
    per_seq = loss.sum(-1) / lengths.clamp(min=1)
    return torch.where(has, per_seq, 0.0).sum() / has.sum().clamp(min=1)


def _global_tokens(loss: torch.Tensor, inp: LossInputs) -> torch.Tensor:
    """Sum over tokens / active tokens of the whole generation batch (caller's ``num_items_in_batch``).

    Without it, falls back to this batch's active tokens: exact for one process and no accumulation.
    """
    n = inp.num_items_in_batch
    if n is None:
        n = inp.mask.sum().clamp(min=1)
    elif float(n) <= 0:
        raise ValueError(f"num_items_in_batch must be > 0, got {float(n)}")
    return loss.sum() / n


# ---- the losses ---------------------------------------------------------------------------------


@register_loss("grpo")
def grpo_loss(inp: LossInputs) -> tuple[torch.Tensor, Metrics]:
    """GRPO (DeepSeekMath): clipped surrogate, mean per sequence then over sequences."""
    objective, metrics = _clipped_objective(inp)
    return _sequence_mean(_finish(objective, inp), inp.mask), metrics


@register_loss("bnpo")
def bnpo_loss(inp: LossInputs) -> tuple[torch.Tensor, Metrics]:
    """BNPO: clipped surrogate, sum over the local batch / its active token count."""
    objective, metrics = _clipped_objective(inp)
    return _finish(objective, inp).sum() / inp.mask.sum().clamp(min=1), metrics


@register_loss("dr_grpo")
def dr_grpo_loss(inp: LossInputs) -> tuple[torch.Tensor, Metrics]:
    """Dr. GRPO: clipped surrogate, sum / (rows x max_completion_length), a constant free of lengths."""
    if inp.max_completion_length is None or inp.max_completion_length <= 0:
        raise ValueError("loss_type='dr_grpo' needs max_completion_length (a positive constant) from the caller")
    objective, metrics = _clipped_objective(inp)
    return _finish(objective, inp).sum() / (inp.mask.shape[0] * inp.max_completion_length), metrics


@register_loss("dapo")
def dapo_loss(inp: LossInputs) -> tuple[torch.Tensor, Metrics]:
    """DAPO token-level loss: clipped surrogate, sum / active tokens of the whole generation batch."""
    objective, metrics = _clipped_objective(inp)
    return _global_tokens(_finish(objective, inp), inp), metrics


@register_loss("cispo")
def cispo_loss(inp: LossInputs) -> tuple[torch.Tensor, Metrics]:
    """CISPO (MiniMax-M1): ``sg(min(r, 1+eps_high)) * A * logp``; every token keeps a gradient."""
    cap = 1 + inp.cfg.eps_high
    r = inp.ratio.detach()
    weight = torch.clamp(r, max=cap)
    objective = weight * inp.advantages * inp.logprobs
    capped = _masked_mean((r > cap).float(), inp.mask)
    zero = torch.zeros((), device=r.device)
    metrics = {"clip_ratio/low": zero, "clip_ratio/high": capped, "clip_ratio/region": capped}
    return _global_tokens(_finish(objective, inp), inp), metrics


@register_loss("sapo")
def sapo_loss(inp: LossInputs) -> tuple[torch.Tensor, Metrics]:
    """SAPO: soft gate ``(4/tau) * sigmoid(tau (r - 1)) * A``, tau by the advantage's sign; no hard clip."""
    cfg, r, adv = inp.cfg, inp.ratio, inp.advantages
    tau = torch.where(adv > 0, cfg.sapo_temperature_pos, cfg.sapo_temperature_neg).to(r.dtype)
    gate = torch.sigmoid(tau * (r - 1))
    objective = gate * (4.0 / tau) * adv
    # d objective / d log r = 4 s(1-s) r A: report the first factor, the gradient's soft trust weight.
    zero = torch.zeros((), device=r.device)
    metrics = {
        "clip_ratio/low": zero,
        "clip_ratio/high": zero,
        "clip_ratio/region": zero,
        "sapo/gate_weight_mean": _masked_mean((4 * gate * (1 - gate)).detach(), inp.mask),
    }
    return _global_tokens(_finish(objective, inp), inp), metrics
