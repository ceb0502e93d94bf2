"""The trainer end to end on the bundled model: metrics, curve, checkpoints, exact resume, references."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from agentrl.core.overrides import build, parse_overrides
from agentrl.core.strict import ConfigError
from agentrl.train.config import TrainConfig
from agentrl.train.trainer import Trainer

SMALL = [
    "prompts_per_step=2",
    "num_generations=4",
    "micro_batch_size=4",
    "rollout.max_tokens_per_turn=32",
    "rollout.max_completion_tokens=160",
    "learning_rate=2e-4",
    "log_every=1",
]


def config(tmp_path, *extra: str) -> TrainConfig:
    return build(TrainConfig, parse_overrides([*SMALL, f"output_dir={tmp_path}", *extra]))


def weights(path) -> dict[str, torch.Tensor]:
    return load_file(path / "model.safetensors")


def test_train_writes_metrics_curve_samples_and_checkpoint(tmp_path):
    trainer = Trainer(config(tmp_path, "max_steps=2"))
    before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    trainer.train()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    for key in ("reward/mean", "accuracy", "loss/loss", "loss/clip_ratio/region", "loss/entropy/mean", "rollout/episodes_per_s", "lr"):
        assert key in lines[0], key
    assert lines[0]["rollout/episodes"] + lines[0]["rollout/guided"] == 8  # the calculator's default guidance: demonstrations counted apart
    assert (tmp_path / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "samples.jsonl").read_text().count("\n") == 4
    ckpt = tmp_path / "checkpoints" / "step-000002"
    assert (ckpt / "trainer_state.json").is_file() and (ckpt / "model.safetensors").is_file()
    after = trainer.policy.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), "an optimizer step must change the weights"


def test_resume_is_exact(tmp_path):
    # A wide gathering window makes each turn's requests share one batch even on a loaded machine
    # (other batch compositions mean other padding widths and float noise up to ~3e-6).
    gather = "generator.gather_window_s=0.2"
    straight = Trainer(config(tmp_path / "a", "max_steps=4", "save_every=2", gather))
    straight.train()
    first = Trainer(config(tmp_path / "b", "max_steps=2", "save_every=2", gather))
    first.train()
    resumed = Trainer(config(tmp_path / "b", "max_steps=4", "save_every=2", "resume=latest", gather))
    assert resumed.step == 2 and resumed.data_pos == 4
    resumed.train()
    a = weights(tmp_path / "a" / "checkpoints" / "step-000004")
    b = weights(tmp_path / "b" / "checkpoints" / "step-000004")
    assert a.keys() == b.keys()
    # Bit-identical when the batches match; the tolerance is for float noise should they not.
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst <= 1e-6, worst

    def per_step(run: str, key: str) -> list:
        return [json.loads(x)[key] for x in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]

    assert per_step("a", "reward/mean") == per_step("b", "reward/mean")
    assert per_step("a", "rollout/tokens/sampled") == per_step("b", "rollout/tokens/sampled")

    def prompts(run: str) -> list:  # the data order: the task of each logged trajectory, step by step
        rows = [json.loads(x) for x in (tmp_path / run / "samples.jsonl").read_text().splitlines()]
        return [(r["step"], next(m["content"] for m in r["messages"] if m["role"] == "user")) for r in rows]

    assert prompts("a") == prompts("b") and len(prompts("a")) == 8


def test_reference_kinds_and_kl(tmp_path):
    none = Trainer(config(tmp_path / "none", "max_steps=1"))
    assert none.reference.kind == "none"
    full = Trainer(config(tmp_path / "full", "max_steps=1", "loss.beta=0.1"))
    assert full.reference.kind == "copy"
    full.train()
    kl = json.loads((tmp_path / "full" / "metrics.jsonl").read_text().splitlines()[0])["loss/kl/mean"]
    assert kl == pytest.approx(0.0, abs=1e-6)  # first step: policy == reference
    lora = Trainer(config(tmp_path / "lora", "max_steps=2", "loss.beta=0.1", "peft.r=4", "learning_rate=1e-2"))
    assert lora.reference.kind == "disabled-adapter"
    probe = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        untrained = lora.policy(probe).logits
        with lora.reference.active() as ref:
            assert torch.allclose(ref(probe).logits, untrained, atol=1e-6)  # before any update: equal
    lora.train()
    # After training the adapter, the reference (adapters off) still equals the untouched base model.
    from agentrl.compute.models import load_model

    base = load_model("default", dtype=torch.float32, device="cpu")
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad(), lora.reference.active() as ref:
        ref_logits = ref(ids).logits
        assert torch.allclose(ref_logits, base(ids).logits, atol=1e-5)
    with torch.no_grad():
        assert not torch.allclose(lora.policy(ids).logits, ref_logits, atol=1e-4)

    adapter_dir = tmp_path / "lora" / "checkpoints" / "step-000002"
    assert (adapter_dir / "adapter_model.safetensors").is_file()
    cont = Trainer(config(tmp_path / "cont", "max_steps=1", "loss.beta=0.1", f"model.path={adapter_dir}"))
    assert cont.reference.kind == "ref-adapter"
    with torch.no_grad():
        policy_logits = cont.policy(ids).logits
        with cont.reference.active() as ref:
            assert torch.allclose(ref(ids).logits, policy_logits, atol=1e-5)  # the frozen copy starts equal
    trainable = [n for n, p in cont.policy.named_parameters() if p.requires_grad]
    assert trainable and all(".ref." not in n for n in trainable)


def test_reference_mixing(tmp_path):
    t = Trainer(config(tmp_path, "max_steps=1", "loss.beta=0.05", "ref_mix_alpha=1.0", "ref_mix_every=1"))
    t.train()
    for p, r in zip(t.policy.parameters(), t.reference.model.parameters()):
        assert torch.equal(p, r)  # alpha = 1 copies the policy into the reference


@pytest.mark.parametrize(
    "args, message",
    [
        (["learning_rat=1e-3"], r"learning_rat: unknown key \(did you mean learning_rate\?\)"),
        (["loss.epsilom=0.1"], r"loss.epsilom: unknown key \(did you mean loss.epsilon\?\)"),
        (["loss.loss_type=sapo", "loss.epsilon_high=0.3"], "no effect with loss_type=sapo"),
        (["eval_tasks=10"], "eval_tasks/eval_temperature/eval_seed have no effect"),
        (["sampling.temperature=0"], "training needs temperature > 0"),
        (["ref_mix_alpha=0.5", "ref_mix_every=2"], "needs loss.beta > 0"),
        (["loss.loss_type=ppo"], "loss.loss_type"),
        (["loss.loss_type=cispo", "loss.delta=2.0"], "delta"),
        (["num_generations=1"], "num_generations"),
        (["max_steps"], "expected key=value"),
    ],
)
def test_config_errors_name_the_key(args, message):
    with pytest.raises(ConfigError, match=message):
        build(TrainConfig, parse_overrides(args))


def test_config_file_and_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("max_steps: 7\nloss:\n  loss_type: grpo\n  beta: 0.01\nsampling:\n  temperature: 0.9\n")
    cfg = build(TrainConfig, parse_overrides(["--config", str(path), "max_steps=9", "loss.epsilon=0.1"]))
    assert (cfg.max_steps, cfg.loss.loss_type, cfg.loss.beta, cfg.loss.epsilon, cfg.sampling.temperature) == (9, "grpo", 0.01, 0.1, 0.9)
    with pytest.raises(ConfigError, match="config file not found"):
        parse_overrides(["config=/nonexistent.yaml"])


def test_missing_tracker_is_a_clear_error(tmp_path):
    import importlib.util

    if importlib.util.find_spec("wandb"):
        pytest.skip("wandb is installed here")
    with pytest.raises(ConfigError, match="wandb is not installed"):
        Trainer(config(tmp_path, "report_to=[\"wandb\"]"))



def test_gradient_checkpointing_and_extra_reward(tmp_path):
    reward_file = tmp_path / "my_rewards.py"
    reward_file.write_text("def brevity(completion):\n    return 1.0 / (1 + len(completion))\n")
    t = Trainer(config(tmp_path / "run", "max_steps=1", "gradient_checkpointing=true", f'extra_rewards=[{{"fn": "{reward_file}:brevity", "weight": 0.5}}]'))
    unwrapped = t.accelerator.unwrap_model(t.policy)
    assert getattr(unwrapped, "is_activation_checkpointing", None) or unwrapped.is_gradient_checkpointing
    t.train()
    metrics = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert 0 < metrics["reward/brevity"] <= 1 and "reward/correct" in metrics


def test_non_finite_gradient_skips_the_update(tmp_path, monkeypatch):
    """One NaN loss must not poison the weights (and with them every later rollout)."""
    import agentrl.learn.learner as learner_module

    real = learner_module.policy_loss

    def nan_loss(*args, **kwargs):
        loss, metrics = real(*args, **kwargs)
        return loss * float("nan"), metrics

    monkeypatch.setattr(learner_module, "policy_loss", nan_loss)
    trainer = Trainer(config(tmp_path, "max_steps=1", "save_final=false"))
    before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    trainer.train()
    after = trainer.policy.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    metrics = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["train/skipped_nonfinite"] == 1.0
    assert not (tmp_path / "checkpoints").exists()  # save_final=false


def test_optimizer_offload_trains_the_same_weights(tmp_path):
    """optimizer_offload=true keeps AdamW's moments on the host; the arithmetic is unchanged."""
    gather = "generator.gather_window_s=0.2"
    plain = Trainer(config(tmp_path / "plain", "max_steps=2", gather))
    plain.train()
    offload = Trainer(config(tmp_path / "offload", "max_steps=2", "optimizer_offload=true", gather))
    assert type(offload.optimizer.optimizer).__name__ == "OffloadedAdamW"
    offload.train()
    a = weights(tmp_path / "plain" / "checkpoints" / "step-000002")
    b = weights(tmp_path / "offload" / "checkpoints" / "step-000002")
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst <= 1e-6, worst
    state = next(iter(offload.optimizer.optimizer.state.values()))
    assert float(state["step"]) == 2 and state["exp_avg"].abs().sum() > 0  # the moments were really updated


def test_a_second_trainer_in_the_same_process_may_change_precision(tmp_path):
    """accelerate keeps mixed precision in process-wide state; a bf16 run after an fp32 one in the
    same process failed with "AcceleratorState has already been initialized" (seen in the GPU test
    group, where an earlier test had built an fp32 trainer)."""
    first = Trainer(config(tmp_path / "a", "max_steps=1", "precision=fp32"))
    assert first.accelerator.mixed_precision == "no"
    second = Trainer(config(tmp_path / "b", "max_steps=1", "precision=bf16"))
    assert second.accelerator.mixed_precision == "bf16"
    third = Trainer(config(tmp_path / "c", "max_steps=1", "precision=fp32"))
    assert third.accelerator.mixed_precision == "no"


@pytest.mark.parametrize("native", [False, True])
def test_bf16_on_a_cpu_that_emulates_it_is_kept_and_warned_about(tmp_path, monkeypatch, capsys, native):
    """On an AMD EPYC without AVX-512 a bf16 matrix product ran 36x slower than fp32 (374 against
    10 ms), and the pretrained recipe's precision=bf16 made its first warm-start step take minutes.
    The key is the user's, so it stays; the run says what it costs, before the model loads."""
    import agentrl.train.build as build_module

    if torch.cuda.is_available():
        pytest.skip("the warning is about CPU runs")
    monkeypatch.setattr(build_module, "cpu_has_native_bf16", lambda: native)
    trainer = Trainer(config(tmp_path, "max_steps=1", "precision=bf16"))
    assert trainer.accelerator.mixed_precision == "bf16"
    warned = "precision=bf16 on a CPU without native bf16" in capsys.readouterr().out
    assert warned is not native
    auto = Trainer(config(tmp_path / "auto", "max_steps=1"))
    assert auto.accelerator.mixed_precision == "no"
    assert "without native bf16" not in capsys.readouterr().out
