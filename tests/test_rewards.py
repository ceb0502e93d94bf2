"""Model-based rewards: a tiny sequence-classification reward model built here, and LLM judges
(a scripted fake judge, and the bundled model through the real transformers generator)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
import torch

from agentrl import ToolEnvironment
from agentrl.chat import get_chat_format
from agentrl.compute.models import load_model, load_tokenizer
from agentrl.generators.hf.generator import TransformersGenerator
from agentrl.generators.protocol import Generation, SamplingParams
from agentrl.rollout.rewards import JudgeReward, RewardModel, parse_score


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer("default")


@pytest.fixture(scope="module")
def tiny_rm(tokenizer: Any) -> Any:
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, num_labels=1, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    return Qwen2ForSequenceClassification(cfg).eval()


CONVERSATIONS = [
    [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "The answer is 4."}],
    [{"role": "user", "content": "What is 12 * 7?"}, {"role": "assistant", "content": "I think it is probably 84, but let me be sure of it first."}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}],
]


def test_reward_model_batches_equal_single_scores(tiny_rm: Any, tokenizer: Any) -> None:
    rm = RewardModel(tiny_rm, tokenizer, device="cpu", batch_size=2)
    batched = rm.score(CONVERSATIONS)  # one padded batch of 2, then 1
    singles = [rm.score([c])[0] for c in CONVERSATIONS]
    assert batched == pytest.approx(singles, abs=1e-5)
    assert len(set(round(s, 6) for s in singles)) == 3, "different conversations must score differently"
    # The score is the model's own logit on the rendered text (nothing invented on the way).
    ids = tokenizer(rm.text_of(CONVERSATIONS[0]), return_tensors="pt")
    with torch.no_grad():
        assert tiny_rm(**ids).logits[0, 0].item() == pytest.approx(singles[0], abs=1e-5)
    with pytest.raises(ValueError, match="label 3 out of range"):
        RewardModel(tiny_rm, tokenizer, device="cpu", label=3)


def test_reward_model_as_an_environment_reward_shares_forward_passes(tiny_rm: Any, tokenizer: Any) -> None:
    rm = RewardModel(tiny_rm, tokenizer, device="cpu", batch_size=8, gather_window_s=0.05)
    passes = []
    hook = tiny_rm.register_forward_hook(lambda mod, args, kwargs_out: passes.append(1))
    env = ToolEnvironment(rewards=[rm.as_reward()], datasets={"train": [{"question": "Say something."}]})

    async def episode(text: str) -> tuple[float, list[dict[str, Any]]]:
        e = env.spawn()
        await e.reset(task={"question": "Say something."})
        _, reward, terminated, _, info = await e.step({"role": "assistant", "content": text})
        assert terminated and set(info["rewards"]) == {"reward_model"}
        return reward, e.episode["messages"]

    async def main() -> list[tuple[float, list[dict[str, Any]]]]:
        out: list[Any] = [None] * 5
        async with anyio.create_task_group() as tg:
            for i in range(5):

                async def one(i: int = i) -> None:
                    out[i] = await episode(f"reply number {i} " * (i + 1))

                tg.start_soon(one)
        return out

    try:
        results = anyio.run(main)
    finally:
        hook.remove()
    assert len(passes) == 1, f"5 concurrent episodes should share one forward pass, saw {len(passes)}"
    expected = rm.score([msgs for _, msgs in results])
    assert [r for r, _ in results] == pytest.approx(expected, abs=1e-5)


def test_parse_score() -> None:
    assert parse_score("Score: 7") == 0.7
    assert parse_score("The answer is fine.\nscore = 10") == 1.0
    assert parse_score(" 3 / 10 ") == 0.3
    assert parse_score("Score: 11") is None  # out of the rubric's range
    assert parse_score("no idea") is None
    assert parse_score("Score: 4", low=1, high=5) == 0.75


class ScriptedJudge:
    """A generator that answers every request with a fixed reply (a fake judge model)."""

    def __init__(self, fmt: Any, reply: str) -> None:
        self.fmt, self.reply, self.prompts = fmt, reply, []

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        self.prompts.append(self.fmt.decode(prompt_ids))
        ids = self.fmt.encode(self.reply) + self.fmt.eot_token_ids[:1]
        return Generation(ids, [0.0] * len(ids), "stop")

    def update_weights(self, named_tensors: Any) -> None: ...

    async def close(self) -> None: ...


def judged_episode(judge: JudgeReward, answer: str) -> tuple[float, dict[str, Any]]:
    env = ToolEnvironment(rewards=[judge.as_reward()], datasets={"train": [{"question": "What is 6 * 7?", "answer": "42"}]})

    async def go() -> tuple[float, dict[str, Any]]:
        await env.reset(task={"question": "What is 6 * 7?", "answer": "42"})
        _, reward, _, _, info = await env.step({"role": "assistant", "content": answer})
        return reward, info["rewards"]

    return anyio.run(go)


def test_judge_with_a_scripted_fake_judge(tokenizer: Any) -> None:
    fmt = get_chat_format(tokenizer)
    fake = ScriptedJudge(fmt, "The answer matches the reference.\nScore: 8")
    judge = JudgeReward(fake, fmt)
    reward, components = judged_episode(judge, "The answer is 42.")
    assert reward == pytest.approx(0.8) and components == {"judge": pytest.approx(0.8)}
    [prompt] = fake.prompts
    assert "What is 6 * 7?" in prompt and "Reference answer: 42" in prompt and "The answer is 42." in prompt and "Score: N" in prompt
    confused = JudgeReward(ScriptedJudge(fmt, "I cannot tell."), fmt)
    reward, components = judged_episode(confused, "The answer is 41.")
    assert reward == 0.0 and components == {"judge": None} and confused.unparsed == 1  # skipped, not a zero
    with pytest.raises(ValueError, match="must contain"):
        JudgeReward(fake, fmt, rubric="Grade it.")


def test_judge_with_the_bundled_model(tokenizer: Any) -> None:
    """The real path: rubric -> chat format -> transformers generator -> parsed reply."""
    fmt = get_chat_format(tokenizer)
    model = load_model("default", dtype=torch.float32, device="cpu")
    gen = TransformersGenerator(model, pad_token_id=tokenizer.pad_token_id, gather_window_s=0.002)
    judge = JudgeReward(gen, fmt, max_tokens=24)

    async def go() -> list[tuple[float | None, str]]:
        try:
            task = {"question": "What is 6 * 7?", "answer": "42"}
            msgs = [{"role": "user", "content": "What is 6 * 7?"}, {"role": "assistant", "content": "The answer is 42."}]
            return [await judge.grade(task, msgs) for _ in range(2)]
        finally:
            await gen.close()

    (v1, r1), (v2, r2) = anyio.run(go)
    assert judge.calls == 2 and (v1, r1) == (v2, r2), "a greedy judge grades the same episode the same way"
    assert v1 == parse_score(r1)  # whatever the small model says is read by the same parser
    assert v1 is None or 0.0 <= v1 <= 1.0
