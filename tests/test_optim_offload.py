"""OffloadedAdamW against torch.optim.AdamW: the same numbers, with the moments on the host."""

from __future__ import annotations

import copy

import pytest
import torch

from agentrl.compute.optim.offload import OffloadedAdamW


def _params(device: str) -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    shapes = [(37, 11), (5,), (64, 3), (1,), (129,)]  # sizes that straddle small buckets
    return [torch.nn.Parameter(torch.randn(s, device=device)) for s in shapes]


def _run(opt_cls, params, steps: int, seed: int = 1, **kw) -> torch.optim.Optimizer:
    opt = opt_cls(params, lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1, **kw)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).to(p.device)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return opt


@pytest.mark.parametrize("bucket", [7, 100, 1 << 20])
def test_matches_adamw_on_cpu(bucket):
    ref, ours = _params("cpu"), _params("cpu")
    _run(torch.optim.AdamW, ref, 5, foreach=False)
    opt = _run(OffloadedAdamW, ours, 5, bucket_numel=bucket)
    for a, b in zip(ref, ours):
        assert torch.equal(a, b)
    assert all(float(opt.state[p]["step"]) == 5 for p in ours)


def test_state_dict_round_trip_continues_exactly():
    straight = _params("cpu")
    _run(OffloadedAdamW, straight, 4, bucket_numel=50)
    first = _params("cpu")
    opt = _run(OffloadedAdamW, first, 2, bucket_numel=50)
    saved = copy.deepcopy(opt.state_dict())
    resumed = [torch.nn.Parameter(p.detach().clone()) for p in first]
    opt2 = OffloadedAdamW(resumed, lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1, bucket_numel=50)
    opt2.load_state_dict(saved)
    # the two remaining steps of the straight run used the generator's draws 3-4: replay them
    gen = torch.Generator().manual_seed(1)
    for _ in range(2):
        for p in resumed:
            torch.randn(p.shape, generator=gen)
    for _ in range(2):
        for p in resumed:
            p.grad = torch.randn(p.shape, generator=gen)
        opt2.step()
    for a, b in zip(straight, resumed):
        assert torch.equal(a, b)


def test_rejects_bad_bucket():
    with pytest.raises(ValueError, match="bucket_numel"):
        OffloadedAdamW(_params("cpu"), bucket_numel=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_matches_fused_adamw_on_cuda_with_moments_on_the_host():
    ref, ours = _params("cuda"), _params("cuda")
    _run(torch.optim.AdamW, ref, 5, fused=True)
    opt = _run(OffloadedAdamW, ours, 5, bucket_numel=100)
    for a, b in zip(ref, ours):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    state = opt.state[ours[0]]
    assert state["exp_avg"].device.type == "cpu" and state["exp_avg"].is_pinned()
    assert opt.gpu_buffer_bytes() == 2 * 2 * 100 * 4
