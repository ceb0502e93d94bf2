"""The dynamic-cache decode loop of ``TransformersGenerator`` (CPU, and models the static cache
does not support).

Why a module of its own: ``transformers.py`` holds the generator's queue and threads; the static
loop is in ``continuous.py``. Here the prefix every prompt of a batch shares (a system prompt and
tool schemas: ~113 of the ~130 tokens of the default run's first turn) is prefilled once and its
keys and values copied to every row, which halved the default CPU run's rollout (prefill was most
of it); each row's tail is left-padded after the prefix, so padding sits between the two.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch

from agentrl.generators.hf.decode_steps import EarlyStops, record
from agentrl.generators.hf.sampling import sample_next
from agentrl.generators.hf.static_decode import (
    dynamic_cache,
    full_attention_only,
    left_pad,
    text_config,
)
from agentrl.generators.protocol import FinishReason, Generation

if TYPE_CHECKING:
    from agentrl.generators.hf.generator import TransformersGenerator, _Request

# Shorter common prefixes are not worth the extra forward call.
MIN_SHARED_PREFIX = 16


def shared_prefix(prompts: list[list[int]]) -> int:
    """How many leading tokens all ``prompts`` share, leaving each at least one of its own."""
    return min(len(os.path.commonprefix(prompts)), min(len(p) for p in prompts) - 1)


def can_share_prefix(model: torch.nn.Module) -> bool:
    """Whether a row may hold padding between the shared prefix and its tail.

    The padding moves the tail's keys to later cache columns, not to later positions: harmless
    where attention reads positions (rotary embeddings over explicit position ids) and sees the
    whole cache, wrong where it measures distances in cache columns (a sliding window: a tiny
    sliding-window Qwen2 decoded other greedy tokens; ALiBi-style biases)."""
    config = text_config(model)
    rotary = getattr(config, "rope_parameters", None) is not None or getattr(config, "rope_theta", None) is not None
    return rotary and full_attention_only(model)


def decode_dynamic(gen: TransformersGenerator, reqs: list[_Request]) -> list[Generation]:
    """Prefill (the shared prefix once, then every row's left-padded tail), then one token per step
    for the rows still running; finished rows leave the cache once a quarter of the batch has."""
    dev, n = gen.device, len(reqs)
    lens = [len(r.prompt) for r in reqs]
    cache = dynamic_cache(gen.model.config)
    # The tokens every prompt starts with (a system prompt, tool schemas, a group's question)
    # are encoded once and their keys and values copied to every row; each row keeps at least
    # its last token for the batched forward, which gives the logits to sample from.
    shared = shared_prefix([r.prompt for r in reqs]) if n > 1 and can_share_prefix(gen.model) else 0
    if shared < MIN_SHARED_PREFIX:
        shared = 0
    if shared:
        prefix = torch.tensor([reqs[0].prompt[:shared]], dtype=torch.long, device=dev)
        gen._forward(prefix, torch.ones_like(prefix), torch.arange(shared, device=dev)[None], cache)
        cache.batch_repeat_interleave(n)
    tails = [r.prompt[shared:] for r in reqs]
    ids, valid = left_pad(tails, n, max(len(t) for t in tails), gen.pad_token_id)
    ids = ids.to(dev)
    mask = torch.cat([torch.ones((n, shared), dtype=torch.long), valid.long()], dim=1).to(dev)  # padding sits between prefix and tail
    positions = ((mask.cumsum(-1) - 1).clamp(min=0))[:, shared:]
    next_pos = torch.tensor(lens, dtype=torch.long, device=dev)
    gens = [
        None if r.sampling.seed is None else torch.Generator().manual_seed(r.sampling.seed)
        for r in reqs
    ]
    stops = [set(r.sampling.stop_token_ids) for r in reqs]
    tokens: list[list[int]] = [[] for _ in reqs]
    logprobs: list[list[float]] = [[] for _ in reqs]
    finish: list[FinishReason | None] = [None] * n
    rows = list(range(n))  # batch row -> request index; shrinks as rows finish
    logits = gen._forward(ids, mask, positions, cache)
    early = EarlyStops([r.sampling for r in reqs], stops, dev)
    while True:
        tok, lp = sample_next(early.apply(logits), [reqs[i].sampling for i in rows], [gens[i] for i in rows])
        early.advance()
        record(reqs, rows, tok.tolist(), lp.tolist(), tokens, logprobs, finish, stops)  # finished rows: ignored
        live = [j for j, i in enumerate(rows) if finish[i] is None]
        if not live:
            break
        if len(live) <= 0.75 * len(rows):  # drop finished rows once enough of them pile up
            keep = torch.tensor(live, dtype=torch.long, device=dev)
            cache.batch_select_indices(keep)
            mask, next_pos, tok = mask[keep], next_pos[keep], tok[keep]
            early.keep(keep)
            rows = [rows[j] for j in live]
        mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=1)
        logits = gen._forward(tok[:, None], mask, next_pos[:, None], cache)
        next_pos = next_pos + 1
    gen.stats["tokens_generated"] += sum(len(t) for t in tokens)
    return [Generation(tokens[i], logprobs[i], finish[i] or "abort") for i in range(n)]
