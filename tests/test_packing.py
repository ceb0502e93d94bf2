"""Packed micro-batches and each shared prompt once (agentrl/learn/packing.py, agentrl/compute/packed.py) against
the padded path: the same log-probs and gradients on every model family the trainer supports, LoRA and
full fine-tuning, float32 and bf16; models whose layers keep state across positions are refused."""

from __future__ import annotations

import random

import peft
import pytest
import torch
import transformers
from accelerate import Accelerator

from agentrl.compute.logprobs import completion_logprobs
from agentrl.compute.packed import packed_logprobs, packing_refusal
from agentrl.compute.reference import Reference
from agentrl.core.trajectory import Sample, Trajectory, TrajectoryGroup, Turn
from agentrl.learn import packing
from agentrl.learn.batch import build_batch
from agentrl.learn.config import LearnerConfig
from agentrl.learn.learner import Learner
from agentrl.learn.losses import LossConfig

V = 200
SMALL = dict(
    vocab_size=V,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    intermediate_size=96,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)


def families() -> dict[str, transformers.PreTrainedModel]:
    """Tiny random models of the families the chat formats serve (a small sliding window where a family has one)."""
    t = transformers
    return {
        "qwen2": (t.Qwen2Config, t.Qwen2ForCausalLM, dict(head_dim=32, tie_word_embeddings=True)),
        "qwen3": (t.Qwen3Config, t.Qwen3ForCausalLM, dict(head_dim=32)),
        "qwen3_moe": (
            t.Qwen3MoeConfig,
            t.Qwen3MoeForCausalLM,
            dict(head_dim=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
        ),
        "llama": (t.LlamaConfig, t.LlamaForCausalLM, dict(head_dim=32)),
        "mistral_sliding": (t.MistralConfig, t.MistralForCausalLM, dict(head_dim=32, sliding_window=6)),
        "gemma3_sliding": (
            t.Gemma3TextConfig,
            t.Gemma3ForCausalLM,
            dict(head_dim=32, sliding_window=5, layer_types=["sliding_attention", "full_attention"]),
        ),
        "phi3": (t.Phi3Config, t.Phi3ForCausalLM, {}),
        "smollm3": (t.SmolLM3Config, t.SmolLM3ForCausalLM, dict(head_dim=32, no_rope_layers=[1, 0])),
        "glm4": (t.Glm4Config, t.Glm4ForCausalLM, dict(head_dim=32)),
        "gpt_oss": (
            t.GptOssConfig,
            t.GptOssForCausalLM,
            dict(
                head_dim=32,
                num_local_experts=4,
                num_experts_per_tok=2,
                sliding_window=5,
                layer_types=["sliding_attention", "full_attention"],
            ),
        ),
        "deepseek_v3": (
            t.DeepseekV3Config,
            t.DeepseekV3ForCausalLM,
            dict(
                kv_lora_rank=16,
                q_lora_rank=None,
                qk_rope_head_dim=16,
                qk_nope_head_dim=16,
                v_head_dim=32,
                n_routed_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
                first_k_dense_replace=1,
                n_group=1,
                topk_group=1,
                num_key_value_heads=2,
            ),
        ),
    }


FAMILIES = list(families())


def tiny(name: str) -> transformers.PreTrainedModel:
    config_cls, model_cls, extra = families()[name]
    torch.manual_seed(0)
    return model_cls(config_cls(**(SMALL | extra))).float()


def groups(seed: int = 0, n_groups: int = 3, per_group: int = 4) -> list[TrajectoryGroup]:
    """Groups whose episodes share a prompt; multi-turn completions with tool results (mask 0) between turns."""
    rng = random.Random(seed)
    out = []
    for g in range(n_groups):
        prompt = [rng.randrange(1, V) for _ in range(rng.randint(3, 14))]
        eps = []
        for e in range(per_group):
            t = Trajectory(task={"g": g}, seed=0)
            s = Sample(prompt_ids=list(prompt))
            t.samples.append(s)
            for k in range(rng.randint(1, 3)):
                start, n = len(s.completion_ids), rng.choice([1, 3, 9])
                s.extend(
                    [rng.randrange(1, V) for _ in range(n)],
                    sampled=True,
                    logprobs=[-rng.uniform(0.5, 4) for _ in range(n)],
                )
                t.turns.append(
                    Turn(
                        index=k,
                        message={"role": "assistant"},
                        num_sampled=n,
                        finish_reason="stop",
                        sample=0,
                        start=start,
                    )
                )
                s.extend([rng.randrange(1, V) for _ in range(rng.randint(1, 4))], sampled=False)
            t.reward = float(e % 2)
            t.rewards = {"correct": t.reward}
            t.turns[-1].reward, t.turns[-1].rewards = t.reward, {"correct": t.reward}
            eps.append(t)
        out.append(TrajectoryGroup(task={"g": g}, seed=0, trajectories=eps))
    return out


def both_paths(model, batch, share: bool, budget: int, dtype=None, split: int = 5):
    """Padded and packed log-probs of every row, and the gradients of one weighted sum of each."""
    rows = torch.arange(len(batch))
    keep = int((batch.lengths - batch.starts).max())
    weights = torch.randn(len(batch), keep, generator=torch.Generator().manual_seed(1)) * batch.loss_mask[:, :keep]
    results = []
    for packed in (False, True):
        model.zero_grad(set_to_none=True)
        out = torch.zeros(len(batch), keep)
        for idx in packing.micro_batches(batch, rows, budget, share) if packed else rows.split(split):
            k = int((batch.lengths[idx] - batch.starts[idx]).max())
            with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
                if packed:
                    lp = packed_logprobs(model, packing.layout(batch, idx, k, share, budget), k, chunk_size=7)
                else:
                    width = int(batch.lengths[idx].max())
                    lp = completion_logprobs(model, batch.input_ids[idx, :width], batch.starts[idx], k, chunk_size=7)
            (lp.float() * weights[idx, :k]).sum().backward()
            out[idx, :k] = lp.detach().float()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((out * batch.loss_mask[:, :keep], grads))
    return results


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("share", [True, False], ids=["shared_prompt", "packed_only"])
def test_packed_logprobs_and_gradients_equal_the_padded_path(name, share):
    model = tiny(name)
    assert packing_refusal(model) is None
    batch = build_batch(groups(), pad_id=0)
    (lp0, g0), (lp1, g1) = both_paths(model, batch, share, budget=64)
    assert lp0.abs().sum() > 0
    torch.testing.assert_close(lp1, lp0, atol=1e-5, rtol=0)
    assert g0.keys() == g1.keys() and g0
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], atol=1e-5, rtol=1e-4, msg=n)


@pytest.mark.parametrize("name", ["qwen2", "llama", "gemma3_sliding"])
def test_bf16_and_lora(name):
    base = tiny(name)
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    batch = build_batch(groups(seed=2), pad_id=0)
    (lp0, g0), (lp1, g1) = both_paths(model, batch, share=True, budget=48)
    torch.testing.assert_close(lp1, lp0, atol=1e-5, rtol=0)
    assert g0 and all("lora" in n for n in g0)
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], atol=1e-5, rtol=1e-4, msg=n)
    # bf16: the padded path itself moves by ~2e-3 when its rows fall into other micro-batches (other
    # matrix shapes, other rounding); packing must stay within 1e-3 or within that floor
    (lp0, g0), (lp1, g1) = both_paths(model, batch, share=True, budget=48, dtype=torch.bfloat16)
    (lp2, g2), _ = both_paths(model, batch, share=True, budget=48, dtype=torch.bfloat16, split=1)
    floor = (lp2 - lp0).abs().max()
    assert (lp1 - lp0).abs().max() <= max(1e-3, floor)
    assert (lp1 - lp0).abs().mean() < 1e-4
    for n in g0:  # bf16 gradients: the padded path's own split moves them by up to ~0.6% (norm); packed ~0.9%
        assert (g1[n] - g0[n]).norm() <= max(0.02 * g0[n].norm(), 1.5 * (g2[n] - g0[n]).norm()), n


def test_layout_computes_each_prompt_once_and_no_padding_between():
    batch = build_batch(groups(n_groups=2, per_group=4), pad_id=0)
    rows = torch.arange(len(batch))
    real = int(batch.lengths.sum())
    prompts = int(batch.starts.sum())
    unique = prompts - sum(int(batch.starts[batch.group_ids == g][0]) for g in range(2))
    for share, expect in ((True, real - unique), (False, real)):
        packed = [
            packing.layout(batch, idx, 1, share, 10_000) for idx in packing.micro_batches(batch, rows, 10_000, share)
        ]
        assert (
            sum(int((p.unit >= 0).sum()) for p in packed) == expect
        )  # every real token once, each prompt once when shared
    # a budget smaller than a group's unit splits it (each part repeats the prompt), never drops a row
    micro = packing.micro_batches(batch, rows, 40, True)
    assert sorted(torch.cat(micro).tolist()) == rows.tolist()


@pytest.mark.parametrize(
    ("name", "config"),
    [
        ("lfm2", lambda: transformers.Lfm2Config(**SMALL, layer_types=["conv", "full_attention"])),
        (
            "qwen3_next",
            lambda: transformers.Qwen3NextConfig(
                **SMALL, head_dim=32, layer_types=["linear_attention", "full_attention"], num_experts=2
            ),
        ),
    ],
)
def test_models_that_keep_state_across_positions_are_refused(name, config):
    model = transformers.AutoModelForCausalLM.from_config(config())
    why = packing_refusal(model)
    assert why is not None and name in why


def _learner(model, **settings) -> Learner:
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    cfg = LearnerConfig(
        micro_batch_size=3,
        num_iterations=1,
        steps_per_generation=1,
        temperature=0.9,
        logprob_chunk_size=7,
        max_grad_norm=None,
        mask_truncated_completions=False,
        ref_mix_alpha=None,
        ref_mix_every=1,
        **settings,
    )
    return Learner(
        Accelerator(cpu=True),
        model,
        opt,
        sched,
        Reference(model, "full", 0.0),
        LossConfig(loss_type="dapo", beta=0.0),
        cfg,
    )


@pytest.mark.parametrize(
    "settings",
    [dict(pack_sequences=False), dict(share_prompt=False), dict()],
    ids=["padded", "packed", "packed_shared"],
)
def test_learner_step_is_the_same_and_computes_fewer_tokens(settings):
    torch.manual_seed(0)
    model = tiny("qwen2").train()
    batch = build_batch(groups(n_groups=2, per_group=6), pad_id=0, log_episodes=12)
    (metrics,) = _learner(model, micro_batch_tokens=80, **settings).learn(batch, 0)
    torch.manual_seed(0)
    ref_model = tiny("qwen2").train()
    ref_batch = build_batch(groups(n_groups=2, per_group=6), pad_id=0, log_episodes=12)
    (ref,) = _learner(ref_model, pack_sequences=False, sort_by_length=False).learn(ref_batch, 0)
    for key in ("loss/loss", "grad_norm"):  # the other loss/ metrics are means over micro-batches
        assert metrics[key] == pytest.approx(ref[key], abs=1e-6, rel=1e-5), key
    for a, b in zip(batch.samples, ref_batch.samples):
        torch.testing.assert_close(
            torch.tensor(a.trainer_logprobs), torch.tensor(b.trainer_logprobs), atol=1e-5, rtol=0
        )
    for (n, p), q in zip(model.named_parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=0, msg=n)
    real = int(batch.lengths.sum())
    if settings.get("pack_sequences", True):
        assert metrics["perf/computed_tokens"] < ref["perf/computed_tokens"]
    if settings == {}:
        assert metrics["perf/computed_tokens"] < real  # each prompt once


def test_refused_model_trains_padded_and_says_so(capsys):
    torch.manual_seed(0)
    model = transformers.Lfm2ForCausalLM(transformers.Lfm2Config(**SMALL, layer_types=["conv", "full_attention"]))
    learner = _learner(model)
    assert "pack_sequences: off" in capsys.readouterr().out and not learner.packed
    (metrics,) = learner.learn(build_batch(groups(), pad_id=0), 0)
    assert metrics["grad_norm"] > 0


def test_ranks_get_whole_groups_where_a_step_has_enough_of_them():
    from agentrl.compute.parallel.distributed import learner_rows

    groups = torch.tensor([0] * 3 + [1] * 3 + [2] * 3 + [3] * 3)
    # two steps of 6 rows, two ranks: each rank one whole group per step
    parts = [learner_rows(12, 2, rank, 2, groups) for rank in range(2)]
    assert [p.tolist() for p in parts[0]] == [[0, 1, 2], [6, 7, 8]]
    assert [p.tolist() for p in parts[1]] == [[3, 4, 5], [9, 10, 11]]
    # four ranks over one step of four groups of unequal size: cuts at the boundaries nearest the even split
    uneven = torch.tensor([0] * 5 + [1] + [2] * 2 + [3] * 4)
    cut = [learner_rows(12, 1, rank, 4, uneven)[0].tolist() for rank in range(4)]
    assert cut == [[0, 1, 2, 3, 4], [5], [6, 7], [8, 9, 10, 11]]
    # fewer groups than ranks: the even split (a group's prompt is then computed on both ranks)
    one_group = torch.zeros(4, dtype=torch.long)
    assert [learner_rows(4, 1, rank, 2, one_group)[0].tolist() for rank in range(2)] == [[0, 1], [2, 3]]
