"""Colocated vLLM generation: an in-process vLLM engine behind the async ``Generator`` protocol.

Why this shape: the rollout engine awaits one request per episode turn, many at once, and a new
event loop per rollout (``anyio.run``). vLLM's ``AsyncLLM`` binds itself to one loop, so instead a
dedicated thread owns vLLM's ``LLMEngine`` (built in-process, no engine-core subprocess) and runs
its step loop: requests queued from any loop are added between steps and continuous batching does
the batching; finished outputs wake their callers on their own loop. Owning the engine in this
process is also what lets ``update_weights`` reload weights in place with no disk round-trip.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import torch

from agentrl.generators.hf.generator import GenerationError, GeneratorClosedError, _notifier
from agentrl.generators.protocol import Generation, SamplingParams, T
from agentrl.generators.vllm.common import (
    check_against_checkpoint,
    checkpoint_shapes,
    cpu_env_defaults,
    engine_kwargs,
    normalize_named_tensors,
    reload_in_process,
    require_vllm,
    to_generation,
    to_vllm_sampling,
)
from agentrl.generators.weights import WeightUpdate

__all__ = ["VLLMGenerator"]

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Request:
    request_id: str
    prompt: list[int]
    params: Any  # vllm.SamplingParams
    notify: Any
    done: anyio.Event
    result: Generation | None = None
    error: BaseException | None = None

    def resolve(self) -> None:
        try:
            self.notify(self.done.set)
        except RuntimeError:  # the caller's loop is gone: nobody is waiting
            pass


@dataclass
class _Inbox:
    add: list[_Request] = field(default_factory=list)
    abort: list[str] = field(default_factory=list)


class VLLMGenerator:
    """Serve concurrent ``generate`` calls from an in-process vLLM ``LLMEngine``.

    Build it with :meth:`from_pretrained`. ``max_context`` clips ``max_tokens`` so prompt plus
    output fits (default: the engine's ``max_model_len``) and rejects prompts that leave no room.
    Logprobs are vLLM's processed logprobs of the sampled tokens (see ``vllm_common``).
    """

    def __init__(self, engine: Any, *, max_context: int | None = None) -> None:
        self.engine = engine
        model_config = engine.model_config
        self.vocab_size = int(model_config.get_vocab_size())
        self.max_model_len = int(model_config.max_model_len)
        self.max_context = min(max_context or self.max_model_len, self.max_model_len)
        self._shapes = checkpoint_shapes(model_config.model)  # to refuse pushes that don't fit
        self._tied = bool(getattr(model_config.hf_config, "tie_word_embeddings", False))
        self.stats: dict[str, Any] = {"requests": 0, "steps": 0, "tokens_generated": 0, "weight_updates": 0, "max_running": 0}
        self._ids = itertools.count()
        self._cond = threading.Condition()
        self._inbox = _Inbox()
        self._running: dict[str, _Request] = {}
        self._engine_lock = threading.Lock()  # held for each engine step, weight update and sleep/wake
        self._asleep = False
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="VLLMGenerator", daemon=True)
        self._thread.start()

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        *,
        dtype: str = "auto",
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.9,
        enable_sleep_mode: bool = False,
        enforce_eager: bool | None = None,
        seed: int = 0,
        max_num_seqs: int | None = None,
        max_context: int | None = None,
    ) -> VLLMGenerator:
        """Start an in-process engine on ``path`` (a local folder or hub id).

        On CPU: the environment defaults of ``cpu_env_defaults`` apply, and ``enforce_eager``
        defaults to True (torch.compile warm-up costs ~30 s and gains little for small models).
        ``enable_sleep_mode`` needs CUDA.
        """
        require_vllm()
        cuda = torch.cuda.is_available()
        if enable_sleep_mode and not cuda:
            raise ValueError("generator.enable_sleep_mode needs a CUDA GPU: vLLM's CPU backend has no sleep mode")
        cpu_env_defaults()
        # Colocated means in this process: no engine-core subprocess and the in-process executor
        # (vLLM's CPU platform switches "uni" to "mp" unless this is "0").
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine
        from vllm.v1.executor.abstract import Executor

        args = EngineArgs(
            model=path,
            skip_tokenizer_init=True,  # token ids in, token ids out
            distributed_executor_backend="uni",
            **engine_kwargs(
                dtype=dtype, max_model_len=max_model_len, gpu_memory_utilization=gpu_memory_utilization,
                enable_sleep_mode=enable_sleep_mode, seed=seed, max_num_seqs=max_num_seqs,
                enforce_eager=(not cuda) if enforce_eager is None else enforce_eager,
            ),
        )
        # vLLM's CPU worker pins torch to its own thread settings process-wide; in-process that
        # would also throttle the trainer, so restore them once the engine is built.
        set_threads, threads = torch.set_num_threads, torch.get_num_threads()
        try:
            config = args.create_engine_config()
            engine = LLMEngine(vllm_config=config, executor_class=Executor.get_class(config), log_stats=False, multiprocess_mode=False)
        finally:
            torch.set_num_threads = set_threads
            set_threads(threads)
        return cls(engine, max_context=max_context)

    # ----------------------------------------------------------------- event-loop side

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        """Queue one request; the engine thread adds it at its next step and wakes us when done."""
        if self._closed:
            raise GeneratorClosedError("VLLMGenerator is closed")
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("prompt_ids is empty")
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt token ids out of range [0, {self.vocab_size}): {bad[:10]}")
        room = self.max_context - len(prompt)
        if room < 1:
            raise ValueError(f"prompt has {len(prompt)} tokens; max_context={self.max_context} leaves no room to generate")
        params = to_vllm_sampling(sampling, max_tokens=min(sampling.max_tokens, room))
        req = _Request(f"agentrl-{next(self._ids)}", prompt, params, _notifier(), anyio.Event())
        with self._cond:
            if self._closed:
                raise GeneratorClosedError("VLLMGenerator is closed")
            self._inbox.add.append(req)
            self._cond.notify()
        try:
            await req.done.wait()
        except BaseException:
            with self._cond:  # cancelled: free the engine slot
                self._inbox.abort.append(req.request_id)
                self._cond.notify()
            raise
        if req.error is not None:
            raise req.error
        assert req.result is not None
        return req.result

    async def close(self) -> None:
        """Stop the engine thread (running requests fail with GeneratorClosedError) and the engine."""
        with self._cond:
            already = self._closed
            self._closed = True
            self._cond.notify_all()
        if already:
            return
        await anyio.to_thread.run_sync(self._thread.join)
        shutdown = getattr(getattr(self.engine, "engine_core", None), "shutdown", None)
        if shutdown is not None:
            shutdown()

    # ----------------------------------------------------------------- Generator lifecycle

    def begin_rollout(self) -> None:
        """Wake an engine that sleeps (weights and KV cache back on the GPU) before requests arrive."""
        with self._engine_lock:
            if self._asleep:
                self.engine.wake_up()
                self._asleep = False

    def end_rollout(self) -> None:
        """Free the GPU for the training step: sleep when sleep mode is on (else nothing to free)."""
        self.sleep()

    def load_weights(self, update: WeightUpdate) -> None:
        """New policy weights: full weights (LoRA merged) reloaded in place."""
        with update.full() as named:
            self.update_weights(named)

    def track_episodes(self, delta: int) -> None:
        """Nothing to do: vLLM's scheduler takes requests into the running batch as they come."""

    def run_rollouts(self, rollouts: Callable[[], T]) -> T:
        """Just ``rollouts()``: the engine steps on its own thread whichever thread awaits it."""
        return rollouts()

    # ----------------------------------------------------------------- weights and memory (sync)

    def update_weights(self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> None:
        """Reload weights in place between engine steps (blocks while a step runs).

        ``named_tensors``: full-model weights named as in the checkpoint the engine loaded (use
        ``load_weights(WeightUpdate.from_module(policy, step))`` for a PEFT policy: merged, base names). A tied
        output layer is re-packed and the prefix cache reset. In-flight requests continue under
        the new weights, recomputing their KV cache.
        """
        named = normalize_named_tensors(named_tensors)
        if self._shapes is not None:
            named = check_against_checkpoint(named, self._shapes, self._tied)
        with self._engine_lock:
            if self._asleep:  # weights must be resident to be overwritten; the KV cache may stay asleep
                self.engine.wake_up(tags=["weights"])
            reload_in_process(self.engine, named)
        self.stats["weight_updates"] += 1

    def sleep(self) -> None:
        """Free accelerator memory while the trainer runs (CUDA only; no-op without sleep mode).

        Offloads weights and drops the KV cache (vLLM sleep level 1); the next ``generate`` or
        ``update_weights`` wakes what it needs. Call only when no request is in flight.
        """
        if not self.engine.model_config.enable_sleep_mode or self._asleep:
            return
        with self._engine_lock:
            if self._running:
                raise RuntimeError(f"sleep() with {len(self._running)} request(s) in flight")
            self.engine.reset_prefix_cache()
            self.engine.sleep(level=1)
            self._asleep = True

    # ----------------------------------------------------------------- engine thread

    def _loop(self) -> None:
        """Add queued requests, step the engine, deliver finished outputs; until closed."""
        while True:
            with self._cond:
                while not (self._inbox.add or self._inbox.abort or self._running or self._closed):
                    self._cond.wait()
                if self._closed:
                    leftovers = [*self._inbox.add, *self._running.values()]
                    self._inbox = _Inbox()
                    break
                inbox, self._inbox = self._inbox, _Inbox()
            with self._engine_lock:
                try:
                    self._admit(inbox)
                    if self._running:
                        self._step()
                except Exception as exc:  # noqa: BLE001 - keep serving; fail what was in flight
                    self._fail_running(exc, inbox.add)
        for req in leftovers:
            req.error = GeneratorClosedError("VLLMGenerator was closed before this request finished")
            req.resolve()

    def _admit(self, inbox: _Inbox) -> None:
        if self._asleep and inbox.add:
            self.engine.wake_up()
            self._asleep = False
        for req in inbox.add:
            try:
                self.engine.add_request(req.request_id, {"prompt_token_ids": req.prompt}, req.params)
            except Exception as exc:  # noqa: BLE001 - a bad request fails alone
                req.error = GenerationError(f"vLLM rejected the request: {exc!r}")
                req.resolve()
                continue
            self._running[req.request_id] = req
            self.stats["requests"] += 1
        self.stats["max_running"] = max(self.stats["max_running"], len(self._running))
        aborted = [rid for rid in inbox.abort if rid in self._running]
        if aborted:
            self.engine.abort_request(aborted)
            for rid in aborted:
                self._running.pop(rid, None)  # its caller was cancelled and waits for nothing

    def _fail_running(self, exc: Exception, extra: list[_Request] | None = None) -> None:
        """Fail every request in flight (and ``extra`` not yet resolved) with ``exc`` as the cause."""
        log.error("vLLM engine step failed; failing the %d request(s) in flight", len(self._running), exc_info=exc)
        if exc.__traceback__ is not None:
            traceback.clear_frames(exc.__traceback__)  # free the step's tensors
        failed = list(self._running.values()) + [r for r in extra or [] if r.result is None and r.error is None and r.request_id not in self._running]
        self._running.clear()
        try:
            self.engine.abort_request([r.request_id for r in failed])
        except Exception:  # noqa: BLE001 - the engine may already be unusable
            pass
        for req in failed:
            err = GenerationError(f"vLLM engine step failed with {len(failed)} request(s) in flight: {exc!r}")
            err.__cause__ = exc
            req.error = err
            req.resolve()

    def _step(self) -> None:
        """One engine step; a failure fails the requests in flight, never the thread."""
        try:
            outputs = self.engine.step()
        except Exception as exc:  # noqa: BLE001 - handed to the callers
            self._fail_running(exc)
            return
        self.stats["steps"] += 1
        for out in outputs:
            if not out.finished:
                continue
            req = self._running.pop(out.request_id, None)
            if req is None:
                continue
            try:
                req.result = to_generation(out)
                self.stats["tokens_generated"] += len(req.result.token_ids)
            except Exception as exc:  # noqa: BLE001
                req.error = GenerationError(f"could not read vLLM's output: {exc!r}")
            req.resolve()
