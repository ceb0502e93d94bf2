"""Per-token bookkeeping of a batched decode: stop tokens held back until ``min_tokens``, each
row's sampled token recorded with why it finished, and the host copy of a step's samples that does
not wait for work queued after it. Split from ``transformers.py`` (the generator's queue and loop)."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Protocol

import torch

from agentrl.generators.protocol import FinishReason, SamplingParams


class PendingRequest(Protocol):
    """What the bookkeeping reads of a queued request."""

    cancelled: bool
    max_tokens: int
    sampling: SamplingParams


class EarlyStops:
    """Stop tokens held back until each row has ``min_tokens`` tokens, kept on the logits' device.

    Why a class: the batch's stop sets and minimums are fixed per request, so they become two
    device tensors once (at the batch's start, and for rows a request joins), and each step is
    three kernels with no host work. Built per step from Python sets, as before, it took ~2 ms of
    host time per step at 256 rows and a pageable copy to the GPU that waited for the step in
    flight, which left the GPU idle between decode steps whenever ``min_tokens`` was set.

    Row ``r``'s count is the tokens its request has been given: one per ``advance`` (every row gets
    a token each step), restarted by ``restart`` when a new request takes the row over.
    """

    def __init__(self, params: Sequence[SamplingParams], stops: Sequence[set[int]], device: torch.device) -> None:
        self.device = device
        self.width = max([len(s) for s in stops] + [1])
        ids, minimum = _stop_rows(params, stops, self.width)
        self.ids, self.minimum = ids.to(device), minimum.to(device)
        self.count = torch.zeros(len(params), dtype=torch.long, device=device)
        self.steps = 0
        self.until = int(minimum.max()) if len(params) else 0  # host-side: no row needs masking from this step on

    @property
    def active(self) -> bool:
        """Whether any row may still need its stops masked (checked on the host, no sync)."""
        return self.steps < self.until

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Set the stop tokens of rows below their minimum to -inf, in place; returns ``logits``.

        ``logits`` has one row per tracked row (``keep`` follows a shrinking batch)."""
        if not self.active:
            return logits
        return hold_back(logits, self.ids, self.count, self.minimum)

    def advance(self) -> None:
        """Every row was given one token. Once no row needs masking, counts stop (no kernel per
        step): each is at or past its minimum then, and only ``restart`` lowers one."""
        if self.active:
            self.count += 1
        self.steps += 1

    def keep(self, rows: torch.Tensor) -> None:
        """Follow a batch that dropped rows: keep only ``rows`` (a device index tensor)."""
        self.ids, self.minimum, self.count = self.ids[rows], self.minimum[rows], self.count[rows]

    def restart(self, rows: list[int], params: Sequence[SamplingParams], stops: Sequence[set[int]]) -> None:
        """New requests took ``rows`` over: their counts start at zero (rows past the end are added)."""
        width = max([self.width] + [len(s) for s in stops])
        grow = max(0, max(rows) + 1 - self.ids.shape[0])
        if grow or width > self.width:
            ids = self.ids[:, :1].repeat(1, width)  # padding repeats the row's first id
            ids[:, : self.width] = self.ids
            pad = torch.zeros(grow, dtype=torch.long, device=self.device)
            self.ids = torch.cat([ids, torch.zeros((grow, width), dtype=torch.long, device=self.device)])
            self.minimum, self.count, self.width = torch.cat([self.minimum, pad]), torch.cat([self.count, pad]), width
        ids, minimum = _stop_rows(params, stops, self.width)
        at = torch.tensor(rows, dtype=torch.long, device=self.device)
        self.ids[at], self.minimum[at], self.count[at] = ids.to(self.device), minimum.to(self.device), 0
        self.until = max(self.until, self.steps + int(minimum.max()))


def hold_back(logits: torch.Tensor, stop_ids: torch.Tensor, count: torch.Tensor, minimum: torch.Tensor) -> torch.Tensor:
    """Set each row's ``stop_ids`` to -inf in ``logits`` (in place) while its ``count`` of tokens is
    below its ``minimum``; device ops only, so a captured step can run it too. Returns ``logits``."""
    early = (count < minimum)[:, None]
    logits.scatter_(1, stop_ids, logits.gather(1, stop_ids).masked_fill(early, -math.inf))
    return logits


def _stop_rows(params: Sequence[SamplingParams], stops: Sequence[set[int]], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Host tensors of rows' stop ids ``[n, width]`` (padded with the row's first, so a repeated
    index is masked alike; a row without stops points at token 0 and never masks) and minimums."""
    ids = torch.zeros((len(params), width), dtype=torch.long)
    minimum = torch.zeros(len(params), dtype=torch.long)
    for r, (p, s) in enumerate(zip(params, stops, strict=True)):
        ordered = sorted(s)
        if ordered:
            ids[r] = torch.tensor((ordered * width)[:width])
            minimum[r] = p.min_tokens
    return ids, minimum


def record(
    reqs: Sequence[PendingRequest], rows: list[int], tok_list: list[int], lp_list: list[float],
    tokens: list[list[int]], logprobs: list[list[float]], finish: list[FinishReason | None], stops: list[set[int]],
) -> None:
    """Append batch row ``j``'s sampled token to request ``rows[j]`` and note why it finished, if it did."""
    for j, i in enumerate(rows):
        if finish[i] is not None:
            continue
        if reqs[i].cancelled:
            finish[i] = "abort"
            continue
        tokens[i].append(tok_list[j])
        logprobs[i].append(lp_list[j])
        if tok_list[j] in stops[i]:
            finish[i] = "stop"
        elif len(tokens[i]) >= reqs[i].max_tokens:
            finish[i] = "length"


class HostCopy:
    """Copy sampled tokens and logprobs (of up to ``n`` rows) to the host without waiting for work
    queued after them."""

    def __init__(self, n: int, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        # seconds the host spent blocked on the device's tokens: near the loop's whole time, the
        # GPU is what a batch waits for; near zero, the host's own work is
        self.waited_s = 0.0
        if self.cuda:
            self.tok = torch.empty(n, dtype=torch.long, pin_memory=True)
            self.lp = torch.empty(n, dtype=torch.float32, pin_memory=True)
            self.event = torch.cuda.Event()
            self.rows = 0

    def start(self, tok: torch.Tensor, lp: torch.Tensor) -> None:
        if self.cuda:
            self.rows = tok.shape[0]
            self.tok[: self.rows].copy_(tok, non_blocking=True)
            self.lp[: self.rows].copy_(lp, non_blocking=True)
            self.event.record()
        else:
            self._pending = (tok.tolist(), lp.tolist())

    def wait(self) -> tuple[list[int], list[float]]:
        if self.cuda:
            t = time.perf_counter()
            self.event.synchronize()
            self.waited_s += time.perf_counter() - t
            return self.tok[: self.rows].tolist(), self.lp[: self.rows].tolist()
        return self._pending
