"""``policy_loss``: the one entry point a trainer calls per micro-batch."""

from __future__ import annotations

import torch

from agentrl.learn.losses.aggregation import AGGREGATIONS, StepCounts, active_mask
from agentrl.learn.losses.config import LossConfig
from agentrl.learn.losses.inputs import LossInputs
from agentrl.learn.losses.ratios import k3_kl, kl_weight, log_ratio, sampler_weight


def count_active_tokens(mask: torch.Tensor, truncated: torch.Tensor | None = None) -> int:
    """Active tokens as ``policy_loss`` counts them (truncated rows excluded)."""
    return int(active_mask(mask, truncated).sum())


def _stats(x: torch.Tensor, active: torch.Tensor, name: str, out: dict[str, torch.Tensor]) -> None:
    """Masked mean/min/max of ``x`` over active positions (nothing when none are active)."""
    if not bool(active.any()):
        return
    vals = x.detach()[active].float()
    out[f"{name}/mean"] = vals.mean()
    out[f"{name}/min"] = vals.min()
    out[f"{name}/max"] = vals.max()


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig | None = None,
    *,
    counts: StepCounts | None = None,
    ref_logprobs: torch.Tensor | None = None,
    sampler_logprobs: torch.Tensor | None = None,
    truncated: torch.Tensor | None = None,
    entropies: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """This micro-batch's share of the optimizer step's loss, and its metrics (floats, local).

    Contract with the trainer: pass every micro-batch of a step the same ``counts`` (totals over
    all micro-batches and all ranks, :class:`StepCounts`) and backpropagate the *sum* of the
    returned losses; the result is the step's loss whatever the micro-batch split, and under DDP
    (which averages gradients over ranks) the gradient of the whole step's loss, because the share
    is multiplied by ``counts.num_processes``. ``counts=None`` means this micro-batch is the step.

    Shapes: ``logprobs``/``old_logprobs``/``ref_logprobs``/``sampler_logprobs``/``mask``/
    ``entropies`` [B, T]; ``advantages`` [B] (per sequence) or [B, T] (per token); ``truncated`` [B]
    bool, whose rows are removed from the loss and from every data-dependent count.
    ``old_logprobs=None`` means on-policy (ratio exactly 1, gradient = policy gradient).
    ``sampler_logprobs`` enable the sampler-vs-trainer correction (unless ``cfg.sampler_is_mode``
    is None). ``ref_logprobs`` are required when ``cfg.beta > 0`` and give a KL metric otherwise.
    """
    cfg = cfg or LossConfig()
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [B, T], got {tuple(logprobs.shape)}")
    B, T = logprobs.shape
    for name, t in (("old_logprobs", old_logprobs), ("mask", mask), ("ref_logprobs", ref_logprobs),
                    ("sampler_logprobs", sampler_logprobs), ("entropies", entropies)):  # fmt: skip
        if t is not None and t.shape != (B, T):
            raise ValueError(f"{name} has shape {tuple(t.shape)}, logprobs has {(B, T)}")
    if truncated is not None and truncated.shape != (B,):
        raise ValueError(f"truncated must be [B]={B}, got {tuple(truncated.shape)}")
    if cfg.beta > 0 and ref_logprobs is None:
        raise ValueError(f"beta={cfg.beta} needs ref_logprobs for the KL penalty")

    active = active_mask(mask, truncated)
    m = active.to(logprobs.dtype)
    if counts is None:
        counts = StepCounts.single(mask, truncated)
    adv = advantages.detach().to(device=logprobs.device, dtype=logprobs.dtype)
    if adv.shape == (B,):
        adv = adv[:, None].expand(B, T)
    elif adv.shape != (B, T):
        raise ValueError(f"advantages must be [B] or [B, T], got {tuple(adv.shape)} for logprobs {(B, T)}")
    adv = torch.where(active, adv, 0.0)

    tm: dict[str, torch.Tensor] = {}
    lr = log_ratio(logprobs, old_logprobs, m, cfg.importance_sampling_level)
    spec = cfg.spec
    per_token, loss_metrics = spec.fn(LossInputs(logprobs=logprobs, log_ratio=lr, advantages=adv, mask=m, cfg=cfg))
    if per_token.shape != (B, T):
        raise ValueError(f"loss {spec.name!r} returned shape {tuple(per_token.shape)}; a loss returns the per-token loss {(B, T)}")

    if sampler_logprobs is not None and cfg.sampler_is_mode is not None:
        old = logprobs.detach() if old_logprobs is None else old_logprobs
        lower, upper = cfg.sampler_is_bounds
        is_weight, raw, changed, nonfinite = sampler_weight(
            old, sampler_logprobs, m, level=cfg.sampler_is_level, mode=cfg.sampler_is_mode, cap=upper, lower=lower
        )
        per_token = per_token * is_weight
        _stats(raw, active, "is_ratio", tm)
        word = "masked" if cfg.sampler_is_mode == "mask" else "truncated"
        tm[f"is_ratio/frac_{word}"] = (changed & active).sum() / active.sum().clamp(min=1)
        tm["is_ratio/num_nonfinite_sampler"] = nonfinite.sum()
    if ref_logprobs is not None:
        kl = k3_kl(logprobs, ref_logprobs, m)
        _stats(kl, active, "kl", tm)
        if cfg.beta > 0:
            if cfg.kl_ratio_weighted:
                kl = kl * kl_weight(logprobs, old_logprobs, m, cfg.importance_sampling_level)
            per_token = per_token + cfg.beta * kl

    aggregation = cfg.resolved_aggregation
    share = AGGREGATIONS[aggregation](torch.where(active, per_token, 0.0), m, counts)
    loss = share * counts.num_processes

    tm.update(loss_metrics)
    _stats(torch.exp(lr), active, "ratio", tm)
    _stats(adv, active, "advantages", tm)
    if entropies is not None:
        _stats(entropies, active, "entropy", tm)
    tm["loss"] = loss.detach()
    tm["num_active_tokens"] = m.sum()
    if truncated is not None:
        tm["num_truncated"] = truncated.bool().sum()
    keys = list(tm)
    values = torch.stack([tm[k].detach().float().to(logprobs.device) for k in keys]).tolist()  # one sync
    return loss, dict(zip(keys, values))
