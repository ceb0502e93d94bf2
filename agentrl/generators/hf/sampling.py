"""Drawing the next token from a batch of logits, each row under its own sampling settings.

Why a module of its own: the transformers generator's decode loops (dynamic and static cache)
share it, and it is where a sampler can silently go wrong (a token of probability zero, a filter
applied in another order), so it is tested on its own (tests/test_generator_transformers.py).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from agentrl.generators.protocol import SamplingParams

__all__ = ["RowStreams", "keyed_gumbel_max", "sample_next"]


def _filter_logits(x: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Mask (with -inf) what top-k, top-p and min-p remove from tempered logits, row by row."""
    rows, vocab = x.shape
    dev = x.device
    top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], device=dev).clamp(max=vocab)
    top_p = torch.tensor([p.top_p for p in params], device=dev, dtype=torch.float32)
    if any(p.top_k > 0 or p.top_p < 1 for p in params):
        sorted_x, order = x.sort(dim=-1, descending=True)
        remove = torch.arange(vocab, device=dev)[None, :] >= top_k[:, None]
        probs = sorted_x.masked_fill(remove, -math.inf).softmax(-1)
        mass_before = probs.cumsum(-1) - probs  # keep the smallest prefix whose mass reaches top_p
        remove |= (mass_before >= top_p[:, None]) & (top_p[:, None] < 1)
        remove[:, 0] = False
        x = x.masked_fill(torch.empty_like(remove).scatter_(1, order, remove), -math.inf)
    if any(p.min_p > 0 for p in params):
        # p_i >= min_p * p_max  <=>  x_i - x_max >= log(min_p); a ratio, so renormalising can't change it.
        log_min_p = torch.tensor([p.min_p for p in params], device=dev, dtype=torch.float32).log()
        x = x.masked_fill(x - x.max(-1, keepdim=True).values < log_min_p[:, None], -math.inf)
    return x


def sample_next(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None], fused: bool = False,
    streams: RowStreams | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row under that row's settings; return ``(tokens, logprobs)``.

    The logprob is that of the token under the distribution it was drawn from: ``logits / T``,
    then top-k, top-p, min-p, renormalised. Greedy rows (``T == 0``) report ``log_softmax(logits)``
    of the argmax, i.e. temperature 1 with no filtering, the natural reference for a trainer.
    Seeded rows draw from their own (CPU) ``torch.Generator`` so they don't depend on batch companions.

    ``fused``: draw the common case (one temperature, no filter) with a compiled sampler (the CUDA
    decode path, which compiles its step anyway): :func:`gumbel_max` when no row is seeded, else
    :func:`keyed_gumbel_max` over ``streams`` (each row's seeded stream on the device), which keeps
    a seeded row independent of its batch companions without a host round trip per row.
    """
    n = logits.shape[0]
    first = params[0]
    uniform = first.temperature > 0 and _same_setting(params)
    filtered = first.top_k > 0 or first.top_p < 1 or first.min_p > 0
    unseeded = all(g is None for g in generators)
    if uniform and fused and not filtered:
        if unseeded:
            return _compiled_gumbel_max()(logits, inverse_temperature(first.temperature, logits.device))
        if streams is not None:
            inv_t = inverse_temperature(first.temperature, logits.device)
            return _compiled_keyed_gumbel_max()(logits, streams.keys[:n], streams.counts[:n], inv_t)
    if uniform and unseeded:  # one setting for the whole batch, no per-row seeds -> no index juggling
        x = logits.float() / first.temperature
        if filtered:
            x = _filter_logits(x, params)
        return _race(x.log_softmax(-1))
    logits = logits.float()
    tokens = torch.empty(n, dtype=torch.long, device=logits.device)
    logprobs = torch.empty(n, dtype=torch.float32, device=logits.device)
    greedy = [i for i, p in enumerate(params) if p.temperature == 0]
    sampled = [i for i, p in enumerate(params) if p.temperature != 0]
    if greedy:
        idx = torch.tensor(greedy, device=logits.device)
        rows = logits[idx]
        tok = rows.argmax(-1)
        tokens[idx] = tok
        logprobs[idx] = rows.log_softmax(-1).gather(1, tok[:, None]).squeeze(1)
    if sampled:
        idx = torch.tensor(sampled, device=logits.device)
        temps = torch.tensor([params[i].temperature for i in sampled], device=logits.device)
        logp = _filter_logits(logits[idx] / temps[:, None], [params[i] for i in sampled]).log_softmax(-1)
        seeded = [j for j, i in enumerate(sampled) if generators[i] is not None]
        shared = [j for j, i in enumerate(sampled) if generators[i] is None]
        if shared:  # unseeded rows: the global device RNG
            at = torch.tensor([sampled[j] for j in shared], device=logits.device)
            tokens[at], logprobs[at] = _race(logp[torch.tensor(shared, device=logits.device)])
        if seeded:
            # a seeded row takes one uniform from its own CPU generator (cheap, the same on every
            # device) and inverts the CDF with it, so it doesn't depend on its batch companions
            draws = [torch.rand(1, generator=generators[sampled[j]]).item() for j in seeded]
            at = torch.tensor([sampled[j] for j in seeded], device=logits.device)
            rows = logp[torch.tensor(seeded, device=logits.device)]
            tokens[at], logprobs[at] = _draw(rows, torch.tensor(draws, device=logits.device))
    return tokens, logprobs


_INVERSE_TEMPERATURES: dict[tuple[float, torch.device], torch.Tensor] = {}


def inverse_temperature(temperature: float, device: torch.device | str) -> torch.Tensor:
    """``1 / temperature`` as a ``[1]`` float32 tensor on ``device``, made once per (temperature, device).

    The compiled samplers take it as a tensor everywhere: a Python float is a constant to dynamo,
    so the first draw (a float) and the captured step's draws (its own tensor) compiled the keyed
    sampler twice per process (recompile logs, H200), and every new temperature once more.
    """
    key = (float(temperature), torch.device(device))
    if key not in _INVERSE_TEMPERATURES:
        _INVERSE_TEMPERATURES[key] = torch.full((1,), 1.0 / temperature, dtype=torch.float32, device=device)
    return _INVERSE_TEMPERATURES[key]


def gumbel_max(logits: torch.Tensor, inverse_temperature: float | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One draw per row from ``softmax(logits * inverse_temperature)``: ``(tokens, logprobs)``.

    The same Gumbel-max race as :func:`_race`, written so that a compiler can fuse it: the
    log-partition is a per-row reduction subtracted from the chosen token's tempered logit only,
    so no normalised ``[rows, vocab]`` tensor is written. Compiled (:func:`_compiled_gumbel_max`),
    it is a few kernels that read the logits twice. Eagerly it is slower than :func:`_race` over
    a log-softmax (2.0 against 1.4 ms at 256 rows and a 152k vocabulary on an H200), so the
    eager paths keep that one.
    """
    x = logits.float() * inverse_temperature
    noise = torch.rand_like(x).log_().neg_().log_()  # log(-log u); u = 0 gives +inf: that token loses
    choice = (x - noise).argmax(-1)
    return choice, x.gather(1, choice[:, None]).squeeze(1) - x.logsumexp(-1)


def one_setting(params: list[SamplingParams]) -> float | None:
    """The temperature, when every row samples at the same one (> 0) with no top-k/top-p/min-p
    filter: what the compiled samplers draw (seeds aside); else None."""
    first = params[0]
    if first.temperature <= 0 or first.top_k > 0 or first.top_p < 1 or first.min_p > 0:
        return None
    return first.temperature if _same_setting(params) else None


def _same_setting(params: list[SamplingParams]) -> bool:
    """Whether every row has the first row's temperature and filters."""
    first = params[0]
    return all(
        p.temperature == first.temperature and p.top_k == first.top_k and p.top_p == first.top_p and p.min_p == first.min_p
        for p in params
    )


_M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finaliser on int64 tensors holding 32-bit values (every bit of the
    input moves about half the output bits); products stay below 2**64, so int64 is exact."""
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & _M32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & _M32
    return x ^ (x >> 16)


def keyed_gumbel_max(
    logits: torch.Tensor, keys: torch.Tensor, counts: torch.Tensor, inverse_temperature: float | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`gumbel_max` whose noise is a hash of (row key, row count, token id): ``(tokens, logprobs)``.

    A seeded request's draws must not depend on what shares its batch. Drawing them from a CPU
    generator per row, as the eager paths do, costs a host call per row and step (with 256 seeded
    rows, 2-3 ms per token step on an H100 host, more than the decode step's own kernels). Here
    each row's uniforms are a counter-based hash on the device instead: ``keys`` (int64, from the
    request's seed: :class:`RowStreams`) and ``counts`` (tokens the row has drawn) pick the stream,
    the token id the draw within it. Integer arithmetic is exact on every device, so the same seed
    gives the same uniforms anywhere; compiled, it all fuses into the sampler's few kernels.
    """
    x = logits.float() * inverse_temperature
    lo, hi = keys & _M32, (keys >> 32) & _M32
    row = _mix32(hi ^ _mix32((lo + counts * 0x9E3779B9) & _M32))
    cols = torch.arange(x.shape[-1], device=x.device)
    bits = _mix32((_mix32(row[:, None] ^ cols[None, :]) + lo[:, None]) & _M32)
    choice = (x - _unit_interval(bits).log().neg().log()).argmax(-1)
    return choice, x.gather(1, choice[:, None]).squeeze(1) - x.logsumexp(-1)


def _unit_interval(bits: torch.Tensor) -> torch.Tensor:
    """Uniforms strictly inside (0, 1) from 32-bit hashes: 23 bits, centred in their cells.

    With 24 bits, ``(2**24 - 1) + 0.5`` is not a float32 and rounds up to ``2**24``, so one hash
    in 2**24 gave u = 1, an infinite Gumbel noise, and a uniformly random token won its row:
    with a 151,936-token vocabulary, ~0.9% of all draws. With 23 bits every ``k + 0.5`` is exact,
    so u lies in [2**-24, 1 - 2**-24]."""
    return ((bits >> 9).float() + 0.5) * (2.0**-23)


def stream_key(seed: int) -> int:
    """A row's 63-bit stream key from a request seed (SplitMix64, so nearby seeds are far apart)."""
    z = (seed + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) & 0x7FFFFFFFFFFFFFFF


class RowStreams:
    """Each batch row's random stream for :func:`keyed_gumbel_max`, as two device tensors.

    A seeded request's key comes from its seed; an unseeded one (in a batch with seeded rows) gets
    a random key from torch's global generator. ``counts`` is how many tokens the row's request
    has drawn, so a request admitted mid-batch starts its stream from the beginning.
    """

    def __init__(self, seeds: list[int | None], device: torch.device) -> None:
        self.keys = torch.tensor(self._keys(seeds), dtype=torch.long, device=device)
        self.counts = torch.zeros(len(seeds), dtype=torch.long, device=device)

    @staticmethod
    def _keys(seeds: list[int | None]) -> list[int]:
        """Seeded rows' keys from their seeds; the unseeded rows' from one draw of the global generator."""
        drawn = iter(torch.randint(0, 2**62, (sum(s is None for s in seeds),)).tolist())
        return [stream_key(s) if s is not None else next(drawn) for s in seeds]

    def advance(self) -> None:
        """Every row has drawn one more token."""
        self.counts += 1

    def restart(self, rows: list[int], seeds: list[int | None]) -> None:
        """New requests in ``rows``: their streams start over from their own seeds."""
        at = torch.tensor(rows, dtype=torch.long, device=self.keys.device)
        self.keys[at] = torch.tensor(self._keys(seeds), dtype=torch.long, device=self.keys.device)
        self.counts[at] = 0


@functools.cache
def _compiled_keyed_gumbel_max() -> Any:
    """``keyed_gumbel_max`` under ``torch.compile`` (dynamic rows), compiled once per process on first use.
    A static decode step that samples inside itself (a CUDA graph) passes the inverse temperature
    as a tensor, so a new temperature is new data for the captured graph, not a new graph."""
    return torch.compile(keyed_gumbel_max, dynamic=True)


@functools.cache
def _compiled_gumbel_max() -> Any:
    """``gumbel_max`` under ``torch.compile`` (dynamic rows), compiled once per process on first use."""
    return torch.compile(gumbel_max, dynamic=True)


def _race(logp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gumbel-max sampling: ``argmax(logp + Gumbel noise)`` is a draw from ``softmax(logp)``.

    Unlike inverting a cumulative sum, a zero-probability token (``-inf``) can never win, whatever
    the rounding; and it is a handful of element-wise kernels and one argmax, no scan.
    """
    noise = torch.rand_like(logp).log_().neg_().log_()  # log(-log u); u = 0 gives +inf: that token loses
    choice = (logp - noise).argmax(-1)
    return choice, logp.gather(1, choice[:, None]).squeeze(1)


def _draw(logp: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse-CDF sampling, one uniform per row: the chosen tokens and their log-probabilities.

    A parallel cumulative sum is not exactly monotone (its partial sums round differently across
    blocks), so the target can land on a zero-probability token; such a row takes the nearest
    token with probability above zero instead (rare; costs a host sync only then).
    """
    cdf = logp.exp().cumsum(-1)
    target = (1 - u) * cdf[:, -1]  # in (0, total]
    choice = torch.searchsorted(cdf, target[:, None]).squeeze(1).clamp(max=cdf.shape[1] - 1)
    chosen = logp.gather(1, choice[:, None]).squeeze(1)
    bad = torch.isneginf(chosen)
    if bool(bad.any()):
        for r in bad.nonzero().flatten().tolist():
            possible = torch.isfinite(logp[r]).nonzero().flatten()
            choice[r] = possible[(possible - choice[r]).abs().argmin()]
        chosen = logp.gather(1, choice[:, None]).squeeze(1)
    return choice, chosen
