"""Per-token log-probabilities (and entropies) of given tokens, without materialising B x T x V.

The decoder runs once to get the final hidden states; the output head, the float32 upcast, the
temperature and the log-softmax then run over tiles, so no batch x length x vocab tensor exists.

Two heads compute the same numbers:

- ``head="fused"`` (the default when the output head is a plain ``nn.Linear``): one autograd
  function for linear + log-softmax + gather. Forward keeps only each position's log-partition
  (an online log-sum-exp over vocabulary tiles); backward recomputes each tile and turns it into
  the logits' gradient in place (``softmax - onehot``), then accumulates the hidden-state and
  weight gradients in float32. A tile holds as many elements as ``chunk_size`` positions of the
  full vocabulary (``tile_shape``), so the float32 working set equals the checkpointed head's,
  but with a large vocabulary it spans up to 4096 positions, so the [V, H] weight gradient is
  accumulated once per 4096 positions instead of once per ``chunk_size`` (at 152k x 896 each
  accumulation is ~1 GB of memory traffic). Under bf16 the tile's product and gradient are cast
  ``PIECES`` columns at a time and the entropy is summed in place, so the head's working set is
  one float32 tile and half a bf16 one (it was two float32 tiles); that lets the default
  ``chunk_size`` keep tiles few and large, which a GPU needs (see ``_LinearLogprob``). When the
  learner compiles its layers, each tile's work after the product is one compiled function
  (``agentrl.compute.head_tiles``) and no float32 tile is made at all.
- ``head="checkpoint"``: the head module runs on chunks of ``chunk_size`` positions under
  activation checkpointing (backward recomputes the chunk's logits). Used for heads that are not a
  plain linear layer (a PEFT adapter on ``lm_head``), and kept as the reference the fused head is
  tested against.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from agentrl.compute import head_tiles

Head = Literal["fused", "checkpoint"]
TILE_ROWS = 4096  # most positions per tile of the fused head (see tile_shape)
MIN_TILE_COLS = 8192  # fewest vocabulary columns per tile, unless the vocabulary is smaller
PIECES = 2  # a tile's narrow (bf16) product and gradient are made in this many column pieces


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that skip padding (``cumsum - 1``), as ``generate`` uses for left-padded prompts."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def _head_chunk(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    head: torch.nn.Module,
    temperature: float,
    softcap: float | None,
    want_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of ``targets`` and entropy for one chunk of [N, H] hidden states, in float32."""
    logits = head(hidden).float()
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    if temperature != 1.0:
        logits = logits / temperature
    logp = F.log_softmax(logits, dim=-1)
    token = logp.gather(-1, targets[:, None]).squeeze(-1)
    if want_entropy:  # a diagnostic: no gradient, so backward keeps nothing extra alive for it
        with torch.no_grad():
            entropy = -(logp.exp() * logp).sum(-1)
    else:
        entropy = token.new_empty(0)
    return token, entropy


def token_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    logits_to_keep: int | None = None,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    position_ids: torch.Tensor | None = None,
    return_entropy: bool = False,
    head: Head = "fused",
    **model_kwargs: Any,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities [B, K] of the last ``K = logits_to_keep`` tokens of ``input_ids`` (float32).

    ``logits_to_keep=None`` gives all ``K = L - 1`` predicted tokens: ``out[:, j]`` is
    ``log p(input_ids[:, L-K+j] | input_ids[:, :L-K+j])``. Logits are divided by ``temperature``
    exactly as the sampler did, so these match the sampler's log-probs up to numerics. Works under
    ``torch.no_grad()`` (old/reference log-probs) and with gradients (training), and with PEFT
    models (decoder via ``get_decoder()``, head via ``get_output_embeddings()``). ``position_ids``
    default to ``positions_from_mask(attention_mask)`` so left padding does not shift positions;
    pass them for packed sequences. With ``return_entropy`` also returns [B, K] entropies (no gradient) of the
    tempered distribution. ``head``: see the module docstring. ``model_kwargs`` go to the decoder.
    """
    _check(temperature, chunk_size, head)
    B, L = input_ids.shape
    K = L - 1 if logits_to_keep is None else int(logits_to_keep)
    if not 0 < K < L:
        raise ValueError(f"logits_to_keep must be in [1, {L - 1}] for sequences of length {L}, got {K}")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if position_ids is None:
        position_ids = positions_from_mask(attention_mask)

    decoder, _ = _parts(model)
    out = decoder(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False, **model_kwargs
    )
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    hidden = hidden[:, L - K - 1 : L - 1].reshape(B * K, -1)  # position p predicts token p + 1
    targets = input_ids[:, L - K :].reshape(B * K)

    logprobs, entropy = _head_logprobs(model, hidden, targets, temperature, chunk_size, return_entropy, head)
    if return_entropy:
        return logprobs.view(B, K), entropy.view(B, K)
    return logprobs.view(B, K)


def completion_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    starts: torch.Tensor,
    width: int,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    return_entropy: bool = False,
    only: torch.Tensor | None = None,
    head: Head = "fused",
    grad_into_leaf: bool = False,
    compiled_head: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities [B, width] of each row's completion, for right-padded rows.

    Row ``b`` is ``prompt + completion + padding`` with its completion starting at ``starts[b]``;
    ``out[b, j]`` is ``log p(input_ids[b, starts[b] + j] | input_ids[b, :starts[b] + j])`` (columns
    past a row's completion hold junk the caller masks). Why a layout of its own: with every row
    starting at column 0 and padding only at the end, causal attention alone keeps real tokens
    from seeing padding, so the decoder runs with no attention mask at all. Left padding needs a
    mask in which the padding queries see no key; on an H100 the bf16 backward of
    scaled-dot-product attention turned such fully masked rows into non-finite gradients for the
    whole micro-batch (multi-turn batches, whose prompts differ by tens of tokens; float32 and
    right padding were finite). No mask also lets SDPA pick its causal flash kernel.

    ``only`` ([B, width] bool, optional): score just these positions (the sampled tokens); the
    others are 0 with no gradient. The output head is the costliest part of the training forward
    at a 150k vocabulary, and a multi-turn row's tool results and padding need no log-prob.
    ``grad_into_leaf`` and ``compiled_head`` (``compiled`` there): see ``linear_logprobs`` (the
    learner, which only calls ``.backward()`` and compiles its layers on a GPU).
    """
    _check(temperature, chunk_size, head)
    B, L = input_ids.shape
    # checked where the caller keeps them (the learner: on the host, so no device sync per micro-batch)
    if starts.shape != (B,) or bool((starts < 1).any()) or bool((starts >= L).any()):
        raise ValueError(f"starts must be [B]={B} with 1 <= start < {L}, got {starts.tolist()}")
    starts = starts.to(device=input_ids.device, dtype=torch.long, non_blocking=True)
    if only is not None and only.shape != (B, width):
        raise ValueError(f"only must be [B, width]={(B, width)}, got {tuple(only.shape)}")
    decoder, _ = _parts(model)
    out = decoder(input_ids=input_ids, use_cache=False)
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    cols = (starts[:, None] + torch.arange(width, device=input_ids.device)[None, :]).clamp(max=L - 1)  # [B, width]
    rows = torch.arange(B, device=input_ids.device)[:, None].expand(B, width)
    if only is not None:  # the index is built on the host copy of the mask: no device sync
        keep = only.reshape(-1).nonzero().squeeze(-1).to(input_ids.device, non_blocking=True)
        r, c = rows.reshape(-1)[keep], cols.reshape(-1)[keep]
    else:
        r, c = rows.reshape(-1), cols.reshape(-1)
    h = hidden[r, c - 1]  # position p predicts token p + 1
    targets = input_ids[r, c]
    logprobs, entropy = _head_logprobs(model, h, targets, temperature, chunk_size, return_entropy, head, grad_into_leaf, compiled_head)
    if only is not None:
        full = logprobs.new_zeros(B * width).index_put((keep,), logprobs)
        logprobs = full
        if return_entropy:
            entropy = entropy.new_zeros(B * width).index_put((keep,), entropy)
    if return_entropy:
        return logprobs.view(B, width), entropy.view(B, width)
    return logprobs.view(B, width)


def _check(temperature: float, chunk_size: int, head: str) -> None:
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (log-probs of greedy sampling are not defined), got {temperature}")
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be > 0, got {chunk_size}")
    if head not in ("fused", "checkpoint"):
        raise ValueError(f"head must be 'fused' or 'checkpoint', got {head!r}")


def _parts(model: Any) -> tuple[Any, Any]:
    decoder = model.get_decoder()
    head = model.get_output_embeddings()
    if decoder is None or head is None:
        raise TypeError(f"{type(model).__name__} exposes no decoder/output head (get_decoder/get_output_embeddings)")
    return decoder, head


def _head_logprobs(
    model: Any, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, chunk_size: int, want_entropy: bool, head: Head,
    grad_into_leaf: bool = False, compiled: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """[N] log-probs (and entropies) of ``targets`` from [N, H] hidden states, through the chosen head."""
    module = model.get_output_embeddings()
    softcap = getattr(getattr(model, "config", None), "final_logit_softcapping", None)
    if head == "fused" and type(module) is torch.nn.Linear:  # a PEFT-wrapped head has its own forward
        rows, cols = tile_shape(chunk_size, module.weight.shape[0])
        return linear_logprobs(
            hidden, module.weight, targets, bias=module.bias, temperature=temperature, softcap=softcap,
            tile_rows=rows, tile_cols=cols, return_entropy=want_entropy, grad_into_leaf=grad_into_leaf,
            compiled=compiled,
        )
    return _chunked_head(module, hidden, targets, temperature, softcap, chunk_size, want_entropy)


def tile_shape(chunk_size: int, vocab: int) -> tuple[int, int]:
    """The fused head's tile for the memory of a ``chunk_size x vocab`` chunk: up to ``TILE_ROWS``
    positions by at least ``MIN_TILE_COLS`` vocabulary columns (the whole vocabulary when it is
    small, so a small-vocabulary model runs few, wide tiles rather than many narrow ones)."""
    budget = chunk_size * vocab
    cols = min(vocab, max(MIN_TILE_COLS, budget // TILE_ROWS))
    return max(1, budget // cols), cols


def _chunked_head(
    head: Any, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, softcap: float | None, chunk_size: int, want_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The checkpointed head: ``chunk_size`` positions at a time through the head module."""
    grad = torch.is_grad_enabled()  # then checkpoint even if only the head is trainable
    token_chunks, entropy_chunks = [], []
    for start in range(0, hidden.shape[0], chunk_size):
        h, t = hidden[start : start + chunk_size], targets[start : start + chunk_size]
        args = (h, t, head, temperature, softcap, want_entropy)
        tok, ent = checkpoint(_head_chunk, *args, use_reentrant=False) if grad else _head_chunk(*args)
        token_chunks.append(tok)
        entropy_chunks.append(ent)
    if not token_chunks:  # no position to score: still a tensor on the graph, so backward() works
        empty = hidden[:0].float().sum(-1)
        return empty, empty.detach()
    return torch.cat(token_chunks), torch.cat(entropy_chunks)


# -- the fused head -----------------------------------------------------------------------------------


def linear_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    softcap: float | None = None,
    tile_rows: int = TILE_ROWS,
    tile_cols: int = 16384,
    return_entropy: bool = False,
    grad_into_leaf: bool = False,
    compiled: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``log_softmax(softcap(hidden @ weight.T + bias) / temperature)[n, targets[n]]`` for [N, H]
    ``hidden``, and the entropies (no gradient; an empty tensor unless ``return_entropy``), float32.

    The matrix products run in the autocast dtype when autocast is on (as ``nn.Linear`` would),
    everything after them in float32. No tensor larger than ``tile_rows x tile_cols`` is made
    besides the [V, H] float32 weight gradient. Gradients flow to ``hidden``, ``weight`` and
    ``bias``. With ``grad_into_leaf`` (only for ``.backward()``, never ``torch.autograd.grad``) a
    leaf ``weight`` that already has a float32 ``.grad`` (the second micro-batch of a step on) gets
    its gradient added there directly instead of through a fresh [V, H] float32 buffer that the
    autograd engine would add in: 0.5 GiB less at the moment of the step's peak for a 152k x 896 head.
    ``compiled``: each tile's work after its product runs as one compiled function (``agentrl.compute.head_tiles``;
    heads without a bias or softcap), and no tile larger than ``tile_rows x tile_cols`` in the compute
    dtype is made at all. The learner asks for it when it compiles its layers.
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1] or targets.shape != hidden.shape[:1]:
        raise ValueError(f"linear_logprobs wants hidden [N, H], weight [V, H], targets [N]; got {tuple(hidden.shape)}, {tuple(weight.shape)}, {tuple(targets.shape)}")
    if tile_rows <= 0 or tile_cols <= 0:
        raise ValueError(f"tile sizes must be > 0, got {tile_rows} x {tile_cols}")
    dev = hidden.device.type
    if torch.is_autocast_enabled(dev):
        compute = torch.get_autocast_dtype(dev)
    else:
        compute = torch.promote_types(hidden.dtype, weight.dtype)
    with torch.autocast(dev, enabled=False):
        lp, ent = _LinearLogprob.apply(
            hidden, weight, bias, targets.long(), float(temperature), softcap, compute, tile_rows, tile_cols, return_entropy, grad_into_leaf,
            compiled,
        )
    return lp, ent


def _target_tiles(targets: torch.Tensor, tile_cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each target's vocabulary tile and its column in it, once per row block rather than per tile."""
    tile_of = torch.div(targets, tile_cols, rounding_mode="floor")
    return tile_of, targets - tile_of * tile_cols


def _column_in(offset: torch.Tensor, c0: int, c1: int, tile_cols: int) -> torch.Tensor:
    """The targets' columns as indices into the tile ``[c0, c1)``: a short last tile clamps the
    columns of targets outside it (their values are masked out by the caller)."""
    return offset if c1 - c0 == tile_cols else offset.clamp(max=c1 - c0 - 1)


def _pieces(c0: int, c1: int, dtype: torch.dtype) -> list[tuple[int, int]]:
    """Column ranges of the tile ``[c0, c1)`` whose products are made one at a time: the whole tile
    in float32 (the product is the tile), else ``PIECES`` near-equal ones."""
    n = 1 if dtype == torch.float32 else max(1, min(PIECES, c1 - c0))
    edges = [c0 + (c1 - c0) * i // n for i in range(n + 1)]
    return list(itertools.pairwise(edges))


def _tile_logits(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, c0: int, c1: int, temperature: float, softcap: float | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """float32 tempered logits of the tile of columns ``[c0, c1)`` (and tanh of the capped logits,
    for softcap's derivative). A product in a narrower dtype is made ``PIECES`` columns at a time
    and copied into the float32 tile, so the tile and a whole narrow copy never exist together;
    the logits are the narrow product's, rounded as ``nn.Linear`` under autocast rounds them."""
    if w.dtype == torch.float32:
        y = torch.mm(h, w[c0:c1].t())
    else:
        y = torch.empty((h.shape[0], c1 - c0), device=h.device, dtype=torch.float32)
        for a, z in _pieces(c0, c1, w.dtype):
            y[:, a - c0 : z - c0] = torch.mm(h, w[a:z].t())
    if b is not None:
        y += b[c0:c1].float()
    th = None
    if softcap:
        th = y.div_(softcap).tanh_()
        y = th * softcap
    if temperature != 1.0:
        y.div_(temperature)
    return y, th


class _LinearLogprob(torch.autograd.Function):
    """One float32 tile at a time and nothing of its size beside it but a ``1 / PIECES`` narrow
    piece: the entropy is summed from the exponentiated tile in place (``entr``), and backward
    casts the logits' gradient to the compute dtype piece by piece for its two products.

    The op count per tile matters as much as the bytes: on a GPU the head's kernels can run faster
    than Python issues them, so a tile costs its ~65-90 ops' dispatch whatever its size (at 32 x 8
    x 512 on an H200, 4x the tiles made the learner 1.08 s slower a step;
    benchmarks/head_dispatch.py counts them)."""

    @staticmethod
    def forward(ctx: Any, hidden, weight, bias, targets, temperature, softcap, compute, tile_rows, tile_cols, want_entropy, into_leaf, compiled):  # type: ignore[override]
        N, V = hidden.shape[0], weight.shape[0]
        # compiled tiles for plain heads; a block of one row takes the eager tiles, since the
        # compiled functions specialise a size of 1 and would compile again mid-run
        fast = compiled and bias is None and not softcap
        dev = hidden.device
        log_z = torch.empty(N, device=dev, dtype=torch.float32)
        target_logit = torch.empty(N, device=dev, dtype=torch.float32)
        entropy = torch.empty(N if want_entropy else 0, device=dev, dtype=torch.float32)
        w = weight.to(compute)
        b = None if bias is None else bias.to(compute)
        for r0 in range(0, N, tile_rows):
            r1 = min(N, r0 + tile_rows)
            h = hidden[r0:r1].to(compute)
            t = targets[r0:r1]
            run_max = torch.full((r1 - r0,), float("-inf"), device=dev)
            sum_exp = torch.zeros(r1 - r0, device=dev)
            sum_exp_y = torch.zeros(r1 - r0, device=dev)
            picked = torch.zeros(r1 - r0, device=dev)
            tile_of, offset = _target_tiles(t, tile_cols)
            for k, c0 in enumerate(range(0, V, tile_cols)):
                c1 = min(V, c0 + tile_cols)
                if fast and r1 - r0 > 1:  # one compiled reduction over the narrow product (agentrl.compute.head_tiles)
                    run_max, sum_exp, sum_exp_y, picked = head_tiles.compiled("tile_stats")(
                        torch.mm(h, w[c0:c1].t()), run_max, sum_exp, sum_exp_y, picked, tile_of == k,
                        _column_in(offset, c0, c1, tile_cols), temperature, want_entropy,
                    )
                    continue
                y, _ = _tile_logits(h, w, b, c0, c1, temperature, softcap)
                at = _column_in(offset, c0, c1, tile_cols)
                picked = torch.where(tile_of == k, y.gather(1, at[:, None]).squeeze(1), picked)
                new_max = torch.maximum(run_max, y.amax(dim=1))
                rescale = torch.exp(run_max - new_max)
                e = y.sub_(new_max[:, None]).exp_()  # in place: the tile is now exp(y - max)
                tile_sum = e.sum(dim=1)
                if want_entropy:  # sum of e * y = sum of e * (y - max) + max * sum of e; entr(e) = -e log e
                    e_y = torch.special.entr(e, out=e).sum(dim=1).neg_().addcmul_(new_max, tile_sum)
                    sum_exp_y = torch.addcmul(e_y, sum_exp_y, rescale)
                sum_exp = torch.addcmul(tile_sum, sum_exp, rescale)
                run_max = new_max
                del y, e
            lz = run_max + torch.log(sum_exp)
            log_z[r0:r1] = lz
            target_logit[r0:r1] = picked
            if want_entropy:
                entropy[r0:r1] = lz - sum_exp_y / sum_exp
        ctx.save_for_backward(hidden, weight, bias, targets, log_z)
        ctx.settings = (temperature, softcap, compute, tile_rows, tile_cols, into_leaf, fast)
        ctx.mark_non_differentiable(entropy)
        return target_logit - log_z, entropy

    @staticmethod
    def backward(ctx: Any, grad_lp: torch.Tensor, _grad_entropy: Any):  # type: ignore[override]
        hidden, weight, bias, targets, log_z = ctx.saved_tensors
        temperature, softcap, compute, tile_rows, tile_cols, into_leaf, fast = ctx.settings
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        N, V = hidden.shape[0], weight.shape[0]
        g = grad_lp.float()
        w = weight.to(compute)
        b = None if bias is None else bias.to(compute)
        grad_h = torch.zeros(hidden.shape, device=hidden.device, dtype=torch.float32) if need_h else None
        grad_w = _weight_grad_buffer(weight, into_leaf) if need_w else None
        grad_b = torch.zeros(V, device=hidden.device, dtype=torch.float32) if need_b else None
        for r0 in range(0, N, tile_rows):
            r1 = min(N, r0 + tile_rows)
            h = hidden[r0:r1].to(compute)
            t, gr, lz = targets[r0:r1], g[r0:r1], log_z[r0:r1]
            rows = torch.arange(r1 - r0, device=hidden.device)
            tile_of, offset = _target_tiles(t, tile_cols)
            for k, c0 in enumerate(range(0, V, tile_cols)):
                c1 = min(V, c0 + tile_cols)
                if fast and r1 - r0 > 1:  # the product becomes the logits' gradient in place, in the compute dtype
                    d = torch.mm(h, w[c0:c1].t())
                    head_tiles.compiled("tile_grad_")(d, lz, gr, tile_of == k, _column_in(offset, c0, c1, tile_cols), temperature)
                    if grad_h is not None:
                        _add_mm(grad_h[r0:r1], d, w[c0:c1])
                    if grad_w is not None:
                        _add_mm(grad_w[c0:c1], d.t(), h)
                    del d
                    continue
                y, th = _tile_logits(h, w, b, c0, c1, temperature, softcap)
                # d lp / d y = onehot(target) - softmax(y); times the incoming gradient, in place
                dy = y.sub_(lz[:, None]).exp_().mul_(-gr[:, None])
                dy.index_put_((rows, _column_in(offset, c0, c1, tile_cols)), gr * (tile_of == k), accumulate=True)
                if temperature != 1.0:
                    dy.div_(temperature)
                if th is not None:  # y = softcap * tanh(z / softcap): dy/dz = 1 - tanh^2
                    dy.mul_(1.0 - th * th)
                if grad_b is not None:
                    grad_b[c0:c1] += dy.sum(dim=0)
                del y, th
                for a, z in _pieces(c0, c1, compute):
                    d = dy[:, a - c0 : z - c0].to(compute)
                    if grad_h is not None:
                        _add_mm(grad_h[r0:r1], d, w[a:z])
                    if grad_w is not None:
                        _add_mm(grad_w[a:z], d.t(), h)
                    del d
                del dy
        out_w = None
        if grad_w is not None and grad_w is not weight.grad:
            out_w = grad_w.to(weight.dtype)
        return (
            None if grad_h is None else grad_h.to(hidden.dtype),
            out_w,
            None if grad_b is None else grad_b.to(bias.dtype),
            None, None, None, None, None, None, None, None, None,
        )


def _weight_grad_buffer(weight: torch.Tensor, into_leaf: bool) -> torch.Tensor:
    """Where the weight gradient is summed: with ``into_leaf`` the leaf's own float32 ``.grad`` when
    it has one (the autograd engine would otherwise add a fresh [V, H] buffer into it), else a new
    float32 buffer."""
    grad = weight.grad if into_leaf and weight.is_leaf else None
    if grad is not None and grad.dtype == torch.float32 and grad.shape == weight.shape and grad.is_contiguous() and type(grad) is torch.Tensor:
        return grad
    return torch.zeros(weight.shape, device=weight.device, dtype=torch.float32)


def _add_mm(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``acc += a @ b`` into float32 ``acc`` without rounding the product to ``a``'s dtype first.

    Rounding each tile's product to bf16 before the sum (what the checkpointed head's autograd does
    per chunk) adds an error per tile; cuBLAS can write a bf16 product straight into float32.
    """
    if a.dtype == torch.float32:
        acc.addmm_(a, b)
    elif a.is_cuda and _mm_out_dtype_works():
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    else:
        acc.addmm_(a.float(), b.float())


@functools.cache
def _mm_out_dtype_works() -> bool:
    """Whether this torch writes a bf16 matrix product into float32 (``addmm(out_dtype=)``, CUDA)."""
    try:
        x = torch.ones((2, 2), device="cuda", dtype=torch.bfloat16)
        acc = torch.zeros((2, 2), device="cuda", dtype=torch.float32)
        torch.addmm(acc, x, x, out_dtype=torch.float32, out=acc)
        return bool(acc[0, 0].item() == 2.0)
    except (TypeError, RuntimeError):
        return False
