"""A Hugging Face ``AutoModelForSequenceClassification`` as a reward.

Concurrent episodes ask for their score one at a time; the requests that arrive within a short
window are scored in one padded forward pass (at most ``batch_size`` per pass) in a worker thread,
so the event loop keeps running the other episodes. The conversation is rendered with the reward
model's own chat template when it has one, else as "role: content" lines.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import anyio
import torch

from agentrl.core.messages import Message
from agentrl.env.environment import Reward


class RewardModel:
    """Scores conversations with a sequence-classification model (logit ``label`` = the reward).

    Args:
        model: a model object or a path / hub id for ``from_pretrained``.
        tokenizer: its tokenizer (loaded from ``model`` when that is a path).
        device: "cpu", "cuda", "cuda:1"... (default: CUDA when available, else CPU).
        batch_size: largest forward pass.
        max_length: tokens kept per conversation (the start is cut, the end where the answer is stays).
        label: which output logit is the score (reward models usually have one).
        gather_window_s: how long a first request waits for others to share its batch.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        device: str | torch.device | None = None,
        batch_size: int = 16,
        max_length: int = 1024,
        label: int = 0,
        gather_window_s: float = 0.01,
        dtype: torch.dtype | None = None,
    ) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if isinstance(model, str):
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(model)
            model = AutoModelForSequenceClassification.from_pretrained(model, **({"dtype": dtype} if dtype else {}))
        if tokenizer is None:
            raise ValueError("RewardModel: pass the tokenizer with a model object")
        if batch_size < 1 or max_length < 1:
            raise ValueError(f"RewardModel: batch_size and max_length must be >= 1, got {batch_size}, {max_length}")
        num_labels = getattr(model.config, "num_labels", 1)
        if not 0 <= label < num_labels:
            raise ValueError(f"RewardModel: label {label} out of range; the model has {num_labels} output(s)")
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
        if getattr(model.config, "pad_token_id", None) is None:
            model.config.pad_token_id = tokenizer.pad_token_id
        self.batch_size, self.max_length, self.label = batch_size, max_length, label
        self.gather_window_s = gather_window_s
        self._queue: list[tuple[str, asyncio.Future[float]]] = []
        self._flusher: asyncio.Task[None] | None = None

    # -- synchronous scoring ----------------------------------------------------------------------

    def text_of(self, messages: Sequence[Message]) -> str:
        """The text the reward model reads for a conversation."""
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(list(messages), tokenize=False)
        return "\n".join(f"{m.get('role')}: {m.get('content') or ''}" for m in messages)

    @torch.no_grad()
    def score_texts(self, texts: Sequence[str]) -> list[float]:
        """Scores of ``texts``, in batches of ``batch_size``."""
        scores: list[float] = []
        side = self.tokenizer.truncation_side
        self.tokenizer.truncation_side = "left"
        try:
            for i in range(0, len(texts), self.batch_size):
                batch = self.tokenizer(
                    list(texts[i : i + self.batch_size]), padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
                ).to(self.device)
                logits = self.model(**batch).logits.float()
                scores.extend(logits[:, self.label].cpu().tolist())
        finally:
            self.tokenizer.truncation_side = side
        return scores

    def score(self, conversations: Sequence[Sequence[Message]]) -> list[float]:
        return self.score_texts([self.text_of(m) for m in conversations])

    # -- as a reward (async, batched across episodes) ---------------------------------------------

    async def ascore(self, messages: Sequence[Message]) -> float:
        """One conversation's score; concurrent calls share forward passes."""
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._queue.append((self.text_of(messages), future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.ensure_future(self._flush())
        return await future

    async def _flush(self) -> None:
        await asyncio.sleep(self.gather_window_s)
        while self._queue:
            batch, self._queue = self._queue[: self.batch_size], self._queue[self.batch_size :]
            try:
                scores = await anyio.to_thread.run_sync(self.score_texts, [t for t, _ in batch])
            except Exception as exc:  # every waiter hears of it; none hangs
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            for (_, fut), value in zip(batch, scores):
                if not fut.done():
                    fut.set_result(value)

    def as_reward(self, name: str = "reward_model", weight: float = 1.0) -> Reward:
        """A ``Reward`` scoring the whole conversation at the end of the episode."""

        async def reward_model(messages: list[Message]) -> float:
            return await self.ascore(messages)

        return Reward(reward_model, weight=weight, name=name)
