"""The fused head's per-tile work as two compiled functions: one read of the narrow product each.

The eager tile (``agentrl.compute.logprobs._LinearLogprob``) copies a tile's bf16 product into a float32
tile and then runs ~10 element-wise and reduction kernels over it, each a full pass over 4 bytes
per element (at 4096 x 37984 that is 0.6 GB a pass), issued one by one from Python. On an H200 at
32 x 8 x 512 those passes were ~0.5 s of the learner's 1.75 s of kernel time a step, and the
~65 ops per tile kept the host busy besides. Compiled by inductor, a tile's forward is one fused
reduction over the bf16 product (max, sum of exponentials, entropy sum and the target's logit)
and its backward one fused element-wise pass that writes the logits' gradient over the product
in place, in the compute dtype, ready for the two matrix products (one kernel each on a CPU). Nothing float32 of a
tile's size exists any more: the head's working set is one bf16 tile.

The numbers are the eager tile's up to the order of float32 additions: the same bf16 product,
taken to float32, divided by the temperature, then the same formulas.
"""

from __future__ import annotations

import functools
from typing import Any

import torch


def tile_stats(
    p: torch.Tensor, run_max: torch.Tensor, sum_exp: torch.Tensor, sum_exp_y: torch.Tensor, picked: torch.Tensor,
    hit: torch.Tensor, at: torch.Tensor, temperature: float, want_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One tile's step of the online log-sum-exp over the vocabulary.

    ``p``: the tile's [R, C] product; ``run_max``, ``sum_exp``, ``sum_exp_y`` (sum of e^y * y, for
    the entropy), ``picked`` (the target's logit): [R] running values; ``hit``: whether a row's
    target lies in this tile, at column ``at``. Returns the four running values after this tile.
    """
    y = p.float()
    if temperature != 1.0:
        y = y / temperature
    picked = torch.where(hit, y.gather(1, at[:, None]).squeeze(1), picked)
    new_max = torch.maximum(run_max, y.amax(dim=1))
    rescale = torch.exp(run_max - new_max)
    z = y - new_max[:, None]
    e = torch.exp(z)
    tile_sum = e.sum(dim=1)
    if want_entropy:  # sum of e * y = sum of e * (y - max) + max * sum of e
        sum_exp_y = (e * z).sum(dim=1) + new_max * tile_sum + sum_exp_y * rescale
    return new_max, tile_sum + sum_exp * rescale, sum_exp_y, picked


def tile_grad_(p: torch.Tensor, log_z: torch.Tensor, g: torch.Tensor, hit: torch.Tensor, at: torch.Tensor, temperature: float) -> None:
    """Overwrite the tile's product ``p`` with the gradient of ``g * log_softmax(y)[target]`` with
    respect to its logits: ``g * (onehot(target) - softmax(y)) / temperature``, in ``p``'s dtype."""
    y = p.float()
    if temperature != 1.0:
        y = y / temperature
    cols = torch.arange(p.shape[1], device=p.device)
    dy = torch.exp(y - log_z[:, None]) * (-g[:, None])
    dy = dy + torch.where(cols[None, :] == at[:, None], (g * hit)[:, None], 0.0)
    if temperature != 1.0:
        dy = dy / temperature
    p.copy_(dy.to(p.dtype))


@functools.cache
def compiled(name: str) -> Any:
    """``tile_stats`` or ``tile_grad_`` compiled once per process, for every tile shape
    (``dynamic=True``: a micro-batch's last row block and a vocabulary's last tile are shorter)."""
    fn = {"tile_stats": tile_stats, "tile_grad_": tile_grad_}[name]
    return torch.compile(fn, dynamic=True, fullgraph=True)
