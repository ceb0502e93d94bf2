"""The rollout engine on the real bundled model and the real transformers generator."""

from __future__ import annotations

import json
import math
import time

import anyio
import torch

from agentrl import Reward, ToolEnvironment, make, tool
from agentrl.chat import default_template, get_chat_format
from agentrl.core.trajectory import Sample, Trajectory, read_jsonl, write_jsonl
from agentrl.environments.calculator import CalculatorEnv, correct
from agentrl.generators.hf.generator import TransformersGenerator
from agentrl.generators.protocol import SamplingParams
from agentrl.rollout import RolloutConfig, RolloutEngine, rollout_metrics


def engine_for(model, fmt, **cfg) -> RolloutEngine:
    sampling = cfg.pop("sampling", SamplingParams(temperature=1.0, seed=1))
    gen = TransformersGenerator(model, pad_token_id=fmt.tokenizer.pad_token_id, gather_window_s=0.002)
    return RolloutEngine(gen, fmt, RolloutConfig(**cfg), sampling)


def run(engine: RolloutEngine, env, tasks, n=1, seed=0):
    async def main():
        try:
            return await engine.run(env, tasks, n=n, seed=seed)
        finally:
            await engine.generator.close()

    return anyio.run(main)


def test_trajectories_are_exact_and_masked(model, fmt):
    env = make("calculator")
    tasks = list(env.dataset("test"))[:6]
    engine = engine_for(model, fmt)
    groups = run(engine, env, tasks, n=2)
    trajs = [t for g in groups for t in g.trajectories]
    assert all(t.ok for t in trajs) and len(trajs) == 12
    for t in trajs:
        [sample] = t.samples
        # The mask marks exactly the sampled tokens, turn by turn.
        assert sum(sample.loss_mask) == sum(turn.num_sampled for turn in t.turns)
        assert len(sample.loss_mask) == len(sample.completion_ids) == len(sample.logprobs)
        # Environment tokens are the bridge's: for this template the full text equals a fresh render.
        if t.finish_reason == "stop" and not any(turn.parse_issues for turn in t.turns):
            assert fmt.decode(sample.ids) == fmt.render_text(t.messages, env.tool_schemas(), add_generation_prompt=False).rstrip("\n")
        # Every environment span is the tool-response turn plus the next assistant header.
        for turn in t.turns[:-1]:
            assert turn.bridge == "proven"
    env_spans = _spans(trajs[0].samples[0], fmt, sampled=False)
    if env_spans:
        assert env_spans[0].startswith("\n<|im_start|>user\n<tool_response>\n") and env_spans[0].endswith("<|im_start|>assistant\n")


def _spans(sample, fmt, sampled: bool) -> list[str]:
    spans, cur = [], []
    for tok, m in zip(sample.completion_ids, sample.loss_mask):
        if bool(m) == sampled:
            cur.append(tok)
        elif cur:
            spans.append(fmt.decode(cur))
            cur = []
    if cur:
        spans.append(fmt.decode(cur))
    return spans


def test_sampler_logprobs_match_trainer_recomputation(model, fmt):
    env = make("calculator")
    engine = engine_for(model, fmt, sampling=SamplingParams(temperature=0.8, seed=3))
    groups = run(engine, env, list(env.dataset("test"))[:4], n=2)
    worst = 0.0
    for t in (t for g in groups for t in g.trajectories):
        for s in t.samples:
            ids = torch.tensor([s.ids])
            with torch.no_grad():
                logits = model(ids).logits[0, :-1].float() / 0.8
            lp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
            start = len(s.prompt_ids) - 1
            for j, (m, sampler_lp) in enumerate(zip(s.loss_mask, s.logprobs)):
                if m:
                    worst = max(worst, abs(lp[start + j].item() - sampler_lp))
    assert worst < 1e-4


def test_tool_wait_overlaps_other_episodes_generation(model, fmt):
    """An episode whose tool awaits an event does not stop the others from generating."""
    engine = engine_for(model, fmt)
    engine.record_events = True
    release = anyio.Event()
    state = {"blocked": None}

    @tool(name="calculator", injected=("env",))
    async def gated(expression: str, env) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: The expression, e.g. "12 * 7".
        """
        from agentrl.tools.calculator import evaluate, format_number

        if state["blocked"] is None:
            state["blocked"] = id(env)
            engine.events.append(("tool_wait", -1, 0))
            await release.wait()
            engine.events.append(("tool_done", -1, 0))
        return format_number(evaluate(expression))

    env = ToolEnvironment(tools=[gated], rewards=[Reward(correct)], datasets={"train": make("calculator").dataset("test")}, max_turns=4)
    tasks = list(env.dataset("train"))[:8]

    async def main():
        async def watcher():
            while True:
                await anyio.sleep(0.005)
                if ("tool_wait", -1, 0) in engine.events:
                    after = engine.events[engine.events.index(("tool_wait", -1, 0)) :]
                    if sum(1 for e in after if e[0] == "generated") >= 3:
                        release.set()
                        return

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                tg.start_soon(watcher)
                groups = await engine.run(env, tasks, n=1)
        await engine.generator.close()
        return groups

    groups = anyio.run(main)
    events = engine.events
    wait, done = events.index(("tool_wait", -1, 0)), events.index(("tool_done", -1, 0))
    assert sum(1 for e in events[wait:done] if e[0] == "generated") >= 3
    assert all(t.ok for g in groups for t in g.trajectories)


def test_each_turn_goes_out_as_one_batch_however_long_the_tools_take(model, fmt):
    """Tools that take different times spread an episode's next request out past the gather
    window; the engine counts its running episodes for the generator, which waits for each of
    them instead of closing the batch at the first pause (that split turns into extra batches)."""
    engine = engine_for(model, fmt, max_turns=3)
    engine.generator.max_gather_s = 60.0  # the count decides, not the clock (a loaded machine)
    delays = iter([0.0, 0.05, 0.01, 0.04, 0.02, 0.03] * 10)

    @tool(name="calculator")
    async def slow(expression: str) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: The expression, e.g. "12 * 7".
        """
        from agentrl.tools.calculator import evaluate, format_number

        await anyio.sleep(next(delays))
        return format_number(evaluate(expression))

    env = ToolEnvironment(tools=[slow], rewards=[Reward(correct)], datasets={"train": make("calculator").dataset("test")}, max_turns=3)
    groups = run(engine, env, list(env.dataset("train"))[:6])
    turns = [len(t.turns) for g in groups for t in g.trajectories]
    assert max(turns) >= 2 and sum(t > 1 for t in turns) >= 3  # tools ran between turns
    assert engine.generator.stats["batch_sizes"] == [sum(t > k for t in turns) for k in range(max(turns))]


def test_blocking_sync_tool_runs_in_a_thread(model, fmt):
    engine = engine_for(model, fmt)
    engine.record_events = True
    calls = {"n": 0}

    @tool(name="calculator")
    def slow_calc(expression: str) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: The expression, e.g. "12 * 7".
        """
        from agentrl.tools.calculator import evaluate, format_number

        calls["n"] += 1
        if calls["n"] == 1:
            engine.events.append(("sleep_start", -1, 0))
            time.sleep(1.5)  # blocks its thread, not the loop
            engine.events.append(("sleep_end", -1, 0))
        return format_number(evaluate(expression))

    env = ToolEnvironment(tools=[slow_calc], rewards=[Reward(correct)], datasets={"train": make("calculator").dataset("test")}, max_turns=4)
    run(engine, env, list(env.dataset("train"))[:8])
    events = engine.events
    start, end = events.index(("sleep_start", -1, 0)), events.index(("sleep_end", -1, 0))
    assert any(e[0] == "generated" for e in events[start:end])


def test_unprovable_template_splits_and_counts(model, fmt):
    # A template that drops tool calls from earlier assistant turns rewrites history.
    lossy = default_template().replace("{%- for call in message.tool_calls or [] %}", "{%- for call in (message.tool_calls if loop.last else []) or [] %}")
    split_fmt = get_chat_format(fmt.tokenizer, "hermes", chat_template=lossy)
    env = make("calculator")
    engine = engine_for(model, split_fmt, sampling=SamplingParams(temperature=0.0))
    groups = run(engine, env, list(env.dataset("test"))[:4])
    trajs = [t for g in groups for t in g.trajectories]
    multi = [t for t in trajs if len(t.turns) > 1]
    assert multi, "the model should call the tool at least once"
    for t in multi:
        assert t.splits == len(t.turns) - 1 == len(t.samples) - 1
        assert all(turn.bridge.startswith("split: not prefix-preserving") for turn in t.turns[:-1])
        for s in t.samples:  # each sample is its own consistent training sequence
            assert all(m == 1 for m in s.loss_mask)
    assert rollout_metrics(groups)["prefix_splits"] == sum(t.splits for t in trajs)


def test_context_overflow_rolls_back_and_scores(model, fmt):
    env = make("calculator")
    task = list(env.dataset("test"))[0]
    sync = env.spawn().sync()
    prompt_len = len(fmt.render(sync.reset(task=task, seed=0)[0], env.tool_schemas()))
    sync.close()
    engine = engine_for(model, fmt, sampling=SamplingParams(temperature=0.0), max_context=prompt_len + 30)
    [group] = run(engine, env, [task])
    [t] = group.trajectories
    assert t.truncated and t.finish_reason == "context"
    [s] = t.samples
    assert len(s.ids) <= prompt_len + 30
    assert s.loss_mask[-1] == 1  # ends on a sampled token: the environment reply was rolled back
    assert t.rewards == {"correct": 0.0, "format": 0.0, "progress": 0.0}


def test_per_turn_token_cap_and_max_turns(model, fmt):
    env = make("calculator")
    tasks = list(env.dataset("test"))[:3]
    [g] = run(engine_for(model, fmt, max_tokens_per_turn=3), env, tasks[:1])
    assert g.trajectories[0].finish_reason == "length" and g.trajectories[0].truncated
    groups = run(engine_for(model, fmt, sampling=SamplingParams(temperature=0.0), max_turns=1), env, tasks)
    assert all(len(t.turns) == 1 for g in groups for t in g.trajectories)


class FlakyEnv(CalculatorEnv):
    async def reset(self, task=None, seed=None):
        if seed == 1:
            raise ConnectionError("sandbox unreachable")
        return await super().reset(task, seed)


def test_infrastructure_error_drops_only_that_episode(model, fmt, tmp_path):
    env = FlakyEnv()
    groups = run(engine_for(model, fmt), env, list(env.dataset("test"))[:3], n=2, seed=0)
    bad = groups[1]
    assert all(not t.ok and "ConnectionError: sandbox unreachable" in t.error for t in bad.trajectories)
    assert bad.ok == [] and all(t.ok for g in (groups[0], groups[2]) for t in g.trajectories)
    m = rollout_metrics(groups, elapsed_s=1.0)
    assert m["episodes/errors"] == 2 and m["finish/error"] == 2
    # JSONL round trip keeps everything.
    path = tmp_path / "t.jsonl"
    trajs = [t for g in groups for t in g.trajectories]
    write_jsonl(trajs, path)
    assert [t.to_dict() for t in read_jsonl(path)] == [t.to_dict() for t in trajs]


def test_a_demonstrated_episodes_missing_logprobs_are_strict_json_and_read_back_as_nan(tmp_path):
    """A demonstration's tokens have no sampler log-prob (NaN); JSON has no NaN, so the file
    writes null there and reading it gives NaN back, the finite values untouched."""
    smp = Sample(prompt_ids=[1, 2], completion_ids=[3, 4, 5], loss_mask=[1, 0, 1], logprobs=[math.nan, 0.0, -0.25],
                 trainer_logprobs=[-1.5, 0.0, math.inf])
    traj = Trajectory(task={"q": 1}, seed=None, samples=[smp])
    path = tmp_path / "demo.jsonl"
    write_jsonl([traj], path)

    def strict(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    line = json.loads(path.read_text(), parse_constant=strict)
    assert line["samples"][0]["logprobs"] == [None, 0.0, -0.25]
    assert line["samples"][0]["trainer_logprobs"] == [-1.5, 0.0, None]
    back = read_jsonl(path)[0].samples[0]
    assert math.isnan(back.logprobs[0]) and back.logprobs[1:] == [0.0, -0.25]
    assert back.trainer_logprobs[:2] == [-1.5, 0.0] and math.isnan(back.trainer_logprobs[2])
    assert smp.logprobs[1:] == [0.0, -0.25] and math.isnan(smp.logprobs[0])  # writing leaves the episode as it was
