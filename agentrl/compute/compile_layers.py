"""Compiled decoder layers for the learner's forward and backward, and nowhere else.

Why: on a GPU the training phase of a small model is bound by its many small element-wise kernels
(RMSNorm, rotary embeddings, SiLU, residual adds, casts) and their launches, not by its matrix
products. ``torch.compile`` of each decoder layer fuses them (regional compilation: every layer
runs the same code, so one graph serves all of them, every sequence length and the checkpoint
recompute). On one H100 it took the Qwen3-0.6B-shaped learner from 1.16 s to 0.77 s per step
(benchmarks/RESULTS.md).

Why only inside ``active()``: the compiled forwards are set as instance attributes for the
duration of one micro-batch's forward and backward, then removed. Generation (which may decode with
the policy module itself), ``copy.deepcopy`` of the policy (the generation copy, the reference
model) and checkpoints never see them, and the state dict keeps its names.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch

from agentrl.compute.models import decoder_layers
from agentrl.compute.parallel.strategy import Strategy

# One per process: a CUDA graph capture on one thread and torch.compile compiling on another must
# not overlap. Compiling synchronises the device (autotuning, loading kernels), which CUDA refuses
# while any stream captures: the learner's first compiled step beside a rollout-ahead generator's
# capture failed with "operation not permitted when stream is capturing" (H200). The generator
# holds it around each capture (and the warm-up that compiles its step), the learner through the
# optimizer step in which its layers compile.
CAPTURE_LOCK = threading.RLock()


def allow_compiled_calls_beside_tracing() -> None:
    """Let a compiled function run on one thread while torch.compile traces on another.

    Why: AOTAutograd's tracing sets FX's "symbolic tracing" flag, a module global, not per thread,
    and a dynamo-compiled function called while it is set raises "Detected that you are using FX
    to symbolically trace a dynamo-optimized function" unless this setting is off. With rollouts
    ahead (``max_staleness`` >= 1) the generator's compiled decode step runs on its own thread
    while the learner compiles its layers: every episode of a batch failed that way (H200). With
    the setting off, such a call runs its function eagerly for that moment instead of raising;
    compiling itself is serialised by dynamo's own lock.
    """
    torch._dynamo.config.error_on_nested_fx_trace = False


def no_duck_sizing() -> contextlib.AbstractContextManager[Any]:
    """Trace dynamic shapes without dynamo's duck sizing, for compiles that serve many shapes.

    Why: duck sizing gives input sizes that are equal at the first trace one symbol, and the
    model's head dimension is one of them (the rotary tables, the KV cache) and later a constant,
    so a size that happened to equal it was fixed to it and the next other size compiled again:
    a decode batch of 64 rows with 64-wide heads (83 s on an H200, mid-rollout), a decode step's
    128 active columns with 128-wide heads, a training micro-batch of sequences as long as the
    head dimension (~7 s for the learner on an H200). Used for the learner's layers, whose
    inputs are few; the decode step marks its caches' fixed dimensions static instead
    (``static_decode._mark_static_dims``): traced without duck sizing, a whole model's caches
    gave dynamo hundreds of symbols to reason about. Patches a process-wide setting for the
    block: a compile on another thread meanwhile also traces without it, which only costs it that
    shortcut.
    """
    from torch.fx.experimental import _config as fx_config

    return fx_config.patch(use_duck_shape=False)


class CompiledLayers:
    """One ``torch.compile``-d forward per decoder layer (dynamic shapes: lengths vary per micro-batch).

    Compilation itself happens lazily, at the first forward inside ``active()``.
    """

    def __init__(self, layers: list[torch.nn.Module]) -> None:
        self.layers = layers
        # a forward set on the instance before (accelerate's offload hooks do that) is compiled and put back after
        self.own = [layer.__dict__.get("forward") for layer in layers]
        self.forwards = [torch.compile(layer.forward, dynamic=True) for layer in layers]
        self.proven = False  # a whole optimizer step has run compiled (set by the learner)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Layers call their compiled forward inside this block (forward and backward both)."""
        for layer, forward in zip(self.layers, self.forwards):
            layer.forward = forward  # type: ignore[method-assign]
        try:
            with no_duck_sizing():  # traced here (forward and backward) for every later length
                yield
        finally:
            for layer, own in zip(self.layers, self.own):
                if own is None:
                    layer.__dict__.pop("forward", None)
                else:
                    layer.forward = own  # type: ignore[method-assign]


def compile_layers(
    model: Any, wanted: bool | None, strategy: Strategy | None = None, *, cuda: bool, full_finetune: bool
) -> tuple[CompiledLayers | None, str]:
    """``CompiledLayers`` for ``model``, or None, and one line saying which and why.

    ``wanted`` is the ``compile_learner`` key: None decides by itself (on for full fine-tuning on
    CUDA; off on CPU, where compiling costs more than it saves on small models, and where the
    parallel strategy says so: for PEFT adapters and under FSDP2).
    """
    if wanted is False:
        return None, ""
    if wanted is None and not cuda:
        return None, ""
    by_default, why = (strategy or Strategy()).compile_by_default(full_finetune)
    if wanted is None and not by_default:
        return None, f"compile_learner: off for {why}; the training forward runs eagerly (compile_learner=true to force it)"
    layers = decoder_layers(model)
    if layers is None:
        return None, f"compile_learner: {type(model).__name__} exposes no get_decoder().layers; the training forward runs eagerly"
    return CompiledLayers(layers), f"compile_learner: the training forward compiles its {len(layers)} decoder layers at the first step"
