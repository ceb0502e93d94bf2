"""Policy losses and advantages against small hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.learn.losses import (
    LOSSES,
    LossConfig,
    StepCounts,
    count_active_tokens,
    group_advantages,
    local_counts,
    log_ratio,
    policy_loss,
    register_loss,
    sampler_weight,
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
        ("dapo", {"tokens": 10}, -5.0 / 10),  # sum / active tokens of the whole step
        ("dapo", None, -5.0 / 4),  # no counts: this micro-batch is the step
        ("grpo", {"sequences": 4}, (-1.0 + -2.0) / 4),  # the step has two more sequences elsewhere
        ("bnpo", {"micro_batches": 2}, -5.0 / 4 / 2),
    ],
)
def test_normalisers(loss_type, kwargs, expected):
    counts = None
    if kwargs is not None:
        base = {"tokens": 4, "sequences": 2, "rows": 2, "micro_batches": 1}
        counts = StepCounts(**(base | kwargs))
    loss, metrics = policy_loss(onpolicy_logprobs(), None, ADV, MASK, LossConfig(loss_type=loss_type), counts=counts)
    assert loss.item() == pytest.approx(expected)
    assert metrics["loss"] == pytest.approx(expected)
    assert metrics["num_active_tokens"] == 4


def test_default_is_dapo_with_its_aggregation_and_override():
    assert LossConfig().loss_type == "dapo" and LossConfig().resolved_aggregation == "token_mean"
    defaults = {"grpo": "sequence_mean", "sapo": "sequence_mean", "bnpo": "local_token_mean", "dr_grpo": "constant_sum", "cispo": "token_mean"}
    assert {k: LOSSES[k].aggregation for k in defaults} == defaults
    loss, _ = policy_loss(onpolicy_logprobs(), None, ADV, MASK, LossConfig(loss_type="dapo", aggregation="sequence_mean"))
    assert loss.item() == pytest.approx((-1.0 + -2.0) / 2)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo"])
def test_on_policy_ratio_one_and_reinforce_gradient(loss_type):
    torch.manual_seed(0)
    logp = (torch.randn(3, 5) - 2).requires_grad_(True)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [0, 1, 1, 1, 0]], dtype=torch.bool)
    adv = torch.tensor([0.7, -1.3, 0.4])
    cfg = LossConfig(loss_type=loss_type)
    counts = StepCounts.single(mask, max_completion_length=5)
    loss, metrics = policy_loss(logp, None, adv, mask, cfg, counts=counts)
    loss.backward()
    assert metrics["ratio/mean"] == 1.0 and metrics["ratio/min"] == 1.0 and metrics["ratio/max"] == 1.0
    # REINFORCE: d loss / d logp_t = -A_i * (normaliser weight of token t).
    n = mask.sum()
    lengths = mask.sum(-1, keepdim=True).float()
    weight = {
        "grpo": mask / lengths / 3,
        "sapo": mask / lengths / 3,
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
    w, raw, changed, _ = sampler_weight(old, sampler, mask, mode="truncate", cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.2, 1.0]]))
    assert changed.tolist() == [[True, False, False]]
    w, _, changed, _ = sampler_weight(old, sampler, mask, mode="mask", cap=2.0, lower=0.5)
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.0, 1.0]]))
    assert changed.tolist() == [[True, True, False]]
    w, _, _, _ = sampler_weight(old, sampler, mask, level="sequence", mode="mask", cap=2.0, lower=0.5)
    torch.testing.assert_close(w, torch.full((1, 3), 0.6))  # product 3 * 0.2 * 1
    w, _, _, _ = sampler_weight(old, sampler, mask, level="geometric", mode="truncate", cap=2.0)
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
        counts = StepCounts.single(MASK, truncated, max_completion_length=5)
        loss, m = policy_loss(logp, None, ADV, MASK, cfg, truncated=truncated, counts=counts)
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
        ({"loss_type": "no_such_file.py:x"}, "file not found"),
        ({"loss_type": "no_such_module_xyz:x"}, "cannot import"),
        ({"aggregation": "median"}, "aggregation"),
        ({"kl_ratio_weighted": True}, "no effect with beta=0"),
        ({"sampler_is_mode": None, "sampler_is_min": 0.5}, "no effect"),
        ({"sampler_is_min": 1.5}, "sampler_is_min"),
        ({"loss_type": "sapo", "epsilon": 0.3}, "no effect with loss_type=sapo"),
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
    with pytest.raises(ValueError, match=match):
        LossConfig(**kwargs)


def test_call_errors():
    lp = onpolicy_logprobs()
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(lp, None, ADV, MASK, LossConfig(beta=0.1))
    with pytest.raises(ValueError, match="max_completion_length"):
        policy_loss(lp, None, ADV, MASK, LossConfig(loss_type="dr_grpo"))
    with pytest.raises(ValueError, match="per-token loss"):
        policy_loss(lp, None, ADV, MASK, LossConfig(loss_type="test_scalar_loss"))
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(lp, None, torch.ones(3), MASK)
    with pytest.raises(ValueError, match="old_logprobs"):
        policy_loss(lp, torch.zeros(2, 4), ADV, MASK)


@register_loss("test_scalar_loss")
def _scalar_loss(inp):  # the old contract (a scalar): policy_loss must name the problem
    return inp.ratio.sum(), {}


def test_register_custom_loss():
    @register_loss("test_sum", aggregation="constant_sum")
    def test_sum(inp):
        return -inp.ratio * inp.advantages, {}

    try:
        counts = StepCounts.single(MASK, max_completion_length=1)
        loss, _ = policy_loss(onpolicy_logprobs(), None, ADV, MASK, LossConfig(loss_type="test_sum"), counts=counts)
        assert loss.item() == pytest.approx(-5.0 / 2)
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


# ---- the trainer contract: shares of micro-batches and ranks add up to the step's loss ----------


def _step_data():
    torch.manual_seed(0)
    lp = (torch.randn(6, 5, dtype=torch.float64) - 1).requires_grad_(True)
    old = lp.detach() + 0.1 * torch.randn(6, 5, dtype=torch.float64)
    adv = torch.tensor([1.0, -0.5, 2.0, -1.5, 0.3, 0.0], dtype=torch.float64)
    mask = torch.tensor(
        [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.bool
    )
    return lp, old, adv, mask


def _counts(mask, parts, ranks=1):
    totals = sum(local_counts(mask[i]) for i in parts)
    return StepCounts.from_totals(totals, micro_batches=len(parts), num_processes=ranks, max_completion_length=5)


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "cispo", "sapo"])
def test_micro_batch_shares_sum_to_the_step_loss(loss_type):
    """Uneven micro-batches with the step's counts give exactly the one-batch loss and gradient."""
    lp, old, adv, mask = _step_data()
    cfg = LossConfig(loss_type=loss_type)
    whole = [slice(0, 6)]
    full, _ = policy_loss(lp, old, adv, mask, cfg, counts=_counts(mask, whole))
    (g_full,) = torch.autograd.grad(full, lp)
    parts = [slice(0, 1), slice(1, 4), slice(4, 6)]
    counts = _counts(mask, parts)
    total = sum(policy_loss(lp[i], old[i], adv[i], mask[i], cfg, counts=counts)[0] for i in parts)
    (g_acc,) = torch.autograd.grad(total, lp)
    torch.testing.assert_close(total, full, rtol=0, atol=1e-12)
    torch.testing.assert_close(g_acc, g_full, rtol=0, atol=1e-12)


def test_local_token_mean_is_the_mean_of_micro_batch_means():
    lp, old, adv, mask = _step_data()
    cfg = LossConfig(loss_type="bnpo")
    parts = [slice(0, 2), slice(2, 4), slice(4, 6)]
    counts = _counts(mask, parts)
    total = sum(policy_loss(lp[i], old[i], adv[i], mask[i], cfg, counts=counts)[0] for i in parts)
    means = [policy_loss(lp[i], old[i], adv[i], mask[i], cfg)[0] for i in parts]
    torch.testing.assert_close(total, sum(means) / 3)


@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean", "constant_sum", "local_token_mean"])
def test_ddp_mean_of_rank_gradients_is_the_step_gradient(aggregation):
    """Two ranks, two micro-batches each: DDP's mean over ranks of each rank's summed loss is the step's loss."""
    lp, old, adv, mask = _step_data()
    cfg = LossConfig(loss_type="dapo", aggregation=aggregation)
    ranks = [[slice(0, 2), slice(2, 3)], [slice(3, 5), slice(5, 6)]]
    every = [p for r in ranks for p in r]
    full = sum(policy_loss(lp[i], old[i], adv[i], mask[i], cfg, counts=_counts(mask, every))[0] for i in every)
    (g_full,) = torch.autograd.grad(full, lp)
    counts = _counts(mask, every, ranks=2)  # what each rank gets after the all-reduce
    per_rank = [sum(policy_loss(lp[i], old[i], adv[i], mask[i], cfg, counts=counts)[0] for i in r) for r in ranks]
    ddp = (per_rank[0] + per_rank[1]) / 2  # DDP averages the ranks' gradients
    (g_ddp,) = torch.autograd.grad(ddp, lp)
    torch.testing.assert_close(ddp, full, rtol=0, atol=1e-12)
    torch.testing.assert_close(g_ddp, g_full, rtol=0, atol=1e-12)


# ---- TRL parity switches -------------------------------------------------------------------------


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
def test_non_finite_sampler_logprob_is_no_correction(level):
    logp = leaf([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    sampler = torch.tensor([[float("nan"), -math.log(1.5), float("-inf")], [float("nan"), 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    loss, m = policy_loss(logp, None, torch.ones(2), mask, LossConfig(loss_type="bnpo", sampler_is_level=level), sampler_logprobs=sampler)
    assert math.isfinite(loss.item()) and m["is_ratio/num_nonfinite_sampler"] == 3
    w_row0 = {"token": [1.0, 1.5, 1.0], "sequence": [1.5] * 3, "geometric": [1.5 ** (1 / 3)] * 3}[level]
    assert loss.item() == pytest.approx(-(sum(w_row0) + 2.0) / 5)
    loss.backward()
    assert torch.isfinite(logp.grad).all()


def test_sampler_lower_bound_separate_from_the_cap():
    old = torch.zeros(1, 3)
    sampler = -torch.log(torch.tensor([[3.0, 0.2, 0.6]]))  # w = 3, 0.2, 0.6
    logp = leaf([[0.0, 0.0, 0.0]])
    args = (logp, None, torch.ones(1), torch.ones(1, 3))
    # default mask bounds [1/cap, cap] = [0.5, 2]: 3 and 0.2 masked
    loss, _ = policy_loss(*args, LossConfig(loss_type="bnpo", sampler_is_mode="mask"), sampler_logprobs=sampler)
    assert loss.item() == pytest.approx(-0.6 / 3)
    # TRL's mask with no lower bound (vllm_importance_sampling_clip_min=None): only 3 masked
    cfg = LossConfig(loss_type="bnpo", sampler_is_mode="mask", sampler_is_cap=2.0, sampler_is_min=0.0)
    loss, _ = policy_loss(*args, cfg, sampler_logprobs=sampler)
    assert loss.item() == pytest.approx(-(0.2 + 0.6) / 3)
    # truncation with a floor: clamp into [0.7, 2]
    cfg = LossConfig(loss_type="bnpo", sampler_is_mode="truncate", sampler_is_min=0.7)
    loss, _ = policy_loss(*args, cfg, sampler_logprobs=sampler)
    assert loss.item() == pytest.approx(-(2.0 + 0.7 + 0.7) / 3)
    assert sampler_weight(old, sampler, torch.ones(1, 3), lower=0.7)[0][0].tolist() == pytest.approx([2.0, 0.7, 0.7])


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_ratio_weighted_kl(level):
    logp = leaf([[-1.0, -2.0]])
    old = torch.tensor([[-1.2, -1.9]])
    ref = torch.tensor([[-0.5, -2.3]])
    cfg = LossConfig(loss_type="bnpo", beta=0.1, kl_ratio_weighted=True, epsilon=100.0, importance_sampling_level=level)
    loss, _ = policy_loss(logp, old, torch.zeros(1), torch.ones(1, 2), cfg, ref_logprobs=ref)
    (g,) = torch.autograd.grad(loss, logp)
    x = logp.detach().clone().requires_grad_(True)
    kl = torch.exp(ref - x) - (ref - x) - 1
    r = torch.exp(x - old) if level == "token" else torch.exp((x - old).mean()).expand(1, 2)
    expected = 0.1 * (kl * r).mean()
    (g_ref,) = torch.autograd.grad(expected, x)
    assert loss.item() == pytest.approx(expected.item())
    torch.testing.assert_close(g, g_ref)
    plain, _ = policy_loss(logp, old, torch.zeros(1), torch.ones(1, 2), LossConfig(loss_type="bnpo", beta=0.1), ref_logprobs=ref)
    assert plain.item() != pytest.approx(loss.item())


# ---- a loss from a user's file or module ---------------------------------------------------------

USER_LOSS = '''
from agentrl.learn.losses import register_loss


@register_loss("{name}", aggregation="sequence_mean")
def half_reinforce(inp):
    return -0.5 * inp.ratio * inp.advantages, {{}}
'''


def test_loss_from_a_file_and_a_module(tmp_path, monkeypatch):
    path = tmp_path / "my_losses.py"
    path.write_text(USER_LOSS.format(name="test_half_file"))
    (tmp_path / "my_loss_module.py").write_text(USER_LOSS.format(name="test_half_module"))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        for spec in (f"{path}:test_half_file", f"{path}:half_reinforce", "my_loss_module:test_half_module"):
            cfg = LossConfig(loss_type=spec)
            assert cfg.resolved_aggregation == "sequence_mean"
            loss, _ = policy_loss(onpolicy_logprobs(), None, ADV, MASK, cfg)
            assert loss.item() == pytest.approx(0.5 * (-1.0 - 2.0) / 2), spec
        assert LossConfig(loss_type="test_half_file").loss_type == "test_half_file"  # registered now
        with pytest.raises(ValueError, match="no loss 'nothing' is registered"):
            LossConfig(loss_type=f"{path}:nothing")
    finally:
        LOSSES.pop("test_half_file", None)
        LOSSES.pop("test_half_module", None)
