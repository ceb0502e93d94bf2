"""The learner's fast path (fused head, packed micro-batches with each prompt once, sampled tokens only) against
the earlier path (padded micro-batches in batch order): the same losses, metrics and updated weights on the same batch.

Measured on this CPU (float32): losses 5e-9 apart, gradient norms 7e-9 (of ~0.09), weights after
two SGD steps at lr 0.5 7e-9 (asserted 1e-6 each). SGD rather than AdamW so a weight difference is the gradient
difference times the learning rate (Adam's first steps are sign-like and amplify rounding noise
in near-zero gradients).
"""

from __future__ import annotations

import random

import pytest
import torch
import transformers
from accelerate import Accelerator

from agentrl.compute.reference import Reference
from agentrl.core.trajectory import Sample, Trajectory, TrajectoryGroup, Turn
from agentrl.learn.batch import build_batch
from agentrl.learn.config import LearnerConfig
from agentrl.learn.learner import Learner
from agentrl.learn.losses import LossConfig

V = 200
OLD = dict(logprob_head="checkpoint", sort_by_length=False, score_sampled_only=False, autocast_cache=True, pack_sequences=False)
NEW = dict(logprob_head="fused", sort_by_length=True, score_sampled_only=True, autocast_cache=False)


def groups(seed: int = 0) -> list[TrajectoryGroup]:
    """Two groups of four episodes of very different lengths, several turns with tool results (mask 0) between."""
    rng = random.Random(seed)
    out = []
    for g in range(2):
        prompt = [rng.randrange(V) for _ in range(rng.randint(3, 12))]
        eps = []
        for e in range(4):
            t = Trajectory(task={"g": g}, seed=0)
            s = Sample(prompt_ids=list(prompt))
            t.samples.append(s)
            for k in range(rng.randint(1, 3)):
                start, n = len(s.completion_ids), rng.choice([2, 5, 20])
                s.extend([rng.randrange(V) for _ in range(n)], sampled=True, logprobs=[-rng.uniform(0.5, 4) for _ in range(n)])
                t.turns.append(Turn(index=k, message={"role": "assistant"}, num_sampled=n, finish_reason="stop", sample=0, start=start))
                s.extend([rng.randrange(V) for _ in range(rng.randint(1, 6))], sampled=False)
            t.reward = float(e % 2)
            t.rewards = {"correct": t.reward}
            t.turns[-1].reward, t.turns[-1].rewards = t.reward, {"correct": t.reward}
            eps.append(t)
        out.append(TrajectoryGroup(task={"g": g}, seed=0, trajectories=eps))
    return out


def train(variant: dict, beta: float, iterations: int) -> tuple[list[dict], dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=1, head_dim=32, intermediate_size=128, tie_word_embeddings=True)
    model = transformers.Qwen2ForCausalLM(cfg).float().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    settings = LearnerConfig(
        micro_batch_size=3, num_iterations=iterations, steps_per_generation=1, temperature=0.9, logprob_chunk_size=7,
        max_grad_norm=None, mask_truncated_completions=False, ref_mix_alpha=None, ref_mix_every=1, **variant,
    )
    learner = Learner(Accelerator(cpu=True), model, opt, sched, Reference(model, "full", beta), LossConfig(loss_type="dapo", beta=beta), settings)
    batch = build_batch(groups(), pad_id=0)
    metrics = list(learner.learn(batch, 0))
    return metrics, {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize(("beta", "iterations"), [(0.0, 1), (0.05, 2)])
def test_fast_path_gives_the_same_step(beta, iterations):
    old_metrics, old_weights = train(OLD, beta, iterations)
    new_metrics, new_weights = train(NEW, beta, iterations)
    same_split, _ = train(dict(NEW, sort_by_length=False, pack_sequences=False), beta, iterations)
    assert len(old_metrics) == len(new_metrics) == iterations
    for a, b, c in zip(old_metrics, new_metrics, same_split):
        assert abs(a["grad_norm"]) > 1e-4  # a real gradient
        # the step's loss and gradient do not depend on how rows fall into micro-batches
        for key in ("loss/loss", "grad_norm"):  # (num_active_tokens is a mean over micro-batches: packing has fewer)
            assert b[key] == pytest.approx(a[key], abs=1e-6, rel=1e-5), key
        # the other metrics are means of micro-batch values: equal when the split is the same
        for key in (k for k in a if k.startswith("loss/")):
            assert c[key] == pytest.approx(a[key], abs=1e-6, rel=1e-5), key
    for name, w in old_weights.items():
        torch.testing.assert_close(new_weights[name], w, atol=1e-6, rtol=0, msg=name)
