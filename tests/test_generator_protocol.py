"""The Generator protocol: every backend declares the lifecycle; the transformers backend honours it for real.

vLLM backends are exercised for real in the vllm group (test_vllm_*.py); here they must import and
declare the protocol without vLLM installed.
"""

from __future__ import annotations

import copy
import inspect
import re
from pathlib import Path

import anyio
import pytest
import torch
import transformers

from agentrl.generators import Generator, SamplingParams, WeightUpdate
from agentrl.generators.transformers import TransformersGenerator
from agentrl.generators.vllm import VLLMGenerator
from agentrl.generators.vllm_client import VLLMServerGenerator

LIFECYCLE = ("generate", "begin_rollout", "end_rollout", "load_weights", "close")
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


@pytest.mark.parametrize("cls", [TransformersGenerator, VLLMGenerator, VLLMServerGenerator])
def test_every_backend_declares_the_protocol(cls):
    for name in LIFECYCLE:
        assert callable(getattr(cls, name, None)), f"{cls.__name__}.{name}"
    assert list(inspect.signature(cls.load_weights).parameters) == ["self", "update"]


def test_trainer_never_asks_which_backend():
    """No hasattr on generators and no backend names in the training side."""
    root = Path(__file__).resolve().parents[1] / "agentrl"
    for path in root.rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"hasattr\([^)]*generator", text), path
    for name in ("trainer.py", "learner.py", "batch.py", "train_state.py"):
        text = (root / name).read_text()
        for word in ("vllm", "VLLM", "TransformersGenerator", "release_memory", "sleep("):
            assert word not in text, (name, word)


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
