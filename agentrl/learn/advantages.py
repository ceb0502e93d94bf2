"""Group-relative advantages of episodes (per-turn credit: ``agentrl.learn.credit``).

Call these on the whole generation batch (gathered across processes) before splitting it into
micro-batches: group and batch statistics must see every episode of a group. Missing rewards are
NaN (``None`` in lists): a missing component contributes nothing; a row with no reward at all is
left out of its group's statistics, gets advantage 0 and is counted in ``num_no_reward``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import torch

Scale = Literal["group", "batch", "none"]
RewardRows = torch.Tensor | Sequence[float | None] | Sequence[Sequence[float | None]] | Sequence[Mapping[str, float | None]]
Weights = Sequence[float] | torch.Tensor | Mapping[str, float] | None


def rewards_tensor(rows: RewardRows, names: Sequence[str] | None = None) -> torch.Tensor:
    """Float64 tensor with NaN for missing, from a tensor, lists with ``None``, or dicts by name.

    For dicts, ``names`` fixes the column order (default: sorted union of keys); absent keys are NaN
    and keys outside ``names`` are an error (a misspelt reward name should not vanish silently).
    """
    if isinstance(rows, torch.Tensor):
        return rows.detach().to(torch.float64)
    rows = list(rows)
    if rows and isinstance(rows[0], Mapping):
        keys = {k for r in rows for k in r}
        cols = list(names) if names is not None else sorted(keys)
        if keys - set(cols):
            raise ValueError(f"rewards {sorted(keys - set(cols))} have no weight; weighted names: {cols}")
        rows = [[r.get(c) for c in cols] for r in rows]
    nan = float("nan")

    def conv(x: object) -> object:
        if x is None:
            return nan
        if isinstance(x, (list, tuple)):
            return [conv(v) for v in x]
        return float(x)  # type: ignore[arg-type]

    return torch.tensor([conv(r) for r in rows], dtype=torch.float64)


def _matrix(rows: RewardRows, weights: Weights) -> tuple[torch.Tensor, Sequence[float] | torch.Tensor | None]:
    """Rewards tensor and positional weights; a weights mapping names the dict columns."""
    if isinstance(weights, Mapping):
        return rewards_tensor(rows, names=list(weights)), list(weights.values())
    return rewards_tensor(rows), weights


def combine_rewards(rewards: torch.Tensor, weights: Sequence[float] | torch.Tensor | None = None) -> torch.Tensor:
    """Weighted sum over the last dim (components), skipping NaN; NaN where every component is missing."""
    r = rewards.to(torch.float64)
    if torch.isinf(r).any():
        raise ValueError("rewards contain +-inf; use NaN (or None) for a missing reward")
    w = torch.ones(r.shape[-1], dtype=torch.float64) if weights is None else torch.as_tensor(weights, dtype=torch.float64)
    if w.shape != (r.shape[-1],):
        raise ValueError(f"{r.shape[-1]} reward components but {tuple(w.shape)} weights")
    present = ~torch.isnan(r)
    total = torch.where(present, r * w.to(r.device), 0.0).sum(-1)
    return torch.where(present.any(-1), total, float("nan"))


def _normalise(
    values: torch.Tensor, valid: torch.Tensor, group_of: torch.Tensor, scale: Scale, eps: float, zero_std_tol: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """Subtract the group mean over valid entries, divide by the group/batch std; 0 where invalid or flat."""
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}")
    _, inv = torch.unique(group_of, return_inverse=True)
    n_groups = int(inv.max()) + 1 if inv.numel() else 0
    v = torch.where(valid, values, 0.0)
    cnt = torch.zeros(n_groups, dtype=torch.float64, device=v.device).index_add_(0, inv, valid.double())
    mean = torch.zeros_like(cnt).index_add_(0, inv, v) / cnt.clamp(min=1)
    dev = torch.where(valid, v - mean[inv], 0.0)
    ss = torch.zeros_like(cnt).index_add_(0, inv, dev**2)
    std = torch.sqrt(ss / (cnt - 1).clamp(min=1))  # unbiased, like torch.std; a single entry has std 0
    seen = cnt > 0
    flat = seen & (std <= zero_std_tol * (1 + mean.abs()))
    if scale == "group":
        denom = std[inv] + eps
    elif scale == "batch":
        n = valid.sum()
        batch_std = torch.sqrt(((v - v.sum() / n.clamp(min=1)) ** 2 * valid).sum() / (n - 1).clamp(min=1))
        denom = batch_std + eps
    else:
        denom = torch.ones_like(dev)
    adv = torch.where(valid & ~flat[inv], dev / denom, 0.0)
    n_seen = int(seen.sum())
    vals = values[valid]
    metrics = {
        "num_groups": float(n_seen),
        "frac_zero_std_groups": float(flat.sum()) / n_seen if n_seen else 0.0,
        "reward_mean": float(vals.mean()) if vals.numel() else 0.0,
        "reward_std": float(vals.std()) if vals.numel() > 1 else 0.0,
    }
    return adv, metrics


def _adv_stats(adv: torch.Tensor, prefix: str = "advantages") -> dict[str, float]:
    if adv.numel() == 0:
        return {}
    return {
        f"{prefix}/mean": float(adv.mean()),
        f"{prefix}/std": float(adv.std()) if adv.numel() > 1 else 0.0,
        f"{prefix}/min": float(adv.min()),
        f"{prefix}/max": float(adv.max()),
    }


def group_advantages(
    rewards: RewardRows,
    group_ids: torch.Tensor,
    *,
    weights: Weights = None,
    scale: Scale = "group",
    eps: float = 1e-4,
    zero_std_tol: float = 1e-6,
) -> tuple[torch.Tensor, dict[str, float]]:
    """[B] float32 advantages ``(R - mean_group) / (std + eps)`` and metrics.

    ``rewards``: [B] or [B, C] (C weighted components, NaN/None missing) or B dicts name -> value
    (``weights`` then a dict name -> weight, or None for all names at weight 1). ``group_ids``: [B];
    groups may differ in size. ``scale``: ``"group"`` divides by the group's std (GRPO),
    ``"batch"`` by the std of all rewards in the batch, ``"none"`` not at all (Dr. GRPO). A group
    whose rewards are all equal (within ``zero_std_tol``) gets advantage 0 whatever the scale.
    """
    r, w = _matrix(rewards, weights)
    total = combine_rewards(r if r.dim() == 2 else r[:, None], w)
    group_ids = torch.as_tensor(group_ids, device=total.device)
    if group_ids.shape != total.shape:
        raise ValueError(f"group_ids has shape {tuple(group_ids.shape)}, rewards give {tuple(total.shape)}")
    valid = ~torch.isnan(total)
    adv, metrics = _normalise(total, valid, group_ids, scale, eps, zero_std_tol)
    metrics["num_no_reward"] = float((~valid).sum())
    metrics.update(_adv_stats(adv))
    return adv.float(), metrics


__all__ = [
    "combine_rewards",
    "group_advantages",
    "rewards_tensor",
]
