"""build_batch: padding the loss expects, masks, per-turn rewards kept, advantages per episode, failures."""

from __future__ import annotations

import math

import anyio
import pytest
import torch

from agentrl.compute.logprobs import completion_logprobs, token_logprobs
from agentrl.core.records import ToolRecord
from agentrl.core.trajectory import Sample, Trajectory, TrajectoryGroup, Turn
from agentrl.learn.batch import EmptyBatchError, build_batch

PAD = 0


def episode(prompt, turns, reward_by_turn, split_after=None, error=None, truncated=False):
    """A hand-built trajectory: ``turns`` = [(sampled ids, env ids)], rewards per turn as dicts."""
    t = Trajectory(task={"q": 1}, seed=0, truncated=truncated, error=error)
    sample = Sample(prompt_ids=list(prompt))
    t.samples.append(sample)
    for k, (sampled, env) in enumerate(turns):
        start = len(sample.completion_ids)
        sample.extend(list(sampled), sampled=True, logprobs=[-0.5] * len(sampled))
        comps = reward_by_turn[k]
        turn = Turn(index=k, message={"role": "assistant"}, num_sampled=len(sampled), finish_reason="stop",
                    reward=sum(v for v in comps.values() if v is not None), rewards=dict(comps),
                    sample=len(t.samples) - 1, start=start, tool_records=[ToolRecord("calc", "ok", 0.01)])
        t.turns.append(turn)
        if split_after == k:
            sample = Sample(prompt_ids=list(prompt) + [9, 9])
            t.samples.append(sample)
        elif env:
            sample.extend(list(env), sampled=False)
    t.reward = sum(turn.reward for turn in t.turns)
    for turn in t.turns:
        for name, v in turn.rewards.items():
            if v is not None:
                t.rewards[name] = t.rewards.get(name, 0.0) + v
    return t


def groups():
    a = episode([5, 6, 7], [([11, 12], [40, 41, 42]), ([13], [])], [{"step": 0.5}, {"correct": 1.0, "step": None}])
    b = episode([5, 6], [([21, 22, 23], [])], [{"correct": 0.0}], truncated=True)
    c = episode([8], [([31], [50]), ([32, 33], [])], [{"step": 0.5}, {"correct": 0.0}], split_after=0)  # two rows
    d = episode([8], [([1], [])], [{"correct": 1.0}], error="RuntimeError: boom")  # failed: dropped
    e = episode([8, 8, 8, 8], [([34], [])], [{"correct": 1.0}])
    return [TrajectoryGroup(task={}, seed=0, trajectories=[a, b]), TrajectoryGroup(task={}, seed=1, trajectories=[c, d, e])]


def test_layout_masks_and_turns():
    batch = build_batch(groups(), pad_id=PAD, log_episodes=1)
    B, C = batch.loss_mask.shape
    W = max(len(s.prompt_ids) + len(s.completion_ids) for s in batch.samples)
    assert B == 5 and C == 6 and batch.input_ids.shape == (5, W)  # C = longest completion, W = longest row
    for i, s in enumerate(batch.samples):
        p, c = len(s.prompt_ids), len(s.completion_ids)
        assert batch.input_ids[i].tolist() == s.prompt_ids + s.completion_ids + [PAD] * (W - p - c)  # right padding only
        assert int(batch.starts[i]) == p and int(batch.lengths[i]) == p + c
        assert batch.loss_mask[i, :c].tolist() == s.loss_mask and batch.loss_mask[i, c:].sum() == 0
        assert torch.equal(batch.token_turn[i] >= 0, batch.loss_mask[i] > 0)  # a turn exactly on sampled tokens
    assert batch.token_turn[0].tolist() == [0, 0, -1, -1, -1, 1]
    assert batch.token_turn[2].tolist()[:2] == [0, -1] and batch.token_turn[3].tolist()[:2] == [1, 1]  # the split episode's turns
    assert batch.truncated.tolist() == [False, True, False, False, False]
    assert batch.group_ids.tolist() == [0, 0, 1, 1, 1] and batch.episode_ids.tolist() == [0, 1, 2, 2, 3]
    assert batch.logged.tolist() == [True, False, False, False, False]
    assert batch.sampler_logprobs[0].tolist() == [-0.5, -0.5, 0.0, 0.0, 0.0, -0.5]


def test_per_turn_rewards_are_kept():
    batch = build_batch(groups(), pad_id=PAD)
    assert batch.reward_names == ["correct", "step"]
    assert batch.turn_rewards.shape == (5, 2) and batch.reward_components.shape == (5, 2, 2)
    assert batch.turn_rewards[0].tolist() == [0.5, 1.0]
    comps = batch.reward_components[0]
    assert math.isnan(comps[0, 0]) and comps[0, 1] == 0.5 and comps[1, 0] == 1.0 and math.isnan(comps[1, 1])  # None stays missing
    assert math.isnan(batch.turn_rewards[1, 1])  # b has one turn
    assert torch.allclose(torch.nansum(batch.turn_rewards, 1), batch.rewards.double())  # turns add up to the episode
    assert batch.metrics["reward/correct"] == pytest.approx(0.5) and "accuracy" not in batch.metrics  # no component is declared the accuracy
    declared = build_batch(groups(), pad_id=PAD, accuracy="correct")  # the environment's accuracy_reward
    assert declared.metrics["accuracy"] == pytest.approx(0.5)
    assert build_batch(groups(), pad_id=PAD, accuracy="step").metrics["accuracy"] == pytest.approx(batch.metrics["reward/step"])


def test_advantages_are_per_episode_and_per_token():
    batch = build_batch(groups(), pad_id=PAD, scale="none")
    # group 0: rewards 1.5, 0.0 -> +-0.75; group 1 (d failed): c = 0.5, e = 1.0 -> -0.25, +0.25, both rows of c alike
    assert batch.advantages.shape == batch.loss_mask.shape
    assert batch.advantages[:, 0].tolist() == pytest.approx([0.75, -0.75, -0.25, -0.25, 0.25])
    sampled = batch.loss_mask > 0  # every sampled token carries its episode's advantage, the rest 0
    assert torch.equal(batch.advantages, torch.where(sampled, batch.advantages[:, :1].expand_as(batch.advantages), 0.0))
    assert batch.metrics["reward/mean"] == pytest.approx((1.5 + 0.0 + 0.5 + 1.0) / 4)


def test_turn_mode_gives_each_turn_its_own_advantage():
    """advantage=turn: a turn's tokens get that turn's advantage (reward-to-go minus the same-turn
    baseline of the group's other episodes), so the two turns of episode a differ."""
    batch = build_batch(groups(), pad_id=PAD, scale="none", mode="turn")
    a = batch.advantages[0]
    turn = batch.token_turn[0]
    # episode a: turns rewarded 0.5 then 1.0 (return-to-go 1.5, 1.0); b has one turn worth 0.0
    # turn 0 baseline = b's return 0.0 -> +1.5; turn 1: nobody else reached it -> baseline 0 -> +1.0
    assert a[turn == 0].unique().tolist() == pytest.approx([1.5])
    assert a[turn == 1].unique().tolist() == pytest.approx([1.0])
    assert batch.advantages[1][batch.token_turn[1] == 0].unique().tolist() == pytest.approx([-1.5])


def test_no_trainable_episode_names_the_first_error():
    t = Trajectory(task={}, seed=0, error="GenerationError: out of memory")
    with pytest.raises(EmptyBatchError, match="1 of 1 failed; first error: GenerationError: out of memory"):
        build_batch([TrajectoryGroup(task={}, seed=0, trajectories=[t])], pad_id=PAD)


def test_padding_lines_up_with_completion_columns():
    """Log-probs of the padded batch (completion_logprobs) equal each sample's own, unpadded."""
    from agentrl.compute.models import load_model

    model = load_model("default", dtype=torch.float32, device="cpu")
    batch = build_batch(groups(), pad_id=PAD)
    with torch.no_grad():
        lp = completion_logprobs(model, batch.input_ids, batch.starts, batch.completion_len)
        for i, s in enumerate(batch.samples):
            ids = torch.tensor([s.ids])
            own = token_logprobs(model, ids, torch.ones_like(ids), logits_to_keep=len(s.completion_ids))
            m = batch.loss_mask[i, : len(s.completion_ids)] > 0
            assert torch.allclose(lp[i, : len(s.completion_ids)][m], own[0][m], atol=1e-4)


def test_rollout_keeps_turn_rewards_and_token_positions():
    """A real multi-turn rollout: each turn's sampled tokens are where the Turn says, rewards per turn add up."""
    from agentrl.chat import get_chat_format
    from agentrl.compute.models import load_model, load_tokenizer
    from agentrl.environments.calculator import CalculatorEnv
    from agentrl.generators import SamplingConfig
    from agentrl.generators.hf.generator import TransformersGenerator
    from agentrl.rollout.config import RolloutConfig
    from agentrl.rollout.engine import RolloutEngine

    model = load_model("default", dtype=torch.float32, device="cpu")
    fmt = get_chat_format(load_tokenizer("default"))
    env = CalculatorEnv(num_train=16, num_test=4, format_weight=0.4)
    gen = TransformersGenerator(model, pad_token_id=0, gather_window_s=0.01)
    engine = RolloutEngine(gen, fmt, RolloutConfig(max_tokens_per_turn=48, max_completion_tokens=200), SamplingConfig(temperature=1.0, seed=1))
    tasks = [dict(env.dataset("train")[i]) for i in range(3)]
    out = anyio.run(lambda: engine.run(env, tasks, n=2, seed=0))
    anyio.run(gen.close)
    trajs = [t for g in out for t in g.ok]
    assert any(len(t.turns) > 1 for t in trajs)
    for t in trajs:
        for turn in t.turns:
            s = t.samples[turn.sample]
            assert s.loss_mask[turn.start : turn.start + turn.num_sampled] == [1] * turn.num_sampled
            assert all(isinstance(r, ToolRecord) for r in turn.tool_records)
        assert sum(turn.reward for turn in t.turns) == pytest.approx(t.reward)
        assert "correct" in t.turns[-1].rewards
    again = Trajectory.from_dict(trajs[0].to_dict())  # records stay typed through JSON
    assert all(isinstance(r, ToolRecord) for turn in again.turns for r in turn.tool_records)
    batch = build_batch(out, pad_id=0)
    assert torch.equal(batch.token_turn >= 0, batch.loss_mask > 0)
