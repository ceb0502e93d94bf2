"""The generator protocol: one request in, the sampled tokens and their logprobs out.

One request per call lets the rollout engine interleave many episodes; a backend batches
concurrent calls itself. Logprobs are those of the sampled tokens under the distribution the
token was actually drawn from: logits / temperature, then top-k, top-p and min-p filtering,
renormalised. With no filtering this is ``log_softmax(logits / temperature)``, which the trainer
recomputes exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, runtime_checkable

from pydantic import ConfigDict, Field

from agentrl.generators.config import SamplingConfig

if TYPE_CHECKING:
    from agentrl.generators.weights import WeightUpdate

FinishReason = Literal["stop", "length", "abort"]
T = TypeVar("T")


class SamplingParams(SamplingConfig):
    """One request: the sampling settings plus this turn's token budget and stop tokens.

    The rollout engine derives it from a ``SamplingConfig`` per turn, so defaults and bounds live
    in one place. ``min_tokens`` works as vLLM's ``min_tokens`` and transformers' ``min_new_tokens``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_tokens: int = Field(256, ge=1, description="tokens this request may sample")
    stop_token_ids: list[int] = Field(default_factory=list, description="sampling one of these ends the request")

    @classmethod
    def of(cls, sampling: SamplingConfig, **request: Any) -> SamplingParams:
        """The request for ``sampling`` with per-turn fields (``max_tokens``, ``stop_token_ids``, ``seed``)."""
        return cls(**{**sampling.model_dump(include=set(SamplingConfig.model_fields)), **request})


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

    ``run_rollouts(rollouts)`` is how a caller starts the event loop that awaits ``generate``
    (train, eval and the background rollouts all do): the backend decides which thread does its
    compute meanwhile, so no caller asks which backend (or wrapper) it holds.

    ``track_episodes(delta)``: the rollout engine says how many of its episodes will send
    requests (their number at the start, one fewer as each ends), so a backend that batches
    concurrent requests can wait for each of them; a backend with its own scheduler ignores it.
    """

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation: ...

    def begin_rollout(self) -> None: ...

    def end_rollout(self) -> None: ...

    def load_weights(self, update: WeightUpdate) -> None: ...

    def track_episodes(self, delta: int) -> None: ...

    def run_rollouts(self, rollouts: Callable[[], T]) -> T:
        """Call ``rollouts`` (it runs an event loop whose tasks await ``generate``) and return its
        result. A backend that computes on this process's CPU may serve its batches on the calling
        thread meanwhile and run ``rollouts`` on a helper thread (one thread for all torch work,
        ``TransformersGenerator.run_hosted``); a backend whose engine has its own threads or
        processes just calls it."""
        ...

    async def close(self) -> None: ...
