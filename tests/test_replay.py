"""Record and replay of tool results through the real rollout engine and the bundled model:
a replayed run reproduces every trajectory token for token without calling a tool."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch

from agentrl import ToolEnvironment, tool
from agentrl.chat import get_chat_format
from agentrl.compute.models import load_model, load_tokenizer
from agentrl.env.replay import REPLAY_ENV, ReplayMiss, ToolTape, record_tools, replay_tools
from agentrl.environments.calculator import CalculatorEnv, correct
from agentrl.generators.config import SamplingConfig
from agentrl.generators.hf.generator import TransformersGenerator
from agentrl.rollout import RolloutConfig, RolloutEngine

CALLS: list[str] = []


@tool(name="calculator")
def flaky_calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: The expression, e.g. "12 * 7".
    """
    # The calculator's own schema (the bundled model was trained on it), but a flaky service:
    # sometimes busy, sometimes off by one.
    CALLS.append(expression)
    roll = random.random()
    if roll < 0.3:
        return "Error: service busy, try again."
    from agentrl.tools.calculator import evaluate, format_number

    value = evaluate(expression)
    return format_number(value + (1 if roll > 0.8 else 0))


@tool(name="calculator")
def forbidden(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: The expression, e.g. "12 * 7".
    """
    raise AssertionError("a tool ran during replay")


def make_env(calculator: Any) -> ToolEnvironment:
    base = CalculatorEnv(num_train=50, num_test=3)
    return ToolEnvironment(tools=[calculator], rewards=[correct], datasets={"test": base.dataset("test")}, max_turns=3)


@pytest.fixture(scope="module")
def parts() -> tuple[Any, Any]:
    torch.manual_seed(0)
    return load_model("default", dtype=torch.float32, device="cpu"), get_chat_format(load_tokenizer("default"))


def rollout(parts: tuple[Any, Any], env: ToolEnvironment) -> list[Any]:
    model, fmt = parts
    gen = TransformersGenerator(model, pad_token_id=fmt.tokenizer.pad_token_id, gather_window_s=0.002)
    engine = RolloutEngine(gen, fmt, RolloutConfig(max_tokens_per_turn=64), SamplingConfig(temperature=1.0, seed=7))
    tasks = [dict(t) for t in env.dataset("test")]

    async def main() -> list[Any]:
        try:
            return await engine.run(env, tasks, n=2, seed=0)
        finally:
            await gen.close()

    groups = anyio.run(main)
    return [t for g in groups for t in g.trajectories]


def fingerprint(traj: Any) -> tuple[Any, ...]:
    return (
        [(s.prompt_ids, s.completion_ids, s.loss_mask) for s in traj.samples],
        [m.get("content") for m in traj.messages],
        traj.reward,
        traj.finish_reason,
        traj.error,
    )


def test_replay_reproduces_episodes_token_for_token_without_tools(parts: tuple[Any, Any], tmp_path: Path) -> None:
    random.seed(1)
    tape_path = tmp_path / "tape.jsonl"
    CALLS.clear()
    with record_tools(tape_path) as tape:
        recorded = rollout(parts, make_env(flaky_calculator))
    assert all(t.ok for t in recorded)
    assert len(CALLS) >= 4 and tape.calls_recorded >= len(CALLS), "the bundled model calls the calculator"
    tool_texts = [m["content"] for t in recorded for m in t.messages if m["role"] == "tool"]
    assert any("busy" in x for x in tool_texts) and any("busy" not in x for x in tool_texts)

    CALLS.clear()
    with replay_tools(tape_path) as replay:
        replayed = rollout(parts, make_env(forbidden))
    assert CALLS == [] and replay.calls_replayed == tape.calls_recorded
    assert [fingerprint(t) for t in replayed] == [fingerprint(t) for t in recorded]
    # Sampler log-probs agree to float noise (the generator batches episodes differently each run).
    for a, b in zip(replayed, recorded):
        for sa, sb in zip(a.samples, b.samples):
            assert sa.logprobs == pytest.approx(sb.logprobs, abs=1e-4)

    # Without the tape the same seeds give other tool results, so the equality above is the tape's doing.
    random.seed(2)
    fresh = rollout(parts, make_env(flaky_calculator))
    assert [fingerprint(t) for t in fresh] != [fingerprint(t) for t in recorded]


def test_replay_of_an_unrecorded_turn_fails_loudly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tape_path = tmp_path / "tape.jsonl"
    env = make_env(flaky_calculator)
    call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": "2 + 2"}}}]}

    async def one_turn() -> list[dict[str, Any]]:
        await env.reset(task={"question": "What is 2 + 2?", "answer": "4"})
        msgs, *_ = await env.step(call)
        return msgs

    random.seed(5)
    with record_tools(tape_path):
        first = anyio.run(one_turn)
    [entry] = [json.loads(line) for line in tape_path.read_text().splitlines()]
    assert entry["results"][0]["message"] == first[0]
    monkeypatch.setenv(REPLAY_ENV, str(tape_path))  # the no-code route used by `agentrl eval`
    assert anyio.run(one_turn) == first
    monkeypatch.delenv(REPLAY_ENV)
    with replay_tools(tape_path):
        assert anyio.run(one_turn) == first
        with pytest.raises(ReplayMiss, match="diverged"):
            anyio.run(one_turn)  # a second identical episode was never recorded: the tape says so
    with pytest.raises(FileNotFoundError, match="record one first"):
        ToolTape(tmp_path / "missing.jsonl", "replay")
