"""Policy losses and advantages against small hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.losses import (
    LOSSES,
    LossConfig,
    LossConfigError,
    count_active_tokens,
    group_advantages,
    log_ratio,
    per_token_returns,
    policy_loss,
    register_loss,
    sampler_weight,
    turn_advantages,
)

# Two sequences of different lengths: 3 and 1 active tokens (padding holds junk on purpose).
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
ADV = torch.tensor([1.0, 2.0])


def leaf(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, requires_grad=True)


def onpolicy_logprobs() -> torch.Tensor:
    return leaf([[-0.5, -1.0, -2.0], [-0.3, float("-inf"), 7.0]])


# ---- normalisers --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("loss_type", "kwargs", "expected"),
    [
        # per-token loss is -A on-policy: row 0 gives -1 x 3 tokens, row 1 gives -2 x 1 token.
        ("grpo", {}, (-1.0 + -2.0) / 2),  # mean per sequence, then over sequences
        ("bnpo", {}, -5.0 / 4),  # sum / local active tokens
        ("dr_grpo", {"max_completion_length": 5}, -5.0 / (2 * 5)),  # sum / (B x L)
        ("dapo", {"num_items_in_batch": 10}, -5.0 / 10),  # sum / global active tokens
        ("dapo", {}, -5.0 / 4),  # fallback: local active tokens
    ],
)
def test_normalisers(loss_type, kwargs, expected):
    loss, metrics = policy_loss(onpolicy_logprobs(), None, ADV, MASK, LossConfig(loss_type=loss_type), **kwargs)
    assert loss.item() == pytest.approx(expected)
    assert metrics["loss"] == pytest.approx(expected)
    assert metrics["num_active_tokens"] == 4


def test_default_is_dapo_and_accepts_tensor_num_items():
    assert LossConfig().loss_type == "dapo"
    loss, _ = policy_loss(onpolicy_logprobs(), None, ADV, MASK, num_items_in_batch=torch.tensor(20))
    assert loss.item() == pytest.approx(-5.0 / 20)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo"])
def test_on_policy_ratio_one_and_reinforce_gradient(loss_type):
    torch.manual_seed(0)
    logp = (torch.randn(3, 5) - 2).requires_grad_(True)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [0, 1, 1, 1, 0]], dtype=torch.bool)
    adv = torch.tensor([0.7, -1.3, 0.4])
    cfg = LossConfig(loss_type=loss_type)
    loss, metrics = policy_loss(logp, None, adv, mask, cfg, max_completion_length=5)
    loss.backward()
    assert metrics["ratio/mean"] == 1.0 and metrics["ratio/min"] == 1.0 and metrics["ratio/max"] == 1.0
    # REINFORCE: d loss / d logp_t = -A_i * (normaliser weight of token t).
    n = mask.sum()
    lengths = mask.sum(-1, keepdim=True).float()
    weight = {
        "grpo": mask / lengths / 3,
        "dr_grpo": mask / (3 * 5),
    }.get(loss_type, mask / n)
    torch.testing.assert_close(logp.grad, -adv[:, None] * weight)


# ---- clipping -----------------------------------------------------------------------------------

R = [[0.5, 1.1, 1.5], [0.5, 1.1, 1.5]]
OLD = torch.zeros(2, 3)
SIGNS = torch.tensor([1.0, -1.0])
FULL = torch.ones(2, 3, dtype=torch.bool)


def ratio_logprobs() -> torch.Tensor:
    return leaf([[math.log(r) for r in row] for row in R])


def test_clipping_value_counts_and_gradient():
    logp = ratio_logprobs()
    loss, metrics = policy_loss(logp, OLD, SIGNS, FULL, LossConfig(loss_type="bnpo", epsilon=0.2))
    # A=+1: min(r, clip(r)) = 0.5, 1.1, 1.2 ; A=-1: min(-r, -clip(r)) = -0.8, -1.1, -1.5
    assert loss.item() == pytest.approx(-(0.5 + 1.1 + 1.2 - 0.8 - 1.1 - 1.5) / 6)
    assert metrics["clip_ratio/low"] == pytest.approx(1 / 6)
    assert metrics["clip_ratio/high"] == pytest.approx(1 / 6)
    assert metrics["clip_ratio/region"] == pytest.approx(2 / 6)
    loss.backward()
    # Clipped tokens (r=1.5 with A>0, r=0.5 with A<0) get no gradient; others get -r A / N.
    expected = torch.tensor([[-0.5, -1.1, 0.0], [0.0, 1.1, 1.5]]) / 6
    torch.testing.assert_close(logp.grad, expected)


def test_clip_higher_and_delta():
    loss, _ = policy_loss(ratio_logprobs(), OLD, SIGNS, FULL, LossConfig(loss_type="bnpo", epsilon=0.2, epsilon_high=0.28))
    assert loss.item() == pytest.approx(-(0.5 + 1.1 + 1.28 - 0.8 - 1.1 - 1.5) / 6)
    logp = ratio_logprobs()
    loss, metrics = policy_loss(logp, OLD, SIGNS, FULL, LossConfig(loss_type="bnpo", delta=1.4))
    # A=-1, r=1.5: the unclipped term is clamped at delta -> min(-1.4, -1.2) = -1.4, no gradient.
    assert loss.item() == pytest.approx(-(0.5 + 1.1 + 1.2 - 0.8 - 1.1 - 1.4) / 6)
    assert metrics["clip_ratio/delta"] == pytest.approx(1 / 6)
    loss.backward()
    assert logp.grad[1, 2].item() == 0.0


def test_cispo_value_and_gradient():
    logp = ratio_logprobs()
    loss, metrics = policy_loss(logp, OLD, SIGNS, FULL, LossConfig(loss_type="cispo", epsilon_high=0.2))
    w = torch.tensor([[0.5, 1.1, 1.2], [0.5, 1.1, 1.2]])  # sg(min(r, 1.2))
    expected = -(w * SIGNS[:, None] * logp.detach()).sum() / 6
    assert loss.item() == pytest.approx(expected.item())
    assert metrics["clip_ratio/high"] == pytest.approx(2 / 6)
    loss.backward()
    torch.testing.assert_close(logp.grad, -w * SIGNS[:, None] / 6)  # every token keeps a gradient


def test_sapo_soft_gate():
    logp = ratio_logprobs()
    cfg = LossConfig(loss_type="sapo", sapo_temperature_pos=1.0, sapo_temperature_neg=2.0)
    loss, _ = policy_loss(logp, OLD, SIGNS, FULL, cfg)

    def sig(x: float) -> float:
        return 1 / (1 + math.exp(-x))

    value, grads = 0.0, []
    for row, a, tau in ((R[0], 1.0, 1.0), (R[1], -1.0, 2.0)):
        for r in row:
            s = sig(tau * (r - 1))
            value += -(4 / tau) * s * a
            grads.append(-4 * s * (1 - s) * r * a / 6)
    assert loss.item() == pytest.approx(value / 6)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor(grads).view(2, 3))


# ---- KL, GSPO, sampler correction, truncation --------------------------------------------------


def test_k3_kl_added_before_normalisation():
    logp = leaf([[-1.0, -2.0]])
    ref = torch.tensor([[-0.5, -2.3]])
    kl = [math.exp(0.5) - 0.5 - 1, math.exp(-0.3) + 0.3 - 1]
    cfg = LossConfig(loss_type="bnpo", beta=0.1)
    loss, metrics = policy_loss(logp, None, torch.zeros(1), torch.ones(1, 2), cfg, ref_logprobs=ref)
    assert loss.item() == pytest.approx(0.1 * sum(kl) / 2)
    assert metrics["kl/mean"] == pytest.approx(sum(kl) / 2)
    loss.backward()  # d k3 / d logp = 1 - exp(ref - logp)
    torch.testing.assert_close(logp.grad, torch.tensor([[1 - math.exp(0.5), 1 - math.exp(-0.3)]]) * 0.1 / 2)


def test_kl_metric_without_penalty():
    _, metrics = policy_loss(leaf([[-1.0]]), None, torch.ones(1), torch.ones(1, 1), ref_logprobs=torch.tensor([[-1.5]]))
    assert metrics["kl/mean"] == pytest.approx(math.exp(-0.5) + 0.5 - 1)


def test_gspo_ratio_is_geometric_mean_and_gradient():
    torch.manual_seed(1)
    logp = (torch.randn(2, 4) - 1).requires_grad_(True)
    old = logp.detach() + 0.1 * torch.randn(2, 4)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    ratio = torch.exp(log_ratio(logp, old, mask, "sequence"))
    for i, n in enumerate((3, 4)):
        geo = torch.prod(torch.exp(logp.detach()[i, :n] - old[i, :n])) ** (1 / n)
        torch.testing.assert_close(ratio[i, :n], geo.expand(n))
    # With grpo normalisation and no clipping, the gradient equals that of the sequence objective.
    adv = torch.tensor([0.5, -0.25])
    cfg = LossConfig(loss_type="grpo", epsilon=10.0, importance_sampling_level="sequence")
    loss, _ = policy_loss(logp, old, adv, mask, cfg)
    (g,) = torch.autograd.grad(loss, logp)
    x = logp.detach().clone().requires_grad_(True)
    seq = torch.exp(torch.where(mask, x - old, 0.0).sum(-1) / mask.sum(-1))
    (g_ref,) = torch.autograd.grad(-(seq * adv).mean(), x)
    torch.testing.assert_close(g, g_ref)


def test_gspo_sequence_clipping():
    old = torch.zeros(1, 2)
    logp = leaf([[math.log(2.0), 0.0]])  # geometric mean sqrt(2) > 1.2 -> both tokens clipped for A>0
    _, metrics = policy_loss(logp, old, torch.ones(1), torch.ones(1, 2), LossConfig(importance_sampling_level="sequence"))
    assert metrics["clip_ratio/high"] == 1.0
    assert metrics["ratio/mean"] == pytest.approx(math.sqrt(2))


def test_sampler_weight_truncate_vs_mask():
    old = torch.zeros(1, 3)
    sampler = -torch.log(torch.tensor([[3.0, 0.2, 1.0]]))  # w = exp(old - sampler) = 3, 0.2, 1
    mask = torch.ones(1, 3)
    w, raw, changed = sampler_weight(old, sampler, mask, mode="truncate", cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.2, 1.0]]))
    assert changed.tolist() == [[True, False, False]]
    w, _, changed = sampler_weight(old, sampler, mask, mode="mask", cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.0, 1.0]]))
    assert changed.tolist() == [[True, True, False]]
    w, _, _ = sampler_weight(old, sampler, mask, level="sequence", mode="mask", cap=2.0)
    torch.testing.assert_close(w, torch.full((1, 3), 0.6))  # product 3 * 0.2 * 1
    w, _, _ = sampler_weight(old, sampler, mask, level="geometric", mode="truncate", cap=2.0)
    torch.testing.assert_close(w, torch.full((1, 3), 0.6 ** (1 / 3)))
    assert not w.requires_grad


def test_sampler_correction_in_loss():
    logp = leaf([[0.0, 0.0, 0.0]])  # on-policy, so old = logp and w = exp(0 - sampler)
    sampler = -torch.log(torch.tensor([[3.0, 0.2, 1.0]]))
    args = (logp, None, torch.ones(1), torch.ones(1, 3))
    loss, m = policy_loss(*args, LossConfig(loss_type="bnpo"), sampler_logprobs=sampler)
    assert loss.item() == pytest.approx(-(2.0 + 0.2 + 1.0) / 3)
    assert m["is_ratio/frac_truncated"] == pytest.approx(1 / 3)
    assert m["is_ratio/max"] == pytest.approx(3.0) and m["is_ratio/min"] == pytest.approx(0.2)
    loss, m = policy_loss(*args, LossConfig(loss_type="bnpo", sampler_is_mode="mask"), sampler_logprobs=sampler)
    assert loss.item() == pytest.approx(-1.0 / 3)  # masked tokens still count in the normaliser
    assert m["is_ratio/frac_masked"] == pytest.approx(2 / 3)
    loss, m = policy_loss(*args, LossConfig(loss_type="bnpo", sampler_is_mode=None), sampler_logprobs=sampler)
    assert loss.item() == pytest.approx(-1.0) and "is_ratio/mean" not in m


def test_truncated_rows_removed():
    truncated = torch.tensor([False, True])
    for loss_type, expected in (("grpo", -1.0), ("bnpo", -1.0), ("dapo", -1.0), ("dr_grpo", -3.0 / (2 * 5))):
        logp = onpolicy_logprobs()
        cfg = LossConfig(loss_type=loss_type)
        loss, m = policy_loss(logp, None, ADV, MASK, cfg, truncated=truncated, max_completion_length=5)
        assert loss.item() == pytest.approx(expected), loss_type
        assert m["num_active_tokens"] == 3 and m["num_truncated"] == 1
        loss.backward()
        assert logp.grad[1].abs().sum() == 0
    assert count_active_tokens(MASK, truncated) == 3 and count_active_tokens(MASK) == 4


def test_per_token_advantages_and_entropy_metric():
    adv = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    ent = torch.tensor([[0.5, 1.5, 1.0], [2.0, 9.0, 9.0]])
    loss, m = policy_loss(onpolicy_logprobs(), None, adv, MASK, LossConfig(loss_type="bnpo"), entropies=ent)
    assert loss.item() == pytest.approx(-(1 + 2 + 3 + 4) / 4)
    assert m["entropy/mean"] == pytest.approx(5.0 / 4)
    assert m["advantages/max"] == 4.0


def test_all_masked_gives_zero_loss_with_graph():
    logp = onpolicy_logprobs()
    for loss_type in ("grpo", "bnpo", "dapo"):
        loss, _ = policy_loss(logp, None, ADV, torch.zeros(2, 3), LossConfig(loss_type=loss_type))
        assert loss.item() == 0.0 and loss.requires_grad


# ---- config and registry ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"loss_type": "ppo2"}, "unknown"),
        ({"loss_type": "cispo", "delta": 2.0}, "delta"),
        ({"loss_type": "sapo", "delta": 2.0}, "delta"),
        ({"delta": 1.1}, "delta"),
        ({"epsilon": -0.1}, "epsilon"),
        ({"epsilon_high": -0.1}, "epsilon_high"),
        ({"beta": -1.0}, "beta"),
        ({"importance_sampling_level": "episode"}, "importance_sampling_level"),
        ({"sapo_temperature_neg": 0.0}, "sapo_temperature"),
        ({"sampler_is_mode": "mask", "sampler_is_cap": 1.0}, "sampler_is_cap"),
        ({"sampler_is_mode": "clip"}, "sampler_is_mode"),
        ({"sampler_is_level": "batch"}, "sampler_is_level"),
    ],
)
def test_config_errors(kwargs, match):
    with pytest.raises(LossConfigError, match=match):
        LossConfig(**kwargs)


def test_call_errors():
    lp = onpolicy_logprobs()
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(lp, None, ADV, MASK, LossConfig(beta=0.1))
    with pytest.raises(ValueError, match="max_completion_length"):
        policy_loss(lp, None, ADV, MASK, LossConfig(loss_type="dr_grpo"))
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(lp, None, torch.ones(3), MASK)
    with pytest.raises(ValueError, match="old_logprobs"):
        policy_loss(lp, torch.zeros(2, 4), ADV, MASK)
    with pytest.raises(ValueError, match="num_items_in_batch"):
        policy_loss(lp, None, ADV, MASK, num_items_in_batch=0)


def test_register_custom_loss():
    @register_loss("test_sum")
    def test_sum(inp):
        return (-inp.ratio * inp.advantages * inp.mask).sum(), {}

    try:
        loss, _ = policy_loss(onpolicy_logprobs(), None, ADV, MASK, LossConfig(loss_type="test_sum"))
        assert loss.item() == pytest.approx(-5.0)
        with pytest.raises(ValueError, match="already registered"):
            register_loss("test_sum")(lambda inp: (inp.mask.sum(), {}))
    finally:
        LOSSES.pop("test_sum")


# ---- advantages ---------------------------------------------------------------------------------


def test_group_advantages_group_scale_and_zero_std():
    adv, m = group_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0, 5.0, 5.0]), torch.tensor([0, 0, 0, 0, 1, 1]))
    std = math.sqrt(4 * 0.25 / 3)  # unbiased
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, 0.5, -0.5, 0, 0]) / (std + 1e-4))
    assert m["frac_zero_std_groups"] == 0.5 and m["num_groups"] == 2 and m["num_no_reward"] == 0


def test_group_advantages_unequal_groups_batch_and_none():
    r = torch.tensor([1.0, 2.0, 3.0, 0.0, 4.0])
    g = torch.tensor([7, 7, 7, 3, 3])
    adv, _ = group_advantages(r, g)
    expected = torch.tensor([-1 / (1 + 1e-4), 0.0, 1 / (1 + 1e-4), -2 / (math.sqrt(8) + 1e-4), 2 / (math.sqrt(8) + 1e-4)])
    torch.testing.assert_close(adv, expected)
    adv, _ = group_advantages(r, g, scale="none")
    torch.testing.assert_close(adv, torch.tensor([-1.0, 0.0, 1.0, -2.0, 2.0]))
    adv, _ = group_advantages(r, g, scale="batch")
    torch.testing.assert_close(adv, torch.tensor([-1.0, 0.0, 1.0, -2.0, 2.0]) / (r.std().item() + 1e-4))


def test_group_advantages_missing_components():
    rows = [[1.0, None], [None, None], [0.0, 2.0], [0.5, float("nan")]]
    adv, m = group_advantages(rows, torch.tensor([0, 0, 0, 0]), weights=[1.0, 0.5], scale="none")
    # totals: 1, (none), 0 + 0.5 * 2 = 1, 0.5 -> mean over rewarded rows 2.5 / 3
    torch.testing.assert_close(adv, torch.tensor([1 - 2.5 / 3, 0.0, 1 - 2.5 / 3, 0.5 - 2.5 / 3]))
    assert m["num_no_reward"] == 1
    dicts = [{"a": 1.0, "b": None}, {}, {"a": 0.0, "b": 2.0}, {"a": 0.5}]
    adv2, _ = group_advantages(dicts, torch.zeros(4, dtype=torch.long), weights=[1.0, 0.5], scale="none")
    torch.testing.assert_close(adv2, adv)
    adv3, _ = group_advantages(dicts, torch.zeros(4, dtype=torch.long), weights={"b": 0.5, "a": 1.0}, scale="none")
    torch.testing.assert_close(adv3, adv)
    with pytest.raises(ValueError, match="no weight"):
        group_advantages(dicts, torch.zeros(4, dtype=torch.long), weights={"a": 1.0})


def test_group_advantages_all_missing_group_and_errors():
    adv, m = group_advantages([None, None, 1.0, 3.0], torch.tensor([0, 0, 1, 1]), scale="none")
    torch.testing.assert_close(adv, torch.tensor([0.0, 0.0, -1.0, 1.0]))
    assert m["num_groups"] == 1 and m["num_no_reward"] == 2 and m["frac_zero_std_groups"] == 0.0
    with pytest.raises(ValueError, match="inf"):
        group_advantages([float("inf"), 1.0], torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="scale"):
        group_advantages([0.0, 1.0], torch.tensor([0, 0]), scale="rank")


def test_per_token_returns_reward_to_go():
    rewards = torch.tensor([[1.0, float("nan"), 2.0]])
    turns = torch.tensor([[-1, 0, 0, 1, 2, 2]])
    torch.testing.assert_close(per_token_returns(rewards, turns), torch.tensor([[0, 3, 3, 2, 2, 2]], dtype=torch.float64))
    expected = torch.tensor([[0, 1.5, 1.5, 1.0, 2.0, 2.0]], dtype=torch.float64)
    torch.testing.assert_close(per_token_returns(rewards, turns, gamma=0.5), expected)


def test_turn_advantages():
    nan = float("nan")
    rewards = torch.tensor([[0.0, 1.0], [nan, 0.0], [nan, nan]])  # row 2 has no reward at all
    turns = torch.tensor([[0, 0, 1], [0, 1, 1], [0, 0, -1]])
    adv, m = turn_advantages(rewards, turns, torch.tensor([0, 0, 0]), scale="none")
    # returns: row 0 -> [1, 1], row 1 -> [0, 0]; group mean over 4 (episode, turn) pairs is 0.5
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.5, 0.5], [-0.5, -0.5, -0.5], [0.0, 0.0, 0.0]]))
    assert m["num_no_reward"] == 1 and m["return_mean"] == 0.5
    adv, m = turn_advantages(rewards[:1], turns[:1], torch.tensor([0]))
    assert adv.abs().sum() == 0 and m["frac_zero_std_groups"] == 1.0  # one episode, returns [1, 1]


@pytest.mark.parametrize("loss_type", ["dapo", "cispo", "sapo"])
def test_global_normaliser_makes_accumulation_exact(loss_type):
    """Micro-batches with num_items_in_batch = all active tokens sum to the full batch's loss and gradient."""
    torch.manual_seed(0)
    lp = (torch.randn(4, 5) - 1).requires_grad_(True)
    old = lp.detach() + 0.1 * torch.randn(4, 5)
    adv = torch.tensor([1.0, -0.5, 2.0, -1.5])
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0]], dtype=torch.bool)
    cfg = LossConfig(loss_type=loss_type)
    n = int(mask.sum())
    full, _ = policy_loss(lp, old, adv, mask, cfg, num_items_in_batch=n)
    (g_full,) = torch.autograd.grad(full, lp)
    parts = [policy_loss(lp[i], old[i], adv[i], mask[i], cfg, num_items_in_batch=n)[0] for i in (slice(0, 1), slice(1, 4))]
    total = parts[0] + parts[1]
    (g_acc,) = torch.autograd.grad(total, lp)
    assert torch.allclose(total, full, atol=1e-6)
    assert torch.allclose(g_acc, g_full, atol=1e-6)
    # bnpo normalises locally, so the same split would not add up: that is why the trainer averages it.
    b_full, _ = policy_loss(lp, old, adv, mask, LossConfig(loss_type="bnpo"))
    b_parts = sum(policy_loss(lp[i], old[i], adv[i], mask[i], LossConfig(loss_type="bnpo"))[0] for i in (slice(0, 1), slice(1, 4)))
    assert not torch.allclose(b_parts, b_full)
