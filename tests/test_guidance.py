"""Guidance: demonstrated episodes on the sampled episodes' token path, kept where they beat every sample."""

from __future__ import annotations

import json
import math

import anyio
import pytest
import torch
from chat_fixtures import TOOLS, load_asset_tokenizer, tool_call

from agentrl.chat import get_chat_format
from agentrl.compute.models import load_tokenizer
from agentrl.core.overrides import build, parse_overrides
from agentrl.core.strict import ConfigError
from agentrl.core.trajectory import Sample, Trajectory, TrajectoryGroup, Turn
from agentrl.environments.calculator import CalculatorEnv
from agentrl.generators.hf.generator import TransformersGenerator
from agentrl.generators.protocol import SamplingParams
from agentrl.learn.batch import build_batch
from agentrl.rollout import RolloutConfig, RolloutEngine, rollout_metrics
from agentrl.rollout.guidance import GuidedRollouts, merge_guided
from agentrl.train.config import TrainConfig
from agentrl.train.trainer import Trainer


def rollout(model, fmt, env, tasks, n, guidance=True, temperature=1.0):
    gen = TransformersGenerator(model, pad_token_id=fmt.tokenizer.pad_token_id, gather_window_s=0.002)
    config = RolloutConfig(max_tokens_per_turn=48, max_completion_tokens=256, max_context=1024)
    engine = RolloutEngine(gen, fmt, config, SamplingParams(temperature=temperature, seed=1))
    if guidance:
        engine = GuidedRollouts(engine)

    async def main():
        try:
            return await engine.run(env, tasks, n=n, seed=0)
        finally:
            await gen.close()

    return anyio.run(main)


def test_a_demonstration_replaces_the_worst_sample_only_where_it_beats_every_sample(model, fmt):
    env = CalculatorEnv()
    tasks = list(env.dataset("test"))[:12]  # one- and two-call tasks: the bundled model solves some groups, not others
    groups = rollout(model, fmt, env, tasks, n=4)
    guided_groups = 0
    for group in groups:
        guided = [t for t in group.trajectories if t.guided]
        samples = [t for t in group.trajectories if not t.guided]
        assert len(group.trajectories) == 4 and sorted(t.index for t in group.trajectories) == [0, 1, 2, 3]
        if not guided:  # a sample already scored what the demonstration scores (1.7: correct, well formed, every step)
            assert max(t.reward for t in samples) >= 1.7 - 1e-9
            continue
        guided_groups += 1
        (demo,) = guided
        assert demo.reward == pytest.approx(1.7) and demo.rewards["correct"] == 1.0
        assert all(demo.reward > t.reward for t in samples)
        # the same token path as a sampled episode: the rendered conversation, trained on its assistant turns
        sample = demo.samples[0]
        assert len(demo.samples) == 1 and demo.splits == 0
        assert sample.ids == fmt.render(demo.messages, env.tool_schemas(), add_generation_prompt=False)[: len(sample.ids)]
        assert sample.num_sampled == sum(t.num_sampled for t in demo.turns) and all(math.isnan(x) for x, m in zip(sample.logprobs, sample.loss_mask) if m)
        assert len(demo.turns) == 1 + len(demo.task["steps"])
    assert 0 < guided_groups < len(groups), "the bundled model solves some of these tasks at T=1 and fails others"
    metrics = rollout_metrics(groups)
    assert metrics["guided"] == guided_groups and metrics["episodes"] == 4 * len(groups) - guided_groups


def test_without_guidance_no_episode_is_demonstrated(model, fmt):
    env = CalculatorEnv()
    groups = rollout(model, fmt, env, list(env.dataset("test"))[:4], n=2, guidance=False)
    assert not any(t.guided for g in groups for t in g.trajectories)
    assert "guided" not in rollout_metrics(groups)


class Faulty(CalculatorEnv):
    """Demonstrations that raise, return nothing, or return garbage, by task."""

    async def demonstrate(self):
        kind = self.episode["task"]["question"][-2]
        if kind in "0123":
            raise RuntimeError("the expert crashed")
        if kind in "456":
            return None
        return {"role": "user", "content": "not an assistant turn"}


def test_a_failing_demonstration_never_costs_the_samples(model, fmt):
    env = Faulty()
    tasks = list(env.dataset("test"))[:6]
    groups = rollout(model, fmt, env, tasks, n=3)
    assert all(not t.guided and t.ok for g in groups for t in g.trajectories)
    assert [len(g.trajectories) for g in groups] == [3] * 6


def traj(reward: float, guided: bool = False, ok: bool = True, index: int = 0) -> Trajectory:
    t = Trajectory(task={}, seed=0, index=index, guided=guided, reward=reward, error=None if ok else "boom")
    t.samples = [Sample(prompt_ids=[1, 2], completion_ids=[3, 4], loss_mask=[1, 1], logprobs=[-1.0, -1.0])]
    t.turns = [Turn(index=0, message={"role": "assistant", "content": ""}, num_sampled=2, finish_reason="stop", reward=reward)]
    return t


def test_merge_takes_the_demonstration_only_above_every_sample_in_place_of_the_worst():
    groups = [
        TrajectoryGroup(task={}, seed=0, trajectories=[traj(0.5, index=0), traj(0.2, index=1), traj(0.9, index=2)]),
        TrajectoryGroup(task={}, seed=1, trajectories=[traj(1.7, index=0), traj(0.2, index=1)]),  # a tie: not taken
        TrajectoryGroup(task={}, seed=2, trajectories=[traj(0.5, index=0), traj(0.0, ok=False, index=1)]),  # an error goes first
        TrajectoryGroup(task={}, seed=3, trajectories=[traj(0.1, index=0), traj(0.1, index=1)]),
    ]
    demos = [traj(1.7, guided=True, index=3), traj(1.7, guided=True), traj(1.7, guided=True), traj(1.7, guided=True, ok=False)]
    assert merge_guided(groups, demos) == 2
    assert [t.reward for t in groups[0].trajectories] == [0.5, 1.7, 0.9] and groups[0].trajectories[1].index == 1
    assert not any(t.guided for t in groups[1].trajectories)
    assert groups[2].trajectories[1].guided and groups[2].trajectories[1].index == 1
    assert not any(t.guided for t in groups[3].trajectories)


def test_guided_weight_scales_only_demonstrations_and_the_reward_is_the_policys():
    def groups():
        return [TrajectoryGroup(task={}, seed=0, trajectories=[traj(0.2, index=0), traj(0.4, index=1), traj(1.7, guided=True, index=2)])]

    plain = build_batch(groups(), pad_id=0)
    weighted = build_batch(groups(), pad_id=0, guided_weight=4.0)
    assert torch.allclose(weighted.advantages[:2], plain.advantages[:2])
    assert torch.allclose(weighted.advantages[2], 4 * plain.advantages[2]) and plain.advantages[2, 0] > 0
    assert weighted.metrics["reward/mean"] == pytest.approx(0.3), "training reward leaves demonstrations out"


@pytest.mark.parametrize("name", ["default", "qwen3"])
def test_assistant_ids_are_what_the_model_would_sample_for_the_message(name):
    tok = load_tokenizer("default") if name == "default" else load_asset_tokenizer(name)
    fmt = get_chat_format(tok)
    messages = [{"role": "user", "content": "Weather in Paris, and 2 + 3?"}]
    message = {"role": "assistant", "content": "", "tool_calls": [tool_call("get_weather", {"city": "Paris"}, "call_0"), tool_call("add", {"a": 2, "b": 3}, "call_1")]}
    ids = fmt.assistant_ids(messages, message, TOOLS)
    assert ids[-1] in fmt.eot_token_ids
    assert fmt.render(messages, TOOLS) + ids == fmt.render([*messages, message], TOOLS, add_generation_prompt=False)[: len(fmt.render(messages, TOOLS)) + len(ids)]
    parsed = fmt.parse(ids, TOOLS)
    assert not parsed.issues
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in parsed.to_message()["tool_calls"]] == [("get_weather", {"city": "Paris"}), ("add", {"a": 2, "b": 3})]


def test_guidance_needs_an_environment_that_demonstrates(tmp_path):
    cfg = build(TrainConfig, parse_overrides(["env=math_python", "guidance.enabled=true", f"output_dir={tmp_path}"]))
    with pytest.raises(ConfigError, match=r"guidance.enabled: env=math_python .* has no demonstrations; it must implement demonstrate\(\)"):
        Trainer(cfg)


SMALL = ["prompts_per_step=4", "num_generations=4", "micro_batch_size=8", "rollout.max_tokens_per_turn=32", "rollout.max_completion_tokens=160"]


def test_a_guided_run_trains_on_demonstrations_and_logs_them(tmp_path):
    cfg = build(TrainConfig, parse_overrides([*SMALL, "max_steps=2", f"output_dir={tmp_path}", "guidance.enabled=true", "guidance.weight=2"]))
    Trainer(cfg).train()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    assert all(1 <= m["rollout/guided"] <= 4 and m["rollout/episodes"] == 16 - m["rollout/guided"] for m in lines)
    assert all(m["reward/mean"] < 1.7 and math.isfinite(m["loss/loss"]) and m["loss/is_ratio/num_nonfinite_sampler"] > 0 for m in lines)
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert all("guided" in s for s in samples)


def test_demonstrated_tokens_are_trained_as_on_policy_tokens():
    """A demonstration's tokens carry NaN sampler log-probs: the sampler correction leaves them alone,
    so the step equals the one where the sampler reported exactly the trainer's log-probs, and it
    makes the demonstration more likely."""
    import transformers
    from accelerate import Accelerator

    from agentrl.compute.logprobs import completion_logprobs
    from agentrl.compute.reference import Reference
    from agentrl.learn.config import LearnerConfig
    from agentrl.learn.learner import Learner
    from agentrl.learn.losses import LossConfig

    def demo_groups():
        g = torch.Generator().manual_seed(0)
        trajs = []
        for i in range(4):
            t = Trajectory(task={}, seed=0, index=i, guided=i == 3, reward=1.7 if i == 3 else 0.1 * i)
            s = Sample(prompt_ids=[5, 6, 7])
            ids = torch.randint(10, 100, (6,), generator=g).tolist()
            s.extend(ids, sampled=True, logprobs=[math.nan] * 6 if i == 3 else [-2.0] * 6)  # samples far from the trainer: corrected
            t.samples.append(s)
            t.turns.append(Turn(index=0, message={"role": "assistant"}, num_sampled=6, finish_reason="stop", reward=t.reward))
            trajs.append(t)
        return [TrajectoryGroup(task={}, seed=0, trajectories=trajs)]

    def step(on_policy_demo: bool):
        torch.manual_seed(0)
        cfg = transformers.Qwen2Config(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                       head_dim=16, intermediate_size=64)
        model = transformers.Qwen2ForCausalLM(cfg).float().train()
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        settings = LearnerConfig(micro_batch_size=4, num_iterations=1, steps_per_generation=1, temperature=1.0, logprob_chunk_size=64,
                                 max_grad_norm=None, mask_truncated_completions=False, ref_mix_alpha=None, ref_mix_every=1)
        learner = Learner(Accelerator(cpu=True), model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0),
                          Reference(model, "full", 0.0), LossConfig(loss_type="dapo"), settings)
        batch = build_batch(demo_groups(), pad_id=0)

        def demo_logprobs():
            with torch.no_grad():
                return completion_logprobs(model, batch.input_ids[3:4], batch.starts[3:4], batch.loss_mask.shape[1])[0, :6]

        before = demo_logprobs()
        assert torch.isnan(batch.sampler_logprobs[3, :6]).all()
        if on_policy_demo:
            batch.sampler_logprobs[3, :6] = before
        metrics = list(learner.learn(batch, 0))
        return float(before.sum()), float(demo_logprobs().sum()), [p.detach().clone() for p in model.parameters()], metrics[0]

    before, after, nan_weights, metrics = step(on_policy_demo=False)
    _, _, exact_weights, _ = step(on_policy_demo=True)
    assert after > before + 0.1, "the demonstration's tokens became more likely"
    assert metrics["loss/is_ratio/num_nonfinite_sampler"] == 6
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(nan_weights, exact_weights))


def test_merge_above_mean_takes_the_demonstration_in_solved_groups_too():
    groups = [
        TrajectoryGroup(task={}, seed=0, trajectories=[traj(1.7, index=0), traj(0.2, index=1), traj(0.9, index=2)]),  # mean 0.93
        TrajectoryGroup(task={}, seed=1, trajectories=[traj(1.7, index=0), traj(1.7, index=1)]),  # mean 1.7: not above
    ]
    assert merge_guided(groups, [traj(1.7, guided=True), traj(1.7, guided=True)], keep="above_mean") == 1
    assert [t.guided for t in groups[0].trajectories] == [False, True, False]
    assert not any(t.guided for t in groups[1].trajectories)


def test_guidance_with_rollouts_made_ahead(tmp_path):
    """The background generator's engine plays demonstrations too (the same engine settings)."""
    cfg = build(TrainConfig, parse_overrides([*SMALL, "max_steps=2", f"output_dir={tmp_path}", "guidance.enabled=true", "max_staleness=1"]))
    Trainer(cfg).train()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    assert all(m["rollout/guided"] >= 1 and 0 <= m["async/staleness"] <= 1 for m in lines)
