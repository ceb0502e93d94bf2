"""Log-probs of packed rows: several sequences (and groups that share a prompt) in one row, no padding between them.

Why its own module: the padded path (``completion_logprobs``) computes every row up to the
micro-batch's longest, and every sample of a GRPO group recomputes the group's prompt. Here a row
holds *units* laid out back to back; a unit is one sequence, or one prompt followed by the
completions of every sample that shares it (each sample's completion is a *branch*). An explicit
attention mask keeps every token inside its unit, and inside a unit a branch token sees the prompt
and its own branch's earlier tokens only. Each token's position id is the one it has in its own
sequence, so rotary embeddings, sliding windows and the attention itself see exactly what the
padded path sees; the prompt's activations get the gradient of every branch through attention.

The mask is a dense boolean (SDPA) or additive (eager) [R, 1, W, W] tensor handed to the decoder
as an already built 4D mask (a dict by layer type for models with sliding layers), which
transformers uses as given. Models whose layers keep state across positions (convolutions, linear
attention, state-space layers) cannot be packed this way: :func:`packing_refusal` says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from agentrl.compute.logprobs import _check, _head_logprobs, _parts

# sequence mixers that see each token once: a dense mask is all they need
ATTENTION_TYPES = frozenset({"full_attention", "sliding_attention"})
MASKED_IMPLEMENTATIONS = frozenset({"sdpa", "eager"})
# modules whose name says they carry state along the sequence (no attention mask reaches them)
STATEFUL_PARTS = ("conv", "mamba", "linear_attn", "ssm", "mixer", "rwkv", "recurrent", "delta")


@dataclass
class PackedRows:
    """One packed micro-batch. R rows of W columns; N training sequences, each scored on ``width`` columns.

    ``unit`` and ``branch`` say who sees whom: a token sees earlier tokens of its own unit whose
    branch is -1 (the unit's shared part) or its own branch. Padding at the end of a row is a unit
    of its own. ``pred_row/pred_col`` [N, width]: the column whose hidden state predicts the
    sequence's j-th completion token, which sits at ``tgt_row/tgt_col``; past a sequence's end both
    point at its last real token (junk the caller masks, as in the padded path).
    """

    input_ids: torch.Tensor  # [R, W] long
    positions: torch.Tensor  # [R, W] long; the position of each token in its own sequence
    unit: torch.Tensor  # [R, W] long
    branch: torch.Tensor  # [R, W] long
    pred_row: torch.Tensor  # [N, width] long
    pred_col: torch.Tensor  # [N, width] long
    tgt_col: torch.Tensor  # [N, width] long

    @property
    def tokens(self) -> int:
        """Columns the decoder computes (padding included)."""
        return int(self.input_ids.numel())


def packing_refusal(model: Any) -> str | None:
    """Why ``model`` cannot be trained on packed rows (one line), or None when it can."""
    if not hasattr(model, "get_decoder") and isinstance(getattr(model, "model", None), torch.nn.Module):
        model = model.model  # the FSDP2 root (agentrl/compute/parallel/fsdp.py) holds the causal LM
    config = getattr(model, "config", None)
    name = getattr(config, "model_type", type(model).__name__)
    impl = getattr(config, "_attn_implementation", None)
    if impl not in MASKED_IMPLEMENTATIONS:
        return f"{name}: attention implementation {impl!r} takes no explicit mask (packing needs sdpa or eager)"
    types = set(getattr(config, "layer_types", None) or ())
    if types - ATTENTION_TYPES:
        odd = sorted(types - ATTENTION_TYPES)
        return f"{name}: layers of type {odd} keep state across positions or need their own mask"
    if getattr(config, "attention_chunk_size", None):
        return f"{name}: chunked attention needs its own mask"
    decoder, _ = _parts(model)
    for layer in getattr(decoder, "layers", ()):
        for part, _module in layer.named_children():
            if any(word in part.lower() for word in STATEFUL_PARTS):
                return f"{name}: decoder layers have a {part!r} part, which keeps state across positions"
    return None


def _visible(packed: PackedRows, window: int | None) -> torch.Tensor:
    """[R, 1, W, W] bool: query q sees key k (causal, same unit, shared part or own branch, inside the window)."""
    W = packed.input_ids.shape[1]
    col = torch.arange(W, device=packed.unit.device)
    u, b, p = packed.unit, packed.branch, packed.positions
    ok = (col[None, :, None] >= col[None, None, :]) & (u[:, :, None] == u[:, None, :])
    ok &= (b[:, None, :] == -1) | (b[:, :, None] == b[:, None, :])
    if window is not None:
        ok &= (p[:, :, None] - p[:, None, :]) < window
    return ok[:, None]


def attention_masks(config: Any, packed: PackedRows, dtype: torch.dtype) -> Any:
    """The decoder's ``attention_mask`` for these rows: one 4D mask, or one per layer type."""
    additive = getattr(config, "_attn_implementation", "sdpa") == "eager"

    def form(ok: torch.Tensor) -> torch.Tensor:
        if not additive:
            return ok
        return torch.zeros(ok.shape, dtype=dtype, device=ok.device).masked_fill_(~ok, torch.finfo(dtype).min)

    types = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    if not types:  # one mask for every layer (Mistral-style models slide every layer when a window is set)
        return form(_visible(packed, window))
    return {t: form(_visible(packed, window if t == "sliding_attention" else None)) for t in set(types)}


def packed_logprobs(
    model: Any,
    packed: PackedRows,
    width: int,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    return_entropy: bool = False,
    only: torch.Tensor | None = None,
    head: Any = "fused",
    grad_into_leaf: bool = False,
    compiled_head: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities [N, width] of each sequence's completion, as ``completion_logprobs`` gives them.

    ``only`` ([N, width] bool, on the host): score just these positions; the others are 0 with no gradient.
    """
    _check(temperature, chunk_size, head)
    N = packed.pred_row.shape[0]
    if packed.pred_row.shape != (N, width) or (only is not None and only.shape != (N, width)):
        raise ValueError(f"packed indices and only must be [N, width]={(N, width)}")
    decoder, _ = _parts(model)
    dev = decoder.get_input_embeddings().weight.device
    ids = packed.input_ids.to(dev)
    dtype = (
        torch.get_autocast_dtype(dev.type)
        if torch.is_autocast_enabled(dev.type)
        else decoder.get_input_embeddings().weight.dtype
    )
    moved = PackedRows(
        *(
            t.to(dev)
            for t in (
                packed.input_ids,
                packed.positions,
                packed.unit,
                packed.branch,
                packed.pred_row,
                packed.pred_col,
                packed.tgt_col,
            )
        )
    )
    mask = attention_masks(getattr(model, "config", None), moved, dtype)
    out = decoder(input_ids=ids, attention_mask=mask, position_ids=moved.positions, use_cache=False)
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    r, pc, tc = moved.pred_row.reshape(-1), moved.pred_col.reshape(-1), moved.tgt_col.reshape(-1)
    if only is not None:  # the index is built on the host copy of the mask: no device sync
        keep = only.reshape(-1).nonzero().squeeze(-1).to(dev, non_blocking=True)
        r, pc, tc = r[keep], pc[keep], tc[keep]
    logprobs, entropy = _head_logprobs(
        model, hidden[r, pc], ids[r, tc], temperature, chunk_size, return_entropy, head, grad_into_leaf, compiled_head
    )
    if only is not None:
        logprobs = logprobs.new_zeros(N * width).index_put((keep,), logprobs)
        if return_entropy:
            entropy = entropy.new_zeros(N * width).index_put((keep,), entropy)
    if return_entropy:
        return logprobs.view(N, width), entropy.view(N, width)
    return logprobs.view(N, width)
