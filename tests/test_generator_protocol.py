"""The Generator protocol: every backend declares the lifecycle; the transformers backend honours it for real.

vLLM backends are exercised for real in the vllm group (test_vllm_*.py); here they must import and
declare the protocol without vLLM installed.
"""

from __future__ import annotations

import copy
import inspect
import re
import threading
from pathlib import Path

import anyio
import pytest
import torch
import transformers

from agentrl.generators import Generator, SamplingParams, WeightUpdate, run_with
from agentrl.generators.gathered import GatheredGenerator
from agentrl.generators.hf.generator import TransformersGenerator
from agentrl.generators.vllm.client import VLLMServerGenerator
from agentrl.generators.vllm.colocated import VLLMGenerator

LIFECYCLE = ("generate", "begin_rollout", "end_rollout", "load_weights", "run_rollouts", "close")
PROMPT = [5, 9, 13, 2]
GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


def tiny_model(seed: int) -> transformers.Qwen2ForCausalLM:
    config = transformers.Qwen2Config(
        vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        head_dim=32, intermediate_size=128, tie_word_embeddings=True, max_position_embeddings=128, initializer_range=0.2,
    )
    torch.manual_seed(seed)
    return transformers.Qwen2ForCausalLM(config).eval()


def generate(gen, prompt=PROMPT, sampling=GREEDY):
    gen.begin_rollout()
    try:
        return anyio.run(gen.generate, prompt, sampling)
    finally:
        gen.end_rollout()


@pytest.mark.parametrize("cls", [TransformersGenerator, VLLMGenerator, VLLMServerGenerator, GatheredGenerator])
def test_every_backend_declares_the_protocol(cls):
    for name in LIFECYCLE:
        assert name in vars(cls) and callable(vars(cls)[name]), f"{cls.__name__}.{name}"  # its own, not found through __getattr__
    assert list(inspect.signature(cls.load_weights).parameters) == ["self", "update"]
    assert list(inspect.signature(cls.run_rollouts).parameters) == ["self", "rollouts"]


def test_trainer_never_asks_which_backend():
    """No hasattr/getattr/isinstance on generators outside generators/, and no backend names on the
    training side (train/ and learn/)."""
    root = Path(__file__).resolve().parents[1] / "agentrl"
    for path in root.rglob("*.py"):
        if path.is_relative_to(root / "generators"):
            continue
        text = path.read_text()
        assert not re.search(r"(hasattr|getattr)\(\s*[\w.]*(generator|gen|inner|backend)\b", text), path
        assert not re.search(r"isinstance\([^)]*(Generator|generator|backend)", text), path
    for path in [*(root / "train").rglob("*.py"), *(root / "learn").rglob("*.py")]:
        text = path.read_text()
        for word in ("vllm", "VLLM", "TransformersGenerator", "release_memory", "sleep(", "backend =="):
            assert word not in text, (path, word)


def test_shared_module_sees_every_update_without_a_copy():
    model = tiny_model(0)
    gen = TransformersGenerator(model, pad_token_id=0)
    assert isinstance(gen, Generator)
    before = generate(gen)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    gen.load_weights(WeightUpdate.from_module(model, version=1))  # nothing to move: it is the same module
    assert gen.model is model and gen.stats["weight_updates"] == 1
    assert generate(gen).token_ids != before.token_ids
    assert generate(gen).token_ids == generate(TransformersGenerator(copy.deepcopy(model), pad_token_id=0)).token_ids
    anyio.run(gen.close)


def test_generation_copy_holds_weights_only_during_a_rollout():
    model = tiny_model(1)
    gen = TransformersGenerator(model, pad_token_id=0, weights_dtype=torch.bfloat16)
    assert gen.model is not model and all(p.numel() == 0 for p in gen.model.parameters())  # nothing while training
    gen.begin_rollout()
    for (n, p), (_, q) in zip(model.named_parameters(), gen.model.named_parameters()):
        assert q.dtype == torch.bfloat16 and torch.equal(q, p.detach().to(torch.bfloat16)), n
    out = anyio.run(gen.generate, PROMPT, GREEDY)
    gen.end_rollout()
    assert all(p.numel() == 0 for p in gen.model.parameters())
    reference = TransformersGenerator(copy.deepcopy(model).to(torch.bfloat16), pad_token_id=0)
    assert out.token_ids == generate(reference).token_ids
    with torch.no_grad():  # an optimizer step on the master weights shows at the next rollout
        for p in model.parameters():
            p.mul_(-1.0)
    gen.load_weights(WeightUpdate.from_module(model, version=1))
    gen.begin_rollout()
    assert all(torch.equal(q, p.detach().to(torch.bfloat16)) for p, q in zip(model.parameters(), gen.model.parameters()))
    gen.end_rollout()


def test_the_generation_copy_leaves_the_policys_input_grad_hook_behind():
    """Checkpointed training makes the policy's input embeddings require grad through a forward
    hook; the deep copy took it along, and the compiled decode step traced it and compiled it a
    second time (recompile logs, H200). The copy decodes without it; the policy keeps it."""
    model = tiny_model(1)
    model.enable_input_require_grads()
    gen = TransformersGenerator(model, pad_token_id=0, weights_dtype=torch.bfloat16)
    assert len(model.get_input_embeddings()._forward_hooks) == 1
    assert len(gen.model.get_input_embeddings()._forward_hooks) == 0
    gen.begin_rollout()
    assert generate(gen).token_ids == generate(TransformersGenerator(copy.deepcopy(model).to(torch.bfloat16), pad_token_id=0)).token_ids
    gen.end_rollout()
    ids = torch.tensor([[1, 2, 3]])
    assert model.get_input_embeddings()(ids).requires_grad  # still there for training


@pytest.mark.parametrize("weights_dtype", [None, torch.bfloat16], ids=["in-place", "copy"])
def test_weights_from_a_path_load_into_any_transformers_generator(tmp_path, weights_dtype):
    """The form that crosses a process boundary: a saved folder."""
    target, source = tiny_model(2), tiny_model(3)
    source.save_pretrained(tmp_path)
    update = WeightUpdate.from_path(tmp_path, version=7)
    assert update.module is None and not update.is_adapter
    gen = TransformersGenerator(target, pad_token_id=0, weights_dtype=weights_dtype)
    gen.load_weights(update)
    expected_model = copy.deepcopy(source).to(weights_dtype or torch.float32)
    expected = generate(TransformersGenerator(expected_model, pad_token_id=0), sampling=SamplingParams(temperature=1.0, seed=3, max_tokens=12))
    assert generate(gen, sampling=SamplingParams(temperature=1.0, seed=3, max_tokens=12)).token_ids == expected.token_ids
    with pytest.raises(FileNotFoundError):
        WeightUpdate.from_path(tmp_path / "nothing", version=0)


def test_lora_update_reads_merged_full_weights_and_the_adapter(tmp_path):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_model(4), LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    update = WeightUpdate.from_module(model, version=3)
    assert update.is_adapter and update.lora_config["r"] == 4
    merged = copy.deepcopy(model).merge_and_unload().state_dict()
    with update.full() as named:
        got = dict(named)
        assert set(got) == set(merged) - {"lm_head.weight"}  # tied head left out
        assert all(torch.allclose(got[k], merged[k], atol=1e-6) for k in got)
    ids = torch.tensor([PROMPT])
    with torch.no_grad(), model.disable_adapter():
        plain = model(ids).logits
    with torch.no_grad():
        assert not torch.allclose(model(ids).logits, plain)  # unmerged again after the block
    with update.adapter() as lora:
        assert lora and all("lora_" in n for n, _ in lora)
    model.save_pretrained(tmp_path)
    saved = WeightUpdate.from_path(tmp_path, version=3)
    assert saved.is_adapter and saved.lora_config["r"] == 4
    with saved.adapter() as lora:
        assert lora
    with pytest.raises(ValueError, match="only a LoRA adapter"), saved.full():
        pass


class _Rollouts:
    """A rollout that records which thread its event loop ran on and which ran the model."""

    def __init__(self, gen):
        self.gen, self.loop_thread, self.model_threads = gen, None, set()
        model = gen.model
        self.hook = model.register_forward_hook(lambda *_: self.model_threads.add(threading.get_ident()))

    def __call__(self):
        async def main():
            self.loop_thread = threading.get_ident()
            return await self.gen.generate(PROMPT, GREEDY)

        return anyio.run(main)


@pytest.mark.parametrize("host", [None, True, False], ids=["default", "hosted", "model-thread"])
def test_run_rollouts_lets_the_backend_pick_the_thread(host):
    """``run_with`` starts every rollout through ``Generator.run_rollouts``: the transformers backend
    on CPU (by default, or when asked) runs the model on the calling thread and the event loop on a
    helper; otherwise on its own model thread. Same tokens either way; a wrapper passes it through."""
    gen = TransformersGenerator(tiny_model(5), pad_token_id=0, host_rollouts=host)
    assert gen.host_rollouts is (host if host is not None else True)  # CPU here
    rollouts = _Rollouts(gen)
    out = gen.run_rollouts(rollouts)
    caller = threading.get_ident()
    if gen.host_rollouts:
        assert rollouts.model_threads == {caller} and rollouts.loop_thread != caller
    else:
        assert caller not in rollouts.model_threads and rollouts.loop_thread == caller
    assert out.token_ids == generate(TransformersGenerator(tiny_model(5), pad_token_id=0)).token_ids
    rollouts.hook.remove()
    anyio.run(gen.close)


def test_run_with_goes_through_a_wrapper():
    """FSDP2's ``GatheredGenerator`` hands ``run_rollouts`` to the backend it wraps (no attribute
    lookups through it): a CPU transformers backend inside still serves on the calling thread."""
    inner = TransformersGenerator(tiny_model(6), pad_token_id=0)
    wrapped = GatheredGenerator(inner, policy=None, copy=inner.model)  # no rollout lifecycle here: nothing is gathered
    rollouts = _Rollouts(inner)
    out = run_with(wrapped, lambda: rollouts.gen.generate(PROMPT, GREEDY))
    assert rollouts.model_threads == {threading.get_ident()}
    assert len(out.token_ids) > 0
    rollouts.hook.remove()
    anyio.run(inner.close)
