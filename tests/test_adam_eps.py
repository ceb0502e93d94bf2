"""``adam_eps`` reaches the optimizer: with a large epsilon a parameter whose gradient is tiny moves in
proportion to it, not by ~learning_rate as AdamW's per-parameter normalisation makes it (the step that
broke a small Sokoban model's call syntax, docs/environments.md)."""

from __future__ import annotations

import pytest
import torch

from agentrl.train.build import build_optimizer
from agentrl.train.config import TrainConfig


def one_step(overrides: dict, offload: bool = False) -> torch.Tensor:
    cfg = TrainConfig(learning_rate=1e-3, optimizer_offload=offload, **overrides)
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    optimizer, _, _ = build_optimizer(cfg, model, cuda=False)
    model.weight.grad = torch.tensor([[1e-5, 1e-3]])  # one near-silent parameter, one that matters
    optimizer.step()
    return -model.weight.detach()[0]


@pytest.mark.parametrize("offload", [False, True])
def test_large_adam_eps_keeps_tiny_gradients_from_taking_full_steps(offload: bool) -> None:
    default = one_step({}, offload)
    assert default[0] == pytest.approx(1e-3, rel=1e-2) and default[1] == pytest.approx(1e-3, rel=1e-2)  # both move by ~lr
    damped = one_step({"adam_eps": 1e-3}, offload)
    assert damped[0] == pytest.approx(1e-3 * 1e-5 / (1e-5 + 1e-3), rel=1e-3)  # ~1e-5: in proportion to its gradient
    assert damped[1] == pytest.approx(0.5e-3, rel=1e-3)
    with pytest.raises(ValueError, match="adam_eps"):
        TrainConfig(adam_eps=0)
