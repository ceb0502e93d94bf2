"""Multi-turn rollouts with Qwen3's real tokenizer and template, thinking on: no silent prefix break.

The model is a tiny random Qwen3 (vocabulary = the real tokenizer's 151,669 tokens) run by the real
``TransformersGenerator`` inside the real ``RolloutEngine``. Two choices make the episodes honest
multi-turn episodes:

* A random model almost never ends a turn (one chance in 151,669 per token), and an episode whose
  turn hits the length cap ends there. So the model's output layer is restricted to a dozen tokens
  (``RestrictedHead`` adds -1e4 to the logits of every other token), among them ``<think>``,
  ``</think>``, newlines, words and ``<|im_end|>``. What it writes is still random: reasoning
  blocks that close or not, empty ones, stray tags, plain text, so the parser and the bridge see
  the odd shapes a real policy produces early in training.
* A random model never writes a well-formed tool call, so the environment does not wait for one:
  it answers every turn, alternately with a tool response (``role: tool``, which keeps Qwen3's
  "last query") and with a new user question (which makes Qwen3's own template strip earlier
  reasoning). Both ways the template can rewrite history are therefore exercised on every episode.

Then every bridge the engine appended is re-proven here from the conversation, independently of
the engine, and every unproven one must be a counted split whose new sample starts from a fresh
render of the conversation.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
import torch
from chat_fixtures import TOOLS, load_asset_tokenizer
from transformers import Qwen3Config, Qwen3ForCausalLM

from agentrl.chat import ChatFormat, get_chat_format
from agentrl.core.trajectory import Trajectory
from agentrl.env.environment import Environment
from agentrl.generators.config import SamplingConfig
from agentrl.generators.hf.generator import TransformersGenerator
from agentrl.rollout import RolloutConfig, RolloutEngine, rollout_metrics

TURNS = 5
ALLOWED = ["<think>", "</think>", "\n", "\n\n", "Hello", " world", " sum", " 42", ".", "<|im_end|>", "<|im_end|>"]


class ScriptedEnv(Environment):
    """Answers every assistant turn, tool results and new questions in turn, for ``TURNS`` turns."""

    max_turns = TURNS + 1

    def tool_schemas(self) -> list[dict[str, Any]]:
        return TOOLS

    async def reset(self, task: dict[str, Any] | None = None, seed: int | None = None) -> tuple[list, dict]:
        self.turn = 0
        return [{"role": "system", "content": "Think, then answer."}, {"role": "user", "content": "What is 40+2?"}], {}

    async def step(self, message: Any) -> tuple[list, float, bool, bool, dict]:
        self.turn += 1
        if self.turn >= TURNS:
            return [], 1.0, True, False, {}
        if self.turn % 2:
            reply = {"role": "tool", "tool_call_id": f"call_{self.turn}", "name": "add", "content": '{"sum": 42}'}
        else:
            reply = {"role": "user", "content": f"And question {self.turn}?"}
        return [reply], 0.0, False, False, {}


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_asset_tokenizer("qwen3")


@pytest.fixture(scope="module")
def model(tokenizer: Any) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=1, num_key_value_heads=1, head_dim=32, tie_word_embeddings=False,
        max_position_embeddings=2048,
    )  # fmt: skip
    model = Qwen3ForCausalLM(config).eval()
    allowed = sorted({tokenizer.convert_tokens_to_ids(t) if t.startswith("<") else tokenizer.encode(t)[0] for t in ALLOWED})
    model.lm_head = RestrictedHead(model.lm_head, allowed)
    return model


class RestrictedHead(torch.nn.Module):
    """The model's own output layer, with every token outside ``allowed`` pushed to -1e4."""

    def __init__(self, head: torch.nn.Linear, allowed: list[int]) -> None:
        super().__init__()
        self.head = head
        self.register_buffer("penalty", torch.full((head.out_features,), -1e4))
        self.penalty[allowed] = 0.0

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(hidden) + self.penalty


def rollout(fmt: ChatFormat, model: Qwen3ForCausalLM, episodes: int = 6, env: Environment | None = None) -> list[Trajectory]:
    gen = TransformersGenerator(model, pad_token_id=fmt.tokenizer.pad_token_id, gather_window_s=0.002)
    cfg = RolloutConfig(max_tokens_per_turn=80, max_completion_tokens=4000, max_context=4000)
    engine = RolloutEngine(gen, fmt, cfg, SamplingConfig(temperature=1.0, seed=3))

    async def main() -> list:
        try:
            return await engine.run(env or ScriptedEnv(), [{}], n=episodes, seed=0)
        finally:
            await gen.close()

    return [t for g in anyio.run(main) for t in g.trajectories]


def check_no_silent_break(fmt: ChatFormat, trajs: list[Trajectory]) -> tuple[int, int]:
    """Re-prove every bridge from the messages; returns (proven, split) counts over all turns."""
    proven = split = 0
    eot = set(fmt.eot_token_ids)
    for t in trajs:
        assert t.ok, t.error
        assert len(t.turns) >= 3, f"episode ended after {len(t.turns)} turns ({t.finish_reason})"
        messages = list(t.messages[:2])
        sample, pos = t.samples[0], 0
        assert sample.prompt_ids == fmt.render(messages, TOOLS)
        for turn in t.turns:
            messages.append(turn.message)
            assert sample.loss_mask[pos : pos + turn.num_sampled] == [1] * turn.num_sampled
            pos += turn.num_sampled
            if turn is t.turns[-1]:
                break
            before = fmt.render(messages, TOOLS, add_generation_prompt=False)
            after = fmt.render([*messages, *turn.env_messages], TOOLS)
            if turn.bridge == "proven":
                proven += 1
                assert after[: len(before)] == before, "a bridge was appended where the render is no prefix"
                last_eot = max(i for i, x in enumerate(before) if x in eot)
                env = sample.completion_ids[pos : pos + turn.num_env_tokens]
                assert env == after[last_eot + 1 :] and sample.loss_mask[pos : pos + len(env)] == [0] * len(env)
                pos += turn.num_env_tokens
            else:
                split += 1
                assert turn.bridge.startswith("split: not prefix-preserving"), turn.bridge
                assert after[: len(before)] != before, "a split where the bridge was provable"
                assert pos == len(sample.completion_ids)  # the old sample ends with the sampled turn
                sample, pos = t.samples[t.samples.index(sample) + 1], 0
                assert sample.prompt_ids == after  # the new sample starts from a fresh render
            messages.extend(turn.env_messages)
        assert pos == len(sample.completion_ids) and sample is t.samples[-1]
        assert t.splits == len(t.samples) - 1 == sum(turn.bridge.startswith("split") for turn in t.turns)
    return proven, split


def test_training_template_proves_every_bridge(tokenizer: Any, model: Qwen3ForCausalLM) -> None:
    fmt = get_chat_format(tokenizer)
    assert fmt.name == "qwen3" and fmt.template_source.startswith("training template")
    trajs = rollout(fmt, model)
    proven, split = check_no_silent_break(fmt, trajs)
    metrics = rollout_metrics(trajs)
    assert split == 0 and metrics["prefix_splits"] == 0
    assert proven == metrics["bridges/proven"] >= 3 * len(trajs)
    # The random outputs did contain reasoning blocks, closed and not, that a template could strip.
    texts = [fmt.decode(s.completion_ids) for t in trajs for s in t.samples]
    assert sum(x.count("</think>") for x in texts) >= len(trajs)


def test_original_template_splits_and_counts(tokenizer: Any, model: Qwen3ForCausalLM) -> None:
    """With Qwen3's own template the same rollouts cannot all be bridged: each break is a split."""
    fmt = get_chat_format(tokenizer, training_template=False)
    assert fmt.template_source == "tokenizer"
    trajs = rollout(fmt, model)
    proven, split = check_no_silent_break(fmt, trajs)
    metrics = rollout_metrics(trajs)
    assert split > 0 and metrics["prefix_splits"] == split and metrics["bridges/proven"] == proven
