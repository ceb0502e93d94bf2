"""The CUDA-graph decode path against the dynamic-cache path, on a real GPU (``pytest -m gpu``)."""

from __future__ import annotations

import anyio
import pytest
import torch
import transformers

from agentrl.generators.hf.generator import TransformersGenerator
from agentrl.generators.protocol import SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def model() -> transformers.Qwen2ForCausalLM:
    config = transformers.Qwen2Config(
        vocab_size=512, hidden_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=256, tie_word_embeddings=True, max_position_embeddings=2048, initializer_range=0.1,
    )
    torch.manual_seed(0)
    return transformers.Qwen2ForCausalLM(config).to("cuda").eval()


def generate(gen: TransformersGenerator, prompts: list[list[int]], params: SamplingParams, close: bool = True) -> list:
    async def main() -> list:
        out: list = [None] * len(prompts)

        async def one(i: int) -> None:
            out[i] = await gen.generate(prompts[i], params)

        async with anyio.create_task_group() as tg:
            for i in range(len(prompts)):
                tg.start_soon(one, i)
        if close:
            await gen.close()
        return out

    return anyio.run(main)


def test_graph_decode_matches_dynamic_cache():
    m = model()
    prompts = [[(7 * i + j) % 500 + 1 for j in range(3 + (5 * i) % 40)] for i in range(37)]  # ragged, batch -> 64
    greedy = SamplingParams(temperature=0, max_tokens=48)
    dynamic = generate(TransformersGenerator(m, 0, static_cache=False, gather_window_s=0.2), prompts, greedy)
    graph_gen = TransformersGenerator(m, 0, static_cache=True, gather_window_s=0.2)
    graphed = generate(graph_gen, prompts, greedy)
    assert graph_gen.static.stats["graphs_captured"] >= 1 and graph_gen.static.stats["graph_replays"] >= 47
    same = sum(a.token_ids == b.token_ids for a, b in zip(dynamic, graphed))
    assert same >= len(prompts) - 1, f"only {same}/{len(prompts)} greedy outputs agree"
    for a, b in zip(dynamic, graphed):
        if a.token_ids == b.token_ids:
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-3
    seeded = SamplingParams(temperature=1.0, max_tokens=32, seed=3)
    a = generate(TransformersGenerator(m, 0, static_cache=True), prompts[:5], seeded)
    b = generate(TransformersGenerator(m, 0, static_cache=True), prompts[:5], seeded)
    assert [x.token_ids for x in a] == [x.token_ids for x in b]


def test_graph_decode_sees_weight_updates():
    """Weights are copied in place, so a captured graph decodes with the new ones."""
    m = model()
    gen = TransformersGenerator(m, 0, static_cache=True)
    prompts, params = [[1, 2, 3, 4]], SamplingParams(temperature=0, max_tokens=16)
    before = generate(gen, prompts, params, close=False)[0].token_ids
    assert gen.static.stats["graphs_captured"] == 1
    torch.manual_seed(1)
    gen.update_weights({k: torch.randn_like(v) * 0.1 for k, v in m.named_parameters()})
    after = generate(gen, prompts, params)[0].token_ids
    assert gen.static.stats["graphs_captured"] == 1  # replayed, not recaptured
    reference = generate(TransformersGenerator(m, 0, static_cache=False), prompts, params)[0].token_ids
    assert after == reference and after != before


def test_compiled_graph_decode_matches_graph_decode():
    """generator.compile_decode: the torch.compile'd step, captured as a graph, decodes the same tokens."""
    m = model()
    prompts = [[(11 * i + j) % 500 + 1 for j in range(2 + (3 * i) % 17)] for i in range(9)]  # batch -> 16
    greedy = SamplingParams(temperature=0, max_tokens=40)
    plain = generate(TransformersGenerator(m, 0, static_cache=True, gather_window_s=0.2), prompts, greedy)
    gen = TransformersGenerator(m, 0, static_cache=True, compile_decode=True, gather_window_s=0.2)
    compiled = generate(gen, prompts, greedy)
    assert gen.static.stats["graph_replays"] >= 40
    same = sum(a.token_ids == b.token_ids for a, b in zip(plain, compiled))
    assert same >= len(prompts) - 1, f"only {same}/{len(prompts)} greedy outputs agree"
    for a, b in zip(plain, compiled):
        if a.token_ids == b.token_ids:
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-3


def test_sampling_on_cuda_never_draws_zero_probability_tokens():
    """A peaked 151,936-token distribution (most probabilities underflow to 0) sampled 64k times."""
    from agentrl.generators.hf.generator import sample_next

    torch.manual_seed(0)
    logits = (torch.randn(512, 151936, device="cuda") * 40).to(torch.bfloat16)
    params = [SamplingParams(temperature=1.0)] * 512
    for _ in range(128):
        _, logprobs = sample_next(logits, params, [None] * 512)
        assert torch.isfinite(logprobs).all()


def test_the_compiled_sampler_draws_the_tempered_distribution_with_its_logprobs():
    from test_generator_transformers import check_gumbel_max

    from agentrl.generators.hf.generator import sample_next

    check_gumbel_max(lambda logits, inv_t: sample_next(logits, [SamplingParams(temperature=1 / inv_t)] * logits.shape[0], [None] * logits.shape[0], fused=True), "cuda")
    torch.manual_seed(0)
    logits = (torch.randn(512, 151936, device="cuda") * 40).to(torch.bfloat16)  # most probabilities underflow to 0
    for _ in range(32):
        tokens, logprobs = sample_next(logits, [SamplingParams(temperature=1.0)] * 512, [None] * 512, fused=True)
        assert torch.isfinite(logprobs).all()
        assert torch.allclose(logprobs, logits.float().log_softmax(-1).gather(1, tokens[:, None]).squeeze(1), atol=1e-4)


def test_capturing_a_graph_keeps_the_allocators_cached_memory():
    """torch.cuda.graph's context empties the caching allocator on entry: each rollout's capture
    gave the learner's cached blocks back to the driver. The generator's capture keeps them."""
    gen = TransformersGenerator(model(), 0, static_cache=True, gather_window_s=0.2)
    block = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    del block  # 256 MiB now free but cached
    reserved = torch.cuda.memory_reserved()
    out = generate(gen, [[1, 2, 3], [4, 5]], SamplingParams(temperature=0, max_tokens=6))
    assert gen.static.stats["graphs_captured"] >= 1 and all(len(o.token_ids) == 6 for o in out)
    assert torch.cuda.memory_reserved() >= reserved


def test_rollouts_that_capture_again_do_not_grow_the_allocated_memory():
    """Each capture used to run on two new CUDA streams, and cuBLAS keeps a workspace (32 MiB on
    a Hopper card) per stream that multiplies: allocated memory grew by 0.19 GiB a training step
    (8 x 8 x 256, H200) until torch's 32 pooled streams had all been used, ~1 GiB in all. The
    decoder's two streams are made once; a rollout's graphs, freed after it, leave nothing behind."""
    gen = TransformersGenerator(model(), 0, static_cache=True, gather_window_s=0.2)
    prompts = [[(3 * i + j) % 500 + 1 for j in range(4 + i)] for i in range(6)]
    after = []
    for _ in range(5):
        gen.begin_rollout()
        out = generate(gen, prompts, SamplingParams(temperature=0, max_tokens=8), close=False)
        assert all(len(o.token_ids) == 8 for o in out)
        gen.end_rollout()  # frees the caches and graphs: the next rollout captures again
        torch.cuda.synchronize()
        after.append(torch.cuda.memory_allocated())
    assert gen.static.stats["graphs_captured"] >= 5
    assert after[-1] - after[1] < 4 * 2**20, [a / 2**20 for a in after]
    anyio.run(gen.close)


def test_defaults_decode_through_cuda_graphs_and_the_compiled_step():
    """With no generator settings, a supported model on CUDA gets the static cache, graphs and the
    compiled step (issue 13: the fast path is the default), and decodes like the eager graph path."""
    from agentrl.generators import build_generator
    from agentrl.generators.config import GeneratorConfig

    m = model()
    gen = build_generator(GeneratorConfig(gather_window_s=0.2), model=m, model_path="unused", pad_token_id=0, max_context=None)
    assert gen.static is not None and gen.static._compiled is not None
    prompts = [[(11 * i + j) % 500 + 1 for j in range(2 + (3 * i) % 17)] for i in range(9)]
    greedy = SamplingParams(temperature=0, max_tokens=40)
    fast = generate(gen, prompts, greedy)
    assert gen.static.stats["graph_replays"] >= 40
    batch = gen.stats["trace"][-1]  # where the batch's time went: captures, and the host waiting on the GPU
    assert batch["captures"] >= 1 and batch["capture_s"] > 0 and 0 < batch["wait_s"] < batch["end"] - batch["start"]
    plain = generate(TransformersGenerator(m, 0, static_cache=True, gather_window_s=0.2), prompts, greedy)
    same = sum(a.token_ids == b.token_ids for a, b in zip(plain, fast))
    assert same >= len(prompts) - 1, f"only {same}/{len(prompts)} greedy outputs agree"


def test_rollouts_ahead_on_cuda_train_beside_a_capturing_generator(tmp_path):
    """max_staleness=1 on CUDA: the generation copy decodes (graph captures, compiled step) on its
    own thread while the learner runs checkpointed bf16 forwards and backwards. Process-global
    switches flipped per batch (SDPA kernels) and a global-mode capture made the learner fail
    (H100, rollout_device=cuda:1); the run must finish every step with finite updates."""
    import json
    import math

    from agentrl.core.overrides import build, parse_overrides
    from agentrl.train.config import TrainConfig
    from agentrl.train.trainer import Trainer

    device = "cuda:1" if torch.cuda.device_count() > 1 else "cuda:0"
    keys = [
        "prompts_per_step=4", "num_generations=8", "micro_batch_size=8", "rollout.max_tokens_per_turn=64",
        "rollout.max_completion_tokens=192", "learning_rate=2e-5", "max_steps=5", f"output_dir={tmp_path}",
        "precision=bf16", "gradient_checkpointing=true", "max_staleness=1", f"rollout_device={device}",
        "samples_per_log=0", "save_final=false",
    ]
    Trainer(build(TrainConfig, parse_overrides(keys))).train()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 5
    assert all(math.isfinite(r["loss/loss"]) for r in rows)
    assert sum(r.get("train/skipped_nonfinite", 0) for r in rows) == 0


def test_continuous_batching_through_the_compiled_graph_matches_decoding_alone():
    """A request sent while a graph-replayed, compiled batch runs takes a finished row (its keys and
    values copied into the captured cache) and decodes what it decodes alone."""
    from test_continuous_batching import follow_up

    m = model()
    late_prompt = [(11 * j) % 500 + 1 for j in range(20)]
    alone = generate(TransformersGenerator(m, 0, static_cache=False), [late_prompt], SamplingParams(temperature=0, max_tokens=24))[0]
    gen = TransformersGenerator(m, 0, static_cache=True, compile_decode=True, gather_window_s=0.2, continuous=True, admit_every=1)
    first = [("long", [(3 * j) % 500 + 1 for j in range(30)], SamplingParams(temperature=0, max_tokens=400)),
             ("short", [5, 9, 13], SamplingParams(temperature=0, max_tokens=2))]
    (long, _), late, order = follow_up(gen, first, (late_prompt, SamplingParams(temperature=0, max_tokens=24)))
    assert gen.stats["admitted"] == 1 and gen.stats["batches"] == 1 and order == ["short", "then", "long"]
    assert late.token_ids == alone.token_ids
    assert len(long.token_ids) == 400


def test_the_keyed_sampler_on_cuda_draws_the_tempered_distribution_and_matches_the_cpu():
    """Seeded rows on the compiled path draw from integer-hash streams: the tempered distribution
    with exact log-probabilities on the GPU too, and the same uniforms as on the CPU."""
    from test_generator_transformers import check_gumbel_max

    from agentrl.generators.hf.sampling import RowStreams, _compiled_keyed_gumbel_max

    streams = RowStreams(list(range(4096)), torch.device("cuda"))
    draw = _compiled_keyed_gumbel_max()
    check_gumbel_max(lambda logits, inv_t: draw(logits, streams.keys, streams.counts, inv_t), "cuda")
    logits = torch.randn(64, 4096)
    keys, counts = RowStreams(list(range(64)), torch.device("cpu")).keys, torch.arange(64)
    on_cpu, _ = draw(logits, keys, counts, 1.0)
    on_gpu, _ = draw(logits.cuda(), keys.cuda(), counts.cuda(), 1.0)
    assert (on_cpu == on_gpu.cpu()).float().mean() > 0.95  # the same noise; float rounding may flip a near tie


def test_a_captured_step_that_samples_inside_itself_draws_what_the_host_sampler_draws():
    """The whole token step as one graph (forward, min_tokens, keyed draw, next input): the same tokens
    as the host-side sampler over the same streams, across several active-length graphs, and the
    warm-up runs before each capture must not move the batch on."""
    m = model().to(torch.bfloat16)
    prompts = [[(7 * i + j) % 500 + 1 for j in range(3 + (5 * i) % 40)] for i in range(20)]
    stops = [1, 2, 3, 4, 5, 6, 7, 8]
    params = [SamplingParams(temperature=0.9, max_tokens=300, min_tokens=150, stop_token_ids=stops, seed=i) for i in range(20)]

    def run(in_step: bool):
        gen = TransformersGenerator(m, 0, static_cache=True, compile_decode=True, gather_window_s=0.2, sample_in_step=in_step)

        async def main() -> list:
            out: list = [None] * len(prompts)

            async def one(i: int) -> None:
                out[i] = await gen.generate(prompts[i], params[i])

            async with anyio.create_task_group() as tg:
                for i in range(len(prompts)):
                    tg.start_soon(one, i)
            await gen.close()
            return out

        return anyio.run(main), gen

    (inside, a), (outside, b) = run(True), run(False)
    assert a.stats["sampled_in_step"] == 1 and b.stats["sampled_in_step"] == 0
    assert a.static.stats["graphs_captured"] >= 3  # columns 3-342: three active lengths at least
    same = sum(x.token_ids == y.token_ids for x, y in zip(inside, outside))
    assert same >= 18, same  # bf16: a near tie may flip between two kernels' roundings
    for x in inside:
        assert not set(x.token_ids[:150]) & set(stops) and torch.isfinite(torch.tensor(x.logprobs)).all()
