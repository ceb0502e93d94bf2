"""The typed boundary between rollouts and learning: ``Batch``, built by one function from trajectory groups.

Why one record: the learning side (log-probs, losses, optimizer, and later other ranks or another
process) needs the same few tensors whatever produced the episodes. A row is one training
sequence (a ``Sample``; an episode the engine split has several rows). Each row is laid out
prompt, completion, padding (right padding only), with its completion starting at ``starts[b]``;
``agentrl.compute.logprobs.completion_logprobs`` returns [B, C] log-probs aligned with ``loss_mask`` and
the other [B, C] tensors. Right padding needs no attention mask in the training forward: with
left padding, the bf16 backward over fully masked padding queries made gradients non-finite on
an H100 (benchmarks/RESULTS.md, issue 13).

Per-turn reward components are kept (``reward_components`` [B, K, R], ``turn_rewards`` [B, K])
with each sampled token's turn (``token_turn`` [B, C]), so advantages can be per token; today's
estimator is the episode-level group advantage, broadcast over each row's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentrl.core.errors import AgentrlError
from agentrl.core.trajectory import Sample, Trajectory, TrajectoryGroup
from agentrl.learn.advantages import Scale
from agentrl.learn.losses import AdvantageMode, compute_advantages


class EmptyBatchError(AgentrlError, RuntimeError):
    """No episode of a generation batch produced a trainable token."""


@dataclass
class Batch:
    """One generation batch, ready for the trainer. B rows, P prompt and C completion columns,
    K turns (the most any episode had), R reward components."""

    input_ids: torch.Tensor  # [B, W] long; prompt then completion, right-padded with the pad id
    starts: torch.Tensor  # [B] long; the column where each row's completion starts (its prompt length)
    lengths: torch.Tensor  # [B] long; prompt + completion tokens of each row
    loss_mask: torch.Tensor  # [B, C] float; 1 exactly on sampled tokens
    sampler_logprobs: torch.Tensor  # [B, C] float; the generator's, 0 where the mask is 0
    advantages: torch.Tensor  # [B, C] float; per token
    token_turn: torch.Tensor  # [B, C] long; the episode turn of each sampled token, -1 elsewhere
    turn_rewards: torch.Tensor  # [B, K] float64; the weighted reward of each turn of the row's episode, NaN past its last
    reward_components: torch.Tensor  # [B, K, R] float64; unweighted components per turn, NaN where absent
    reward_names: list[str]  # R component names, the last axis of reward_components
    rewards: torch.Tensor  # [B] float; the row's episode reward (weighted total)
    truncated: torch.Tensor  # [B] bool; the episode hit a limit
    group_ids: torch.Tensor  # [B] long; rows of one task (GRPO group) share it
    episode_ids: torch.Tensor  # [B] long; index into ``trajectories``
    samples: list[Sample]  # [B] the Sample each row came from
    logged: torch.Tensor  # [B] bool; rows whose trainer log-probs are written back to their Sample (samples.jsonl)
    trajectories: list[Trajectory]  # the episodes trained on (failed ones are left out)
    metrics: dict[str, float]  # reward and advantage statistics of this batch

    def __len__(self) -> int:
        return int(self.loss_mask.shape[0])

    @property
    def completion_len(self) -> int:
        return int(self.loss_mask.shape[1])


def build_batch(
    groups: list[TrajectoryGroup], *, pad_id: int, scale: Scale = "group", log_episodes: int = 0, mode: AdvantageMode = "episode",
    guided_weight: float = 1.0, accuracy: str | None = None,
) -> Batch:
    """The ``Batch`` of these groups: failed episodes dropped, rewards kept per turn, advantages per token.

    ``scale``: the advantage normalisation (``group``, ``batch``, ``none``). ``mode``: ``episode``
    (GRPO: the episode's group-relative advantage on every token) or ``turn`` (each turn's tokens
    get that turn's advantage, ``agentrl.learn.losses.turn_level_advantages``). ``log_episodes``: the
    first this many episodes get the trainer's log-probs written back onto their samples.
    ``guided_weight``: multiplies the advantages of demonstrated episodes (``guidance.weight``,
    agentrl/rollout/guidance.py) after the group normalisation.
    """
    trajs: list[Trajectory] = []
    group_of: list[int] = []
    for g, group in enumerate(groups):
        for t in group.ok:
            trajs.append(t)
            group_of.append(g)
    rows = [(e, s) for e, t in enumerate(trajs) for s in t.samples if s.num_sampled > 0]
    if not rows:
        failed = [t for g in groups for t in g.trajectories if not t.ok]
        first = f"; first error: {failed[0].error}" if failed else ""
        raise EmptyBatchError(f"no episode of this generation batch has a sampled token ({len(failed)} of {sum(len(g.trajectories) for g in groups)} failed{first})")

    rewards = torch.tensor([t.reward for t in trajs], dtype=torch.float32)
    turn_values = [[turn.reward for turn in t.turns] or [0.0] for t in trajs]
    per_turn, adv_metrics = compute_advantages([t.reward for t in trajs], turn_values, group_of, mode=mode, scale=scale)
    if guided_weight != 1.0:
        per_turn = [adv * guided_weight if t.guided else adv for adv, t in zip(per_turn, trajs)]
    turn_rewards, components, names = _turn_rewards(trajs)

    B = len(rows)
    C = max(len(s.completion_ids) for _, s in rows)
    W = max(len(s.prompt_ids) + len(s.completion_ids) for _, s in rows)
    ids = torch.full((B, W), pad_id, dtype=torch.long)
    mask = torch.zeros((B, C), dtype=torch.float32)
    sampler = torch.zeros((B, C), dtype=torch.float32)
    token_turn = torch.full((B, C), -1, dtype=torch.long)
    for i, (e, s) in enumerate(rows):
        p, c = len(s.prompt_ids), len(s.completion_ids)
        ids[i, : p + c] = torch.tensor(s.prompt_ids + s.completion_ids)
        mask[i, :c] = torch.tensor(s.loss_mask, dtype=torch.float32)
        sampler[i, :c] = torch.tensor(s.logprobs, dtype=torch.float32)
        sample_index = next(k for k, other in enumerate(trajs[e].samples) if other is s)
        for turn in trajs[e].turns:
            if turn.sample == sample_index and turn.num_sampled:
                token_turn[i, turn.start : turn.start + turn.num_sampled] = turn.index
    episode = torch.tensor([e for e, _ in rows], dtype=torch.long)
    return Batch(
        input_ids=ids,
        starts=torch.tensor([len(s.prompt_ids) for _, s in rows], dtype=torch.long),
        lengths=torch.tensor([len(s.prompt_ids) + len(s.completion_ids) for _, s in rows], dtype=torch.long),
        loss_mask=mask,
        sampler_logprobs=sampler,
        advantages=_token_advantages(per_turn, episode, token_turn),
        token_turn=token_turn,
        turn_rewards=turn_rewards[episode],
        reward_components=components[episode],
        reward_names=names,
        rewards=rewards[episode],
        truncated=torch.tensor([trajs[e].truncated for e, _ in rows], dtype=torch.bool),
        group_ids=torch.tensor(group_of, dtype=torch.long)[episode],
        episode_ids=episode,
        samples=[s for _, s in rows],
        logged=episode < log_episodes,
        trajectories=trajs,
        metrics=reward_metrics(trajs, accuracy) | {f"adv/{k}": v for k, v in adv_metrics.items()},
    )


def _token_advantages(per_turn: list[torch.Tensor], episode: torch.Tensor, token_turn: torch.Tensor) -> torch.Tensor:
    """[B, C]: each sampled token gets its turn's advantage (0 where no turn: masked tokens)."""
    out = torch.zeros(token_turn.shape, dtype=torch.float32)
    for i, e in enumerate(episode.tolist()):
        turns = token_turn[i]
        has = turns >= 0
        adv = per_turn[e]
        out[i, has] = adv[turns[has].clamp(max=len(adv) - 1)].float()
    return out


def _turn_rewards(trajs: list[Trajectory]) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """[E, K] weighted turn rewards and [E, K, R] components (NaN where absent), and the R names."""
    names = sorted({k for t in trajs for turn in t.turns for k in turn.rewards})
    col = {n: j for j, n in enumerate(names)}
    K = max((len(t.turns) for t in trajs), default=0)
    totals = torch.full((len(trajs), K), float("nan"), dtype=torch.float64)
    comps = torch.full((len(trajs), K, len(names)), float("nan"), dtype=torch.float64)
    for e, t in enumerate(trajs):
        for k, turn in enumerate(t.turns):
            totals[e, k] = turn.reward
            for name, value in turn.rewards.items():
                if value is not None:
                    comps[e, k, col[name]] = value
    return totals, comps, names


def reward_metrics(trajs: list[Trajectory], accuracy: str | None = None) -> dict[str, float]:
    """Mean reward and each component's mean over the episodes where it applied: the policy's own
    episodes (demonstrated ones, agentrl/rollout/guidance.py, are trained on but are not its reward).
    ``accuracy``: the component also logged as ``accuracy`` (the environment's ``accuracy_reward``)."""
    trajs = [t for t in trajs if not t.guided]
    rewards = torch.tensor([t.reward for t in trajs], dtype=torch.float32)
    out = {"reward/mean": float(rewards.mean()) if trajs else 0.0, "reward/std": float(rewards.std()) if len(trajs) > 1 else 0.0}
    for name in sorted({k for t in trajs for k in t.rewards}):
        values = [t.rewards[name] for t in trajs if t.rewards.get(name) is not None]
        if values:
            out[f"reward/{name}"] = sum(values) / len(values)
            out[f"reward/{name}/std"] = float(torch.tensor(values, dtype=torch.float64).std()) if len(values) > 1 else 0.0
    if accuracy is not None and f"reward/{accuracy}" in out:
        out["accuracy"] = out[f"reward/{accuracy}"]
    return out | group_metrics(trajs)


def group_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """Per-step metrics a TRL user reads (docs/training.md has the table): ``reward/group_std`` is the
    mean over groups of the std within each group (unbiased, as ``torch.std``: what the advantages see,
    unlike the batch's ``reward/std``); completion lengths are sampled tokens per episode; the clipped
    ratio is the share of episodes cut by a token or turn limit."""
    groups: dict[int, list[float]] = {}
    for t in trajs:
        groups.setdefault(t.group, []).append(t.reward)
    stds = [float(torch.tensor(r, dtype=torch.float64).std()) for r in groups.values() if len(r) > 1]
    lengths = [t.num_sampled for t in trajs]
    if not lengths:
        return {}
    return {
        "reward/group_std": sum(stds) / len(stds) if stds else 0.0,
        "completions/mean_length": sum(lengths) / len(lengths),
        "completions/min_length": float(min(lengths)),
        "completions/max_length": float(max(lengths)),
        "completions/clipped_ratio": sum(t.truncated for t in trajs) / len(trajs),
    }
