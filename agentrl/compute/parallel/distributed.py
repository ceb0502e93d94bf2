"""Data parallel over torch.distributed (through accelerate): who rolls out what, who trains on what.

Why its own module: the trainer's loop should not change shape when there are several processes.
The rule is one *global* generation batch, the same whatever the number of ranks:

- the step's tasks (``prompts_per_step`` of them, a global number) are cut into contiguous blocks,
  one per rank (:func:`share`); a rank rolls out its block with environment seed ``seed + global
  index``, so each episode is sampled exactly as one process would sample it, and GRPO groups
  stay whole;
- every rank then receives every group (:func:`gather`, pickled trajectories) and builds the same
  global ``Batch``: advantages (``advantage_scale=batch`` included), reward metrics and eval
  numbers are those of one process by construction;
- each optimizer step's rows are split between ranks (:func:`learner_rows`); the losses normalise
  by totals reduced over all ranks and :func:`average_gradients` averages the gradients, so N
  processes take the step one process would take.

A peer that dies or stalls makes the next collective fail within ``distributed_timeout_s``;
:func:`peer_failures` turns that into one ``DistributedError`` that says so.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from agentrl.core.errors import AgentrlError


class DistributedError(AgentrlError, RuntimeError):
    """A collective with the other ranks failed: a peer died, stalled or could not be reached."""


def accelerator_handlers(timeout_s: float) -> list[Any]:
    """Accelerate kwargs handlers: every collective fails after ``timeout_s`` instead of waiting forever."""
    from accelerate.utils import InitProcessGroupKwargs

    return [InitProcessGroupKwargs(timeout=dt.timedelta(seconds=timeout_s))]


def average_gradients(parameters: Iterable[torch.nn.Parameter], world: int, bucket_bytes: int = 256 * 2**20) -> None:
    """All-reduce the trainable parameters' gradients to their mean over ranks, in flat buckets.

    Why not DDP's hooks: the log-prob path never calls DDP's forward, so they would not fire. A
    parameter without a gradient on this rank counts as zero (every rank must send the same sizes).
    Ranks may run different numbers of micro-batches: only this one call is collective.
    """
    params = [p for p in parameters if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    bucket: list[torch.nn.Parameter] = []
    size = 0
    for i, p in enumerate(params):
        bucket.append(p)
        size += p.grad.numel() * p.grad.element_size()
        if size >= bucket_bytes or i == len(params) - 1:
            flat = torch.cat([q.grad.reshape(-1) for q in bucket])
            torch.distributed.all_reduce(flat)
            flat /= world
            offset = 0
            for q in bucket:
                n = q.grad.numel()
                q.grad.copy_(flat[offset : offset + n].view_as(q.grad))
                offset += n
            bucket, size = [], 0


def share(n: int, rank: int, world: int) -> tuple[int, int]:
    """The contiguous block ``[start, stop)`` of ``n`` items that ``rank`` owns; sizes differ by at most one."""
    return n * rank // world, n * (rank + 1) // world


def gather(accelerator: Any, obj: Any) -> list[Any]:
    """``obj`` of every rank, in rank order (``[obj]`` on one process). Picklable objects only."""
    if accelerator.num_processes == 1:
        return [obj]
    out: list[Any] = [None] * accelerator.num_processes
    torch.distributed.all_gather_object(out, obj)
    return out


def any_rank(accelerator: Any, flag: bool) -> bool:
    """True when ``flag`` is set on any rank (a Ctrl-C seen by one rank stops all at the same step)."""
    if accelerator.num_processes == 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=accelerator.device)
    return bool(accelerator.reduce(t, reduction="sum").item() > 0)


def mean_over_ranks(accelerator: Any, metrics: dict[str, float]) -> dict[str, float]:
    """Each key's mean over the ranks that have it (ranks may differ: a key can need active tokens)."""
    parts = gather(accelerator, metrics)
    keys = sorted({k for p in parts for k in p})
    return {k: sum(p[k] for p in parts if k in p) / sum(1 for p in parts if k in p) for k in keys}


def learner_rows(
    num_rows: int, steps_per_generation: int, rank: int, world: int, groups: torch.Tensor | None = None
) -> list[torch.Tensor]:
    """This rank's rows of each optimizer step of a generation batch of ``num_rows`` rows.

    One process trains step ``i`` on ``arange(num_rows).chunk(steps_per_generation)[i]``; with
    ``world`` ranks each such chunk is cut into ``world`` contiguous parts. Every rank must get a
    row of every step (DDP needs one backward from each), so too small a batch is an error.
    ``groups`` ([num_rows] group ids, rows of a group contiguous): the cuts fall between groups
    where the chunk has enough of them (:func:`group_cuts`), so a group's shared prompt is computed
    on one rank from the same rows as in one process, and N ranks sum the same numbers as one.
    """
    chunks = [c for c in torch.arange(num_rows).chunk(steps_per_generation) if len(c)]
    if world == 1:
        return chunks
    if any(len(c) < world for c in chunks):
        raise DistributedError(
            f"a generation batch of {num_rows} rows in {len(chunks)} optimizer step(s) leaves some of the {world} ranks "
            "without a row to train on: raise prompts_per_step or num_generations, or use fewer processes"
        )
    if groups is None:
        return [c.tensor_split(world)[rank] for c in chunks]
    return [c.tensor_split(group_cuts(groups[c].tolist(), world))[rank] for c in chunks]


def group_cuts(groups: list[int], world: int) -> list[int]:
    """``world - 1`` cut positions in a chunk of rows with these group ids: at group boundaries, each
    nearest the even split, when the chunk has at least ``world`` groups; else the even split."""
    n = len(groups)
    even = [n * k // world for k in range(1, world)]
    bounds = [i for i in range(1, n) if groups[i] != groups[i - 1]]
    if len(bounds) < world - 1:
        return even
    cuts: list[int] = []
    for k, target in enumerate(even):
        left = world - 2 - k  # cuts still to place after this one
        options = [b for b in bounds if (not cuts or b > cuts[-1]) and sum(1 for x in bounds if x > b) >= left]
        cuts.append(min(options, key=lambda b: (abs(b - target), b)))
    return cuts


_PEER_HINTS = ("gloo", "nccl", "connection", "timed out", "timeout", "peer", "socket", "broken pipe", "closed")


@contextlib.contextmanager
def peer_failures(accelerator: Any, timeout_s: float) -> Iterator[None]:
    """Turn a failed collective (a dead or stalled peer) into one ``DistributedError`` that names it."""
    if accelerator.num_processes == 1:
        yield
        return
    try:
        yield
    except DistributedError:
        raise
    except Exception as exc:  # torch raises DistBackendError or RuntimeError with the backend's text
        dist_error = getattr(torch.distributed, "DistError", ())
        text = str(exc).lower()
        if not (isinstance(exc, dist_error) or any(h in text for h in _PEER_HINTS)):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DistributedError(
            f"rank {accelerator.process_index} of {accelerator.num_processes}: a collective with the other ranks failed - "
            f"a peer process died, stalled for more than distributed_timeout_s={timeout_s:g}s, or is unreachable "
            f"({type(exc).__name__}: {first[:300]})"
        ) from exc


def leave_process_group(code: int) -> None:
    """End a launched multi-process command: after a clean finish, wait for every rank and destroy
    the process group; then leave without the interpreter's teardown (``os._exit``).

    Why: with gloo, a rank that had finished its work sometimes aborted in that teardown
    ("terminate called without an active exception", SIGABRT), so the launch failed after a run
    that had succeeded (2 of 6 two-rank runs under pytest at d2c5025, once in CI at 193e17e). A
    failed command skips the barrier (a peer may be gone) but still leaves the same way. Nothing
    happens outside a process group of two or more ranks.
    """
    import os
    import sys

    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return
    if code == 0:
        with contextlib.suppress(Exception):
            dist.barrier()
            dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
