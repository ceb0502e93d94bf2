"""The generator protocol: one request in, the sampled tokens and their logprobs out.

One request per call lets the rollout engine interleave many episodes; a backend batches
concurrent calls itself. Logprobs are those of the sampled tokens under the distribution the
token was actually drawn from: logits / temperature, then top-k, top-p and min-p filtering,
renormalised. With no filtering this is ``log_softmax(logits / temperature)``, which the trainer
recomputes exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from agentrl.generators.weights import WeightUpdate

FinishReason = Literal["stop", "length", "abort"]


@dataclass
class SamplingParams:
    """Per-request sampling settings. ``top_k=0`` and ``top_p=1`` and ``min_p=0`` mean no filtering.

    ``min_tokens``: stop tokens are masked until this many tokens were generated (as vLLM's
    ``min_tokens`` and transformers' ``min_new_tokens``); used to benchmark fixed-length decoding.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_tokens: int = 256
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    min_tokens: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 <= self.min_p < 1:
            raise ValueError(f"min_p must be in [0, 1), got {self.min_p}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Generation:
    """What one request produced. ``finish_reason`` is "stop" when a stop token was sampled (it is
    included in ``token_ids``), "length" at ``max_tokens``, "abort" when the backend gave up."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason


@runtime_checkable
class Generator(Protocol):
    """What the rollout engine and the trainer ask of a backend; nothing else is backend-specific.

    The generator owns its weights and memory. A training step is, in order:
    ``begin_rollout()`` (weights resident, caches ready), many concurrent ``generate`` calls,
    ``end_rollout()`` (free what the training step needs: KV caches, graphs, a generation copy,
    or the whole engine asleep), the trainer's update, then ``load_weights(update)`` with the new
    policy weights. All three are synchronous and idempotent, and must not be called while a
    ``generate`` is in flight. ``WeightUpdate`` can be read in this process or from a path, so the
    same calls fit a generator in another process.
    """

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation: ...

    def begin_rollout(self) -> None: ...

    def end_rollout(self) -> None: ...

    def load_weights(self, update: WeightUpdate) -> None: ...

    async def close(self) -> None: ...
