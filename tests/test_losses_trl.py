"""``policy_loss`` against TRL's own ``GRPOTrainer._compute_loss``: values and gradients in float64.

Both run on one tiny real Qwen2 model (float64, its log-probs in float64 on both sides) and the same inputs: prompts, completions with
environment tokens masked out (TRL's ``tool_mask``), advantages, old/reference log-probs and
importance weights, split into two micro-batches of one optimizer step. TRL's trainer object is
built with ``object.__new__`` and the attributes ``_compute_loss`` reads; its maths is TRL's.
Skipped when TRL is not installed (``pip install -e ".[dev]"`` installs it on Python >= 3.11).
The differences these settings do not cover are listed in docs/losses.md.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

import pytest
import torch

trl = pytest.importorskip("trl", minversion="1.16")

import transformers  # noqa: E402
from trl.trainer.grpo_trainer import GRPOTrainer  # noqa: E402

from agentrl.learn.losses import LossConfig, StepCounts, local_counts, policy_loss  # noqa: E402

TEMPERATURE = 0.7
MAX_COMPLETION = 12
B, P, C = 4, 5, 9  # rows, prompt length (equal: no left padding), completion width
MICRO = [slice(0, 2), slice(2, 4)]  # TRL's micro-batches have equal sizes


def tiny_model() -> transformers.PreTrainedModel:
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(
        vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=False,
    )  # fmt: skip
    cfg._attn_implementation = "eager"
    model = transformers.Qwen2ForCausalLM(cfg).to(torch.float64)
    model.train()  # TRL's "train" mode: gradient accumulation scaling applies
    return model


def float64_logprobs(model, input_ids, attention_mask, logits_to_keep, **_):
    """Per-token log-probs and entropies of the completion, in float64 end to end.

    TRL's fused LM head returns float32 log-probs (~3e-7 off), which would hide the loss maths below
    float32 noise; both sides use this function instead, so only the losses differ.
    """
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -logits_to_keep - 1 : -1]
    logp = torch.log_softmax(logits / TEMPERATURE, dim=-1)
    token = logp.gather(-1, input_ids[:, -logits_to_keep:, None])[..., 0]
    return token, -(logp.exp() * logp).sum(-1), None


@pytest.fixture(scope="module")
def model() -> transformers.PreTrainedModel:
    return tiny_model()


@pytest.fixture(scope="module")
def data(model) -> dict[str, torch.Tensor]:
    return make_data(model)


def make_data(model) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    lengths = torch.tensor([9, 4, 7, 6])  # completion lengths; the rest is right padding
    completion_mask = (torch.arange(C)[None, :] < lengths[:, None]).long()
    tool_mask = torch.ones(B, C, dtype=torch.long)
    tool_mask[0, 3:5] = 0  # environment tokens inside a completion: not the model's
    tool_mask[2, 2:4] = 0
    ids = torch.randint(1, 48, (B, P + C), generator=g)
    with torch.no_grad():
        attn = torch.cat([torch.ones(B, P, dtype=torch.long), completion_mask], 1)
        current = float64_logprobs(model, ids, attn, C)[0]
    # off-policy by up to ~e^0.5 per token, so clipping, capping and the gates all take part
    old = current + 0.5 * (torch.rand(B, C, generator=g, dtype=torch.float64) * 2 - 1)
    return {
        "prompt_ids": ids[:, :P],
        "prompt_mask": torch.ones(B, P, dtype=torch.long),
        "completion_ids": ids[:, P:],
        "completion_mask": completion_mask,
        "tool_mask": tool_mask,
        "advantages": torch.tensor([1.0, -0.7, 0.4, -1.3], dtype=torch.float64),
        "old_per_token_logps": old,
        "ref_per_token_logps": current + 0.3 * torch.randn(B, C, generator=g, dtype=torch.float64),
        "importance_sampling_ratio": torch.exp(0.4 * (torch.rand(B, C, generator=g, dtype=torch.float64) - 0.5)),
    }


def trl_trainer(model, *, loss_type: str, beta: float, level: str, epsilon_high: float, delta: float | None,
                bias_kl: bool, sampler: bool) -> GRPOTrainer:  # fmt: skip
    """A GRPOTrainer with only the state ``_compute_loss`` reads (no dataset, no generation)."""
    from accelerate import Accelerator
    from trl import GRPOConfig

    args = GRPOConfig(
        output_dir="unused", loss_type=loss_type, beta=beta, epsilon=0.2, epsilon_high=epsilon_high, delta=delta,
        importance_sampling_level=level, use_bias_correction_kl=bias_kl, max_completion_length=MAX_COMPLETION,
        per_device_train_batch_size=2, gradient_accumulation_steps=len(MICRO), steps_per_generation=len(MICRO),
        sapo_temperature_pos=1.0, sapo_temperature_neg=1.05, num_generations=2, report_to=[], use_cpu=True,
    )  # fmt: skip
    t = object.__new__(GRPOTrainer)
    t.args, t.model, t.accelerator = args, model, Accelerator()
    t.loss_type, t.beta, t.importance_sampling_level = loss_type, beta, level
    t.epsilon_low, t.epsilon_high = args.epsilon, args.epsilon_high
    t.temperature, t.max_completion_length = TEMPERATURE, MAX_COMPLETION
    t.top_entropy_quantile, t.off_policy_mask_threshold = 1.0, None
    t.use_vllm = t.vllm_importance_sampling_correction = sampler
    t.aux_loss_enabled, t._entropy_bonus_enabled = False, False
    t.current_gradient_accumulation_steps = len(MICRO)
    t._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    t._get_per_token_logps_and_entropies = float64_logprobs
    return t


def grads(model) -> list[torch.Tensor]:
    out = [p.grad.detach().clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return out


def run_trl(model, data, **kw) -> tuple[float, list[torch.Tensor]]:
    t = trl_trainer(model, **kw)
    mask = data["completion_mask"] * data["tool_mask"]
    total = 0.0
    for sl in MICRO:
        inputs = {k: v[sl] for k, v in data.items() if k != "importance_sampling_ratio" or kw["sampler"]}
        inputs["num_items_in_batch"] = mask.sum().to(torch.float64)  # spans the generation batch (= this step)
        loss = t._compute_loss(model, inputs)
        loss.backward()
        total += loss.item()
    return total, grads(model)


def run_ours(model, data, cfg: LossConfig) -> tuple[float, list[torch.Tensor]]:
    mask = data["completion_mask"] * data["tool_mask"]
    totals = sum(local_counts(mask[sl]) for sl in MICRO)
    counts = StepCounts.from_totals(totals, micro_batches=len(MICRO), max_completion_length=MAX_COMPLETION)
    total = 0.0
    for sl in MICRO:
        ids = torch.cat([data["prompt_ids"][sl], data["completion_ids"][sl]], 1)
        attn = torch.cat([data["prompt_mask"][sl], data["completion_mask"][sl]], 1)
        logp, _, _ = float64_logprobs(model, ids, attn, C)
        # TRL's importance_sampling_ratio is exp(old - sampler) computed at generation; hand the same
        # weight over as sampler log-probs (with a cap that changes nothing: TRL clips it earlier)
        sampler = data["old_per_token_logps"][sl] - torch.log(data["importance_sampling_ratio"][sl])
        loss, _ = policy_loss(
            logp, data["old_per_token_logps"][sl], data["advantages"][sl], mask[sl], cfg, counts=counts,
            ref_logprobs=data["ref_per_token_logps"][sl],
            sampler_logprobs=sampler if cfg.sampler_is_mode is not None else None,
        )  # fmt: skip
        loss.backward()
        total += loss.item()
    return total, grads(model)


CLIPPED = ["grpo", "bnpo", "dr_grpo", "dapo"]
SETTINGS = [
    *[dict(loss_type=t, level=lv, beta=b, bias_kl=k, eps_high=0.28, delta=None, sampler=False)
      for t, lv, (b, k) in itertools.product([*CLIPPED, "cispo", "sapo"], ["token", "sequence"], [(0.0, False), (0.04, False), (0.04, True)])],
    *[dict(loss_type=t, level="token", beta=0.0, bias_kl=False, eps_high=0.2, delta=1.5, sampler=False) for t in CLIPPED],
    *[dict(loss_type=t, level="token", beta=0.04, bias_kl=True, eps_high=0.28, delta=None, sampler=True)
      for t in [*CLIPPED, "cispo", "sapo"]],
]  # fmt: skip
SEEN: dict[str, float] = {}


@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: "-".join(f"{k}={v}" for k, v in s.items()))
def test_policy_loss_matches_trl(model, data, s):
    cispo = s["loss_type"] == "cispo"
    trl_value, trl_grads = run_trl(
        model, data, loss_type=s["loss_type"], beta=s["beta"], level=s["level"], delta=s["delta"], bias_kl=s["bias_kl"],
        sampler=s["sampler"], epsilon_high=(1 + s["eps_high"]) if cispo else s["eps_high"],  # TRL's cispo cap is absolute
    )  # fmt: skip
    extra = {} if s["loss_type"] == "sapo" else {"epsilon": 0.2, "epsilon_high": s["eps_high"]}
    if s["beta"]:
        extra["kl_ratio_weighted"] = s["bias_kl"]
    cfg = LossConfig(
        loss_type=s["loss_type"], beta=s["beta"], importance_sampling_level=s["level"], delta=s["delta"],
        sampler_is_mode="truncate" if s["sampler"] else None, sampler_is_cap=1e9, **extra,
    ) if s["sampler"] else LossConfig(
        loss_type=s["loss_type"], beta=s["beta"], importance_sampling_level=s["level"], delta=s["delta"],
        sampler_is_mode=None, **extra,
    )  # fmt: skip
    value, ours = run_ours(model, data, cfg)
    worst = max((a - b).abs().max().item() for a, b in zip(ours, trl_grads))
    scale = max(g.abs().max().item() for g in trl_grads)
    assert scale > 1e-4, "the setting produced no gradient: it would compare nothing"
    assert value == pytest.approx(trl_value, abs=1e-10, rel=0)  # float64: seen <= 3e-16
    assert worst <= 1e-10, (worst, scale)
    SEEN["value"] = max(SEEN.get("value", 0.0), abs(value - trl_value))
    SEEN["grad"] = max(SEEN.get("grad", 0.0), worst)
    print(f"max |diff| so far: loss {SEEN['value']:.2e}, gradient {SEEN['grad']:.2e}")
