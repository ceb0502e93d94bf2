"""TransformersGenerator: batched decode matches HF, logprobs, batching, stops, seeds, responsiveness, weights."""

from __future__ import annotations

import math
import time

import anyio
import pytest
import torch
import transformers

from agentrl.generators.hf.generator import (
    GenerationError,
    GeneratorClosedError,
    TransformersGenerator,
    sample_next,
)
from agentrl.generators.protocol import Generation, Generator, SamplingParams

PROMPTS = [[5, 9, 13], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [42], [7, 7, 30, 31, 50, 2]]


def tiny_model(seed: int) -> transformers.Qwen2ForCausalLM:
    config = transformers.Qwen2Config(
        vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        head_dim=32, intermediate_size=128, tie_word_embeddings=True, max_position_embeddings=512,
        initializer_range=0.2,  # peaky enough that outputs vary and filters bite
    )
    torch.manual_seed(seed)
    return transformers.Qwen2ForCausalLM(config).eval()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny_qwen2")
    tiny_model(0).save_pretrained(path)
    return str(path)


@pytest.fixture(params=[False, True], ids=["dynamic-cache", "static-cache"])
def gen(model_path, request) -> TransformersGenerator:
    """Every behaviour test runs on both decode paths (the static one eagerly here, as a graph on CUDA)."""
    g = TransformersGenerator.from_pretrained(model_path, device="cpu", dtype=torch.float32, pad_token_id=0, gather_window_s=0.05)
    if request.param:
        from agentrl.generators.hf.static_decode import StaticDecoder

        g.static = StaticDecoder(g.model, g.pad_token_id, use_graphs=False)
    return g


def run_all(gen: TransformersGenerator, requests: list[tuple[list[int], SamplingParams]]) -> list[Generation]:
    """Fire all requests concurrently on one loop, then close the generator."""
    results: list[Generation | None] = [None] * len(requests)

    async def main() -> None:
        async def one(i: int) -> None:
            results[i] = await gen.generate(*requests[i])

        async with anyio.create_task_group() as tg:
            for i in range(len(requests)):
                tg.start_soon(one, i)
        await gen.close()

    anyio.run(main)
    return results  # type: ignore[return-value]


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n, min_new_tokens=n, pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt):].tolist()


def test_protocol(gen):
    assert isinstance(gen, Generator)


def test_greedy_matches_hf_generate_with_left_padding(gen):
    n = 12
    results = run_all(gen, [(p, SamplingParams(temperature=0, max_tokens=n)) for p in PROMPTS])
    assert gen.stats["batches"] == 1 and gen.stats["batch_sizes"] == [len(PROMPTS)]
    for prompt, res in zip(PROMPTS, results):
        assert res.token_ids == hf_greedy(gen.model, prompt, n)
        assert res.finish_reason == "length" and len(res.logprobs) == n
        # greedy logprobs are log_softmax(logits) (temperature 1, no filtering)
        with torch.no_grad():
            logits = gen.model(torch.tensor([prompt + res.token_ids])).logits[0, len(prompt) - 1 : -1]
        ref = logits.log_softmax(-1).gather(1, torch.tensor(res.token_ids)[:, None]).squeeze(1)
        assert torch.allclose(torch.tensor(res.logprobs), ref, atol=1e-4)


def test_a_prefix_every_prompt_shares_is_encoded_once_and_decodes_as_if_alone(gen):
    """Prompts that start alike (a system prompt and tool schemas) share one prefill of that
    prefix; the tails differ in length (padding then sits between prefix and tail), and one
    prompt is the prefix plus a single token."""
    prefix = [(7 * i) % 50 + 3 for i in range(40)]
    prompts = [prefix + [9], prefix + [5, 9, 13, 21], prefix + [1, 2, 3, 4, 5, 6, 7, 8], prefix + [42, 42]]
    n = 8
    passes = gen.stats["forward_passes"]
    results = run_all(gen, [(p, SamplingParams(temperature=0, max_tokens=n)) for p in prompts])
    assert gen.stats["batches"] == 1
    if gen.static is None:  # the dynamic path: the prefix's forward, the tails', then one per token
        assert gen.stats["forward_passes"] - passes == 2 + (n - 1)
    for prompt, res in zip(prompts, results):
        assert res.token_ids == hf_greedy(gen.model, prompt, n)
        with torch.no_grad():
            logits = gen.model(torch.tensor([prompt + res.token_ids])).logits[0, len(prompt) - 1 : -1]
        ref = logits.log_softmax(-1).gather(1, torch.tensor(res.token_ids)[:, None]).squeeze(1)
        assert torch.allclose(torch.tensor(res.logprobs), ref, atol=1e-4)


def test_a_sliding_window_model_prefills_every_row_whole():
    """Padding between a shared prefix and a row's tail would shift the tail's cache columns, and a
    sliding window counts columns: such a model keeps plain left padding and HF's tokens."""
    torch.manual_seed(0)
    sliding = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, head_dim=32, num_key_value_heads=1,
        intermediate_size=64, use_sliding_window=True, sliding_window=16, max_window_layers=0, initializer_range=0.2,
    )).eval()
    prefix = [(7 * i) % 50 + 3 for i in range(40)]
    prompts = [prefix + [9], prefix + [5, 9, 13, 21], prefix + [1, 2, 3, 4, 5, 6, 7, 8]]
    gen = TransformersGenerator(sliding, 0, gather_window_s=0.05)
    results = run_all(gen, [(p, SamplingParams(temperature=0, max_tokens=8)) for p in prompts])
    assert gen.stats["forward_passes"] == 8
    for prompt, res in zip(prompts, results):
        assert res.token_ids == hf_greedy(sliding, prompt, 8)


def test_shared_prefix_leaves_every_prompt_a_token_of_its_own():
    from agentrl.generators.hf.dynamic_decode import shared_prefix

    assert shared_prefix([[1, 2, 3], [1, 2, 4], [1, 2, 3, 5]]) == 2
    assert shared_prefix([[1, 2, 3], [1, 2, 3, 4]]) == 2  # the first is all prefix: it keeps its last token
    assert shared_prefix([[1, 2], [3, 4]]) == 0


def test_sampled_logprobs_match_recomputation(gen):
    t = 0.7
    results = run_all(gen, [(p, SamplingParams(temperature=t, max_tokens=10, seed=i)) for i, p in enumerate(PROMPTS)])
    for prompt, res in zip(PROMPTS, results):
        with torch.no_grad():
            logits = gen.model(torch.tensor([prompt + res.token_ids])).logits[0, len(prompt) - 1 : -1]
        ref = (logits / t).log_softmax(-1).gather(1, torch.tensor(res.token_ids)[:, None]).squeeze(1)
        assert torch.allclose(torch.tensor(res.logprobs), ref, atol=1e-4)


def hand_filtered_logprobs(logits: torch.Tensor, t: float, top_k: int, top_p: float, min_p: float) -> dict[int, float]:
    """Reference: temper, keep top-k, then the smallest prefix reaching top_p, then min-p; renormalise."""
    scaled = (logits.double() / t).tolist()
    order = sorted(range(len(scaled)), key=lambda i: -scaled[i])[: top_k or len(scaled)]
    z = sum(math.exp(scaled[i]) for i in order)
    kept, mass = [], 0.0
    for i in order:
        if mass >= top_p:
            break
        kept.append(i)
        mass += math.exp(scaled[i]) / z
    best = math.exp(scaled[kept[0]])
    kept = [i for i in kept if math.exp(scaled[i]) >= min_p * best]
    z = sum(math.exp(scaled[i]) for i in kept)
    return {i: scaled[i] - math.log(z) for i in kept}


@pytest.mark.parametrize("top_k,top_p,min_p", [(5, 1.0, 0.0), (0, 0.6, 0.0), (8, 0.8, 0.0), (0, 1.0, 0.3)])
def test_filtered_logprobs_are_renormalised(gen, top_k, top_p, min_p):
    t, prompt = 1.3, PROMPTS[1]
    params = [SamplingParams(temperature=t, top_k=top_k, top_p=top_p, min_p=min_p, max_tokens=1, seed=s) for s in range(24)]
    results = run_all(gen, [(prompt, p) for p in params])
    with torch.no_grad():
        logits = gen.model(torch.tensor([prompt])).logits[0, -1]
    allowed = hand_filtered_logprobs(logits, t, top_k, top_p, min_p)
    assert 1 < len(allowed) < 64
    for res in results:
        [tok] = res.token_ids
        assert tok in allowed
        assert res.logprobs[0] == pytest.approx(allowed[tok], abs=1e-4)


def test_concurrent_requests_are_batched(gen):
    max_tokens = 8
    results = run_all(gen, [(PROMPTS[i % 4], SamplingParams(temperature=1.0, max_tokens=max_tokens)) for i in range(64)])
    assert all(len(r.token_ids) == max_tokens for r in results)
    s = gen.stats
    print(f"64 requests x {max_tokens} tokens: batches={s['batches']} sizes={s['batch_sizes']} forward_passes={s['forward_passes']}")
    assert s["batches"] <= 3 and sum(s["batch_sizes"]) == 64
    # the static path runs one speculative step per batch past its last token
    assert max_tokens <= s["forward_passes"] <= s["batches"] * (max_tokens + (gen.static is not None))


def test_stop_tokens_and_per_row_max_tokens(gen):
    greedy = hf_greedy(gen.model, PROMPTS[0], 10)
    stop = greedy[3]
    cut = greedy.index(stop) + 1
    requests = [
        (PROMPTS[0], SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[stop])),
        (PROMPTS[0], SamplingParams(temperature=0, max_tokens=2)),
        (PROMPTS[0], SamplingParams(temperature=0, max_tokens=7)),
        (PROMPTS[1], SamplingParams(temperature=0, max_tokens=1)),
    ]
    stopped, two, seven, one = run_all(gen, requests)
    assert stopped.token_ids == greedy[:cut] and stopped.finish_reason == "stop"  # stop token included
    assert two.token_ids == greedy[:2] and two.finish_reason == "length"
    assert seven.token_ids == greedy[:7] and seven.finish_reason == "length"
    assert len(one.token_ids) == 1 and one.finish_reason == "length"
    assert gen.stats["forward_passes"] == 7 + (gen.static is not None)  # ends when the longest row is done (+1 speculative step)


def test_seed_reproducible_whatever_the_batch(gen, model_path):
    target = (PROMPTS[2], SamplingParams(temperature=1.0, top_k=20, max_tokens=16, seed=1234))
    alone = run_all(gen, [target])[0]
    companions = [(p, SamplingParams(temperature=0.9, max_tokens=30, seed=s)) for s, p in enumerate(PROMPTS)]
    companions += [(p, SamplingParams(temperature=1.0, max_tokens=5)) for p in PROMPTS]
    other = TransformersGenerator.from_pretrained(model_path, device="cpu", dtype=torch.float32, pad_token_id=0, gather_window_s=0.05)
    torch.manual_seed(99)  # the global RNG (used by unseeded rows) differs too
    together = run_all(other, companions[:3] + [target] + companions[3:])
    assert other.stats["batches"] == 1
    assert together[3].token_ids == alone.token_ids
    assert together[3].logprobs == pytest.approx(alone.logprobs, abs=1e-4)
    # and the seed does matter
    differs = run_all(TransformersGenerator(gen.model, 0), [(PROMPTS[2], SamplingParams(temperature=1.0, top_k=20, max_tokens=16, seed=4321))])
    assert differs[0].token_ids != alone.token_ids


def test_event_loop_stays_responsive(gen):
    ticks: list[float] = []
    done = anyio.Event()

    async def ticker() -> None:
        while not done.is_set():
            ticks.append(time.monotonic())
            await anyio.sleep(0.002)

    async def main() -> float:
        results = []

        async def one(p) -> None:
            results.append(await gen.generate(p, SamplingParams(temperature=1.0, max_tokens=150)))

        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            start = time.monotonic()
            async with anyio.create_task_group() as work:
                for i in range(32):
                    work.start_soon(one, PROMPTS[i % 4])
            elapsed = time.monotonic() - start
            done.set()
        await gen.close()
        assert len(results) == 32
        return elapsed

    elapsed = anyio.run(main)
    gaps = [b - a for a, b in zip(ticks, ticks[1:])]
    print(f"batch of 32 x 150 tokens took {elapsed:.2f}s; {len(ticks)} ticks, max gap {max(gaps) * 1000:.0f} ms")
    assert elapsed > 0.1
    assert len(ticks) > elapsed / 0.05 and max(gaps) < 0.1


def test_max_context(model_path):
    gen = TransformersGenerator.from_pretrained(model_path, device="cpu", dtype=torch.float32, pad_token_id=0, max_context=8)

    async def main() -> Generation:
        with pytest.raises(ValueError, match="max_context"):
            await gen.generate(list(range(8)), SamplingParams(max_tokens=4))
        with pytest.raises(ValueError, match="out of range"):
            await gen.generate([1, 64], SamplingParams())
        res = await gen.generate(list(range(5)), SamplingParams(temperature=0, max_tokens=10))
        await gen.close()
        return res

    res = anyio.run(main)
    assert len(res.token_ids) == 3 and res.finish_reason == "length"


def test_batch_failure_fails_only_that_batch(gen, monkeypatch):
    owner = gen.static or gen  # the object whose forward the decode path calls
    name = "forward" if gen.static else "_forward"
    real = getattr(owner, name)

    def boom(*args, **kwargs):
        raise RuntimeError("CUDA out of memory (simulated)")

    async def main() -> Generation:
        monkeypatch.setattr(owner, name, boom)
        with pytest.raises(GenerationError, match="out of memory") as info:
            await gen.generate(PROMPTS[0], SamplingParams(max_tokens=3))
        assert isinstance(info.value.__cause__, RuntimeError)
        monkeypatch.setattr(owner, name, real)
        res = await gen.generate(PROMPTS[0], SamplingParams(max_tokens=3))
        await gen.close()
        return res

    assert len(anyio.run(main).token_ids) == 3


def test_update_weights_and_close(gen):
    params = SamplingParams(temperature=0, max_tokens=10)
    before = run_all(gen, [(PROMPTS[1], params)])[0].token_ids
    new = tiny_model(1)
    gen.update_weights(new.state_dict())
    model = gen.model
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # still tied
    gen2 = TransformersGenerator(model, 0)
    after = run_all(gen2, [(PROMPTS[1], params)])[0].token_ids
    assert after != before and after == hf_greedy(new, PROMPTS[1], 10)
    gen2.update_weights([("model.norm.weight", torch.ones(64))])  # iterable of pairs works too
    assert gen2.stats["weight_updates"] == 1

    with pytest.raises(ValueError, match="no.such.weight"):
        gen2.update_weights({"no.such.weight": torch.zeros(3), "model.norm.weight": torch.ones(64)})
    with pytest.raises(ValueError, match="shape"):
        gen2.update_weights({"model.norm.weight": torch.ones(3)})

    async def after_close() -> None:
        await gen2.close()  # idempotent
        with pytest.raises(GeneratorClosedError):
            await gen2.generate(PROMPTS[0], params)

    anyio.run(after_close)


def test_cancelled_request_does_not_break_others(gen):
    async def main() -> list[Generation]:
        with anyio.move_on_after(0.01):  # cancelled while queued or mid-batch
            await gen.generate(PROMPTS[0], SamplingParams(max_tokens=400))
        results = [await gen.generate(p, SamplingParams(temperature=0, max_tokens=4)) for p in PROMPTS[:2]]
        await gen.close()
        return results

    assert [len(r.token_ids) for r in anyio.run(main)] == [4, 4]


def test_bfloat16(model_path):
    gen = TransformersGenerator.from_pretrained(model_path, device="cpu", dtype=torch.bfloat16, pad_token_id=0)
    assert gen.model.dtype == torch.bfloat16
    results = run_all(gen, [(p, SamplingParams(temperature=0.8, top_p=0.9, max_tokens=6)) for p in PROMPTS])
    assert all(len(r.token_ids) == 6 and all(math.isfinite(x) and x <= 0 for x in r.logprobs) for r in results)


def test_sampling_follows_the_distribution(model_path):
    gen = TransformersGenerator.from_pretrained(model_path, device="cpu", dtype=torch.float32, pad_token_id=0, max_batch_size=512, gather_window_s=0.05)
    prompt, t, n = PROMPTS[0], 0.8, 512
    results = run_all(gen, [(prompt, SamplingParams(temperature=t, max_tokens=1, seed=s if s % 2 else None)) for s in range(n)])
    with torch.no_grad():
        probs = (gen.model(torch.tensor([prompt])).logits[0, -1] / t).softmax(-1)
    counts = torch.bincount(torch.tensor([r.token_ids[0] for r in results]), minlength=64).float()
    for tok in probs.topk(3).indices.tolist():
        p = probs[tok].item()
        assert abs(counts[tok].item() / n - p) < 4 * math.sqrt(p * (1 - p) / n)


def test_min_tokens_masks_stop_tokens_until_reached(gen):
    free = run_all(gen, [(PROMPTS[1], SamplingParams(temperature=0, max_tokens=8))])[0].token_ids
    stop = free[0]  # greedy would stop at once if this were a stop token
    gen2 = TransformersGenerator(gen.model, 0, gather_window_s=0.05)
    gen2.static = gen.static and type(gen.static)(gen.model, 0, use_graphs=False)
    plain, forced = run_all(gen2, [
        (PROMPTS[1], SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[stop])),
        (PROMPTS[1], SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[stop], min_tokens=4)),
    ])
    assert plain.token_ids == [stop] and plain.finish_reason == "stop"
    assert len(forced.token_ids) >= 4 and stop not in forced.token_ids[:4]
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(min_tokens=-1)


def test_early_stops_masks_each_rows_own_stops_until_its_own_minimum():
    from agentrl.generators.hf.decode_steps import EarlyStops

    params = [SamplingParams(min_tokens=2), SamplingParams(min_tokens=0), SamplingParams(min_tokens=3), SamplingParams(min_tokens=5)]
    stops = [{3, 7}, {3}, {5}, set()]  # the last row has a minimum but nothing to hold back
    early = EarlyStops(params, stops, torch.device("cpu"))
    masked_at = []
    for _ in range(4):
        logits = early.apply(torch.zeros(4, 10))
        masked_at.append({(r, c) for r, c in torch.isinf(logits).nonzero().tolist()})
        early.advance()
    assert masked_at == [{(0, 3), (0, 7), (2, 5)}, {(0, 3), (0, 7), (2, 5)}, {(2, 5)}, set()]
    assert not early.active  # the host knows without asking the device: apply is free from here on
    early.restart([1, 5], [SamplingParams(min_tokens=1), SamplingParams(min_tokens=2)], [{4}, {1, 2, 9}])  # row 5: the batch grows
    masked_at = []
    for _ in range(3):
        logits = early.apply(torch.zeros(6, 10))
        masked_at.append({(r, c) for r, c in torch.isinf(logits).nonzero().tolist()})
        early.advance()
    assert masked_at == [{(1, 4), (5, 1), (5, 2), (5, 9)}, {(5, 1), (5, 2), (5, 9)}, set()]
    early.keep(torch.tensor([5]))
    assert early.apply(torch.zeros(1, 10)).isinf().sum() == 0


def check_gumbel_max(draw, device: str) -> None:
    """``draw(logits, inverse_temperature)`` samples tempered softmax and reports each token's log-probability."""
    torch.manual_seed(0)
    rows, t = 4096, 0.7
    base = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -math.inf, 1.5, -3.0])
    logits = base.repeat(rows, 1).to(device=device, dtype=torch.bfloat16)
    tokens, logprobs = draw(logits, 1 / t)
    exact = (logits.float() / t).log_softmax(-1)
    assert torch.allclose(logprobs, exact.gather(1, tokens[:, None]).squeeze(1), atol=1e-5)
    counts = torch.bincount(tokens.cpu(), minlength=8).float()
    probs = exact[0].exp().cpu()
    assert counts[5] == 0  # probability zero: never drawn
    for tok in range(8):
        p = probs[tok].item()
        assert abs(counts[tok].item() / rows - p) <= 4 * math.sqrt(p * (1 - p) / rows) + 1e-9


def test_gumbel_max_draws_the_tempered_distribution_with_its_logprobs():
    """Eagerly and compiled (the CUDA decode path's sampler; inductor's CPU code here)."""
    from agentrl.generators.hf.sampling import _compiled_gumbel_max, gumbel_max

    check_gumbel_max(gumbel_max, "cpu")
    check_gumbel_max(_compiled_gumbel_max(), "cpu")


def test_sample_next_never_draws_a_zero_probability_token():
    """Peaked distributions (most tokens at probability 0 in float32) are drawn exactly.

    The GPU's parallel cumulative sum is not exactly monotone, so inverse-CDF sampling could land on
    a token of probability 0 (sampler logprob -inf); the unseeded rows now use Gumbel-max sampling.
    """
    torch.manual_seed(0)
    vocab, n = 4096, 2000
    logits = torch.full((n, vocab), -1e4)
    logits[:, :3] = torch.tensor([2.0, 1.0, 0.0])  # three possible tokens, the rest underflow to 0
    logits[:, 7] = -math.inf  # a masked stop token
    params = [SamplingParams(temperature=1.0)] * n
    tokens, logprobs = sample_next(logits, params, [None] * n)
    assert torch.isfinite(logprobs).all() and int(tokens.max()) <= 2
    counts = torch.bincount(tokens, minlength=3).float() / n
    expected = torch.tensor([2.0, 1.0, 0.0]).softmax(-1)
    assert (counts[:3] - expected).abs().max() < 4 * math.sqrt(0.25 / n)
    assert torch.allclose(logprobs, expected.log()[tokens], atol=1e-5)
    # mixed settings (the per-row path): seeded rows invert the CDF, unseeded rows race
    mixed = [SamplingParams(temperature=1.0, seed=i) if i % 2 else SamplingParams(temperature=0.5) for i in range(n)]
    gens = [torch.Generator().manual_seed(i) if i % 2 else None for i in range(n)]
    tokens, logprobs = sample_next(logits, mixed, gens)
    assert torch.isfinite(logprobs).all() and int(tokens.max()) <= 2


def test_run_hosted_serves_batches_on_the_calling_thread(gen):
    """run_hosted: the model runs on the caller's thread, the event loop on a helper; same results."""
    import threading

    seen: set[int] = set()
    hook = gen.model.register_forward_hook(lambda *_: seen.add(threading.get_ident()))
    params = SamplingParams(temperature=0, max_tokens=8)

    async def main() -> list[Generation]:
        out: list[Generation | None] = [None] * len(PROMPTS)

        async def one(i: int) -> None:
            out[i] = await gen.generate(PROMPTS[i], params)

        async with anyio.create_task_group() as tg:
            for i in range(len(PROMPTS)):
                tg.start_soon(one, i)
        return out  # type: ignore[return-value]

    try:
        first = gen.run_hosted(lambda: anyio.run(main))
        second = gen.run_hosted(lambda: anyio.run(main))  # hosting again after a finished rollout
    finally:
        hook.remove()
    assert seen == {threading.get_ident()} and gen._thread is None
    assert [r.token_ids for r in first] == [r.token_ids for r in second] == [hf_greedy(gen.model, p, 8) for p in PROMPTS]
    assert gen.stats["batches"] == 2

    async def boom() -> None:
        await gen.generate(PROMPTS[0], params)
        raise KeyError("from the event loop")

    with pytest.raises(KeyError, match="from the event loop"):  # the helper's error reaches the caller
        gen.run_hosted(lambda: anyio.run(boom))

    async def close_inside() -> None:
        await gen.close()

    gen.run_hosted(lambda: anyio.run(close_inside))  # closing while hosted ends the serving loop
    with pytest.raises(GeneratorClosedError):
        anyio.run(gen.generate, PROMPTS[0], params)


def test_run_hosted_falls_back_when_a_worker_thread_serves(gen):
    params = SamplingParams(temperature=0, max_tokens=4)
    anyio.run(gen.generate, PROMPTS[0], params)  # starts the worker thread
    assert gen._thread is not None
    result = gen.run_hosted(lambda: anyio.run(gen.generate, PROMPTS[1], params))
    assert len(result.token_ids) == 4
    anyio.run(gen.close)


def test_cuda_graph_decoding_is_the_default_on_cuda_with_a_named_fallback(capsys):
    """generator.cuda_graphs=null: on for a supported model on CUDA, off on CPU; an unsupported model
    decodes eagerly with one line naming why, and an explicit true for it is an error."""
    import transformers as tf

    from agentrl.generators import _use_cuda_graphs

    full = tf.Qwen2ForCausalLM(tf.Qwen2Config(vocab_size=64, hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                                              num_key_value_heads=1, intermediate_size=64))
    sliding = tf.Qwen2ForCausalLM(tf.Qwen2Config(vocab_size=64, hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                                                 num_key_value_heads=1, intermediate_size=64, use_sliding_window=True, sliding_window=16))
    assert _use_cuda_graphs(None, cuda=False, model=full) is False
    assert capsys.readouterr().out == ""
    assert _use_cuda_graphs(True, cuda=False, model=full) is False  # CPU: the eager path, as before, said once
    assert capsys.readouterr().out == "generator: cuda_graphs=true has no effect without CUDA; decoding eagerly\n"
    assert _use_cuda_graphs(None, cuda=True, model=full) is True
    assert _use_cuda_graphs(False, cuda=True, model=full) is False
    assert capsys.readouterr().out == ""
    assert _use_cuda_graphs(None, cuda=True, model=sliding) is False
    line = capsys.readouterr().out.strip()
    assert line.startswith("generator: decoding without CUDA graphs:") and "sliding-window" in line and "\n" not in line
    with pytest.raises(ValueError, match="cuda_graphs=true: .*sliding-window"):
        _use_cuda_graphs(True, cuda=True, model=sliding)


def test_compiled_decode_step_compiles_once_for_every_batch_and_cache_length():
    """generator.compile_decode: one compile serves every (batch, cache length) shape. Compiled for
    its first shape, the step recompiled at the first new cache length, the first new batch size and
    a batch of one, each costing 25-47 s in the middle of a GPU rollout (benchmarks/RESULTS.md), and
    again where it was first traced attending to the whole cache."""
    from torch._dynamo.utils import counters

    from agentrl.generators.hf.static_decode import StaticDecoder

    m = tiny_model(0)
    plain = StaticDecoder(m, 0, use_graphs=False)
    compiled = StaticDecoder(m, 0, use_graphs=False, compile=True)
    before = counters["stats"]["unique_graphs"]
    with torch.no_grad():
        # (rows, new tokens, prompt length, steps): the first case attends to all of its cache's
        # columns (traced there, the step recompiled for every later shorter active length) and
        # has as many rows as the model's head dimension (32: traced there, the batch size was
        # fixed to it); the last crosses an active-length boundary (column 128), where the mask
        # and keys narrow
        for n, new, width, steps in [(32, 20, 200, 3), (8, 100, 3, 3), (8, 300, 3, 3), (4, 100, 3, 3), (1, 100, 3, 3), (16, 400, 3, 3), (4, 300, 125, 6)]:
            prompts = [[1 + (i + j) % 60 for j in range(width + i % 4)] for i in range(n)]
            a, b = plain.start(prompts, new), compiled.start(prompts, new)
            tok = a.prefill_logits.argmax(-1)
            for _ in range(steps):
                la, lb = a.step(tok), b.step(tok)
                assert lb.shape == la.shape == (n, 64)
                assert torch.allclose(la, lb, atol=1e-4), (la - lb).abs().max()
                tok = la.argmax(-1)
    assert m.config.head_dim == 32
    assert counters["stats"]["unique_graphs"] - before == 1


def test_compiled_decode_step_keeps_the_active_length_symbolic_when_it_equals_the_head_dimension():
    """Qwen3's heads are 128 wide, and so are a step's first active columns (ACTIVE_STEP): traced
    with duck sizing, the two shared one symbol, the active length was fixed to 128 and the step
    compiled again at 256 and 384 (a Qwen3-0.6B rollout spent 216 s capturing on an H200)."""
    from torch._dynamo.utils import counters

    from agentrl.generators.hf.static_decode import ACTIVE_STEP, StaticDecoder

    config = transformers.Qwen2Config(
        vocab_size=64, hidden_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        head_dim=ACTIVE_STEP, intermediate_size=128, tie_word_embeddings=True, max_position_embeddings=1024,
    )
    torch.manual_seed(0)
    dec = StaticDecoder(transformers.Qwen2ForCausalLM(config).eval(), 0, use_graphs=False, compile=True)
    before = counters["stats"]["unique_graphs"]
    with torch.no_grad():
        batch = dec.start([[1 + (i + j) % 60 for j in range(120 + i % 3)] for i in range(4)], 200)
        tok = batch.prefill_logits.argmax(-1)
        for _ in range(140):  # from column 122 (128 active columns) to 262 (384)
            tok = batch.step(tok).argmax(-1)
    assert batch.column > 2 * ACTIVE_STEP
    assert counters["stats"]["unique_graphs"] - before == 1


def test_a_static_cache_is_sized_to_128_columns_and_a_live_one_that_fits_is_reused():
    """A new cache is the need rounded up to 128 columns (256 gave a 64-row Qwen3 batch needing 357
    columns 512 of them: 1.1 GB never written); a live cache of the batch's rows that is at most
    256 longer serves a later need, so a multi-turn rollout whose needs move by a few tokens keeps
    its caches and graphs. Decoding on a reused, longer cache gives the same tokens."""
    from agentrl.generators.hf.static_decode import StaticDecoder

    dec = StaticDecoder(tiny_model(0), 0, use_graphs=False)
    prompt = [[1 + j % 60 for j in range(101)]] * 8
    first = dec.start(prompt, 256)  # needs 357
    assert dec.cache_length(8, 357) == 384 and first.slot.mask.shape[-1] == 384
    assert dec.cache_length(8, 300) == 384  # fits in the live cache
    assert dec.cache_length(8, 120) == 128  # 384 would be 264 columns more than it needs
    assert dec.cache_length(4, 300) == 384 and (4, 384) not in dec._slots  # another batch shape: its own
    longer = dec.start(prompt, 300)  # needs 401: a new cache of 512
    assert longer.slot.mask.shape[-1] == 512 and dec.cache_length(8, 380) == 384  # the smaller live one fits best
    tokens = []
    for batch in (dec.start(prompt, 29), StaticDecoder(tiny_model(0), 0, use_graphs=False).start(prompt, 29)):  # needs 130
        tok, got = batch.prefill_logits.argmax(-1), []
        for _ in range(5):
            tok = batch.step(tok).argmax(-1)
            got.append(tok.tolist())
        tokens.append((batch.slot.mask.shape[-1], got))
    assert tokens[0][0] == 384 and tokens[1][0] == 256 and tokens[0][1] == tokens[1][1]


def test_keyed_gumbel_max_draws_the_tempered_distribution_from_each_rows_own_stream():
    """The compiled CUDA path's seeded sampler (eagerly and compiled on this CPU): the tempered
    distribution with exact log-probabilities, one stream per (key, count), whatever the batch."""
    from agentrl.generators.hf.sampling import RowStreams, _compiled_keyed_gumbel_max, keyed_gumbel_max

    for draw in (keyed_gumbel_max, _compiled_keyed_gumbel_max()):
        streams = RowStreams(list(range(4096)), torch.device("cpu"))  # 4096 seeds: 4096 independent draws
        check_gumbel_max(lambda logits, inv, d=draw, s=streams: d(logits, s.keys, s.counts, inv), "cpu")
        # the same stream position draws the same token alone or beside others; the next one moves on
        logits = torch.randn(6, 5000)
        keys, counts = streams.keys[:6], torch.tensor([0, 3, 3, 9, 0, 1])
        together, lp = draw(logits, keys, counts, 1.3)
        alone = [draw(logits[i : i + 1], keys[i : i + 1], counts[i : i + 1], 1.3)[0].item() for i in range(6)]
        assert together.tolist() == alone
        assert torch.allclose(lp, (logits * 1.3).log_softmax(-1).gather(1, together[:, None]).squeeze(1), atol=1e-5)
        draws = torch.stack([draw(logits[:1].expand(64, -1), keys[:1].expand(64), torch.arange(64), 1.0)[0]])
        assert len(set(draws.flatten().tolist())) > 30  # a row's successive draws are not stuck


def test_the_compiled_samplers_compile_once_whatever_the_temperature_or_caller():
    """The first draw of a batch (``sample_next``) passed ``1 / T`` as a float and the captured step
    its own ``[1]`` tensor, so every process compiled the keyed sampler twice (recompile logs of an
    H200 run), and a new temperature meant another compile. One tensor per temperature now."""
    from torch._dynamo.utils import counters

    from agentrl.generators.hf.sampling import (
        RowStreams,
        _compiled_keyed_gumbel_max,
        inverse_temperature,
        sample_next,
    )

    logits, n = torch.randn(8, 300), 8
    streams = RowStreams(list(range(n)), torch.device("cpu"))
    seeded = [torch.Generator().manual_seed(i) for i in range(n)]
    sample_next(logits, [SamplingParams(temperature=0.7)] * n, seeded, fused=True, streams=streams)  # compiles, or finds
    sample_next(logits, [SamplingParams(temperature=0.7)] * n, [None] * n, fused=True)
    before = counters["stats"]["unique_graphs"]
    for t in (1.3, 0.4):
        tok, lp = sample_next(logits, [SamplingParams(temperature=t)] * n, seeded, fused=True, streams=streams)
        assert torch.allclose(lp, (logits / t).log_softmax(-1).gather(1, tok[:, None]).squeeze(1), atol=1e-5)
        sample_next(logits, [SamplingParams(temperature=t)] * n, [None] * n, fused=True)
    step_inv_t = torch.full((1,), 1 / 0.9)  # what a captured static step passes (its own buffer, filled)
    _compiled_keyed_gumbel_max()(logits[:5], streams.keys[:5], streams.counts[:5], step_inv_t)
    assert counters["stats"]["unique_graphs"] == before
    assert inverse_temperature(0.7, torch.device("cpu")) is inverse_temperature(0.7, "cpu")  # made once


def test_a_seeded_request_on_the_compiled_static_path_is_the_same_alone_or_in_a_batch(model_path):
    """The compiled decode path (the CUDA default, compiled here on the CPU) draws seeded rows from
    device streams; a request must still not depend on its batch companions, and its seed matters."""
    model = transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    target = (PROMPTS[2], SamplingParams(temperature=1.0, max_tokens=12, seed=1234))

    def fresh() -> TransformersGenerator:
        return TransformersGenerator(model, 0, static_cache=True, compile_decode=True, gather_window_s=0.2)

    from agentrl.generators.hf.sampling import _compiled_keyed_gumbel_max

    used = _compiled_keyed_gumbel_max.cache_info().hits
    alone = run_all(fresh(), [target])[0]
    assert _compiled_keyed_gumbel_max.cache_info().hits > used  # drawn from the device streams
    companions = [(p, SamplingParams(temperature=1.0, max_tokens=20, seed=s)) for s, p in enumerate(PROMPTS)]
    companions += [(p, SamplingParams(temperature=1.0, max_tokens=5)) for p in PROMPTS]
    gen = fresh()
    together = run_all(gen, companions[:3] + [target] + companions[3:])
    assert gen.stats["batches"] == 1
    assert together[3].token_ids == alone.token_ids
    assert together[3].logprobs == pytest.approx(alone.logprobs, abs=1e-4)
    other = run_all(fresh(), [(PROMPTS[2], SamplingParams(temperature=1.0, max_tokens=12, seed=4321))])[0]
    assert other.token_ids != alone.token_ids


def test_static_decode_attends_to_the_written_columns_only_and_matches_the_dynamic_cache(model_path):
    """The static path gives each step the cache's columns up to the next multiple of ACTIVE_STEP
    (one graph per length on CUDA): greedy decoding across those boundaries, with rows of other
    prompt lengths, must match the dynamic cache token for token."""
    from agentrl.generators.hf.static_decode import ACTIVE_STEP, StaticDecoder

    model = transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    prompts = [[1 + (3 * i + j) % 60 for j in range(20 + 37 * i)] for i in range(4)]  # 20-131 tokens
    params = SamplingParams(temperature=0, max_tokens=2 * ACTIVE_STEP + 20)
    static = TransformersGenerator(model, 0, static_cache=True, gather_window_s=0.2)
    assert isinstance(static.static, StaticDecoder)
    a = run_all(static, [(p, params) for p in prompts])
    dynamic = TransformersGenerator(model, 0, static_cache=False, gather_window_s=0.2)
    b = run_all(dynamic, [(p, params) for p in prompts])
    assert [len(x.token_ids) for x in a] == [params.max_tokens] * 4
    for x, y in zip(a, b):
        assert x.token_ids == y.token_ids
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)
    slot = next(iter(static.static._slots.values()))
    assert sorted(size for size, _ in slot.active) == [256, 384, 512]  # the longest prompt ends past column 128, its last token before 512
    # the batch's trace entry says where its time went; on the CPU no graph is captured and the
    # host never waits for a device (the GPU group checks the CUDA side)
    batch = static.stats["trace"][-1]
    assert (batch["captures"], batch["capture_s"], batch["wait_s"]) == (0, 0.0, 0.0)
    assert "wait_s" not in dynamic.stats["trace"][-1] and dynamic.stats["trace"][-1]["requests"] == 4


def test_a_step_that_samples_inside_itself_draws_what_the_host_sampler_draws(model_path):
    """The compiled static path (the CUDA default; compiled on this CPU, where the "graph" is the same
    step run eagerly) samples inside the step: the stream draws, min_tokens holding back up to
    STOP_WIDTH stop ids, the next token fed to the next step. It must draw what the host-side
    sampler draws from the same streams, token for token, and never stop before min_tokens."""
    model = transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    stops = [1, 2, 3, 4, 5, 6]  # a tenth of the tiny vocabulary: sampled early unless held back
    requests = [
        (p, SamplingParams(temperature=0.8, max_tokens=24, min_tokens=12 if i % 2 else 0, stop_token_ids=stops, seed=70 + i))
        for i, p in enumerate(PROMPTS * 2)
    ]

    def run(in_step: bool) -> tuple[list[Generation], TransformersGenerator]:
        gen = TransformersGenerator(model, 0, static_cache=True, compile_decode=True, gather_window_s=0.2, sample_in_step=in_step)
        return run_all(gen, requests), gen

    (inside, a), (outside, b) = run(True), run(False)
    assert a.stats["sampled_in_step"] == 1 and b.stats["sampled_in_step"] == 0 and a.stats["batches"] == 1
    for x, y, (_, sp) in zip(inside, outside, requests):
        assert x.token_ids == y.token_ids and x.finish_reason == y.finish_reason
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)
        assert not set(x.token_ids[: sp.min_tokens]) & set(stops)
    assert any(x.finish_reason == "stop" for x in inside)  # the stops are reachable, so min_tokens did hold them


def test_sampling_inside_the_step_is_on_by_default_and_off_from_the_config():
    """generator.sample_in_step reaches the transformers generator: on by default (it applies only
    to the compiled static step), ``false`` turns it off, and other backends refuse it by name."""
    from agentrl.core.overrides import build, parse_overrides
    from agentrl.core.strict import ConfigError
    from agentrl.generators import build_generator
    from agentrl.generators.config import GeneratorConfig

    model = tiny_model(0)
    assert GeneratorConfig().sample_in_step is True
    off = build(GeneratorConfig, parse_overrides(["sample_in_step=false"]))
    gen = build_generator(off, model_path="unused", pad_token_id=0, max_context=None, model=model)
    assert gen.sample_in_step is False
    assert build_generator(GeneratorConfig(), model_path="unused", pad_token_id=0, max_context=None, model=model).sample_in_step is True
    with pytest.raises((ValueError, ConfigError), match="sample_in_step: only for backend=transformers"):
        build(GeneratorConfig, parse_overrides(["backend=vllm-server", "sample_in_step=true"]))


def test_keyed_uniforms_stay_strictly_inside_the_unit_interval_at_the_extreme_hashes():
    """A hash of all ones once made u == 1.0 (float32 rounding), an infinite Gumbel noise and a
    uniformly random winner: ~0.9% of draws at a 151,936-token vocabulary, too rare for the
    distribution tests to see. Every 32-bit hash must give 0 < u < 1 and a finite noise."""
    from agentrl.generators.hf.sampling import _unit_interval

    bits = torch.tensor([0, 1, 2**31, 2**32 - 512, 2**32 - 257, 2**32 - 2, 2**32 - 1], dtype=torch.long)
    for compiled in (False, True):
        u = (torch.compile(_unit_interval) if compiled else _unit_interval)(bits)
        assert bool(((u > 0) & (u < 1)).all()), u.tolist()
        assert bool(torch.isfinite(u.log().neg().log()).all())
