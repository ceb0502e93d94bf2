"""``policy_loss``: the one entry point a trainer calls per micro-batch."""

from __future__ import annotations

import torch

from agentrl.losses.config import LossConfig
from agentrl.losses.registry import LOSSES, LossInputs
from agentrl.losses.weights import k3_kl, log_ratio, sampler_weight


def count_active_tokens(mask: torch.Tensor, truncated: torch.Tensor | None = None) -> int:
    """Active tokens as ``policy_loss`` counts them (truncated rows excluded).

    Sum this over every micro-batch of the generation batch and every process to get
    ``num_items_in_batch`` for the dapo/cispo/sapo normaliser.
    """
    m = mask > 0
    if truncated is not None:
        m = m & ~truncated.bool().to(m.device)[:, None]
    return int(m.sum())


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
    ref_logprobs: torch.Tensor | None = None,
    sampler_logprobs: torch.Tensor | None = None,
    truncated: torch.Tensor | None = None,
    num_items_in_batch: int | float | torch.Tensor | None = None,
    max_completion_length: int | None = None,
    entropies: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Scalar loss of one micro-batch and its metrics (floats, local to this micro-batch).

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

    m = (mask > 0).to(logprobs.dtype)
    if truncated is not None:
        m = m * (~truncated.bool().to(m.device))[:, None].to(m.dtype)
    active = m > 0
    adv = advantages.detach().to(device=logprobs.device, dtype=logprobs.dtype)
    if adv.shape == (B,):
        adv = adv[:, None].expand(B, T)
    elif adv.shape != (B, T):
        raise ValueError(f"advantages must be [B] or [B, T], got {tuple(adv.shape)} for logprobs {(B, T)}")
    adv = torch.where(active, adv, 0.0)

    tm: dict[str, torch.Tensor] = {}
    lr = log_ratio(logprobs, old_logprobs, m, cfg.importance_sampling_level)
    is_weight = None
    if sampler_logprobs is not None and cfg.sampler_is_mode is not None:
        old = logprobs.detach() if old_logprobs is None else old_logprobs
        is_weight, raw, changed = sampler_weight(
            old, sampler_logprobs, m, level=cfg.sampler_is_level, mode=cfg.sampler_is_mode, cap=cfg.sampler_is_cap
        )
        _stats(raw, active, "is_ratio", tm)
        word = "masked" if cfg.sampler_is_mode == "mask" else "truncated"
        tm[f"is_ratio/frac_{word}"] = (changed & active).sum() / active.sum().clamp(min=1)
    kl = None
    if ref_logprobs is not None:
        kl = k3_kl(logprobs, ref_logprobs, m)
        _stats(kl, active, "kl", tm)

    inp = LossInputs(
        logprobs=logprobs,
        log_ratio=lr,
        advantages=adv,
        mask=m,
        cfg=cfg,
        is_weight=is_weight,
        kl=kl if cfg.beta > 0 else None,
        num_items_in_batch=num_items_in_batch,
        max_completion_length=max_completion_length,
    )
    loss, loss_metrics = LOSSES[cfg.loss_type](inp)

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
