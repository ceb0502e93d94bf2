"""Per-token bookkeeping of a batched decode: stop tokens held back until ``min_tokens``, each
row's sampled token recorded with why it finished, and the host copy of a step's samples that does
not wait for work queued after it. Split from ``transformers.py`` (the generator's queue and loop)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import torch

from agentrl.generators.base import FinishReason, SamplingParams


class PendingRequest(Protocol):
    """What the bookkeeping reads of a queued request."""

    cancelled: bool
    max_tokens: int
    sampling: SamplingParams


def suppress_early_stops(
    logits: torch.Tensor, reqs: Sequence[PendingRequest], rows: list[int], counts: list[int], stops: list[set[int]]
) -> torch.Tensor:
    """Mask the stop tokens of rows that have not yet produced ``min_tokens`` tokens (vectorised)."""
    early = [j for j, i in enumerate(rows) if counts[i] < reqs[i].sampling.min_tokens and stops[i]]
    if not early:
        return logits
    cols = sorted(set().union(*(stops[rows[j]] for j in early)))
    block = torch.zeros((logits.shape[0], len(cols)), dtype=torch.bool)
    for j in early:
        for c, col in enumerate(cols):
            block[j, c] = col in stops[rows[j]]
    cols_t = torch.tensor(cols, device=logits.device)
    logits = logits.clone()
    logits[:, cols_t] = logits[:, cols_t].masked_fill(block.to(logits.device), -math.inf)
    return logits


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
            self.event.synchronize()
            return self.tok[: self.rows].tolist(), self.lp[: self.rows].tolist()
        return self._pending
