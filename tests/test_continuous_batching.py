"""Continuous batching on the static-cache decode path (eagerly on the CPU; a CUDA graph on a GPU):
a finished row's request is answered at once, and a request queued meanwhile takes its row over."""

from __future__ import annotations

import threading
import time

import anyio
import pytest
import torch
from test_generator_transformers import hf_greedy, tiny_model

from agentrl.generators.hf.generator import GenerationError, TransformersGenerator
from agentrl.generators.hf.static_decode import StaticBatch, StaticDecoder
from agentrl.generators.protocol import Generation, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=8)


def static_generator(model: torch.nn.Module | None = None, **kwargs) -> TransformersGenerator:
    kwargs.setdefault("continuous", True)
    gen = TransformersGenerator(model if model is not None else tiny_model(0), 0, gather_window_s=0.05, **kwargs)
    gen.static = StaticDecoder(gen.model, 0, use_graphs=False)
    return gen


def follow_up(gen: TransformersGenerator, first: list, then: tuple, before_then=None) -> tuple[list[Generation], Generation, list[str]]:
    """Start ``first`` (name, prompt, params) requests together; when the one named "short" returns,
    send ``then`` (prompt, params) while the others still decode. Returns the results, ``then``'s
    result and the order in which the requests were answered."""
    order: list[str] = []
    out: dict[str, Generation] = {}

    async def main() -> None:
        async def one(name: str, prompt: list[int], params: SamplingParams) -> None:
            out[name] = await gen.generate(prompt, params)
            order.append(name)
            if name == "short":
                if before_then is not None:
                    await anyio.to_thread.run_sync(before_then)
                out["then"] = await gen.generate(*then)
                order.append("then")

        async with anyio.create_task_group() as tg:
            for name, prompt, params in first:
                tg.start_soon(one, name, prompt, params)
        await gen.close()

    anyio.run(main)
    return [out[name] for name, _, _ in first], out["then"], order


def logprobs_of(model: torch.nn.Module, prompt: list[int], res: Generation, temperature: float = 1.0) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + res.token_ids])).logits[0, len(prompt) - 1 : -1]
    return (logits / temperature).log_softmax(-1).gather(1, torch.tensor(res.token_ids)[:, None]).squeeze(1)


def test_a_request_sent_mid_batch_takes_a_finished_row_and_decodes_as_if_alone():
    gen = static_generator(admit_every=1)
    long_prompt, short_prompt, late_prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [5, 9, 13], [7, 7, 30, 31, 50, 2]
    (long, short), late, order = follow_up(
        gen,
        [("long", long_prompt, SamplingParams(temperature=0, max_tokens=300)), ("short", short_prompt, SamplingParams(temperature=0, max_tokens=3))],
        (late_prompt, GREEDY),
    )
    assert gen.stats["batches"] == 1 and gen.stats["admitted"] == 1  # no second batch: it joined the running one
    assert order == ["short", "then", "long"]  # the short one was answered while the long one still ran
    assert late.token_ids == hf_greedy(gen.model, late_prompt, 8)
    assert torch.allclose(torch.tensor(late.logprobs), logprobs_of(gen.model, late_prompt, late), atol=1e-4)
    assert long.token_ids == hf_greedy(gen.model, long_prompt, 300)  # the row beside it is untouched
    assert short.token_ids == hf_greedy(gen.model, short_prompt, 3)


def test_a_request_admitted_mid_batch_keeps_its_stop_token_back_for_its_own_min_tokens():
    gen = static_generator(admit_every=1)
    late_prompt = [7, 7, 30, 31, 50, 2]
    stop = hf_greedy(gen.model, late_prompt, 1)[0]  # greedy would stop at once if this were a stop token
    _, late, _ = follow_up(
        gen,
        [("long", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], SamplingParams(temperature=0, max_tokens=60)), ("short", [5, 9, 13], SamplingParams(temperature=0, max_tokens=3))],
        (late_prompt, SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[stop], min_tokens=4)),
    )
    assert gen.stats["admitted"] == 1  # it joined the running batch, 4 steps after the batch began
    assert len(late.token_ids) >= 4 and stop not in late.token_ids[:4]


def test_a_seeded_request_samples_the_same_tokens_whether_admitted_or_alone():
    seeded = SamplingParams(temperature=0.8, max_tokens=12, seed=7)
    prompt = [4, 8, 15, 16]
    gen = static_generator(admit_every=1)
    _, joined, _ = follow_up(
        gen,
        [("long", [3] * 12, SamplingParams(temperature=0, max_tokens=300)), ("short", [9, 9], SamplingParams(temperature=0, max_tokens=2))],
        (prompt, seeded),
    )
    assert gen.stats["admitted"] == 1
    alone = static_generator()

    async def solo() -> Generation:
        try:
            return await alone.generate(prompt, seeded)
        finally:
            await alone.close()

    assert joined.token_ids == anyio.run(solo).token_ids
    assert torch.allclose(torch.tensor(joined.logprobs), logprobs_of(alone.model, prompt, joined, 0.8), atol=1e-4)


@pytest.mark.parametrize(
    "late", [([2] * 40, GREEDY), ([2, 3], SamplingParams(temperature=0, max_tokens=253))], ids=["prompt-past-the-column", "output-past-the-cache"]
)
def test_a_request_that_does_not_fit_the_running_batch_waits_for_the_next(late):
    """The first prompt ends at a column the running rows have not reached; the second would run
    past the end of the batch's cache (prompt 3 + 100 tokens: 256 columns) from any column it can
    join at (at least 3, the first prompts' width: 3 + 253 + 1 > 256), however late it arrives."""
    gen = static_generator(admit_every=1)
    first = [("long", [1, 2, 3], SamplingParams(temperature=0, max_tokens=100)), ("short", [5, 9, 13], SamplingParams(temperature=0, max_tokens=2))]
    _, res, _ = follow_up(gen, first, late)
    if len(late[0]) == 40:  # admitted once the batch reached column 40
        assert gen.stats["batches"] == 1 and gen.stats["admitted"] == 1
    else:
        assert gen.stats["batches"] == 2 and gen.stats["admitted"] == 0
    assert res.token_ids == hf_greedy(gen.model, late[0], late[1].max_tokens)


def test_no_request_joins_while_a_weight_update_waits_for_the_batch():
    gen = static_generator(admit_every=1)
    updated = threading.Event()

    def start_update() -> None:  # blocks until the running batch ends; the late request must not keep it running
        threading.Thread(target=lambda: (gen.update_weights(tiny_model(1).state_dict()), updated.set()), daemon=True).start()
        deadline = time.monotonic() + 10
        while gen._updates_waiting == 0 and time.monotonic() < deadline:
            time.sleep(0.001)

    late_prompt = [7, 7, 30]
    _, late, _ = follow_up(
        gen,
        [("long", [1, 2, 3, 4], SamplingParams(temperature=0, max_tokens=300)), ("short", [5, 9], SamplingParams(temperature=0, max_tokens=2))],
        (late_prompt, GREEDY),
        before_then=start_update,
    )
    assert updated.wait(10)
    assert gen.stats["admitted"] == 0 and gen.stats["batches"] == 2
    assert late.token_ids == hf_greedy(tiny_model(1), late_prompt, 8)  # decoded after the update, with its weights


def test_a_failure_after_admission_fails_the_admitted_request_and_keeps_answers_already_given(monkeypatch):
    gen = static_generator(admit_every=1)
    plain = StaticBatch.admit
    calls = {"n": 0}

    def admit_then_fail(self, rows, prompts):  # the admission works; the next step fails
        calls["n"] += 1
        out = plain(self, rows, prompts)
        monkeypatch.setattr(StaticBatch, "step", lambda self, tokens: (_ for _ in ()).throw(RuntimeError("device lost")))
        return out

    monkeypatch.setattr(StaticBatch, "admit", admit_then_fail)
    errors: dict[str, BaseException] = {}
    answers: dict[str, Generation] = {}

    async def main() -> None:
        async def one(name: str, prompt: list[int], params: SamplingParams) -> None:
            try:
                answers[name] = await gen.generate(prompt, params)
            except GenerationError as e:
                errors[name] = e
            if name == "short":
                await one("late", [7, 7, 30], GREEDY)

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, "long", [1, 2, 3, 4], SamplingParams(temperature=0, max_tokens=300))
            tg.start_soon(one, "short", [5, 9], SamplingParams(temperature=0, max_tokens=2))
        await gen.close()

    anyio.run(main)
    assert calls["n"] == 1
    assert set(answers) == {"short"} and len(answers["short"].token_ids) == 2
    assert set(errors) == {"long", "late"} and "device lost" in str(errors["late"])


def test_admit_every_must_be_positive():
    with pytest.raises(ValueError, match="admit_every"):
        TransformersGenerator(tiny_model(0), 0, admit_every=0)


def test_continuous_batching_is_opt_in():
    from agentrl.generators.config import GeneratorConfig

    assert TransformersGenerator(tiny_model(0), 0).continuous is False
    assert GeneratorConfig().continuous_batching is False


def test_requests_join_in_groups_of_an_eighth_of_the_batch():
    """16 rows: a single late request waits for a second one (or for ``admit_every`` steps), so
    two requests sent together join in one admission, one prefill."""
    gen = static_generator(admit_every=1000)
    quick = [(f"q{i}", [5, i + 1], SamplingParams(temperature=0, max_tokens=2)) for i in range(14)]
    first = [("long", [1, 2, 3], SamplingParams(temperature=0, max_tokens=300)), ("short", [5, 9, 13], SamplingParams(temperature=0, max_tokens=2)), *quick]
    out: dict[str, Generation] = {}

    async def main() -> None:
        async def one(name: str, prompt: list[int], params: SamplingParams) -> None:
            out[name] = await gen.generate(prompt, params)
            if name == "short":
                async with anyio.create_task_group() as tg:
                    tg.start_soon(one, "late1", [7, 7, 30], GREEDY)
                    await anyio.sleep(0.02)  # the first waits: one request is not a group of two
                    tg.start_soon(one, "late2", [8, 30], GREEDY)

        async with anyio.create_task_group() as tg:
            for name, prompt, params in first:
                tg.start_soon(one, name, prompt, params)
        await gen.close()

    anyio.run(main)
    assert gen.stats["batches"] == 1 and gen.stats["admitted"] == 2 and gen.stats["admissions"] == 1
    assert out["late1"].token_ids == hf_greedy(gen.model, [7, 7, 30], 8)
    assert out["late2"].token_ids == hf_greedy(gen.model, [8, 30], 8)


def test_without_continuous_batching_every_request_is_answered_when_its_batch_ends():
    gen = static_generator(continuous=False, admit_every=1)
    first = [("long", [1, 2, 3, 4], SamplingParams(temperature=0, max_tokens=60)), ("short", [5, 9], SamplingParams(temperature=0, max_tokens=2))]
    _, late, order = follow_up(gen, first, ([7, 7, 30], GREEDY))
    assert gen.stats["admitted"] == 0 and gen.stats["batches"] == 2
    assert order.index("long") < order.index("then")  # the short one's answer waited for the long one
    assert late.token_ids == hf_greedy(gen.model, [7, 7, 30], 8)
