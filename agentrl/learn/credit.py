"""Per-turn credit assignment: per-turn advantages with an unbiased per-turn baseline.

Episodes of one group (same task) may have different numbers of turns. A turn's return is its
reward-to-go within its episode; its baseline is the mean return at the same turn index over the
*other* episodes of the group that reached that turn (0 when none did). The baseline is a function
of other, independent episodes only, so it leaves the policy gradient unbiased whatever the turn
counts (docs/training.md, "Per-turn credit", has the estimator and the proof sketch). Baselines
that include the episode itself - the mean over every turn of the group, or over the turns at the
same index - are biased when the number of turns varies (tests/test_losses_turns.py measures it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

from agentrl.learn.advantages import Scale, group_advantages

AdvantageMode = Literal["episode", "turn"]  # the trainer's `advantage=episode|turn`
TurnRewards = Sequence[Sequence[float | None]]


def pad_turns(turn_rewards: TurnRewards) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 [E, K] rewards (NaN for missing and past the end) and long [E] turn counts."""
    counts = torch.tensor([len(t) for t in turn_rewards], dtype=torch.long)
    K = int(counts.max()) if len(counts) else 0
    out = torch.full((len(turn_rewards), K), float("nan"), dtype=torch.float64)
    for i, row in enumerate(turn_rewards):
        for k, r in enumerate(row):
            if r is not None:
                out[i, k] = float(r)
    return out, counts


def reward_to_go(turn_rewards: torch.Tensor, num_turns: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """[E, K] ``G_k = sum_{j >= k} gamma^(j-k) r_j`` within each episode (NaN reward = 0); NaN past its last turn."""
    r = torch.nan_to_num(turn_rewards.to(torch.float64), nan=0.0)
    E, K = r.shape
    g = torch.zeros_like(r)
    running = torch.zeros(E, dtype=r.dtype)
    for k in range(K - 1, -1, -1):  # K (turns) is small
        running = r[:, k] + gamma * running
        g[:, k] = running
    inside = torch.arange(K)[None, :] < num_turns[:, None]
    return torch.where(inside, g, float("nan"))


def turn_level_advantages(
    turn_rewards: torch.Tensor,
    num_turns: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    scale: Scale = "group",
    gamma: float = 1.0,
    eps: float = 1e-4,
    zero_std_tol: float = 1e-6,
) -> tuple[torch.Tensor, dict[str, float]]:
    """[E, K] float32 per-turn advantages ``(G_ik - b_ik) / s`` (0 past an episode's last turn).

    ``b_ik``: mean of ``G_jk`` over episodes ``j != i`` of the group with a turn ``k`` (0 if none).
    ``turn_rewards``: [E, K], NaN for a turn without reward and past the episode's end;
    ``num_turns``: [E]; ``group_ids``: [E]. An episode whose rewards are all missing is left out of
    every baseline and gets advantage 0. ``scale``: ``"none"`` is the unbiased estimator;
    ``"group"`` / ``"batch"`` divide by the std of the group's / batch's per-turn returns (each
    (episode, turn) once), GRPO's per-task step size; there a group (batch) whose returns are all
    equal gets 0.
    """
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}")
    E, K = turn_rewards.shape
    num_turns = torch.as_tensor(num_turns, dtype=torch.long)
    group_ids = torch.as_tensor(group_ids)
    if num_turns.shape != (E,) or group_ids.shape != (E,):
        raise ValueError(f"num_turns {tuple(num_turns.shape)} and group_ids {tuple(group_ids.shape)} must be [{E}]")
    if E and (int(num_turns.min()) < 1 or int(num_turns.max()) > K):
        raise ValueError(f"num_turns must lie in [1, {K}]")
    inside = torch.arange(K)[None, :] < num_turns[:, None]
    rewarded = ~(torch.isnan(turn_rewards) | ~inside).all(-1)  # [E]
    valid = inside & rewarded[:, None]  # (episode, turn) pairs that take part
    g = torch.where(valid, reward_to_go(turn_rewards, num_turns, gamma), 0.0)

    _, inv = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inv.max()) + 1 if E else 0
    v = valid.double()
    sum_gk = torch.zeros(n_groups, K, dtype=torch.float64).index_add_(0, inv, g)  # per group and turn index
    cnt_gk = torch.zeros(n_groups, K, dtype=torch.float64).index_add_(0, inv, v)
    others = cnt_gk[inv] - v  # episodes j != i with a turn k
    baseline = torch.where(others > 0, (sum_gk[inv] - g) / others.clamp(min=1), 0.0)
    adv = torch.where(valid, g - baseline, 0.0)

    # scale: std of the per-turn returns (each pair once) of the group or of the batch
    cnt = cnt_gk.sum(-1)
    mean = sum_gk.sum(-1) / cnt.clamp(min=1)
    ss = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, inv, (torch.where(valid, g - mean[inv, None], 0.0) ** 2).sum(-1))
    std = torch.sqrt(ss / (cnt - 1).clamp(min=1))
    flat = std <= zero_std_tol * (1 + mean.abs())
    if scale == "group":  # a flat group has nothing to scale by (and its returns nothing to learn from)
        adv = torch.where(flat[inv, None], 0.0, adv / (std[inv, None] + eps))
    elif scale == "batch":
        vals = g[valid]
        batch_std = float(vals.std()) if vals.numel() > 1 else 0.0
        adv = adv / (batch_std + eps) if batch_std > zero_std_tol else torch.zeros_like(adv)
    seen = cnt > 0
    metrics = {
        "num_groups": float(seen.sum()),
        "frac_zero_std_groups": float((flat & seen).sum()) / max(int(seen.sum()), 1),
        "num_no_reward": float((~rewarded).sum()),
        "turns/mean": float(num_turns.double().mean()) if E else 0.0,
        "return_mean": float(g[valid].mean()) if valid.any() else 0.0,
        "frac_turns_without_baseline": float((valid & (others == 0)).sum()) / max(int(valid.sum()), 1),
    }
    return adv.float(), metrics


def compute_advantages(
    episode_rewards: Sequence[float | None] | torch.Tensor,
    turn_rewards: TurnRewards,
    group_ids: Sequence[int] | torch.Tensor,
    *,
    mode: AdvantageMode = "episode",
    scale: Scale = "group",
    gamma: float = 1.0,
    eps: float = 1e-4,
) -> tuple[list[torch.Tensor], dict[str, float]]:
    """Per-turn advantages of each episode (a float32 [num_turns] tensor each) and metrics.

    ``episode_rewards``: each episode's total reward (None: no reward). ``turn_rewards``: per
    episode, one entry per turn (None: no reward at that turn); its length is the episode's number
    of turns. ``mode="episode"``: GRPO's group-relative advantage of the total, the same on every
    turn. ``mode="turn"``: :func:`turn_level_advantages`; the part of the total no turn accounts
    for (an episode-level reward) is credited to the last turn.
    """
    if mode not in ("episode", "turn"):
        raise ValueError(f"advantage mode must be 'episode' or 'turn', got {mode!r}")
    totals = torch.tensor([float("nan") if r is None else float(r) for r in episode_rewards], dtype=torch.float64)
    if len(turn_rewards) != len(totals) or len(group_ids) != len(totals):
        raise ValueError(f"{len(totals)} episode rewards, {len(turn_rewards)} turn-reward lists, {len(group_ids)} group ids")
    if any(len(t) == 0 for t in turn_rewards):
        raise ValueError("every episode needs at least one turn (an empty turn-reward list was given)")
    groups = torch.as_tensor(group_ids)
    _, counts = pad_turns(turn_rewards)
    if mode == "episode":
        adv, metrics = group_advantages(totals, groups, scale=scale, eps=eps)
        return [adv[i].expand(int(n)).clone() for i, n in enumerate(counts)], metrics
    per_turn, counts = pad_turns(turn_rewards)
    attributed = torch.nan_to_num(per_turn, nan=0.0).sum(-1)
    rows = torch.arange(len(totals))
    last = per_turn[rows, counts - 1]
    residual = torch.where(torch.isnan(totals), float("nan"), totals - attributed)
    per_turn[rows, counts - 1] = torch.where(torch.isnan(residual), last, torch.nan_to_num(last, nan=0.0) + residual)
    adv, metrics = turn_level_advantages(per_turn, counts, groups, scale=scale, gamma=gamma, eps=eps)
    return [adv[i, : int(n)].clone() for i, n in enumerate(counts)], metrics


def turns_to_tokens(per_turn: torch.Tensor, token_turn: torch.Tensor) -> torch.Tensor:
    """[B, T] per-token values from [B, K] per-turn values and each token's turn index (-1: none, gets 0)."""
    token_turn = torch.as_tensor(token_turn, dtype=torch.long, device=per_turn.device)
    if token_turn.numel() and int(token_turn.max()) >= per_turn.shape[1]:
        raise ValueError(f"token_turn has turn {int(token_turn.max())} but only {per_turn.shape[1]} turns")
    out = torch.gather(per_turn, 1, token_turn.clamp(min=0))
    return torch.where(token_turn >= 0, out, 0.0)


__all__ = ["AdvantageMode", "compute_advantages", "pad_turns", "reward_to_go", "turn_level_advantages", "turns_to_tokens"]
