"""With ``check_model=true``: does the model fit the tokenizer, and does a greedy turn stop and parse?

A template can be perfect and the model still never write its end-of-turn token or its call
syntax (a base model, a fine-tune on another template). One short greedy generation through the
same generator and parser the rollout engine uses shows it.
"""

from __future__ import annotations

from typing import Any

import agentrl.doctor.material as M
from agentrl.doctor.checks import FAIL, PASS, WARN, Check, parse, short


def load_for_check(spec: str, device: str | None) -> tuple[Any, Check | None]:
    """The model, or a FAIL check saying why it could not be loaded."""
    from transformers.utils import logging as hf_logging

    from agentrl.compute.models import load_model
    from agentrl.doctor.loading import DoctorError, load_offline_first

    hf_logging.disable_progress_bar()  # the report is the output; a weights bar would interleave with it
    try:
        return load_offline_first(spec, lambda path, **kw: load_model(path, device=device, **kw), "model"), None
    except DoctorError as exc:
        return None, Check("model loads", FAIL, f"could not load a causal LM: {exc}")


def check_vocab(model: Any, tokenizer: Any) -> Check:
    rows = model.get_input_embeddings().num_embeddings
    if rows < len(tokenizer):
        return Check("model matches tokenizer", FAIL, f"the embedding has {rows} rows but the tokenizer has {len(tokenizer)} tokens: "
                     "ids past the embedding crash generation")  # fmt: skip
    return Check("model matches tokenizer", PASS, f"{rows} embedding rows for {len(tokenizer)} tokens")


def episode_start(env_name: str | None) -> tuple[list[M.Message], list[M.Message] | None, str]:
    """The opening messages and tool schemas to generate from: an environment's first test task or the doctor's own."""
    if env_name is None:
        return M.history(), M.TOOLS, "the doctor's flight/weather prompt"
    import anyio

    from agentrl.env.registry import make

    env = make(env_name)
    try:  # the test split is small and what evaluation uses; building a train split can take seconds
        task, where = dict(env.dataset("test")[0]), f"environment {env_name!r}, first test task"
    except Exception:
        task, where = None, f"environment {env_name!r}, seed 0"
    messages, _info = anyio.run(lambda: env.reset(task=task, seed=0))
    return list(messages), env.tool_schemas() or None, where


def check_generation(fmt: Any, model: Any, env_name: str | None, max_new_tokens: int) -> Check:
    """Greedy-generate one assistant turn with agentrl's transformers generator and parse it."""
    import anyio

    from agentrl.compute.models import pad_token_id
    from agentrl.generators.hf.generator import TransformersGenerator
    from agentrl.generators.protocol import SamplingParams

    name = "greedy generation parses"
    messages, tools, where = episode_start(env_name)
    prompt = fmt.render(messages, tools)
    pad = pad_token_id(fmt.tokenizer, fmt.stop_token_ids)
    generator = TransformersGenerator(model, pad_token_id=pad, max_batch_size=1)
    sampling = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, stop_token_ids=list(fmt.stop_token_ids))

    async def run() -> Any:
        try:
            return await generator.generate(prompt, sampling)
        finally:
            await generator.close()

    gen = anyio.run(run)
    parsed = parse(fmt, gen.token_ids, tools)
    texts = {"generated text": fmt.decode(gen.token_ids)}
    calls = [f"{c.name}({c.arguments if c.arguments is not None else c.raw_arguments})" for c in parsed.tool_calls]
    details = [
        f"prompt: {where} ({short(str(messages[-1].get('content')), 100)!r}), {len(prompt)} ids; "
        f"generated {len(gen.token_ids)} ids, finish_reason={gen.finish_reason}",
        f"parsed: content={short(parsed.content, 120)!r}, "
        + (f"reasoning={short(parsed.reasoning, 80)!r}, " if parsed.reasoning is not None else "")
        + f"calls={calls}",
        *(f"issue {i.kind}: {i.detail}" for i in parsed.issues),
    ]
    if gen.finish_reason == "stop" and not parsed.issues:
        what = f"{len(calls)} tool call(s)" if calls else "a plain answer"
        return Check(name, PASS, f"stopped on the end-of-turn token after {len(gen.token_ids)} ids; parsed {what}", details, texts=texts)
    why = "did not stop within max_new_tokens" if gen.finish_reason != "stop" else "the output has parse issues"
    return Check(name, WARN, f"{why} (the model, not the template: is it trained on this format?)", details, texts=texts)
