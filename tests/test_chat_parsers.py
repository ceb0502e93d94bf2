"""Response parsers: hand-written nasty outputs, random corruptions, and template round trips."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from chat_fixtures import TOOLS, build_tiny_tokenizer, load_asset_tokenizer, tool_call

from agentrl.chat import ChatFormat, ParsedResponse, get_chat_format, get_parser
from agentrl.chat.parsers import HermesParser, Qwen3Parser

KNOWN_KINDS = {
    "empty", "empty_call", "bad_json", "missing_name", "not_an_object", "arguments_not_object", "unclosed_tag",
    "stray_tag", "trailing_text", "text_between_calls", "multiple_calls", "tool_response_in_output",
    "reasoning_tag", "call_in_reasoning", "text_before_reasoning", "truncated", "tokens_after_end_of_turn",
    "decode_error", "bad_name", "undeclared_tool", "name_aliased", "text_outside_message",
}  # fmt: skip

CALL_F = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
CALL_G = '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>'

# (text, exact set of issue kinds, number of calls returned)
HERMES_CASES: list[tuple[str, set[str], int]] = [
    ("", {"empty"}, 0),
    ("  \n ", {"empty"}, 0),
    ("Hello there", set(), 0),
    (CALL_F, set(), 1),
    ("Let me see.\n" + CALL_F + "\n" + CALL_G, set(), 2),
    ('<tool_call>\n{"name": "f", "arguments": {"a": 1,}}\n</tool_call>', {"bad_json"}, 1),
    ('<tool_call>\n{"nam": f}\n</tool_call>', {"bad_json"}, 0),
    ('<tool_call>{"arguments": {}}</tool_call>', {"missing_name"}, 0),
    ('<tool_call>{"name": 5, "arguments": {}}</tool_call>', {"missing_name"}, 0),
    ('<tool_call>{"name": "  ", "arguments": {}}</tool_call>', {"missing_name"}, 0),
    ('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>', set(), 1),
    ('<tool_call>{"name": "f", "arguments": "{a: 1}"}</tool_call>', {"bad_json"}, 1),
    ('<tool_call>{"name": "f", "parameters": {"a": 1}}</tool_call>', set(), 1),
    ('<tool_call>{"name": "f"}</tool_call>', set(), 1),
    ('<tool_call>{"name": "f", "arguments": [1, 2]}</tool_call>', {"arguments_not_object"}, 1),
    ('<tool_call>{"name": "f", "arguments": "[1, 2]"}</tool_call>', {"arguments_not_object"}, 1),
    ('<tool_call>[{"name": "f", "arguments": {}}]</tool_call>', {"not_an_object"}, 0),
    ('<tool_call>\n{"name": "f", "arguments": {"a": 1}}', {"unclosed_tag"}, 1),
    ('<tool_call>\n{"name": "f", "arguments": {"a": ', {"unclosed_tag", "bad_json"}, 1),
    ("<tool_call>", {"unclosed_tag", "empty_call"}, 0),
    ("<tool_call></tool_call>", {"empty_call"}, 0),
    (CALL_F + "\nDone!", {"trailing_text"}, 1),
    (CALL_F + "\nby the way\n" + CALL_G, {"text_between_calls"}, 2),
    ("hello </tool_call>", {"stray_tag"}, 0),
    (CALL_F + "</tool_call>", {"trailing_text", "stray_tag"}, 1),
    ('<tool_call>{"name": "f", "arguments": {"s": "a </tool_call> b"}}</tool_call>', set(), 1),
    (CALL_F + "\n<tool_response>\n42\n</tool_response>", {"trailing_text", "tool_response_in_output"}, 1),
    ("<tool_call>" + "[" * 100_000, {"unclosed_tag", "bad_json"}, 0),
    ('<tool_call>{"name": "f", "arguments": {' + CALL_G, {"unclosed_tag", "bad_json"}, 2),
    ("<think>hmm</think>Hi", {"reasoning_tag"}, 0),
]

QWEN3_CASES: list[tuple[str, set[str], int]] = [
    ("<think>\nreasoning\n</think>\n\nAnswer", set(), 0),
    ("reasoning\n</think>\n\n" + CALL_F, set(), 1),
    ("<think>\nI will call " + CALL_G + "\n</think>\n\nok", {"call_in_reasoning"}, 0),
    ("<think>\nthinking forever", {"unclosed_tag"}, 0),
    ("<think>\n" + CALL_G, {"unclosed_tag", "call_in_reasoning"}, 0),
    ("<think>\n\n</think>\n\n", {"empty"}, 0),
    ("Answer without thinking", set(), 0),
    ("<think>a</think>b<think>c</think>", {"stray_tag"}, 0),
    ("pre <think>a</think> b", {"text_before_reasoning"}, 0),
    ("</think>", {"empty"}, 0),
    ("", {"empty"}, 0),
]


def check_invariants(result: ParsedResponse) -> None:
    """What any caller may rely on, whatever the model wrote."""
    assert isinstance(result, ParsedResponse)
    assert isinstance(result.content, str)
    assert result.reasoning is None or isinstance(result.reasoning, str)
    for call in result.tool_calls:
        assert isinstance(call.name, str) and call.name.strip()
        assert call.arguments is None or isinstance(call.arguments, dict)
        if call.arguments is None:
            assert call.error and isinstance(call.raw_arguments, str)
    for issue in result.issues:
        assert issue.kind in KNOWN_KINDS, issue
        assert isinstance(issue.detail, str)
    json.dumps(result.to_message())


@pytest.mark.parametrize(("text", "kinds", "n_calls"), HERMES_CASES)
def test_hermes_hand_written(text: str, kinds: set[str], n_calls: int) -> None:
    result = get_parser("hermes").parse(text)
    check_invariants(result)
    assert {i.kind for i in result.issues} == kinds, result.issues
    assert len(result.tool_calls) == n_calls


@pytest.mark.parametrize(("text", "kinds", "n_calls"), QWEN3_CASES)
def test_qwen3_hand_written(text: str, kinds: set[str], n_calls: int) -> None:
    result = get_parser("qwen3").parse(text)
    check_invariants(result)
    assert {i.kind for i in result.issues} == kinds, result.issues
    assert len(result.tool_calls) == n_calls


def test_bad_json_call_keeps_name_and_raw_arguments() -> None:
    result = HermesParser().parse('<tool_call>\n{"name": "f", "arguments": {"a": 1,}}\n</tool_call>')
    (call,) = result.tool_calls
    assert (call.name, call.arguments, call.error, call.raw_arguments) == ("f", None, "bad_json", '{"a": 1,}')
    assert result.to_message()["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a": 1,}'}


def test_details_of_parsed_calls() -> None:
    result = HermesParser().parse("Let me see.\n" + CALL_F + "\n" + CALL_G)
    assert result.content == "Let me see."
    assert [(c.name, c.arguments, c.error) for c in result.tool_calls] == [("f", {"a": 1}, None), ("g", {}, None)]
    assert result.tool_calls[0].raw_arguments == '{"a": 1}'
    parallel = HermesParser(allow_parallel_calls=False).parse(CALL_F + CALL_G)
    assert [i.kind for i in parallel.issues] == ["multiple_calls"] and len(parallel.tool_calls) == 2
    assert HermesParser().parse('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>').tool_calls[
        0
    ].arguments == {"a": 1}
    s = HermesParser().parse('<tool_call>{"name": "f", "arguments": {"s": "a </tool_call> b"}}</tool_call>')
    assert s.tool_calls[0].arguments == {"s": "a </tool_call> b"}


def test_qwen3_reasoning_details() -> None:
    implicit = Qwen3Parser().parse("step 1\nstep 2\n</think>\n\nSure.\n" + CALL_F)
    assert (implicit.reasoning, implicit.content) == ("step 1\nstep 2", "Sure.")
    assert implicit.tool_calls[0].arguments == {"a": 1}
    hidden = Qwen3Parser().parse("<think>\n" + CALL_G + "\n</think>\n\nno call")
    assert hidden.tool_calls == [] and hidden.content == "no call" and CALL_G in (hidden.reasoning or "")
    assert Qwen3Parser().parse("plain").reasoning is None


# ------------------------------------------------------------------ random corruption
_INSERTS = ['{', '}', '"', ':', ',', '[', ']', '\\', '\n', ' ', 'null', '"name"', '"arguments"', '<tool_call>',
            '</tool_call>', '<think>', '</think>', '<tool_response>', '\x00', '\ud800', 'é', '1e999',
            'NaN']  # fmt: skip
_VALID = [
    "Hello!",
    CALL_F,
    "Let me check.\n" + CALL_F + "\n" + CALL_G,
    '<tool_call>\n{"name": "add", "arguments": {"a": 1.5, "b": [true, null, {"c": "x\\"y"}]}}\n</tool_call>',
    "<think>\nI need the weather.\n</think>\n\n" + CALL_F,
    "I need the weather.\n</think>\n\nSure.\n" + CALL_F + "\n" + CALL_G,
]


def corrupt(text: str, rng: random.Random) -> str:
    """Apply 1-3 random edits: truncation, deletion, duplication, insertion."""
    for _ in range(rng.randint(1, 3)):
        n = len(text)
        i, j = sorted(rng.randint(0, n) for _ in range(2))
        op = rng.choice(["truncate", "delete", "duplicate", "insert", "insert"])
        if op == "truncate":
            text = text[:i]
        elif op == "delete":
            text = text[:i] + text[min(j, i + 6) :]
        elif op == "duplicate":
            text = text[:j] + text[i:j] + text[j:]
        else:
            text = text[:i] + rng.choice(_INSERTS) + text[i:]
    return text


def corrupted_outputs(count: int, seed: int = 1234) -> list[str]:
    rng = random.Random(seed)
    return [corrupt(rng.choice(_VALID), rng) for _ in range(count)]


@pytest.mark.parametrize("name", ["hermes", "qwen3"])
def test_random_corruptions_never_raise(name: str) -> None:
    parser = get_parser(name)
    outputs = corrupted_outputs(400)
    kinds: set[str] = set()
    for text in outputs:
        result = parser.parse(text)
        check_invariants(result)
        kinds |= {i.kind for i in result.issues}
    assert {"bad_json", "unclosed_tag"} <= kinds  # the corruptions did reach the error paths


# ------------------------------------------------------------------ round trips through templates
ARGS: dict[str, Any] = {
    "int": 3, "neg": -7, "big": 12345678901234567890, "float": 2.5, "whole_float": 2.0, "tiny": 1e-07,
    "true": True, "false": False, "none": None, "text": 'héllo "quoted"\nnew line </tool_call> {braces}',
    "nested": {"list": [1, 2.0, "three", [False, {"deep": None}]], "empty": {}, "empty_list": []},
}  # fmt: skip


def typed(value: Any) -> Any:
    """A structure that differs whenever types differ (1 vs 1.0 vs True)."""
    if isinstance(value, dict):
        return {k: typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [typed(v) for v in value]
    return (type(value).__name__, value)


def sampled_ids(fmt: ChatFormat, prompt_msgs: list[dict], assistant: dict, **kw: Any) -> list[int]:
    """The ids a model would have sampled to produce ``assistant`` canonically (through end of turn)."""
    prompt = fmt.render(prompt_msgs, TOOLS, **kw)
    full = fmt.render([*prompt_msgs, assistant], TOOLS, add_generation_prompt=False, **kw)
    assert full[: len(prompt)] == prompt
    last_eot = max(i for i, t in enumerate(full) if t in fmt.eot_token_ids)
    return full[len(prompt) : last_eot + 1]


@pytest.fixture(scope="module")
def tiny_format(tmp_path_factory: pytest.TempPathFactory) -> ChatFormat:
    return get_chat_format(build_tiny_tokenizer(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module")
def qwen3_format() -> ChatFormat:
    return get_chat_format(load_asset_tokenizer("qwen3"))


PROMPT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris, and 1+2?"}]


@pytest.mark.parametrize("content", ["", "Let me check."])
def test_hermes_round_trip(tiny_format: ChatFormat, content: str) -> None:
    calls = [tool_call("get_weather", {"city": "Paris"}), tool_call("add", ARGS)]
    assistant = {"role": "assistant", "content": content, "tool_calls": calls}
    result = tiny_format.parse(sampled_ids(tiny_format, PROMPT, assistant))
    assert result.issues == [] and result.content == content
    assert [c.name for c in result.tool_calls] == ["get_weather", "add"]
    assert typed(result.tool_calls[1].arguments) == typed(ARGS)
    assert result.to_message() == {"role": "assistant", "content": content, "tool_calls": calls}


def test_hermes_round_trip_string_arguments(tiny_format: ChatFormat) -> None:
    assistant = {"role": "assistant", "content": "", "tool_calls": [tool_call("add", json.dumps(ARGS))]}
    (call,) = tiny_format.parse(sampled_ids(tiny_format, PROMPT, assistant)).tool_calls
    assert typed(call.arguments) == typed(ARGS)


@pytest.mark.parametrize("content", ["", "Checking both."])
def test_qwen3_round_trip_with_reasoning(qwen3_format: ChatFormat, content: str) -> None:
    calls = [tool_call("get_weather", {"city": "Paris"}), tool_call("add", ARGS)]
    assistant = {"role": "assistant", "content": content, "reasoning_content": "Two tools.\nBoth now.",
                 "tool_calls": calls}  # fmt: skip
    result = qwen3_format.parse(sampled_ids(qwen3_format, PROMPT, assistant))
    assert result.issues == [] and result.content == content and result.reasoning == "Two tools.\nBoth now."
    assert typed(result.tool_calls[1].arguments) == typed(ARGS)
    assert result.to_message() == assistant


def test_qwen3_round_trip_thinking_disabled(qwen3_format: ChatFormat) -> None:
    assistant = {"role": "assistant", "content": "Sure.", "tool_calls": [tool_call("add", {"a": 1, "b": 2})]}
    prompt = qwen3_format.render(PROMPT, TOOLS, enable_thinking=False)
    assert qwen3_format.decode(prompt).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    text = 'Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call><|im_end|>'
    result = qwen3_format.parse(qwen3_format.encode(text))
    assert result.issues == [] and result.reasoning is None
    assert result.to_message() == assistant


def test_corrupted_token_ids_never_raise(tiny_format: ChatFormat) -> None:
    rng = random.Random(7)
    eot = tiny_format.eot_token_ids[0]
    vocab = len(tiny_format.tokenizer)
    for text in corrupted_outputs(150, seed=99):
        text = text.encode("utf-8", "replace").decode("utf-8")  # ids come from text a tokenizer can hold
        ids = tiny_format.encode(text) + rng.choice([[eot], [], [eot, 5, 6]])
        if rng.random() < 0.2:
            ids.insert(rng.randint(0, len(ids)), rng.choice([vocab + 3, 10**9, -1]))
        result = tiny_format.parse(ids)
        check_invariants(result)
        tiny_format.render_text([*PROMPT, result.to_message()], TOOLS)  # the template accepts what we return
