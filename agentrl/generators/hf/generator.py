"""Batched generation with a plain Hugging Face causal LM, behind the async ``Generator`` protocol.

Why: the rollout engine awaits one request per episode turn, hundreds at once, on one event loop.
Calls are queued; a dedicated model thread gathers them into one left-padded batch (prefill, then
token-by-token decode with a KV cache), so N concurrent requests cost about ``max_tokens`` forward
passes rather than N times that, and the event loop never waits on the model.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import torch

from agentrl.compute.generation_copy import generation_copy
from agentrl.core.errors import AgentrlError
from agentrl.generators.hf.continuous import decode_continuous
from agentrl.generators.hf.dynamic_decode import decode_dynamic
from agentrl.generators.hf.sampling import sample_next
from agentrl.generators.protocol import Generation, SamplingParams, T
from agentrl.generators.weights import WeightUpdate, normalize_named_tensors

__all__ = ["GenerationError", "GeneratorClosedError", "TransformersGenerator", "sample_next"]


class GeneratorClosedError(AgentrlError, RuntimeError):
    """``generate`` was called after ``close()``, or the request was still queued when it closed."""


class GenerationError(AgentrlError, RuntimeError):
    """The batch this request was in failed (e.g. out of memory); the caller decides what to do.

    Only that batch's requests see it; the worker keeps serving later requests. ``__cause__`` holds
    the original exception.
    """


def _notifier() -> Callable[[Callable[[], None]], None]:
    """A thread-safe, non-blocking "run this soon on the caller's event loop" (asyncio or trio)."""
    try:
        return asyncio.get_running_loop().call_soon_threadsafe
    except RuntimeError:
        import trio  # anyio's other backend

        return trio.lowlevel.current_trio_token().run_sync_soon


@dataclass(eq=False)
class _Request:
    prompt: list[int]
    sampling: SamplingParams
    max_tokens: int
    notify: Callable[[Callable[[], None]], None]
    done: anyio.Event
    arrived: float = field(default_factory=time.monotonic)
    result: Generation | None = None
    error: BaseException | None = None
    cancelled: bool = False
    resolved: bool = False

    def resolve(self) -> None:
        """Wake the awaiting task on its own loop (once); if that loop is gone nobody is waiting."""
        if self.resolved:
            return
        self.resolved = True
        try:
            self.notify(self.done.set)
        except RuntimeError:
            pass


class TransformersGenerator:
    """Serve concurrent ``generate`` calls from one HF causal LM by batching them.

    ``model`` must already be on its device and dtype, in eval mode. Queued requests share a batch
    until every episode the rollout engine runs has sent one (``track_episodes``), or, for callers
    that track none, while each arrives within ``gather_window_s`` of the previous one; at most
    0.1 s after the first, at most ``max_batch_size``. Those arriving while a batch runs go into the next. ``max_context`` clips ``max_tokens`` so prompt plus
    output fits, and rejects prompts that leave no room.

    Weights: by default the generator decodes with ``model`` itself, so a trainer sharing the
    module sees every optimizer step with no copy. ``weights_dtype`` (e.g. bf16 while ``model``
    holds fp32 master weights) decodes from a copy in that dtype instead: half the bytes read per
    token and no per-step casts under autocast. The copy holds weights only between
    ``begin_rollout`` (cast from ``model``) and ``end_rollout`` (freed), so a training step does
    not carry 2 bytes per parameter it never reads.

    ``training_alongside``: a learner runs forwards on another thread while this generator
    decodes (rollouts ahead); process-global switches are then set once, never per batch.
    ``continuous`` (static cache only): a queued request may take over the row of a finished one
    while a batch runs (``agentrl/generators/hf/continuous.py``), checked every ``admit_every`` steps.
    ``sample_in_step`` (compiled static decoding): a batch with one tempered setting and no
    filters draws its tokens inside the captured step (``StaticBatch.advance``) instead of the
    host launching the sampler after each step (the same draws), and its graphs keep no logits.
    ``host_rollouts``: whether ``run_rollouts`` serves the batches on the calling thread
    (``run_hosted``) rather than on a model thread of its own; default (None): on CPU only, where
    a second thread doing torch work costs every op a kernel wake-up.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        pad_token_id: int,
        *,
        max_batch_size: int = 256,
        gather_window_s: float = 0.005,
        max_context: int | None = None,
        static_cache: bool | None = None,
        compile_decode: bool = False,
        weights_dtype: torch.dtype | None = None,
        training_alongside: bool = False,
        host_rollouts: bool | None = None,
        continuous: bool = False,
        admit_every: int = 16,
        sample_in_step: bool = True,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if admit_every < 1:
            raise ValueError(f"admit_every must be >= 1, got {admit_every}")
        self.source = model  # the module whose weights this generator decodes with
        self._copy = weights_dtype is not None and next(model.parameters()).dtype != weights_dtype
        if self._copy:
            if hasattr(model, "peft_config"):
                raise ValueError("weights_dtype: a generation copy of a PEFT model is not supported; decode with the model itself")
            model = generation_copy(model, weights_dtype)
            self._set_copy_weights(model, None)
        self._foreign = False  # the copy holds weights written by load_weights, not cast from source
        self.model = model
        self.pad_token_id = int(pad_token_id)
        self.max_batch_size = max_batch_size
        self.gather_window_s = gather_window_s
        self.max_gather_s = max(gather_window_s, 0.1)
        self.max_context = max_context
        self.device = next(model.parameters()).device
        self._training_alongside = training_alongside
        if training_alongside and self.device.type == "cuda":
            torch.backends.cuda.enable_cudnn_sdp(False)  # see _attention_backends
        self.host_rollouts = self.device.type == "cpu" if host_rollouts is None else host_rollouts
        self.vocab_size = model.get_input_embeddings().num_embeddings
        signature = inspect.signature(model.forward).parameters
        self._keep_last_logits = "logits_to_keep" in signature
        self._cache_kwarg = "cache" if "cache" in signature else "past_key_values"  # renamed in transformers 5.x
        self.stats: dict[str, Any] = {
            "batches": 0, "forward_passes": 0, "batch_sizes": [], "tokens_generated": 0, "weight_updates": 0, "admitted": 0, "admissions": 0,
            "sampled_in_step": 0,  # batches whose compiled steps drew their own next tokens
            "host_wait_s": 0.0,  # static cache: seconds the host waited for the device's sampled tokens
            # the last batches' timeline (start and end on time.monotonic, requests, forward passes;
            # static cache: graphs captured, seconds in captures, seconds the host waited for the
            # device's tokens): where a rollout's time goes between batches, inside them and to
            # their longest rows
            "trace": deque(maxlen=512),
        }
        self.continuous, self.admit_every = continuous, admit_every
        self.sample_in_step = sample_in_step
        self._cond = threading.Condition()
        self._pending: deque[_Request] = deque()
        self._weights_lock = threading.Lock()  # held for a whole batch, so weights never change mid-batch
        self._updates_waiting = 0  # callers waiting for that lock (under _cond): a running batch stops admitting
        self._episodes = 0  # episodes the rollout engine runs now (track_episodes; under _cond)
        self._thread: threading.Thread | None = None
        self._host: threading.Event | None = None  # set while run_hosted serves batches on its caller's thread
        self._closed = False
        # Static cache + CUDA graphs when asked for (build_generator asks by default on CUDA; see
        # static_decode.py and docs/performance.md); otherwise the dynamic cache.
        from agentrl.generators.hf.static_decode import StaticDecoder

        want_static = bool(static_cache)
        if want_static and not StaticDecoder.supports(model):
            if static_cache:
                raise ValueError("static_cache=True: this model (sliding-window or mixed attention) or transformers version is not supported")
            want_static = False
        if compile_decode and not want_static:
            raise ValueError("compile_decode=True needs static_cache=True (the compiled step runs on the static cache)")
        self.static = StaticDecoder(model, self.pad_token_id, compile=compile_decode) if want_static else None

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        device: str | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
        *,
        pad_token_id: int | None = None,
        max_batch_size: int = 256,
        gather_window_s: float = 0.005,
        max_context: int | None = None,
        **model_kwargs: Any,
    ) -> TransformersGenerator:
        """Load a causal LM (default device: CUDA if available) and wrap it."""
        from transformers import AutoModelForCausalLM

        if dtype is not None:
            model_kwargs["dtype"] = dtype
        model = AutoModelForCausalLM.from_pretrained(path, **model_kwargs)
        model.to(device or ("cuda" if torch.cuda.is_available() else "cpu")).eval()
        if pad_token_id is None:  # any id works: padded positions are masked out
            cfg = model.generation_config
            pad_token_id = next((t for t in (cfg.pad_token_id, cfg.eos_token_id, model.config.pad_token_id) if t is not None), 0)
            if isinstance(pad_token_id, (list, tuple)):
                pad_token_id = pad_token_id[0]
        return cls(model, pad_token_id, max_batch_size=max_batch_size, gather_window_s=gather_window_s, max_context=max_context)

    # ----------------------------------------------------------------- event-loop side

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        """Queue one request and wait (without blocking the loop) for its batch to finish it."""
        if self._closed:
            raise GeneratorClosedError("TransformersGenerator is closed")
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("prompt_ids is empty")
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:  # would otherwise crash the whole batch
            raise ValueError(f"prompt token ids out of range [0, {self.vocab_size}): {bad[:10]}")
        max_tokens = sampling.max_tokens
        if self.max_context is not None:
            room = self.max_context - len(prompt)
            if room < 1:
                raise ValueError(f"prompt has {len(prompt)} tokens; max_context={self.max_context} leaves no room to generate")
            max_tokens = min(max_tokens, room)
        req = _Request(prompt, sampling, max_tokens, _notifier(), anyio.Event())
        with self._cond:
            if self._closed:
                raise GeneratorClosedError("TransformersGenerator is closed")
            if self._thread is None and self._host is None:
                self._thread = threading.Thread(target=self._worker, name="TransformersGenerator", daemon=True)
                self._thread.start()
            self._pending.append(req)
            self._cond.notify()
        try:
            await req.done.wait()
        except BaseException:
            req.cancelled = True  # dropped from its batch at the next step, or never started
            raise
        if req.error is not None:
            raise req.error
        assert req.result is not None
        return req.result

    async def close(self) -> None:
        """Stop the worker: the running batch finishes, queued requests fail with GeneratorClosedError."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            await anyio.to_thread.run_sync(thread.join)

    # ----------------------------------------------------------------- Generator lifecycle

    def begin_rollout(self) -> None:
        """Give the generation copy (if any) its weights, cast from ``source`` (one pass over them)."""
        if self._copy and not self._foreign:
            with self._exclusive():
                self._set_copy_weights(self.model, self.source)

    def end_rollout(self) -> None:
        """Free what training needs: the static KV caches and CUDA graphs (recaptured on next use)
        and the generation copy's weights."""
        self.release_memory()
        if self._copy and not self._foreign:
            with self._exclusive():
                self._set_copy_weights(self.model, None)

    def load_weights(self, update: WeightUpdate) -> None:
        """New policy weights. From ``source`` itself there is nothing to move: the module is shared,
        or the copy is cast from it at the next ``begin_rollout``. Anything else is copied in."""
        if update.module is self.source:
            self._foreign = False
        else:
            if hasattr(self.model, "peft_config"):
                raise ValueError("load_weights: full weights from elsewhere cannot be written into a PEFT model")
            with update.full() as named:
                if self._copy:
                    self._foreign = True
                    self._set_copy_weights(self.model, None)
                    self._write_copy(named)
                else:
                    self.update_weights(named)
                    return  # update_weights counted it
        self.stats["weight_updates"] += 1

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """The weights lock, for work between batches; a running batch stops admitting requests
        meanwhile (continuous batching would otherwise keep it running, and the caller waiting)."""
        with self._cond:
            self._updates_waiting += 1
        try:
            with self._weights_lock:
                yield
        finally:
            with self._cond:
                self._updates_waiting -= 1
                self._cond.notify_all()  # a batch held back for this update may start

    @staticmethod
    def _set_copy_weights(target: torch.nn.Module, source: torch.nn.Module | None) -> None:
        """Cast ``source``'s parameters into ``target`` (same names), or empty them when None."""
        with torch.no_grad():
            if source is None:
                for q in target.parameters():
                    q.data = torch.empty(0, dtype=q.dtype, device=q.device)
                return
            for (name, p), (other, q) in zip(source.named_parameters(), target.named_parameters(), strict=True):
                assert name == other, f"generation copy out of step with the policy: {name} != {other}"
                q.data = p.detach().to(q.dtype)

    def _write_copy(self, named: list[tuple[str, torch.Tensor]]) -> None:
        """Give the generation copy weights read from an update (checkpoint names; tied head optional)."""
        given = dict(normalize_named_tensors(named))
        with self._exclusive(), torch.no_grad():
            for name, q in self.model.named_parameters():
                if name not in given:
                    raise ValueError(f"load_weights: the update has no tensor for {name}")
                q.data = given[name].detach().to(device=self.device, dtype=q.dtype).clone()

    def release_memory(self) -> None:
        """Free the static KV caches and CUDA graphs between rollouts (recaptured on next use)."""
        if self.static is not None:
            with self._exclusive():
                self.static.invalidate()

    def update_weights(self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy new weights into the model between batches (blocks while a batch runs).

        Names are those of ``model.named_parameters()`` / ``named_buffers()``; tied weights share one
        tensor, so writing either name updates both and they stay tied. From an event loop, call it
        via ``anyio.to_thread.run_sync`` if batches may be in flight.
        """
        items = list(named_tensors.items()) if isinstance(named_tensors, Mapping) else list(named_tensors)
        targets = dict(self.model.named_parameters(remove_duplicate=False))
        targets.update(self.model.named_buffers(remove_duplicate=False))
        unknown = [name for name, _ in items if name not in targets]
        if unknown:
            raise ValueError(f"update_weights: {len(unknown)} unknown parameter name(s): {unknown[:10]}")
        wrong = [f"{n}: {tuple(t.shape)} != {tuple(targets[n].shape)}" for n, t in items if t.shape != targets[n].shape]
        if wrong:
            raise ValueError(f"update_weights: shape mismatch: {wrong[:10]}")
        with self._exclusive(), torch.no_grad():
            for name, tensor in items:
                targets[name].copy_(tensor)
        self.stats["weight_updates"] += 1

    # ----------------------------------------------------------------- model thread

    def _worker(self) -> None:
        self._serve(None)

    def run_rollouts(self, rollouts: Callable[[], T]) -> T:
        """``run_hosted(rollouts)`` when ``host_rollouts`` (by default on CPU), else ``rollouts()``
        with the batches on the model thread."""
        return self.run_hosted(rollouts) if self.host_rollouts else rollouts()

    def run_hosted(self, fn: Callable[[], Any]) -> Any:
        """Call ``fn`` on a helper thread while the calling thread runs the batches; return its result.

        ``fn`` runs an event loop that awaits ``generate`` (e.g. ``lambda: anyio.run(...)``). Why:
        on CPU, OpenMP gives every thread that runs parallel ops its own team of workers; with
        two live teams on a small machine libgomp stops spinning and wakes its workers through the
        kernel on every op. Measured on 2 cores: a [64, 256] x [256, 1024] linear 100 -> 180 us,
        a whole ``generate`` 0.61 -> 0.94 s when run off the thread that loaded the model. The
        trainer does its torch work on the main thread, so it serves generation there too.
        If a worker thread already serves this generator (it was used outside ``run_hosted``),
        ``fn`` simply runs here and the worker keeps serving.
        """
        with self._cond:
            if self._host is not None:
                raise RuntimeError("run_hosted: this generator is already hosted by another thread")
            if self._thread is not None:
                until = None
            else:
                until = self._host = threading.Event()
        if until is None:
            return fn()
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:  # noqa: BLE001 - re-raised on the calling thread
                box["error"] = exc
            finally:
                with self._cond:
                    until.set()
                    self._cond.notify_all()

        helper = threading.Thread(target=target, name="agentrl-event-loop", daemon=True)
        helper.start()
        try:
            self._serve(until)
        except BaseException:
            self._fail_pending(GeneratorClosedError("the thread serving this generator was interrupted"))
            helper.join(timeout=5)
            raise
        finally:
            with self._cond:
                self._host = None
        helper.join()
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def track_episodes(self, delta: int) -> None:
        """The rollout engine counts here the episodes that will send requests (their number at the
        start of a run, -1 as each ends once none waits to start).

        Why: between turns each episode parses, runs its tools and renders on the event loop, so
        the next turn's requests arrive spread out; any pause longer than ``gather_window_s`` (a
        slow tool, a garbage collection) split a turn into two batches, and the two halves then
        stayed apart for the rest of the rollout, each batch paying a whole prefill and decode
        for a few rows (measured: 8-11 batches per 4-turn rollout instead of 4). With episodes
        counted, a batch starts once every running episode has sent its request, or
        ``max_gather_s`` after the first one arrived.
        """
        with self._cond:
            self._episodes = max(0, self._episodes + delta)
            self._cond.notify_all()

    def _fail_pending(self, error: BaseException) -> None:
        with self._cond:
            leftovers, self._pending = list(self._pending), deque()
        for req in leftovers:
            req.error = error
            req.resolve()

    def _serve(self, until: threading.Event | None) -> None:
        """Gather queued requests into batches and run them until closed (or ``until`` is set)."""
        if self.device.type == "cuda":  # a new thread starts on cuda:0; rank r's model (or a rollout copy) lives elsewhere
            torch.cuda.set_device(self.device)
        while True:
            with self._cond:
                while not self._pending and not self._closed and not (until is not None and until.is_set()):
                    self._cond.wait()
                if self._closed:
                    break
                if not self._pending:  # ``until`` is set and nothing is left to serve
                    return
                # Gather until every episode the rollout engine runs has sent its request
                # (track_episodes), or, with none tracked, until requests stop arriving for
                # gather_window_s (episodes reach their first generate call one render apart);
                # never longer than max_gather_s.
                cap = self._pending[0].arrived + self.max_gather_s
                while len(self._pending) < self.max_batch_size and not self._closed:
                    if self._episodes > 0 and len(self._pending) >= self._episodes:
                        break
                    deadline = cap if self._episodes > 0 else min(cap, self._pending[-1].arrived + self.gather_window_s)
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                # An update waiting for the weights goes first: the lock is not fair, so a batch
                # started now could take it back and decode with the weights the update replaces.
                while self._updates_waiting and not self._closed:
                    self._cond.wait()
                if self._closed:
                    continue
                batch: list[_Request] = []
                while self._pending and len(batch) < self.max_batch_size:
                    req = self._pending.popleft()
                    if not req.cancelled:
                        batch.append(req)
            if batch:
                self._run_batch(batch)
        self._fail_pending(GeneratorClosedError("TransformersGenerator was closed before this request ran"))

    def _run_batch(self, batch: list[_Request]) -> None:
        """Decode one batch; a failure fails only these requests, never the worker."""
        interrupted: BaseException | None = None
        start, passes, admitted = time.monotonic(), self.stats["forward_passes"], self.stats["admitted"]
        before = self._timing()
        try:
            with self._weights_lock, torch.inference_mode(), self._attention_backends():
                results = self._decode(batch)
        except BaseException as exc:  # noqa: BLE001 - handed to the callers (and re-raised if not an Exception)
            if not isinstance(exc, Exception):
                interrupted = exc  # KeyboardInterrupt on a hosting thread: the callers must still wake up
            if exc.__traceback__ is not None:
                traceback.clear_frames(exc.__traceback__)  # free the batch's tensors (think OOM)
            for req in batch:
                if req.resolved:  # finished (and answered) before the failure
                    continue
                err = GenerationError(f"generation failed for a batch of {len(batch)} request(s): {exc!r}")
                err.__cause__ = exc
                req.error = err
        else:
            for req, gen in zip(batch, results):
                req.result = gen
        self.stats["batches"] += 1
        self.stats["batch_sizes"].append(len(batch))
        self.stats["trace"].append({
            "start": start, "end": time.monotonic(), "requests": len(batch), "admitted": self.stats["admitted"] - admitted,
            "forward_passes": self.stats["forward_passes"] - passes, "longest_prompt": max(len(r.prompt) for r in batch),
            **{k: round(v - before[k], 4) for k, v in self._timing().items()},
        })
        for req in batch:
            req.resolve()
        if interrupted is not None:
            raise interrupted

    def _forward(self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any) -> torch.Tensor:
        """One forward pass that grows ``cache`` in place; returns the last position's logits."""
        extra: dict[str, Any] = {self._cache_kwarg: cache}
        if self._keep_last_logits:  # don't materialise (batch, prompt, vocab) logits at prefill
            extra["logits_to_keep"] = 1
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True, **extra)
        self.stats["forward_passes"] += 1
        return out.logits[:, -1]

    def _attention_backends(self) -> Any:
        """On CUDA, keep SDPA off cuDNN for decoding.

        cuDNN attention builds an execution plan per new shape, and decoding makes a new key length
        every step with batch and prompt sizes that keep changing: measured ~50 ms per step versus
        ~5 ms (bf16, H200). The switch is process-global while a batch runs, so with a learner
        running forwards on another thread (``training_alongside``: rollouts ahead) it is made once
        for the whole process at construction instead: a learner whose checkpointed forward and
        recompute saw different SDPA kernels failed its backward (H100, rollout_device=cuda:1).
        """
        if self.device.type != "cuda" or self._training_alongside:
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])

    def _timing(self) -> dict[str, float]:
        """Static cache: graphs captured, seconds in captures (waiting for ``CAPTURE_LOCK``
        included), seconds the host waited on the device's tokens, so far (a batch's trace entry
        holds its share); nothing on the dynamic cache."""
        if self.static is None:
            return {}
        s = self.static.stats
        return {"captures": s["graphs_captured"], "capture_s": s["capture_s"], "wait_s": self.stats["host_wait_s"]}

    def _decode(self, reqs: list[_Request]) -> list[Generation]:
        """One batch: the static-cache loop (agentrl/generators/hf/continuous.py) or the dynamic-cache
        one (agentrl/generators/hf/dynamic_decode.py)."""
        if self.static is not None:
            return self._decode_static(reqs)
        return decode_dynamic(self, reqs)

    def _decode_static(self, reqs: list[_Request]) -> list[Generation]:
        """The static-cache loop (continuous batching when asked): agentrl/generators/hf/continuous.py."""
        return decode_continuous(self, reqs)

    def _admissible(self, fits: Callable[[int, int], bool], limit: int, least: int = 1) -> list[_Request]:
        """Up to ``limit`` queued requests that ``fits(prompt length, max_tokens)`` allows to join the
        running batch, in arrival order, if there are at least ``least`` of them; none while a
        weight update waits for the batch to end."""
        with self._cond:
            if self._closed or self._updates_waiting or len(self._pending) < least:
                return []
            ready = [req for req in self._pending if not req.cancelled and fits(len(req.prompt), req.max_tokens)][:limit]
            if len(ready) < least:
                return []
            taken = set(map(id, ready))
            self._pending = deque(req for req in self._pending if id(req) not in taken and not req.cancelled)
        return ready
