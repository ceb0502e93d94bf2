"""An LLM judge as a reward: ask a model, through any agentrl generator, to grade with a rubric.

The judge sees the task, the conversation's final answer (and optionally a reference answer) in a
prompt built from ``rubric``, answers in free text, and ``parse_score`` reads the first
"Score: N" (or a lone number) from it, scaled to [0, 1] by ``scale``. A reply without a readable
score gives ``None``: the reward is skipped for that episode rather than counted as zero, and
``unparsed`` counts how often it happened.
"""

from __future__ import annotations

import re
from typing import Any

from agentrl.chat.base import ChatFormat
from agentrl.core.messages import Message
from agentrl.env.environment import Reward
from agentrl.generators.protocol import Generator, SamplingParams

DEFAULT_RUBRIC = (
    "You grade answers. Question:\n{question}\n\nReference answer: {reference}\n\nAnswer to grade:\n{answer}\n\n"
    "Is the answer correct and complete? Reply with one line 'Score: N' where N is from {low} to {high}."
)
_SCORE_RE = re.compile(r"score\s*[:=]?\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)
_NUMBER_RE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(?:/\s*\d+)?\s*$")


def parse_score(text: str, low: float = 0.0, high: float = 10.0) -> float | None:
    """The judge's score in [0, 1], from "Score: N" or a reply that is only a number; else None."""
    match = _SCORE_RE.search(text or "") or _NUMBER_RE.match(text or "")
    if not match:
        return None
    value = float(match.group(1))
    if not low <= value <= high:
        return None
    return (value - low) / (high - low)


class JudgeReward:
    """Grades an episode's final answer by asking ``generator`` (any agentrl Generator).

    Args:
        generator: the judge model's generator (may be the policy's own, or another model's).
        chat_format: the judge model's chat format (renders the prompt, reads the reply).
        rubric: the prompt; ``{question}``, ``{answer}``, ``{reference}``, ``{low}``, ``{high}`` are filled in.
        reference_key: the task column holding a reference answer ("" for none).
        scale: the score range the rubric asks for.
        max_tokens / temperature: the judge's sampling (greedy by default, so grades repeat).
    """

    def __init__(
        self,
        generator: Generator,
        chat_format: ChatFormat,
        rubric: str = DEFAULT_RUBRIC,
        *,
        reference_key: str = "answer",
        scale: tuple[float, float] = (0.0, 10.0),
        max_tokens: int = 64,
        temperature: float = 0.0,
        system_prompt: str | None = None,
    ) -> None:
        if scale[0] >= scale[1]:
            raise ValueError(f"JudgeReward scale must be (low, high) with low < high, got {scale}")
        for key in ("{answer}",):
            if key not in rubric:
                raise ValueError(f"JudgeReward rubric must contain {key}")
        self.generator, self.chat_format, self.rubric = generator, chat_format, rubric
        self.reference_key, self.scale, self.system_prompt = reference_key, scale, system_prompt
        self.sampling = SamplingParams(temperature=temperature, max_tokens=max_tokens, stop_token_ids=chat_format.stop_token_ids)
        self.unparsed = 0
        self.calls = 0

    def prompt(self, task: dict[str, Any], messages: list[Message]) -> list[Message]:
        """The judge's conversation for one episode."""
        question = task.get("question") or task.get("prompt") or next((m.get("content", "") for m in messages if m.get("role") == "user"), "")
        answer = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "assistant"), "")
        reference = str(task.get(self.reference_key, "")) if self.reference_key else ""
        text = self.rubric.format(question=question, answer=answer, reference=reference or "(none)", low=_fmt(self.scale[0]), high=_fmt(self.scale[1]))
        judge: list[Message] = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*judge, {"role": "user", "content": text}]

    async def grade(self, task: dict[str, Any], messages: list[Message]) -> tuple[float | None, str]:
        """(score in [0, 1] or None, the judge's reply text)."""
        ids = self.chat_format.render(self.prompt(task, messages))
        generation = await self.generator.generate(ids, self.sampling)
        reply = self.chat_format.parse(generation.token_ids).content or ""
        self.calls += 1
        value = parse_score(reply, *self.scale)
        if value is None:
            self.unparsed += 1
        return value, reply

    def as_reward(self, name: str = "judge", weight: float = 1.0) -> Reward:
        async def judge(task: dict[str, Any], messages: list[Message]) -> float | None:
            return (await self.grade(task, messages))[0]

        return Reward(judge, weight=weight, name=name)


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)
