"""How a per-token loss becomes one number: the aggregation, separate from the objective.

The trainer gives every micro-batch the same :class:`StepCounts` (totals over the whole optimizer
step: every micro-batch and every rank) and *sums* the micro-batch losses. Each aggregation
returns this micro-batch's share of the step's loss, so the shares of all micro-batches of all
ranks add up to it exactly, whatever the micro-batch sizes. ``policy_loss`` then multiplies the
share by ``num_processes``: DDP averages gradients over ranks, and mean-over-ranks of
``num_processes x (sum of a rank's shares)`` is the sum of all shares, the step's loss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from agentrl.core.registry import Registry

Aggregation = Callable[[torch.Tensor, torch.Tensor, "StepCounts"], torch.Tensor]


@dataclass(frozen=True)
class StepCounts:
    """Totals over one optimizer step (all its micro-batches, all ranks); the same for each micro-batch.

    ``tokens``: active tokens (loss mask, truncated rows excluded). ``sequences``: rows with at least
    one active token. ``rows``: all rows, masked or not. ``micro_batches``: micro-batches over all
    ranks. ``num_processes``: ranks whose gradients DDP averages. ``max_completion_length``: the
    constant of the constant-length sum (``dr_grpo``), a config value, never a measured length.
    """

    tokens: float
    sequences: float
    rows: float
    micro_batches: int
    num_processes: int = 1
    max_completion_length: int | None = None

    def __post_init__(self) -> None:
        if self.micro_batches < 1 or self.num_processes < 1 or self.rows < 0 or self.tokens < 0:
            raise ValueError(f"StepCounts out of range: {self}")

    @classmethod
    def single(cls, mask: torch.Tensor, truncated: torch.Tensor | None = None, **kw: int | None) -> StepCounts:
        """Counts for a step that is this one micro-batch on one process (tests, simple callers)."""
        tokens, sequences, rows = local_counts(mask, truncated).tolist()
        return cls(tokens=tokens, sequences=sequences, rows=rows, micro_batches=1, **kw)  # type: ignore[arg-type]

    @classmethod
    def from_totals(cls, totals: torch.Tensor, micro_batches: int, **kw: int | None) -> StepCounts:
        """From ``local_counts`` summed over micro-batches and ranks (one all-reduce of 3 numbers)."""
        tokens, sequences, rows = (float(v) for v in totals.tolist())
        return cls(tokens=tokens, sequences=sequences, rows=rows, micro_batches=micro_batches, **kw)  # type: ignore[arg-type]


def active_mask(mask: torch.Tensor, truncated: torch.Tensor | None = None) -> torch.Tensor:
    """Bool [B, T]: tokens that enter the loss (mask > 0, rows flagged truncated removed)."""
    m = mask > 0
    if truncated is not None:
        m = m & ~truncated.bool().to(m.device)[:, None]
    return m


def local_counts(mask: torch.Tensor, truncated: torch.Tensor | None = None) -> torch.Tensor:
    """float64 [3] (active tokens, active sequences, rows) of one micro-batch or any set of rows.

    Sum it over the step's micro-batches and reduce it over ranks, then :meth:`StepCounts.from_totals`.
    """
    m = active_mask(mask, truncated)
    return torch.tensor([float(m.sum()), float(m.any(-1).sum()), float(m.shape[0])], dtype=torch.float64)


AGGREGATIONS: Registry[Aggregation] = Registry("aggregation")


def register_aggregation(name: str) -> Callable[[Aggregation], Aggregation]:
    """Decorator: make ``fn(per_token_loss, mask, counts) -> share`` selectable as ``loss.aggregation=name``."""

    def deco(fn: Aggregation) -> Aggregation:
        return AGGREGATIONS.add(name, fn)

    return deco


def _masked_sum(loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask > 0, loss, 0.0)


@register_aggregation("token_mean")
def token_mean(loss: torch.Tensor, mask: torch.Tensor, counts: StepCounts) -> torch.Tensor:
    """Sum over tokens / active tokens of the whole step (DAPO's token-level loss; every token weighs the same)."""
    return _masked_sum(loss, mask).sum() / max(counts.tokens, 1.0)


@register_aggregation("sequence_mean")
def sequence_mean(loss: torch.Tensor, mask: torch.Tensor, counts: StepCounts) -> torch.Tensor:
    """Each sequence's token mean, summed / active sequences of the step (GRPO; every sequence weighs the same)."""
    lengths = mask.sum(-1)
    per_seq = _masked_sum(loss, mask).sum(-1) / lengths.clamp(min=1)
    return per_seq.sum() / max(counts.sequences, 1.0)


@register_aggregation("constant_sum")
def constant_sum(loss: torch.Tensor, mask: torch.Tensor, counts: StepCounts) -> torch.Tensor:
    """Sum over tokens / (rows of the step x ``max_completion_length``): Dr. GRPO, no length in the normaliser."""
    if counts.max_completion_length is None or counts.max_completion_length <= 0:
        raise ValueError("aggregation 'constant_sum' (dr_grpo) needs StepCounts.max_completion_length, a positive constant")
    return _masked_sum(loss, mask).sum() / (max(counts.rows, 1.0) * counts.max_completion_length)


@register_aggregation("local_token_mean")
def local_token_mean(loss: torch.Tensor, mask: torch.Tensor, counts: StepCounts) -> torch.Tensor:
    """This micro-batch's token mean / micro-batches of the step (BNPO as TRL runs it: depends on the split)."""
    return _masked_sum(loss, mask).sum() / mask.sum().clamp(min=1) / counts.micro_batches


__all__ = ["AGGREGATIONS", "StepCounts", "active_mask", "local_counts", "register_aggregation"]
