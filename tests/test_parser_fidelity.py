"""Issue 42: the parser defects other implementations' test vectors exposed, each from its minimal input.

Argument values are JSON values; a value of another type than the schema declares is coerced where
that is unambiguous and ``bad_value`` otherwise; names are checked against the family's grammar and
the declared tools (Muse Glimmer's ``tool.tool`` alias applied and reported); text outside the
call syntax is kept and reported, never dropped.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentrl.chat import get_parser

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "count": {"type": "number"}, "days": {"type": "integer"},
                           "metric": {"type": "boolean"}},
        },
    },
}  # fmt: skip
TOOLS = [WEATHER]


def kinds(result: Any) -> set[str]:
    return {i.kind for i in result.issues}


# ----------------------------------------------------------------------------- lfm2: JSON values only
@pytest.mark.parametrize(
    ("call", "why"),
    [
        ("label(tags={'urgent', 'bug'})", "a set"),
        ("f(x=[b'z'])", "a bytes"),
        ("f(x=[1j])", "a complex"),
        ("f(x=nan)", "JSON number"),
        ("f(x={1: 'a'})", "not a string"),
    ],
)
def test_lfm2_values_that_are_not_json_are_bad_values(call: str, why: str) -> None:
    result = get_parser("lfm2").parse(f"<|tool_call_start|>[{call}]<|tool_call_end|>")
    json.dumps(result.to_message())  # raised TypeError for the set, bytes and complex values
    assert kinds(result) == {"bad_value"} and why in result.issues[0].detail
    assert result.tool_calls[0].arguments is None and result.tool_calls[0].error == "bad_value"


def test_lfm2_python_tuples_become_lists() -> None:
    result = get_parser("lfm2").parse("<|tool_call_start|>[f(x=[(1, 2)])]<|tool_call_end|>")
    assert result.issues == [] and result.tool_calls[0].arguments == {"x": [[1, 2]]}


# ----------------------------------------------------------------------------- the shared value converter
def glm4_call(value: str, key: str = "count") -> str:
    return f"<tool_call>get_weather\n<arg_key>{key}</arg_key>\n<arg_value>{value}</arg_value>\n</tool_call>"


def xml_call(value: str, key: str = "count") -> str:
    return f"<tool_call>\n<function=get_weather>\n<parameter={key}>\n{value}\n</parameter>\n</function>\n</tool_call>"


def atem_call(value: str, key: str = "count") -> str:
    return (f' to=get_weather<|message|><atem:function_calls>\n<atem:invoke name="get_weather">\n'
            f'<atem:parameter name="{key}">{value}</atem:parameter>\n</atem:invoke>\n</atem:function_calls>')  # fmt: skip


FAMILIES = [("glm4", glm4_call), ("qwen3_xml", xml_call), ("atem", atem_call)]


@pytest.mark.parametrize(("parser", "write"), FAMILIES)
@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [("count", '"42"', 42), ("count", "2.5", 2.5), ("days", '"3"', 3), ("days", "3.0", 3), ("metric", '"true"', True)],
)
def test_unambiguous_values_are_coerced_to_the_schema(parser: str, write: Any, key: str, value: str, expected: Any) -> None:
    result = get_parser(parser).parse_with_tools(write(value, key), TOOLS)
    assert result.issues == [], result.issues
    got = result.tool_calls[0].arguments[key]
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize(("parser", "write"), FAMILIES)
@pytest.mark.parametrize(("key", "value"), [("days", "3.5"), ("days", '"3.5"'), ("count", "abc"), ("metric", "1"),
                                            ("count", "[1]")])  # fmt: skip
def test_values_of_the_wrong_type_are_bad_values(parser: str, write: Any, key: str, value: str) -> None:
    result = get_parser(parser).parse_with_tools(write(value, key), TOOLS)
    assert kinds(result) == {"bad_value"}, result.issues
    assert result.tool_calls[0].arguments is None


def test_coerce_keeps_what_fits_and_unknown_types() -> None:
    from agentrl.chat.parsers.names import (  # new in issue 42: imported here so the rest runs on older code
        coerce,
        json_value,
    )

    assert coerce(7, {"integer", "null"}) == (7, None)
    assert coerce(None, {"integer", "null"}) == (None, None)
    assert coerce("x", set()) == ("x", None)
    assert coerce({"a": 1}, {"custom"}) == ({"a": 1}, None)
    assert coerce(True, {"integer"})[1] is not None  # a boolean is not an integer here, as in JSON schema
    assert json_value((1, {"a": (2,)})) == ([1, {"a": [2]}], None)


# ----------------------------------------------------------------------------- gpt_oss: text before a header
def test_gpt_oss_keeps_and_reports_text_before_a_message_header() -> None:
    result = get_parser("gpt_oss").parse("Some text <|channel|>analysis<|message|>reasoning<|end|>")
    assert result.content == "Some text" and result.reasoning == "reasoning"
    assert kinds(result) == {"text_outside_message"}


def test_gpt_oss_headers_of_both_orders_have_no_stray_text() -> None:
    for text in ('<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": 1}',
                 '<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{"a": 1}'):  # fmt: skip
        result = get_parser("gpt_oss").parse(text)
        assert result.issues == [] and result.tool_calls[0].arguments == {"a": 1}


# ----------------------------------------------------------------------------- atem: quoted headers
def test_atem_header_quoted_in_an_answer_is_not_a_new_message() -> None:
    quoted = "You could write <|start|>assistant to=get_weather<|message|><atem:function_calls>\n" \
             '<atem:invoke name="get_weather">\n</atem:invoke>\n</atem:function_calls>'  # fmt: skip
    result = get_parser("atem").parse_with_tools(" to=user<|message|>" + quoted, TOOLS)
    assert result.tool_calls == []
    assert result.content == quoted
    assert kinds(result) == {"stray_tag"}


def test_atem_messages_still_end_at_eom() -> None:
    text = " to=self<|message|>hm<|eom|><|start|>assistant" + atem_call("1")
    result = get_parser("atem").parse_with_tools(text, TOOLS)
    assert result.issues == [] and result.reasoning == "hm" and result.tool_calls[0].arguments == {"count": 1}


# ----------------------------------------------------------------------------- names
def test_muse_glimmer_tool_dot_tool_is_the_declared_tool() -> None:
    """The template advertises ``get_weather.*`` recipients for an undotted ``get_weather``."""
    text = (' to=get_weather.get_weather<|message|><atem:function_calls>\n<atem:invoke name="get_weather.get_weather">\n'
            '<atem:parameter name="days">2</atem:parameter>\n</atem:invoke>\n</atem:function_calls>')  # fmt: skip
    result = get_parser("atem").parse_with_tools(text, TOOLS)
    assert [c.name for c in result.tool_calls] == ["get_weather"]
    assert result.tool_calls[0].arguments == {"days": 2}
    assert kinds(result) == {"name_aliased"}  # applied and counted


def test_an_alias_needs_a_declared_target() -> None:
    text = atem_call("1").replace("get_weather", "other.other")
    result = get_parser("atem").parse_with_tools(text, TOOLS)
    assert [c.name for c in result.tool_calls] == ["other.other"] and kinds(result) == {"undeclared_tool"}


@pytest.mark.parametrize("parser", ["glm4", "qwen3_xml", "hermes", "lfm2"])
def test_calls_to_undeclared_tools_are_reported(parser: str) -> None:
    text = {
        "glm4": glm4_call("1").replace("get_weather", "nope"),
        "qwen3_xml": xml_call("1").replace("get_weather", "nope"),
        "hermes": '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>',
        "lfm2": "<|tool_call_start|>[nope()]<|tool_call_end|>",
    }[parser]
    result = get_parser(parser).parse_with_tools(text, TOOLS)
    assert [c.name for c in result.tool_calls] == ["nope"]  # kept: the dispatcher answers "unknown tool"
    assert kinds(result) == {"undeclared_tool"}
    assert get_parser(parser).parse(text).issues == []  # without schemas nothing is declared, nothing to check


def test_deepseek_v3_refuses_a_json_object_as_a_function_name() -> None:
    """DeepSeek V3.1's call syntax read by the V3 parser gave a call named '{"x":1}'."""
    text = '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"x":1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
    result = get_parser("deepseek_v3").parse(text)
    assert result.tool_calls == [] and kinds(result) == {"bad_name"}
    assert "deepseek_v31" in result.issues[0].detail


@pytest.mark.parametrize(
    ("parser", "text"),
    [
        ("hermes", '<tool_call>\n{"name": "get weather now", "arguments": {}}\n</tool_call>'),
        ("glm4", "<tool_call>{\"a\":\n</tool_call>"),
        ("qwen3_xml", "<tool_call>\n<function={\"a\": 1}>\n</function>\n</tool_call>"),
        ("mistral", '[TOOL_CALLS]{"a": 1}[ARGS]{}'),
        ("gpt_oss", '<|channel|>commentary to=functions.f"x <|constrain|>json<|message|>{}'),
    ],
)
def test_names_outside_the_grammar_are_bad_names(parser: str, text: str) -> None:
    result = get_parser(parser).parse(text)
    assert result.tool_calls == [] and "bad_name" in kinds(result), result


def test_gpt_oss_empty_call_body_is_reported() -> None:
    """Found by the corpus's streaming cut: a harmony call cut right after <|message|> ran with {}."""
    result = get_parser("gpt_oss").parse("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>")
    assert kinds(result) == {"empty_call"}
    assert result.tool_calls[0].arguments is None and result.tool_calls[0].error == "empty_call"
