"""Batch decoding over a preallocated (static) KV cache, with the one-token step as a CUDA graph.

Why: with a dynamic cache every decode step is a fresh Python walk through the model — for a
0.5B model on an H100 that is ~25 ms of launch overhead for ~1 ms of GPU work, per token. With
fixed shapes (batch padded to a power of two, cache length to a bucket) and fixed tensor
addresses, the whole step can be recorded once as a CUDA graph and replayed per token.

How it fits the model: transformers' ``StaticCache`` holds the keys and values; its layers write
at a per-layer ``cumulative_length`` counter that the graph increments on replay. Prompts are left
padded so that every row writes the same cache column at each step. The attention mask is passed
as a ready 4-D boolean tensor (``[batch, 1, query, cache]``), which transformers uses as is, and
position ids are passed explicitly, so the captured step contains no host synchronisation.
Rows that finish keep running (their output is ignored) until the whole batch is done, unless a
queued request takes the row over (``StaticBatch.admit``, continuous batching): its prompt is
prefilled on a cache of its own and its keys and values are copied into that row, ending at the
current column; the row's mask then hides everything before them.

Only models whose layers all use full attention, and a transformers whose static layers expose
``cumulative_length``, are supported; ``StaticDecoder.supports`` says so and the generator falls
back to the dynamic cache otherwise. Without CUDA (or with ``use_graphs=False``) the same code
runs eagerly, which is how its equivalence with the dynamic path is tested on CPU.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch

from agentrl.compute.compile_layers import CAPTURE_LOCK

__all__ = ["StaticBatch", "StaticDecoder"]


GQA_DECODE = "agentrl_sdpa_gqa"


def grouped_decode_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any, **kwargs: Any) -> Any:
    """SDPA for one decode token with grouped-query attention, without copying the KV cache.

    transformers' SDPA path expands keys and values to every query head (``repeat_kv``) whenever a
    mask is given: for a 0.5B Qwen2 at batch 64 that copied ~2.8 GB per token step, half the step's
    GPU time. With one query token, the query heads that share a KV head can instead act as that
    head's query rows — the same numbers, no copy. Anything else goes to transformers' SDPA.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    B, H, q, D = query.shape
    if attention_mask is not None and attention_mask.dim() == 4:
        # a decode step's mask covers only the cache's active columns (StaticDecoder.active_length),
        # and never all of them (the cache's spare column, StaticDecoder._slot): no branch here,
        # so the compiled step is one graph whatever the active length
        key, value = key[:, :, : attention_mask.shape[-1]], value[:, :, : attention_mask.shape[-1]]
        if attention_mask.is_floating_point() and attention_mask.dtype != query.dtype:  # SDPA wants the query's
            attention_mask = attention_mask.to(query.dtype)  # (StaticDecoder._additive takes the weights')
    kv_heads = key.shape[1]
    if q != 1 or kv_heads == H or attention_mask is None or attention_mask.dim() != 4 or kwargs.get("dropout", 0.0):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    grouped = query.reshape(B, kv_heads, H // kv_heads, D)  # query head h reads KV head h // (H / kv_heads)
    mask = attention_mask[:, :, :, : key.shape[2]]
    out = torch.nn.functional.scaled_dot_product_attention(grouped, key, value, attn_mask=mask, scale=kwargs.get("scaling"))
    return out.reshape(B, H, 1, D).transpose(1, 2).contiguous(), None


def _register_gqa_decode() -> bool:
    """Make ``GQA_DECODE`` a valid attention implementation (masks built exactly as for SDPA)."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError:
        return False
    AttentionInterface.register(GQA_DECODE, grouped_decode_attention)
    AttentionMaskInterface.register(GQA_DECODE, AttentionMaskInterface._global_mapping["sdpa"])
    return True


def left_pad(prompts: list[list[int]], rows: int, width: int, pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[rows, width]`` token ids with each prompt right-aligned, and which columns are real (host
    tensors; rows past ``len(prompts)`` are all padding)."""
    ids = torch.full((rows, width), pad_token_id, dtype=torch.long)
    valid = torch.zeros((rows, width), dtype=torch.bool)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        valid[i, width - len(p):] = True
    return ids, valid


def dynamic_cache(config: Any) -> Any:
    """An empty transformers ``DynamicCache`` for a model of ``config`` (older versions take none)."""
    from transformers import DynamicCache

    try:
        return DynamicCache(config=config)
    except TypeError:
        return DynamicCache()


def text_config(model: torch.nn.Module) -> Any:
    """The decoder's config (a multimodal model's text part)."""
    return model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config


def full_attention_only(model: torch.nn.Module) -> bool:
    """True when every layer attends to the whole cache (no sliding-window or mixed layers)."""
    config = text_config(model)
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    return all(t == "full_attention" for t in layer_types) and not getattr(config, "use_sliding_window", False)


def _bucket(n: int, minimum: int) -> int:
    """The next power of two >= max(n, minimum)."""
    size = minimum
    while size < n:
        size *= 2
    return size


ACTIVE_STEP = 128  # a decode step attends to the cache's columns up to the next multiple of this
# A new cache is sized to the next multiple of CACHE_STEP. It was 256: a Qwen3-0.6B batch of 64
# rows needing 357 columns got 512, 3.7 GB of keys and values of which 1.1 GB was never written
# (28 layers x 8 KV heads x 128 x 2 bytes x 2 per column and row), the largest part of that row's
# rollout peak. The finer step would mean more distinct caches (each with its own graphs) where
# the need moves between turns, so a live cache up to CACHE_REUSE longer than the need is reused:
# never more columns than the old rounding gave, and no new cache where one already fits.
CACHE_STEP = 128
CACHE_REUSE = 256
STOP_WIDTH = 8  # stop ids per row a step that samples inside itself can hold back (min_tokens)


@dataclass(eq=False)
class _Draw:
    """What a step that samples its own next token reads and writes, at fixed addresses (one per
    slot): the batch's inverse temperature, each row's stream key (``sampling.RowStreams``), how
    many tokens it has been given, its stop ids held back below its minimum, the next mask column,
    and the step's output."""

    inv_t: torch.Tensor  # [1] float32
    keys: torch.Tensor  # [B] int64
    count: torch.Tensor  # [B] int64
    stop_ids: torch.Tensor  # [B, STOP_WIDTH] int64
    minimum: torch.Tensor  # [B] int64
    column: torch.Tensor  # [1] int64: the column the next step writes
    tok: torch.Tensor  # [B] int64
    lp: torch.Tensor  # [B] float32

    @staticmethod
    def empty(rows: int, device: torch.device) -> _Draw:
        def z(*shape: int, dtype: torch.dtype = torch.long) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        return _Draw(z(1, dtype=torch.float32), z(rows), z(rows), z(rows, STOP_WIDTH), z(rows), z(1), z(rows), z(rows, dtype=torch.float32))


@dataclass(eq=False)
class _Active:
    """A decode step over the cache's first ``A`` columns: its mask (refreshed from the slot's
    full mask at every step, inside the graph), and its graph and output once captured."""

    mask: torch.Tensor  # [B, 1, 1, A]
    sampled: bool = False  # the step samples its next token itself (StaticBatch.advance)
    graph: Any = None
    logits: torch.Tensor | None = None  # the graph's output buffer (None for a sampled step's graph)


@dataclass(eq=False)
class _Slot:
    """Everything with a fixed address for one (batch, cache length) shape."""

    cache: Any
    ids: torch.Tensor  # [B, 1] next input token
    pos: torch.Tensor  # [B, 1] its position
    mask: torch.Tensor  # [B, 1, 1, L] which cache columns each row attends to
    active: dict[tuple[int, bool], _Active] = field(default_factory=dict)  # by (active length A, sampled)
    draw: _Draw | None = None
    marked: bool = False  # the cache's fixed dimensions are marked static for the compiled step


def _mark_static_dims(cache: Any) -> None:
    """Tell dynamo that a static cache's KV-head and head dimensions never change (only rows and
    length do), so the compiled step makes them no symbols, and a row count or active length that
    equals one of them at the first trace is not fixed to it (StaticDecoder.__init__)."""
    for layer in cache.layers:
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor) and t.dim() == 4:
                torch._dynamo.mark_static(t, 1)
                torch._dynamo.mark_static(t, 3)


class StaticDecoder:
    """Owns the static caches (and graphs) of one model; ``start`` begins a batch on them."""

    def __init__(
        self, model: torch.nn.Module, pad_token_id: int, *, use_graphs: bool | None = None, max_shapes: int = 4,
        compile: bool = False,
    ) -> None:
        self.model = model
        self.pad_token_id = int(pad_token_id)
        self.device = next(model.parameters()).device
        self.use_graphs = (self.device.type == "cuda") if use_graphs is None else use_graphs
        self.max_shapes = max_shapes
        self._slots: OrderedDict[tuple[int, int], _Slot] = OrderedDict()
        self._pool: Any = None
        self._capture_streams: tuple[Any, Any] | None = None  # see _streams
        import inspect

        params = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"  # renamed in transformers 5.x
        self._gqa_ready = _register_gqa_decode()
        # Attention reads every column it is given, and the cache is sized for the longest row's last
        # token: at 256 rows x 768 columns the SDPA kernel was half the replayed step (71 us of 145
        # per layer, H100). A decode step is therefore given only the columns written so far (up to
        # the next multiple of ACTIVE_STEP), one graph per such length; this needs our own attention
        # function (GQA_DECODE), which narrows the keys to the mask, so only models on SDPA slice.
        self._slices = self._gqa_ready and getattr(model.config, "_attn_implementation", None) == "sdpa"
        # torch.compile for the one-token step only (prefill widths vary), dynamic batch and cache
        # length, batches of at least two rows, KV-head and head dimensions static: each choice
        # avoids a mid-rollout recompile (docs/performance.md, "Recompiles of the decode step")
        self._compiled = torch.compile(model, dynamic=True) if compile else None
        self._bias_ends: tuple[torch.Tensor, torch.Tensor] | None = None  # 0 and -inf for _additive
        self.stats = {"graphs_captured": 0, "graph_replays": 0, "eager_steps": 0, "capture_s": 0.0}

    @property
    def compiled(self) -> bool:
        """Whether the one-token step runs under ``torch.compile``."""
        return self._compiled is not None

    @staticmethod
    def supports(model: torch.nn.Module) -> bool:
        """True when every layer is full attention and transformers' static layers count positions."""
        return StaticDecoder.unsupported_reason(model) is None

    @staticmethod
    def unsupported_reason(model: torch.nn.Module) -> str | None:
        """Why this model cannot decode over the static cache, or None when it can."""
        try:
            from transformers.cache_utils import StaticLayer
        except ImportError:
            return "this transformers has no StaticLayer"
        if not full_attention_only(model):
            return f"{type(model).__name__} has sliding-window or mixed attention layers"
        if not hasattr(StaticLayer(max_cache_len=1), "cumulative_length"):
            return "this transformers' static cache layers have no cumulative_length"
        return None

    def invalidate(self) -> None:
        """Drop caches and graphs, freeing their memory (weight updates do NOT need this)."""
        self._slots.clear()
        self._pool = None

    def _slot(self, batch: int, length: int) -> _Slot:
        from transformers import StaticCache

        key = (batch, length)
        if key in self._slots:
            self._slots.move_to_end(key)
            return self._slots[key]
        while len(self._slots) >= self.max_shapes:
            self._slots.popitem(last=False)
        dev = self.device
        # One spare column where steps attend to their active columns only: the keys a step reads
        # are then always a strict slice of the cache. When the active columns were the whole
        # cache, the compiled step (traced with them fewer) recompiled (dynamo guards on whether
        # the slice is contiguous), 25-47 s on a GPU in the middle of a rollout. Never written.
        spare = 1 if self._slices else 0
        slot = _Slot(
            cache=StaticCache(config=self.model.config, max_cache_len=length + spare),
            ids=torch.full((batch, 1), self.pad_token_id, dtype=torch.long, device=dev),
            pos=torch.zeros((batch, 1), dtype=torch.long, device=dev),
            mask=torch.zeros((batch, 1, 1, length), dtype=torch.bool, device=dev),
        )
        self._slots[key] = slot
        return slot

    def start(self, prompts: list[list[int]], max_new_tokens: int) -> StaticBatch:
        """Prefill ``prompts`` (left padded) and return the batch, ready for ``step``."""
        n = len(prompts)
        width = max(len(p) for p in prompts)
        batch = _bucket(n, 1 if self._compiled is None else 2)
        slot = self._slot(batch, self.cache_length(batch, width + max_new_tokens))
        return StaticBatch(self, slot, prompts, width)

    def cache_length(self, batch: int, need: int) -> int:
        """The cache length for a batch whose rows need ``need`` columns: a live cache of this batch
        that is at least that long and less than ``CACHE_REUSE`` longer (no new cache, no new
        graphs), else ``need`` rounded up to a multiple of ``CACHE_STEP``."""
        fitting = [length for b, length in self._slots if b == batch and need <= length < need + CACHE_REUSE]
        return min(fitting) if fitting else -(-need // CACHE_STEP) * CACHE_STEP

    # -- model calls ---------------------------------------------------------------------------

    def _set_length(self, slot: _Slot, n: int) -> None:
        for layer in slot.cache.layers:
            if getattr(layer, "is_initialized", False):
                layer.cumulative_length.fill_(n)

    def forward(self, slot: _Slot, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        kwargs = {self._cache_kwarg: slot.cache}
        config = self.model.config
        original = getattr(config, "_attn_implementation", None)
        swap = original == "sdpa" and self._gqa_ready
        if swap:  # only for our own calls: training forwards on a shared module keep plain SDPA
            config._attn_implementation = GQA_DECODE
        try:
            compiled = self._compiled is not None and ids.shape[1] == 1
            if compiled and not slot.marked:  # see __init__
                _mark_static_dims(slot.cache)
                slot.marked = True
            call = self._compiled if compiled else self.model
            out = call(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1, **kwargs)
        finally:
            if swap:
                config._attn_implementation = original
        return out.logits[:, -1]

    def active_length(self, slot: _Slot, column: int) -> int:
        """How many cache columns a step writing ``column`` attends to: every column up to it,
        rounded up to a multiple of ``ACTIVE_STEP`` (the cache's whole length where slicing is off)."""
        length = slot.mask.shape[-1]
        return min(length, (column // ACTIVE_STEP + 1) * ACTIVE_STEP) if self._slices else length

    def _active(self, slot: _Slot, column: int, sampled: bool = False) -> _Active:
        size = self.active_length(slot, column)
        if (size, sampled) not in slot.active:
            whole = size == slot.mask.shape[-1]
            mask = slot.mask if whole else slot.mask.new_zeros(slot.mask.shape[:-1] + (size,))
            slot.active[size, sampled] = _Active(mask=mask, sampled=sampled)
        return slot.active[size, sampled]

    def _step(self, slot: _Slot, active: _Active) -> torch.Tensor:
        """The step itself (what a graph records): the active columns' mask, then the forward, and
        for a sampled step the draw and everything the next step reads."""
        if active.mask is not slot.mask:
            active.mask.copy_(slot.mask[..., : active.mask.shape[-1]])
        logits = self.forward(slot, slot.ids, slot.pos, self._additive(active.mask) if self._slices else active.mask)
        if active.sampled:
            from agentrl.generators.hf.decode_steps import hold_back
            from agentrl.generators.hf.sampling import _compiled_keyed_gumbel_max

            d = slot.draw
            assert d is not None
            tok, lp = _compiled_keyed_gumbel_max()(hold_back(logits, d.stop_ids, d.count, d.minimum), d.keys, d.count, d.inv_t)
            d.tok.copy_(tok)
            d.lp.copy_(lp)
            slot.ids[:, 0].copy_(tok)
            slot.pos.add_(1)
            d.count.add_(1)
            slot.mask.index_fill_(3, d.column.clamp(max=slot.mask.shape[-1] - 1), True)
            d.column.add_(1)
        return logits

    def _additive(self, mask: torch.Tensor) -> torch.Tensor:
        """The step's boolean mask as an additive one (0 where attended, -inf elsewhere), made once
        per step for every layer. SDPA turns a boolean mask into this itself, in every layer: inside
        a replayed graph the attention took 30.2 against 24.6 us per layer at 256 rows x 256 columns
        (46.0 against 39.4 at 512; H200, benchmarks/decode_attention.py), the same numbers."""
        if self._bias_ends is None:
            dtype = next(self.model.parameters()).dtype
            self._bias_ends = (torch.zeros((), dtype=dtype, device=self.device), torch.full((), float("-inf"), dtype=dtype, device=self.device))
        return torch.where(mask, *self._bias_ends)

    def decode_step(self, slot: _Slot, column: int, sampled: bool = False) -> torch.Tensor | None:
        """Run one token step for every row; the step writes cache column ``column``. A sampled step
        (``StaticBatch.advance``) also draws each row's next token and feeds it to the next step;
        replayed from a graph, it returns None (its logits are not kept)."""
        active = self._active(slot, column, sampled)
        if not self.use_graphs:
            self.stats["eager_steps"] += 1
            return self._step(slot, active)
        if active.graph is None:
            self._capture(slot, active, column)
        active.graph.replay()
        self.stats["graph_replays"] += 1
        assert active.logits is not None or active.sampled
        return active.logits

    @staticmethod
    def _moving(slot: _Slot, active: _Active) -> list[torch.Tensor]:
        """What a step writes besides the cache column it fills: nothing, unless it samples."""
        if not active.sampled:
            return []
        assert slot.draw is not None
        return [slot.ids, slot.pos, slot.mask, slot.draw.count, slot.draw.column]

    def _streams(self) -> tuple[Any, Any]:
        """The warm-up and capture streams, made once per decoder on its device.

        Not a new pair per capture: cuBLAS keeps a workspace (32 MiB on a Hopper card, plus 1 MiB
        for cuBLASLt) for every stream that runs a matrix multiply, for the life of the process.
        With two new streams per capture, 6 a step in an 8 x 8 x 256 run, the allocated memory
        grew by 0.19 GiB a step until torch's pool of 32 streams per device had been handed out
        once, ~1 GiB later (H200, benchmarks/profile_memory.py: the peak's allocations by stack).
        """
        if self._capture_streams is None:
            self._capture_streams = (torch.cuda.Stream(self.device), torch.cuda.Stream(self.device))
        return self._capture_streams

    def _capture(self, slot: _Slot, active: _Active, column: int) -> None:
        """Warm up on a side stream, then record the step; writes past ``column`` are overwritten later.
        Holds ``CAPTURE_LOCK``: no compiling on another thread while it captures."""
        start = time.perf_counter()
        with CAPTURE_LOCK:
            self._capture_locked(slot, active, column)
        self.stats["capture_s"] += time.perf_counter() - start

    def _capture_locked(self, slot: _Slot, active: _Active, column: int) -> None:
        # a sampled step moves its inputs on (next token, positions, counts, mask column): the
        # warm-up runs must leave them as they were; the capture only records
        saved = [t.clone() for t in self._moving(slot, active)]
        warm, capture = self._streams()
        warm.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(warm):
            for _ in range(2):
                self._set_length(slot, column)
                self._step(slot, active)
        torch.cuda.current_stream(self.device).wait_stream(warm)
        for t, before in zip(self._moving(slot, active), saved, strict=True):
            t.copy_(before)
        self._set_length(slot, column)
        graph = torch.cuda.CUDAGraph()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        # a capture stream on this model's device (torch's default one is made once per process, on
        # whichever device was current then: wrong for a second generator on another GPU)
        # thread_local: a capture forbids unsafe CUDA calls only on this thread. The default
        # ("global") made the learner's kernels on another thread fail while a rollout-ahead
        # generator captured (max_staleness > 0, rollout_device=cuda:1).
        # capture_begin/capture_end rather than the torch.cuda.graph context: on entering, that
        # synchronises the whole device and empties the caching allocator and the pinned host
        # cache, so every capture (one per rollout and new shape, since end_rollout frees the
        # graphs) handed the learner's cached blocks back to the driver, to be allocated again
        # by the next training step; with a learner on another thread it also waited for that
        # learner's queued work. The capture itself needs none of it: its stream only ever captures,
        # so it is idle.
        with torch.cuda.stream(capture):
            graph.capture_begin(self._pool, capture_error_mode="thread_local")
            try:
                logits = self._step(slot, active)
            finally:
                graph.capture_end()
        # A step that samples itself is read through its draw buffers only: its logits ([rows,
        # vocab] float32, ~155 MB at 256 rows and a 152k vocabulary) go back to the shared pool for
        # the next capture instead of staying alive once per active length. No graph reads
        # another's output, and a kept output is read before the next replay, so reuse is safe.
        active.logits = None if active.sampled else logits
        self._set_length(slot, column)  # capture records the counter's increment without running it
        active.graph = graph
        self.stats["graphs_captured"] += 1


class StaticBatch:
    """One running batch: ``prefill_logits`` first, then ``step(tokens)`` per generated token."""

    def __init__(self, decoder: StaticDecoder, slot: _Slot, prompts: list[list[int]], width: int) -> None:
        self.decoder, self.slot, self.n, self.width = decoder, slot, len(prompts), width
        dev = decoder.device
        batch, length = slot.mask.shape[0], slot.mask.shape[-1]
        ids, valid = left_pad(prompts, batch, width, decoder.pad_token_id)
        ids, valid = ids.to(dev), valid.to(dev)
        positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
        # prefill mask: causal over valid prompt columns; padding (and dummy) query rows see only
        # themselves, so no row of the softmax is empty
        causal = torch.ones((width, width), dtype=torch.bool, device=dev).tril()
        prefill = causal[None] & valid[:, None, :]
        prefill |= torch.eye(width, dtype=torch.bool, device=dev)[None]
        mask4 = torch.zeros((batch, 1, width, length), dtype=torch.bool, device=dev)
        mask4[:, 0, :, :width] = prefill
        for layer in slot.cache.layers:  # a reused cache restarts at column 0
            if getattr(layer, "is_initialized", False):
                layer.cumulative_length.zero_()
        self.prefill_logits = decoder.forward(slot, ids, positions, mask4)[: self.n]
        slot.mask.zero_()
        slot.mask[:, 0, 0, :width] = valid
        slot.pos.copy_(valid.long().sum(-1, keepdim=True))
        slot.ids.fill_(decoder.pad_token_id)
        self.column = width
        self._logits = self.prefill_logits

    @property
    def rows(self) -> int:
        """Rows of the captured shape (the batch bucket): ``admit`` may use any of them."""
        return self.slot.mask.shape[0]

    def fits(self, prompt_len: int, max_new_tokens: int) -> bool:
        """Whether a prompt can join now: it must end at the current column, and its tokens (plus
        the speculative step after its last one) must fit in the cache."""
        return prompt_len <= self.column and self.column + max_new_tokens + 1 <= self.slot.mask.shape[-1]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (``[n]``) and return the next logits ``[n, vocab]``."""
        if self.column >= self.slot.mask.shape[-1]:
            raise RuntimeError(f"static cache of {self.slot.mask.shape[-1]} columns is full")
        slot = self.slot
        slot.ids[: self.n, 0].copy_(tokens)
        slot.mask[:, 0, 0, self.column] = True
        logits = self.decoder.decode_step(slot, self.column)
        assert logits is not None
        slot.pos.add_(1)
        self.column += 1
        self._logits = logits
        return logits[: self.n]

    def sample_in_steps(self, tokens: torch.Tensor, keys: torch.Tensor, stop_ids: torch.Tensor, minimum: torch.Tensor, temperature: float) -> None:
        """Feed the first sampled tokens (``[n]``); from here on each step (``advance``) draws every
        row's next token itself (``sampling.keyed_gumbel_max`` with ``keys``), holding back each
        row's ``stop_ids`` (``[n, <= STOP_WIDTH]``) while it has fewer than ``minimum`` tokens, so a
        captured graph is the whole token step and the host only reads the tokens back."""
        slot, n = self.slot, self.n
        if slot.draw is None:
            slot.draw = _Draw.empty(self.rows, self.decoder.device)
        d = slot.draw
        slot.ids[:n, 0].copy_(tokens)
        slot.mask[:, 0, 0, self.column] = True
        d.inv_t.fill_(1.0 / temperature)
        d.keys.zero_()
        d.keys[:n] = keys[:n]
        d.count.fill_(1)  # each row was given its first token
        width = stop_ids.shape[1]
        d.stop_ids.zero_()
        d.stop_ids[:n] = stop_ids[:n, :1]  # padding repeats a row's first stop id
        d.stop_ids[:n, :width] = stop_ids[:n]
        d.minimum.zero_()
        d.minimum[:n] = minimum[:n]
        d.column.fill_(self.column + 1)

    def advance(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One step that samples its own next token (after ``sample_in_steps``): ``(tokens,
        logprobs)`` of every row's next token, ``[n]`` each (views of buffers the next step rewrites)."""
        if self.column >= self.slot.mask.shape[-1]:
            raise RuntimeError(f"static cache of {self.slot.mask.shape[-1]} columns is full")
        d = self.slot.draw
        assert d is not None, "sample_in_steps first"
        self.decoder.decode_step(self.slot, self.column, sampled=True)
        self.column += 1
        return d.tok[: self.n], d.lp[: self.n]

    def admit(self, rows: list[int], prompts: list[list[int]]) -> torch.Tensor:
        """Start ``prompts`` in ``rows`` (rows whose request is done) after a ``step``; return the
        logits ``[n, vocab]`` to sample from next, the admitted rows' from their prompts.

        Each prompt is prefilled (left padded, one forward for all of them) on a dynamic cache,
        and its keys and values are copied into its row so that they end at the current column,
        where the row's next token is written; the row's earlier columns are masked, and its
        positions restart from the prompt's length. Every layer's keys are position-encoded
        already, so where in the row they sit does not matter. Call only when ``fits``.
        """
        dec, slot, col = self.decoder, self.slot, self.column
        width = max(len(p) for p in prompts)
        if width > col or any(r >= self.rows for r in rows):
            raise ValueError(f"cannot admit prompts of up to {width} tokens at column {col} into rows {rows}")
        ids, valid = left_pad(prompts, len(prompts), width, dec.pad_token_id)
        ids, valid = ids.to(dec.device), valid.to(dec.device)
        cache = dynamic_cache(dec.model.config)
        out = dec.model(
            input_ids=ids, attention_mask=valid.long(), position_ids=(valid.long().cumsum(-1) - 1).clamp(min=0),
            use_cache=True, logits_to_keep=1, **{dec._cache_kwarg: cache},
        )
        at = torch.tensor(rows, dtype=torch.long, device=dec.device)
        for static, fresh in zip(slot.cache.layers, cache.layers, strict=True):
            static.keys[at, :, col - width : col] = fresh.keys.to(static.keys.dtype)
            static.values[at, :, col - width : col] = fresh.values.to(static.values.dtype)
        slot.mask[at] = False
        slot.mask[at, 0, 0, col - width : col] = valid
        slot.pos[at, 0] = valid.long().sum(-1)
        self.n = max(self.n, max(rows) + 1)
        logits = self._logits
        logits[at] = out.logits[:, -1].to(logits.dtype)
        return logits[: self.n]
