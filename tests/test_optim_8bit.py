"""``optimizer``: AdamW with bitsandbytes' 8-bit moments (auto's choice for full fine-tuning on CUDA).

Run here on bitsandbytes' CPU kernels: which parameters get 8-bit moments, how far its weights drift
from float32 AdamW's, the choice ``auto`` makes, the trainer end to end with an exact resume, and
the refusals (a resume across optimizers, impossible combinations)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("bitsandbytes", reason="bitsandbytes is in the dev extra; the 8-bit optimizer is optional")

from agentrl.compute.optim.eight_bit import adamw_8bit, choose_optimizer  # noqa: E402
from agentrl.core.overrides import build, parse_overrides  # noqa: E402
from agentrl.core.strict import ConfigError
from agentrl.train.checkpoint import CheckpointError  # noqa: E402
from agentrl.train.config import TrainConfig  # noqa: E402
from agentrl.train.trainer import Trainer  # noqa: E402

HYPER = {"lr": 1e-4, "betas": (0.9, 0.99), "eps": 1e-8, "weight_decay": 0.0}


def small_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(1000, 64), torch.nn.Linear(64, 4096), torch.nn.Linear(4096, 1000))


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int = 30) -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randint(0, 1000, (32,), generator=g)
        torch.nn.functional.cross_entropy(model(x), torch.randint(0, 1000, (32,), generator=g)).backward()
        optimizer.step()
        optimizer.zero_grad()


def test_moments_are_8bit_except_embeddings_and_small_tensors():
    model = small_model()
    optimizer = adamw_8bit(model, list(model.parameters()), **HYPER)
    train(model, optimizer, steps=1)
    dtypes = {name: optimizer.state[p]["state1"].dtype for name, p in model.named_parameters()}
    assert dtypes == {"0.weight": torch.float32, "1.weight": torch.uint8, "1.bias": torch.uint8, "2.weight": torch.uint8, "2.bias": torch.float32}
    big = model[2].weight
    state_bytes = sum(t.numel() * t.element_size() for k, t in optimizer.state[big].items() if k in ("state1", "state2", "absmax1", "absmax2"))
    assert state_bytes / big.numel() < 2.05  # two 1-byte moments and one float32 scale per 256 values each; AdamW keeps 8


def test_weights_track_float32_adamw_closely():
    """The accuracy cost: after 30 steps each weight has moved within ~3% of where float32 AdamW
    takes it (measured 1.8-3.2%, the embedding included, whose own moments are float32 but whose
    gradients come through 8-bit layers)."""
    ref, eight = small_model(), small_model()
    start = [p.detach().clone() for p in ref.parameters()]
    train(ref, torch.optim.AdamW(list(ref.parameters()), **HYPER))
    train(eight, adamw_8bit(eight, list(eight.parameters()), **HYPER))
    for (name, a), b, p0 in zip(ref.named_parameters(), eight.parameters(), start):
        moved = (a - p0).norm()
        assert moved > 0
        assert (a - b).norm() / moved < 0.06, name


@pytest.mark.parametrize(
    ("wanted", "kw", "name", "says"),
    [
        ("auto", {"cuda": True}, "adamw_8bit", "8-bit moments"),
        ("auto", {"cuda": False}, "adamw", ""),
        ("auto", {"cuda": True, "full_finetune": False}, "adamw", ""),
        ("auto", {"cuda": True, "takes_8bit": False}, "adamw", ""),
        ("auto", {"cuda": True, "offload": True}, "adamw", ""),
        ("adamw", {"cuda": True}, "adamw", ""),
        ("adamw_8bit", {"cuda": False}, "adamw_8bit", ""),
    ],
)
def test_auto_chooses_8bit_for_full_fine_tuning_on_cuda(wanted, kw, name, says):
    args = {"offload": False, "cuda": False, "full_finetune": True, "takes_8bit": True, **kw}
    got, line = choose_optimizer(wanted, **args)
    assert got == name and (says in line if says else line == "")


def test_auto_without_bitsandbytes_says_how_to_get_it(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "bitsandbytes" else real(n, *a))
    got, line = choose_optimizer("auto", offload=False, cuda=True, full_finetune=True)
    assert got == "adamw" and "bitsandbytes is not installed" in line and "agentrl[gpu]" in line


SMALL = ["prompts_per_step=2", "num_generations=4", "micro_batch_size=4", "rollout.max_tokens_per_turn=32", "rollout.max_completion_tokens=160",
         "learning_rate=2e-4", "generator.gather_window_s=0.2"]


def config(path, *extra: str) -> TrainConfig:
    return build(TrainConfig, parse_overrides([*SMALL, f"output_dir={path}", *extra]))


def test_trainer_with_8bit_moments_trains_and_resumes_exactly(tmp_path):
    straight = Trainer(config(tmp_path / "a", "max_steps=4", "save_every=2", "optimizer=adamw_8bit"))
    assert getattr(straight.optimizer.optimizer, "kind", None) == "adamw_8bit"
    straight.train()
    first = Trainer(config(tmp_path / "b", "max_steps=2", "save_every=2", "optimizer=adamw_8bit"))
    first.train()
    resumed = Trainer(config(tmp_path / "b", "max_steps=4", "save_every=2", "optimizer=adamw_8bit", "resume=latest"))
    resumed.train()
    state = next(s for s in resumed.optimizer.optimizer.state.values() if s["state1"].dtype == torch.uint8)
    assert state["step"] == 4 and state["absmax1"].abs().sum() > 0  # the 8-bit moments were restored and updated
    a = load_file(tmp_path / "a" / "checkpoints" / "step-000004" / "model.safetensors")
    b = load_file(tmp_path / "b" / "checkpoints" / "step-000004" / "model.safetensors")
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-6


def test_resume_across_optimizers_is_refused_by_name(tmp_path):
    Trainer(config(tmp_path, "max_steps=1", "optimizer=adamw_8bit")).train()
    with pytest.raises(CheckpointError, match="optimizer state is adamw_8bit's.*resume with optimizer=adamw_8bit"):
        Trainer(config(tmp_path, "max_steps=2", "optimizer=adamw", "resume=latest"))


@pytest.mark.parametrize(
    ("keys", "says"),
    [
        (["optimizer=adamw_8bit", "optimizer_offload=true"], "choose one"),
        (["optimizer=adamw_8bit", "distributed.strategy=fsdp", "loss.beta=0"], "does not take sharded parameters"),
        (["optimizer=adam"], "optimizer"),
    ],
)
def test_impossible_combinations_fail_with_the_key(keys, says):
    with pytest.raises(ConfigError, match=says):
        build(TrainConfig, parse_overrides(keys))


def test_a_broken_bitsandbytes_falls_back_under_auto_and_fails_when_asked_for(monkeypatch):
    """Installed but unloadable (its native library, say): auto keeps float32 moments and says why;
    an explicit optimizer=adamw_8bit is one ConfigError naming it."""
    import builtins

    from agentrl.train.build import build_optimizer

    real_import = builtins.__import__

    def broken(name, *a, **kw):
        if name == "bitsandbytes":
            raise RuntimeError("libbitsandbytes_cuda130.so: cannot open shared object file")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", broken)
    model = small_model()
    optimizer, _, line = build_optimizer(TrainConfig(), model, cuda=True)  # auto's choice on CUDA
    assert type(optimizer) is torch.optim.AdamW and "bitsandbytes did not load" in line and "cannot open shared object" in line
    with pytest.raises(ConfigError, match="optimizer=adamw_8bit needs a working bitsandbytes.*RuntimeError"):
        build_optimizer(TrainConfig(optimizer="adamw_8bit"), model, cuda=False)
