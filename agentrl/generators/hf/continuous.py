"""The static-cache decode loop of ``TransformersGenerator``, with continuous batching.

Why: a multi-turn rollout sends an episode's next turn only after its previous turn came back and
its tools ran. A batch that answers every request when its longest row is done keeps the finished
rows idle and those episodes waiting; here a finished row's request is answered at once, and
requests queued meanwhile take the finished rows over (``StaticBatch.admit``). Split from
``transformers.py`` (the generator's queue and threads).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from agentrl.generators.hf.decode_steps import EarlyStops, HostCopy, record
from agentrl.generators.hf.sampling import (
    RowStreams,
    _compiled_keyed_gumbel_max,
    inverse_temperature,
    one_setting,
    sample_next,
)
from agentrl.generators.hf.static_decode import STOP_WIDTH
from agentrl.generators.protocol import FinishReason, Generation

if TYPE_CHECKING:
    from agentrl.generators.hf.generator import TransformersGenerator, _Request


def decode_continuous(gen: TransformersGenerator, reqs: list[_Request]) -> list[Generation]:
    """Decode ``reqs`` over a static cache: rows never shrink and each step is one graph replay.

    Pipelined: the step that consumes token t is launched before the host reads token t back,
    so the host's bookkeeping overlaps the GPU's next step. With ``gen.continuous``, a finished
    row's request is answered at once, and queued requests that fit (``StaticBatch.fits``) take
    the finished rows over, in groups (an eighth of the batch, or all free rows; any number once
    ``admit_every`` steps passed since the last group or when no row is left running): a
    multi-turn episode's next turn then starts while the batch's longest row is still decoding
    instead of after it. Admitted requests are appended to ``reqs``; the batch ends one
    (discarded) step after its last row finishes with nothing left to admit. Without it every
    request is answered when the batch ends.
    """
    assert gen.static is not None
    n = len(reqs)
    run = gen.static.start([r.prompt for r in reqs], max(r.max_tokens for r in reqs) + 1)
    gen.stats["forward_passes"] += 1
    rows = min(run.rows, gen.max_batch_size)
    # per batch row: the request it serves now (a finished row keeps its last one, ignored)
    owner: list[_Request] = list(reqs)
    gens = [None if r.sampling.seed is None else torch.Generator().manual_seed(r.sampling.seed) for r in reqs]
    stops = [set(r.sampling.stop_token_ids) for r in reqs]
    params = [r.sampling for r in reqs]
    tokens: list[list[int]] = [[] for _ in reqs]
    logprobs: list[list[float]] = [[] for _ in reqs]
    finish: list[FinishReason | None] = [None] * n
    results: dict[int, Generation] = {}
    early = EarlyStops(params, stops, gen.device)
    fused = gen.static.compiled  # the compiled step's decoder draws with the compiled sampler too
    # seeded rows' streams on the device (the compiled sampler's): no host call per row and step
    streams = RowStreams([r.sampling.seed for r in reqs] + [0] * (rows - n), gen.device) if fused else None
    to_host = HostCopy(rows, gen.device)
    logits = run.prefill_logits
    since_admit = 0
    least = max(1, rows // 8)
    # The whole token step in one graph: with one tempered setting for the batch and no requests
    # joining it, each step draws every row's next token itself (keyed streams, stop ids held
    # back below min_tokens) and feeds it to the next step; the host only reads tokens back.
    temperature = one_setting(params) if fused and not gen.continuous and gen.sample_in_step else None
    in_step = temperature is not None and streams is not None and early.width <= STOP_WIDTH
    if in_step:
        assert streams is not None
        inv_t = inverse_temperature(temperature, logits.device)
        tok, lp = _compiled_keyed_gumbel_max()(early.apply(logits), streams.keys[:n], streams.counts[:n], inv_t)
        run.sample_in_steps(tok, streams.keys, early.ids, early.minimum, temperature)
        gen.stats["sampled_in_step"] += 1
    while True:
        if in_step:
            to_host.start(tok, lp)
            tok, lp = run.advance()  # speculative: runs while the host looks at the tokens before
        else:
            tok, lp = sample_next(early.apply(logits), params, gens, fused=fused, streams=streams)
            early.advance()
            if streams is not None:
                streams.advance()
            to_host.start(tok, lp)
            logits = run.step(tok)  # speculative: runs while the host looks at tok
        gen.stats["forward_passes"] += 1
        before = [f is None for f in finish]
        record(owner, list(range(len(owner))), *to_host.wait(), tokens, logprobs, finish, stops)
        for j, was_live in enumerate(before):
            if was_live and finish[j] is not None:  # answer now: its episode goes on while the batch runs
                req = owner[j]
                results[id(req)] = req.result = Generation(tokens[j], logprobs[j], finish[j] or "abort")
                gen.stats["tokens_generated"] += len(tokens[j])
                if gen.continuous:  # else answered with the rest when the batch ends
                    req.resolve()
                gens[j], stops[j] = None, set()
        if not gen.continuous:
            if all(f is not None for f in finish):
                break
            continue
        since_admit += 1
        free = [j for j in range(rows) if j >= len(owner) or finish[j] is not None]
        idle = len(free) == rows
        joined = []
        if free:
            # each admission is an eager prefill (several decode steps' worth of time), so requests
            # join in groups: at least an eighth of the batch (or every free row), unless the batch
            # has nothing else to run or the last admission was admit_every steps ago
            urgent = idle or since_admit >= gen.admit_every
            joined = gen._admissible(run.fits, len(free), 1 if urgent else min(len(free), least))
        if joined:
            at = free[: len(joined)]
            reqs.extend(joined)  # part of the batch from here on: a failure now fails them too
            logits = run.admit(at, [r.prompt for r in joined])
            gen.stats["forward_passes"] += 1
            gen.stats["admitted"] += len(joined)
            gen.stats["admissions"] += 1
            since_admit = 0
            for j, req in zip(at, joined):
                if j >= len(owner):  # a padding row of the batch bucket comes into use
                    grow = j + 1 - len(owner)
                    owner += [req] * grow
                    gens += [None] * grow
                    stops += [set() for _ in range(grow)]
                    params += [req.sampling] * grow
                    tokens += [[] for _ in range(grow)]
                    logprobs += [[] for _ in range(grow)]
                    finish += ["abort"] * grow
                owner[j], params[j], finish[j] = req, req.sampling, None
                gens[j] = None if req.sampling.seed is None else torch.Generator().manual_seed(req.sampling.seed)
                stops[j] = set(req.sampling.stop_token_ids)
                tokens[j], logprobs[j] = [], []
            early.restart(at, [r.sampling for r in joined], [stops[j] for j in at])
            if streams is not None:
                streams.restart(at, [r.sampling.seed for r in joined])
        elif idle:
            break
    gen.stats["host_wait_s"] += to_host.waited_s  # the host blocked on the device's tokens (the trace's wait_s)
    return [results[id(r)] for r in reqs]
