"""Packed micro-batches: a ``Batch``'s rows laid out back to back in token-budgeted rows, each shared prompt once.

Why its own module: the padded path computes every micro-batch up to its longest row and every
sample of a GRPO group recomputes the group's prompt (the 8-16 samples of a task share it). Here
the rows that share a prompt (identical prompt tokens) become one *unit*: the prompt, then each
sample's completion as a branch (agentrl/compute/packed.py says who attends to whom). Units are
placed longest first into lines as wide as the micro-batch's longest unit, and a micro-batch holds
as many lines as ``micro_batch_tokens`` allows, so what is computed is the real tokens, each
prompt once, plus the ends of lines. The split does not change the step's loss (each micro-batch
loss is normalised by the step's totals); :func:`micro_batches` and :func:`layout` apply the same
rule, so the learner plans with one and builds each forward with the other.
"""

from __future__ import annotations

import torch

from agentrl.compute.packed import PackedRows
from agentrl.learn.batch import Batch

Unit = tuple[int, list[int]]  # (prompt length, the batch rows sharing that prompt)


def _units(batch: Batch, rows: list[int], share: bool, budget: int) -> list[Unit]:
    """The units of ``rows``, longest first; a shared prompt is repeated only when its unit would pass ``budget``."""
    starts, lengths = batch.starts.tolist(), batch.lengths.tolist()
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for b in rows:
        key = tuple(batch.input_ids[b, : starts[b]].tolist()) if share else (b,)
        by_prompt.setdefault(key, []).append(b)
    units: list[Unit] = []
    for members in by_prompt.values():
        p = starts[members[0]]
        current: list[int] = []
        size = p
        for b in members:
            c = lengths[b] - p
            if current and size + c > budget:  # a unit never passes the budget unless one sequence does
                units.append((p, current))
                current, size = [], p
            current.append(b)
            size += c
        units.append((p, current))
    return sorted(units, key=lambda u: -_size(batch, u))  # stable: equal sizes keep their first-seen order


def _size(batch: Batch, unit: Unit) -> int:
    p, members = unit
    return p + sum(int(batch.lengths[b]) - p for b in members)


def _lines(batch: Batch, units: list[Unit], budget: int) -> list[list[list[Unit]]]:
    """Micro-batches of lines of units: lines as wide as the micro-batch's first (longest) unit, first fit."""
    out: list[list[list[Unit]]] = []
    width, free = 0, []
    for u in units:
        n = _size(batch, u)
        spot = next((i for i, room in enumerate(free) if room >= n), None) if out else None
        if spot is None and out and (len(free) + 1) * width <= budget:
            out[-1].append([])
            free.append(width)
            spot = len(free) - 1
        if spot is None:  # a new micro-batch, as wide as this unit
            out.append([[]])
            width, free, spot = n, [n], 0
        out[-1][spot].append(u)
        free[spot] -= n
    return out


def micro_batches(batch: Batch, rows: torch.Tensor, budget: int, share: bool) -> list[torch.Tensor]:
    """``rows`` in packed micro-batches of at most ``budget`` computed tokens (or one sequence longer than it)."""
    plan = _lines(batch, _units(batch, rows.tolist(), share, budget), budget)
    return [torch.tensor([b for line in mb for _, members in line for b in members], dtype=torch.long) for mb in plan]


def layout(batch: Batch, idx: torch.Tensor, width: int, share: bool, budget: int, align: int = 1) -> PackedRows:
    """The packed rows of the micro-batch ``idx``; output row n is ``idx[n]``, scored on ``width`` completion columns.

    ``align``: line width rounded up to a multiple of it (compiled layers, see the learner's ALIGN).
    """
    rows = idx.tolist()
    plan = _lines(batch, _units(batch, rows, share, budget), budget)
    lines = [line for mb in plan for line in mb]
    W = max(sum(_size(batch, u) for u in line) for line in lines)
    W += -W % align
    R, N = len(lines), len(rows)
    ids = torch.zeros((R, W), dtype=torch.long)
    pos = torch.arange(W).repeat(R, 1)
    unit = torch.empty((R, W), dtype=torch.long)
    branch = torch.full((R, W), -1, dtype=torch.long)
    pred_row = torch.empty((N, width), dtype=torch.long)
    pred_col = torch.empty((N, width), dtype=torch.long)
    tgt_col = torch.empty((N, width), dtype=torch.long)
    out_row = {b: n for n, b in enumerate(rows)}
    j = torch.arange(width)
    u_id = 0
    for r, line in enumerate(lines):
        col = 0
        for p, members in line:
            first = members[0]
            ids[r, col : col + p] = batch.input_ids[first, :p]
            pos[r, col : col + p] = torch.arange(p)
            unit[r, col : col + p + _size(batch, (p, members)) - p] = u_id
            last_prompt = col + p - 1
            col += p
            for k, b in enumerate(members):
                c = int(batch.lengths[b]) - p
                ids[r, col : col + c] = batch.input_ids[b, p : p + c]
                pos[r, col : col + c] = torch.arange(p, p + c)
                branch[r, col : col + c] = k
                n = out_row[b]
                t = col + j.clamp(max=c - 1)  # past the completion: its last token again (masked by the caller)
                pred_row[n] = r
                tgt_col[n] = t
                pred_col[n] = torch.where(t == col, torch.tensor(last_prompt), t - 1)
                col += c
            u_id += 1
        unit[r, col:] = -1 - r  # the line's end: a unit of its own, so no real token sees it
        pos[r, col:] = torch.arange(W - col)
    return PackedRows(ids, pos, unit, branch, pred_row, pred_col, tgt_col)
