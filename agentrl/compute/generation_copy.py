"""The one recipe for a copy of the policy that generation decodes with (a lower-precision copy for
the transformers backend, the unsharded copy under FSDP2, the rollouts-ahead copy on another device)."""

from __future__ import annotations

import copy

import torch

__all__ = ["empty_weights", "generation_copy"]


def empty_weights(module: torch.nn.Module) -> None:
    """Free ``module``'s parameters (zero-size tensors of the same dtype and device)."""
    for q in module.parameters():
        q.data = torch.empty(0, dtype=q.dtype, device=q.device)


def generation_copy(
    model: torch.nn.Module,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    *,
    merge_adapters: bool = False,
    empty: bool = False,
) -> torch.nn.Module:
    """A frozen copy of ``model`` in ``dtype`` on ``device`` (None: unchanged), in eval mode.

    ``merge_adapters``: a PEFT model becomes its base with the adapter merged in. ``empty``: the
    weights are freed before moving (only the small buffers reach the device; the caller fills
    them later, as the FSDP2 gather does).
    """
    with torch.no_grad():
        dup = copy.deepcopy(model)
        if merge_adapters and hasattr(dup, "merge_and_unload"):
            dup = dup.merge_and_unload()
        if empty:
            empty_weights(dup)
        if device is not None or dtype is not None:
            dup = dup.to(device=device, dtype=dtype)
    dup.eval().requires_grad_(False)
    if hasattr(dup, "disable_input_require_grads"):
        # the policy's hook for checkpointed training (its inputs must require grad) came along in
        # the copy: it does nothing for decoding, and a compiled decode step would trace it and
        # compile again once per process (docs/performance.md, "Recompiles")
        dup.disable_input_require_grads()
    return dup
