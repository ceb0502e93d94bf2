"""Per-token log-probabilities (and entropies) of given tokens, without materialising B x T x V.

The decoder runs once to get the final hidden states; the output head, the float32 upcast, the
temperature and the log-softmax then run over chunks of ``chunk_size`` token positions (the batch
and sequence dimensions flattened), so the largest float32 logits tensor is ``chunk_size x V``.
With gradients on, each chunk is activation-checkpointed: backward recomputes that chunk's logits
instead of keeping every chunk's logits alive, which would rebuild the full tensor in memory.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


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
    tempered distribution. ``model_kwargs`` go to the decoder.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (log-probs of greedy sampling are not defined), got {temperature}")
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be > 0, got {chunk_size}")
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

    logprobs, entropy = _chunked_head(model, hidden, targets, temperature, chunk_size, return_entropy)
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
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (log-probs of greedy sampling are not defined), got {temperature}")
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be > 0, got {chunk_size}")
    B, L = input_ids.shape
    starts = starts.to(device=input_ids.device, dtype=torch.long)
    if starts.shape != (B,) or bool((starts < 1).any()) or bool((starts >= L).any()):
        raise ValueError(f"starts must be [B]={B} with 1 <= start < {L}, got {starts.tolist()}")
    decoder, head = _parts(model)
    out = decoder(input_ids=input_ids, use_cache=False)
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    cols = (starts[:, None] + torch.arange(width, device=input_ids.device)[None, :]).clamp(max=L - 1)  # [B, width]
    rows = torch.arange(B, device=input_ids.device)[:, None]
    h = hidden[rows, cols - 1].reshape(B * width, -1)  # position p predicts token p + 1
    targets = input_ids[rows, cols].reshape(B * width)
    logprobs, entropy = _chunked_head(model, h, targets, temperature, chunk_size, return_entropy)
    if return_entropy:
        return logprobs.view(B, width), entropy.view(B, width)
    return logprobs.view(B, width)


def _parts(model: Any) -> tuple[Any, Any]:
    decoder = model.get_decoder()
    head = model.get_output_embeddings()
    if decoder is None or head is None:
        raise TypeError(f"{type(model).__name__} exposes no decoder/output head (get_decoder/get_output_embeddings)")
    return decoder, head


def _chunked_head(
    model: Any, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, chunk_size: int, want_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """[N] log-probs (and entropies) of ``targets`` from [N, H] hidden states, ``chunk_size`` rows at a time."""
    head = model.get_output_embeddings()
    softcap = getattr(getattr(model, "config", None), "final_logit_softcapping", None)
    grad = torch.is_grad_enabled()  # then checkpoint even if only the head is trainable
    token_chunks, entropy_chunks = [], []
    for start in range(0, hidden.shape[0], chunk_size):
        h, t = hidden[start : start + chunk_size], targets[start : start + chunk_size]
        args = (h, t, head, temperature, softcap, want_entropy)
        tok, ent = checkpoint(_head_chunk, *args, use_reentrant=False) if grad else _head_chunk(*args)
        token_chunks.append(tok)
        entropy_chunks.append(ent)
    return torch.cat(token_chunks), torch.cat(entropy_chunks)
