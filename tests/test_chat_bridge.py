"""ChatFormat.bridge: exact ids between a sampled assistant turn and the next one, or a precise refusal."""

from __future__ import annotations

import re
from typing import Any

import pytest
from chat_fixtures import TOOLS, build_tiny_tokenizer, load_asset_tokenizer, tool_call, tool_result

from agentrl.chat import ChatFormat, get_chat_format

SYSTEM = {"role": "system", "content": "Be brief."}
USER = {"role": "user", "content": "What is the weather in Paris?"}
REASONING = "The user wants the weather.\nI should call get_weather."
WEATHER = '{"temp_c": 21, "sky": "sunny"}'
CHATML_TOOL_TURN = (
    f"\n<|im_start|>user\n<tool_response>\n{WEATHER}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
)

# Renders reasoning only in the final message: history is rewritten as soon as anything follows.
STRIPPING_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.role == 'assistant' and message.reasoning_content and loop.last %}"
    "{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{{- message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def assistant(reasoning: str | None = None, content: str = "", **call_args: Any) -> dict[str, Any]:
    call = tool_call("get_weather", call_args or {"city": "Paris"}, "call_0")
    msg: dict[str, Any] = {"role": "assistant", "content": content, "tool_calls": [call]}
    if reasoning is not None:
        msg["reasoning_content"] = reasoning
    return msg


def canonical_turn(fmt: ChatFormat, history: list[dict], reply: dict, **kw: Any) -> tuple[list[int], list[int]]:
    """(prompt ids, sampled ids through end of turn) as if the model wrote ``reply`` canonically."""
    prompt = fmt.render(history, TOOLS, **kw)
    full = fmt.render([*history, reply], TOOLS, add_generation_prompt=False, **kw)
    assert full[: len(prompt)] == prompt, "the template's generation prompt is not a prefix of the turn"
    last_eot = max(i for i, t in enumerate(full) if t in fmt.eot_token_ids)
    return prompt, full[len(prompt) : last_eot + 1]


def run_rounds(fmt: ChatFormat, rounds: list[tuple[dict, list[dict]]], **kw: Any) -> list[int]:
    """Play an episode turn by turn with parse + bridge only; check the ids against one full render."""
    messages = [SYSTEM, USER]
    ids = fmt.render(messages, TOOLS, **kw)
    for reply, env_messages in rounds:
        _, sampled = canonical_turn(fmt, messages, reply, **kw)
        parsed = fmt.parse(sampled)
        assert parsed.issues == []
        messages.append(parsed.to_message())
        ids += sampled
        result = fmt.bridge(messages, env_messages, ids, TOOLS, **kw)
        assert result.proven, result.reason
        ids += result.ids
        messages += env_messages
    assert ids == fmt.render(messages, TOOLS, **kw)
    return ids


def bridge_text(fmt: ChatFormat, reply: dict, env_messages: list[dict], **kw: Any) -> str:
    prompt, sampled = canonical_turn(fmt, [SYSTEM, USER], reply, **kw)
    result = fmt.bridge([SYSTEM, USER, reply], env_messages, prompt + sampled, TOOLS, **kw)
    assert result.proven, result.reason
    return fmt.decode(result.ids)


def refusal(fmt: ChatFormat, reply: dict, env_messages: list[dict], **kw: Any) -> str:
    prompt, sampled = canonical_turn(fmt, [SYSTEM, USER], reply, **kw)
    result = fmt.bridge([SYSTEM, USER, reply], env_messages, prompt + sampled, TOOLS, **kw)
    assert result.ids is None and not result.proven
    return result.reason


# ------------------------------------------------------------------ our template, tiny tokenizer
@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> ChatFormat:
    return get_chat_format(build_tiny_tokenizer(tmp_path_factory.mktemp("tiny")))


@pytest.mark.parametrize("reasoning", [None, REASONING])
def test_tiny_tool_result(tiny: ChatFormat, reasoning: str | None) -> None:
    assert bridge_text(tiny, assistant(reasoning), [tool_result(WEATHER)]) == CHATML_TOOL_TURN


def test_tiny_several_tool_results_share_one_turn(tiny: ChatFormat) -> None:
    text = bridge_text(tiny, assistant(), [tool_result("1"), tool_result("2", call_id="call_1")])
    assert text == "\n<|im_start|>user\n<tool_response>\n1\n</tool_response>\n<tool_response>\n2\n</tool_response>" \
        "<|im_end|>\n<|im_start|>assistant\n"  # fmt: skip


def test_tiny_multi_round_episode(tiny: ChatFormat) -> None:
    run_rounds(tiny, [
        (assistant(None), [tool_result(WEATHER)]),
        (assistant(None, "Again.", city="Lyon"), [tool_result("{}")]),
        ({"role": "assistant", "content": "Sunny, 21 degrees."}, [{"role": "user", "content": "Thanks! 1+2?"}]),
        (assistant(None), [tool_result("3")]),
    ])  # fmt: skip


def test_tiny_multi_round_episode_with_reasoning(tmp_path: Any) -> None:
    """Our template keeps reasoning everywhere, so even a new user turn after reasoning is provable.
    It renders reasoning as <think> blocks, which the 'qwen3' parser reads (detection says 'hermes')."""
    fmt = get_chat_format(build_tiny_tokenizer(tmp_path), chat_format="qwen3")
    final = {"role": "assistant", "content": "Sunny, 21 degrees.", "reasoning_content": "Done."}
    run_rounds(fmt, [
        (assistant(REASONING), [tool_result(WEATHER)]),
        (assistant(None, "Again.", city="Lyon"), [tool_result("{}")]),
        (final, [{"role": "user", "content": "Thanks! And 1+2?"}]),
        (assistant(REASONING), [tool_result("3")]),
    ])  # fmt: skip


def test_tiny_sampled_ids_need_not_be_canonical(tiny: ChatFormat) -> None:
    """Only the end-of-turn token of the sampled ids matters; their tokenisation may be unusual."""
    prompt, sampled = canonical_turn(tiny, [SYSTEM, USER], assistant())
    text = tiny.decode(sampled[:-1])
    spelled = [i for piece in re.split(r"(<[^<>]+>)", text) if piece
               for i in (tiny.encode(piece) if piece.startswith("<") else [j for ch in piece for j in tiny.encode(ch)])]
    assert spelled != sampled[:-1] and tiny.decode(spelled) == text
    a = tiny.bridge([SYSTEM, USER, assistant()], [tool_result(WEATHER)], prompt + sampled, TOOLS)
    b = tiny.bridge([SYSTEM, USER, assistant()], [tool_result(WEATHER)], prompt + spelled + sampled[-1:], TOOLS)
    assert a.proven and a.ids == b.ids


def test_tiny_refusals(tiny: ChatFormat) -> None:
    prompt, sampled = canonical_turn(tiny, [SYSTEM, USER], assistant())
    messages = [SYSTEM, USER, assistant()]
    capped = tiny.bridge(messages, [tool_result(WEATHER)], prompt + sampled[:-1], TOOLS)
    assert capped.ids is None and "length cap" in capped.reason and "<|im_end|>" in capped.reason
    eos = tiny.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    other_stop = tiny.bridge(messages, [tool_result(WEATHER)], prompt + sampled[:-1] + [eos], TOOLS)
    assert other_stop.ids is None and "<|endoftext|>" in other_stop.reason
    not_assistant = tiny.bridge([*messages, tool_result(WEATHER)], [USER], prompt + sampled, TOOLS)
    assert not_assistant.ids is None and "must end with the assistant" in not_assistant.reason


def test_stripping_template_is_not_provable(tmp_path: Any) -> None:
    fmt = get_chat_format(build_tiny_tokenizer(tmp_path, STRIPPING_TEMPLATE), chat_format="hermes")
    reply = {"role": "assistant", "content": "It is sunny.", "reasoning_content": REASONING}
    reason = refusal(fmt, reply, [{"role": "user", "content": "Thanks"}])
    assert "first differ at token" in reason and "<think>" in reason, reason
    plain = {"role": "assistant", "content": "It is sunny."}
    assert bridge_text(fmt, plain, [{"role": "user", "content": "Thanks"}]) == \
        "\n<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n"  # fmt: skip


# ------------------------------------------------------------------ SmolLM2's real ChatML template
def test_smollm2_real_template() -> None:
    fmt = get_chat_format(load_asset_tokenizer("smollm2"), chat_format="hermes")
    assert fmt.eot_token_ids[0] == fmt.tokenizer.convert_tokens_to_ids("<|im_end|>")
    history = [USER]
    reply = {"role": "assistant", "content": "Sunny in Paris."}
    prompt = fmt.render(history)
    full = fmt.render([*history, reply], add_generation_prompt=False)
    sampled = full[len(prompt) : -1]
    follow = [{"role": "user", "content": "And tomorrow?"}]
    result = fmt.bridge([*history, reply], follow, prompt + sampled)
    assert result.proven, result.reason
    assert fmt.decode(result.ids) == "\n<|im_start|>user\nAnd tomorrow?<|im_end|>\n<|im_start|>assistant\n"
    assert prompt + sampled + result.ids == fmt.render([*history, reply, *follow])


# ------------------------------------------------------------------ Qwen3's real template
@pytest.fixture(scope="module")
def qwen3() -> ChatFormat:
    """Qwen3's own template, as inference uses it (the training template is tested below)."""
    return get_chat_format(load_asset_tokenizer("qwen3"), training_template=False)


@pytest.fixture(scope="module")
def qwen3_training() -> ChatFormat:
    return get_chat_format(load_asset_tokenizer("qwen3"))


def test_qwen3_uses_the_verified_training_template(qwen3: ChatFormat, qwen3_training: ChatFormat) -> None:
    assert qwen3.template_source == "tokenizer" and qwen3.chat_template is None
    assert qwen3_training.template_source.startswith("training template qwen3_training.jinja")
    assert get_chat_format(qwen3.tokenizer, chat_template=qwen3.tokenizer.chat_template).template_source == "override"


def test_qwen3_tool_result_after_reasoning(qwen3: ChatFormat) -> None:
    assert bridge_text(qwen3, assistant(REASONING), [tool_result(WEATHER)]) == CHATML_TOOL_TURN


@pytest.mark.parametrize("which", ["qwen3", "qwen3_training"])
def test_qwen3_multi_round_tool_loop_with_reasoning(which: str, request: pytest.FixtureRequest) -> None:
    run_rounds(request.getfixturevalue(which), [
        (assistant(REASONING), [tool_result(WEATHER)]),
        (assistant("Now Lyon.", "Checking Lyon too.", city="Lyon"), [tool_result("{}"), tool_result("{}")]),
        (assistant("Last one.", city="Nice"), [tool_result(WEATHER)]),
    ])  # fmt: skip


@pytest.mark.parametrize("template_kwargs", [{}, {"enable_thinking": False}])
def test_qwen3_tool_result_without_reasoning_is_not_provable(qwen3: ChatFormat, qwen3_training: ChatFormat,
                                                             template_kwargs: dict) -> None:  # fmt: skip
    """Qwen3 writes an empty <think> block into the *final* assistant turn but drops it from an
    earlier turn without reasoning, so appending tool results rewrites that turn; the training
    template keeps the block, so there the same bridge is proven."""
    reason = refusal(qwen3, assistant(None), [tool_result(WEATHER)], **template_kwargs)
    assert "first differ at token" in reason and "<think>" in reason, reason
    empty_think = "<think>\n\n</think>\n\n" if template_kwargs else ""  # thinking off: the prompt closes it
    text = bridge_text(qwen3_training, assistant(None), [tool_result(WEATHER)], **template_kwargs)
    assert text == CHATML_TOOL_TURN + empty_think


def test_qwen3_new_user_turn_strips_reasoning(qwen3: ChatFormat, qwen3_training: ChatFormat) -> None:
    """A new (non tool-response) user message moves Qwen3's 'last query' and strips earlier reasoning."""
    reply = {"role": "assistant", "content": "Sunny.", "reasoning_content": REASONING}
    follow = [{"role": "user", "content": "Thanks! Tomorrow?"}]
    reason = refusal(qwen3, reply, follow)
    assert "first differ at token" in reason and "<think>" in reason, reason
    assert bridge_text(qwen3_training, reply, follow) == \
        "\n<|im_start|>user\nThanks! Tomorrow?<|im_end|>\n<|im_start|>assistant\n"  # fmt: skip


def test_qwen3_training_episode_with_thinking_off_and_new_user_turns(qwen3_training: ChatFormat) -> None:
    final = {"role": "assistant", "content": "Sunny, 21 degrees."}
    run_rounds(qwen3_training, [
        (assistant(None), [tool_result(WEATHER)]),
        (final, [{"role": "user", "content": "Thanks! And 1+2?"}]),
        (assistant(None, "Adding.", city="Lyon"), [tool_result("3")]),
    ], enable_thinking=False)  # fmt: skip


def test_qwen3_refuses_when_stopped_on_endoftext(qwen3: ChatFormat) -> None:
    prompt, sampled = canonical_turn(qwen3, [SYSTEM, USER], assistant(REASONING))
    endoftext = qwen3.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert endoftext in qwen3.stop_token_ids
    result = qwen3.bridge([SYSTEM, USER, assistant(REASONING)], [tool_result(WEATHER)],
                          prompt + sampled[:-1] + [endoftext], TOOLS)  # fmt: skip
    assert result.ids is None and "<|endoftext|>" in result.reason and "<|im_end|>" in result.reason
