"""Per-turn credit: the unbiased per-turn baseline against the naive ones, by exact expectation."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from agentrl.learn.losses import compute_advantages, turn_level_advantages, turns_to_tokens

# A two-parameter agent: turn 0 answers directly (P = 1 - p0, reward 0.9, episode over) or calls a
# tool (reward 0.3 for a well-formed call, a second turn follows); turn 1 answers right with P = p1
# (reward 1). Episodes therefore have 1 or 2 turns, chosen by the policy itself.
P0, P1, DIRECT, CALL = 0.2, 0.5, 0.9, 0.3
# outcome -> (per-turn rewards, per-turn (parameter, d log pi / d parameter))
OUTCOMES = {
    "direct": ([DIRECT], [(0, -P0)]),
    "wrong": ([CALL, 0.0], [(0, 1 - P0), (1, -P1)]),
    "right": ([CALL, 1.0], [(0, 1 - P0), (1, 1 - P1)]),
}
PROB = {"direct": 1 - P0, "wrong": P0 * (1 - P1), "right": P0 * P1}
# J = (1 - p0) * 0.9 + p0 * (0.3 + p1), p = sigmoid(theta)
TRUE_GRAD = torch.tensor([P0 * (1 - P0) * (CALL + P1 - DIRECT), P0 * P1 * (1 - P1)], dtype=torch.float64)


def returns(rewards: list[float]) -> list[float]:
    return [sum(rewards[k:]) for k in range(len(rewards))]


def naive_same_index(rets: list[list[float]]) -> list[list[float]]:
    """Baseline: mean return at the same turn index over the group's episodes that have it (self included)."""
    out = []
    for g in rets:
        out.append([g[k] - sum(r[k] for r in rets if len(r) > k) / sum(len(r) > k for r in rets) for k in range(len(g))])
    return out


def naive_all_turns(rets: list[list[float]]) -> list[list[float]]:
    """Baseline: mean return over every (episode, turn) of the group (self included)."""
    pool = [x for r in rets for x in r]
    return [[x - sum(pool) / len(pool) for x in r] for r in rets]


def ours(rets: list[list[float]], rewards: list[list[float]]) -> list[list[float]]:
    adv, _ = compute_advantages([sum(r) for r in rewards], rewards, [0] * len(rewards), mode="turn", scale="none")
    return [a.double().tolist() for a in adv]


def expected_gradient(estimator, group_size: int) -> torch.Tensor:
    """E[(1/G) sum_i sum_k grad log pi(a_ik) A_ik], exactly, by enumerating every group of outcomes."""
    total = torch.zeros(2, dtype=torch.float64)
    for combo in itertools.product(OUTCOMES, repeat=group_size):
        prob = math.prod(PROB[o] for o in combo)
        rewards = [OUTCOMES[o][0] for o in combo]
        adv = estimator([returns(r) for r in rewards], rewards)
        for i, o in enumerate(combo):
            for k, (param, score) in enumerate(OUTCOMES[o][1]):
                total[param] += prob * score * adv[i][k] / group_size
    return total


@pytest.mark.parametrize("group_size", [2, 3, 4])
def test_unbiased_per_turn_baseline(group_size):
    grad = expected_gradient(ours, group_size)
    torch.testing.assert_close(grad, TRUE_GRAD, rtol=1e-6, atol=0)


@pytest.mark.parametrize("group_size", [2, 3, 4])
def test_naive_per_turn_baselines_are_biased(group_size):
    # Over all turns: the episode's own turns sit in its baseline, more of them when it calls the
    # tool, so the bias depends on the action: not a rescaled true gradient, and in small groups the
    # expected update favours the tool although answering directly earns more (0.9 vs 0.8).
    all_turns = expected_gradient(lambda rets, _: naive_all_turns(rets), group_size)
    ratio = all_turns / TRUE_GRAD
    assert abs(ratio[0] / ratio[1] - 1) > 0.2, ratio
    if group_size <= 3:
        assert TRUE_GRAD[0] < 0 < all_turns[0], all_turns
    # Same turn index: each turn's credit shrinks by E[1 - 1/n_k] (n_k: episodes reaching turn k, self
    # included), smaller for the rarely reached second turn: not a rescaled true gradient.
    same_index = expected_gradient(lambda rets, _: naive_same_index(rets), group_size)
    ratio = same_index / TRUE_GRAD
    assert ratio[0] == pytest.approx(1 - 1 / group_size)  # every episode reaches turn 0
    assert ratio[1] < ratio[0] - 0.05, ratio


def test_compute_advantages_episode_and_turn_modes():
    turn_rewards = [[0.3, 1.0], [0.9], [0.3, None, 0.0]]
    totals = [1.3, 0.9, 0.3]
    adv, m = compute_advantages(totals, turn_rewards, [0, 0, 0], mode="episode", scale="none")
    mean = sum(totals) / 3
    assert [a.tolist() for a in adv] == [pytest.approx([1.3 - mean] * 2), pytest.approx([0.9 - mean]), pytest.approx([0.3 - mean] * 3)]
    adv, m = compute_advantages(totals, turn_rewards, [0, 0, 0], mode="turn", scale="none")
    # returns: [1.3, 1.0], [0.9], [0.3, 0, 0]; baselines from the other episodes at the same index
    expected = [[1.3 - (0.9 + 0.3) / 2, 1.0 - 0.0], [0.9 - (1.3 + 0.3) / 2], [0.3 - (1.3 + 0.9) / 2, 0.0 - 1.0, 0.0 - 0.0]]
    for a, e in zip(adv, expected):
        assert a.tolist() == pytest.approx(e)
    assert m["frac_turns_without_baseline"] == pytest.approx(1 / 6)  # episode 2's third turn


def test_episode_level_reward_goes_to_the_last_turn_and_missing_rewards():
    # per-turn components sum to 0.5; the total 1.5 carries an episode-level 1.0 -> the last turn
    adv, _ = compute_advantages([1.5, None, 0.0], [[0.5, None], [0.2], [0.0, 0.0]], [7, 7, 7], mode="turn", scale="none")
    assert adv[0].tolist() == pytest.approx([1.5 - (0.2 + 0.0) / 2, 1.0 - 0.0])
    assert adv[1].tolist() == pytest.approx([0.2 - (1.5 + 0.0) / 2])  # no total: its turn rewards are used
    none, m = compute_advantages([1.0, 0.0], [[None], [None]], [0, 0], mode="turn", scale="none")
    assert m["num_no_reward"] == 0 and none[0].item() == pytest.approx(1.0)


def test_group_scale_and_flat_groups():
    r = torch.tensor([[1.0, float("nan")], [0.0, float("nan")], [2.0, 2.0], [2.0, 2.0]])
    adv, m = turn_level_advantages(r, torch.tensor([1, 1, 2, 2]), torch.tensor([0, 0, 1, 1]), scale="group")
    std = math.sqrt(0.5)
    torch.testing.assert_close(adv[:2, 0], torch.tensor([1.0, -1.0]) / (std + 1e-4))
    assert adv[:2, 1].abs().sum() == 0  # nothing past an episode's end
    # group 1: returns 4, 2, 4, 2, baselines 4, 2 from the other episode: advantages 0 (not a flat group)
    assert adv[2:].abs().sum() == 0 and m["frac_zero_std_groups"] == 0.0
    batch, _ = turn_level_advantages(r, torch.tensor([1, 1, 2, 2]), torch.tensor([0, 0, 1, 1]), scale="batch")
    none, _ = turn_level_advantages(r, torch.tensor([1, 1, 2, 2]), torch.tensor([0, 0, 1, 1]), scale="none")
    returns = torch.tensor([1.0, 0.0, 4.0, 2.0, 4.0, 2.0], dtype=torch.float64)
    torch.testing.assert_close(batch, none / (returns.std().item() + 1e-4))
    flat = torch.tensor([[1.0], [1.0]])
    adv, m = turn_level_advantages(flat, torch.tensor([1, 1]), torch.tensor([0, 0]), scale="group")
    assert adv.abs().sum() == 0 and m["frac_zero_std_groups"] == 1.0


def test_turns_to_tokens_and_errors():
    per_turn = torch.tensor([[0.5, -1.0]])
    torch.testing.assert_close(turns_to_tokens(per_turn, torch.tensor([[-1, 0, 0, 1]])), torch.tensor([[0.0, 0.5, 0.5, -1.0]]))
    with pytest.raises(ValueError, match="turn"):
        turns_to_tokens(per_turn, torch.tensor([[2]]))
    with pytest.raises(ValueError, match="mode"):
        compute_advantages([1.0], [[1.0]], [0], mode="token")
    with pytest.raises(ValueError, match="at least one turn"):
        compute_advantages([1.0], [[]], [0], mode="turn")
    with pytest.raises(ValueError, match="scale"):
        turn_level_advantages(torch.zeros(1, 1), torch.tensor([1]), torch.tensor([0]), scale="rank")
