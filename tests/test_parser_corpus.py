"""A corpus of parser cases per family, with the expected calls written from each family's documented
call syntax (issue 42): well-formed, parallel, nested arguments, unicode, a streaming cut, malformed.

Each family has a hand-written writer of its published syntax (not its chat template: the corpus
must not inherit a template's bugs). A case writes known calls, parses them back and compares names,
argument values and types, and content. A cut of a well-formed turn (generation stopped mid-call)
must be reported and never yield a call with other arguments than written. Malformed calls of each
family, with the exact issues expected, are the hand-written cases of ``test_chat_families.FAMILIES``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from agentrl.chat import available_parsers, get_parser

Call = tuple[str, dict[str, Any]]
NESTED = {"filter": {"airlines": ["AF", "KL"], "depart": {"after": 6, "before": 22.5}, "direct": False, "seat": None}}
UNICODE = {"city": "東京 café 🚀", "note": "naïve – ok"}
TYPED = {"city": "Paris", "days": 3, "budget": 249.5, "metric": True}
SCHEMA_TYPES = {"city": "string", "days": "integer", "budget": "number", "metric": "boolean", "note": "string",
                "filter": "object", "q": "string"}  # fmt: skip
TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {
        k: {"type": t} for k, t in SCHEMA_TYPES.items()}}}}
    for name in ("get_weather", "search", "flights")
]  # fmt: skip


def js(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def text_value(value: Any) -> str:
    """Untyped families: strings as they are, everything else as JSON."""
    return value if isinstance(value, str) else js(value)


def py_value(value: Any) -> str:
    """Python-literal families (LFM2, Llama 4): quoted strings, True/None, JSON for lists and objects."""
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"
    if isinstance(value, (dict, list)):
        return js(value)
    return repr(value)


def gemma_value(value: Any) -> str:
    if isinstance(value, str):
        return f'<|"|>{value}<|"|>'
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{gemma_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(gemma_value(v) for v in value) + "]"
    return js(value)


DS = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>")
DSML = "｜DSML｜"


def _dsml_param(k: str, v: Any) -> str:
    kind = "true" if isinstance(v, str) else "false"
    return f'<{DSML}parameter name="{k}" string="{kind}">{text_value(v)}</{DSML}parameter>\n'


# family -> writer(content, calls) -> text, each from the syntax in its parser's docstring / docs/chat_formats.md
WRITERS: dict[str, Callable[[str, list[Call]], str]] = {
    "hermes": lambda c, calls: c + "".join(f'\n<tool_call>\n{js({"name": n, "arguments": a})}\n</tool_call>' for n, a in calls),
    "qwen3": lambda c, calls: "<think>\nhm\n</think>\n\n" + c + "".join(
        f'\n<tool_call>\n{js({"name": n, "arguments": a})}\n</tool_call>' for n, a in calls),
    "qwen3_xml": lambda c, calls: c + "".join(
        f"\n<tool_call>\n<function={n}>\n" + "".join(f"<parameter={k}>\n{text_value(v)}\n</parameter>\n" for k, v in a.items())
        + "</function>\n</tool_call>" for n, a in calls),
    "llama3": lambda c, calls: (c + "\n" if c else "") + "\n".join(js({"name": n, "parameters": a}) for n, a in calls),
    "mistral": lambda c, calls: c + "[TOOL_CALLS] " + js([{"name": n, "arguments": a} for n, a in calls]),
    "deepseek_v3": lambda c, calls: c + DS[0] + "".join(
        f"{DS[2]}function{DS[4]}{n}\n```json\n{js(a)}\n```{DS[3]}" for n, a in calls) + DS[1],
    "deepseek_v31": lambda c, calls: c + DS[0] + "".join(f"{DS[2]}{n}{DS[4]}{js(a)}{DS[3]}" for n, a in calls) + DS[1],
    "deepseek_v32": lambda c, calls: c + f"\n\n<{DSML}function_calls>\n" + "".join(
        f'<{DSML}invoke name="{n}">\n' + "".join(_dsml_param(k, v) for k, v in a.items()) + f"</{DSML}invoke>\n"
        for n, a in calls) + f"</{DSML}function_calls>",
    # harmony: one call per message (a turn ends at <|call|>); text goes on the commentary channel first
    "gpt_oss": lambda c, calls: (f"<|channel|>commentary<|message|>{c}<|end|><|start|>assistant" if c else "") + "<|end|><|start|>assistant".join(
        f"<|channel|>commentary to=functions.{n} <|constrain|>json<|message|>{js(a)}" for n, a in calls),
    "lfm2": lambda c, calls: c + "<|tool_call_start|>[" + ", ".join(
        f"{n}(" + ", ".join(f"{k}={py_value(v)}" for k, v in a.items()) + ")" for n, a in calls) + "]<|tool_call_end|>",
    "gemma4": lambda c, calls: c + "".join(
        f"<|tool_call>call:{n}{{" + ",".join(f"{k}:{gemma_value(v)}" for k, v in a.items()) + "}<tool_call|>" for n, a in calls),
    "glm4": lambda c, calls: c + "".join(
        f"\n<tool_call>{n}\n" + "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{text_value(v)}</arg_value>\n" for k, v in a.items())
        + "</tool_call>" for n, a in calls),
    # ATEM: one message per call; text to the user would end the turn, so a call turn carries none
    "atem": lambda c, calls: "<|eom|><|start|>assistant".join(
        f" to={n}<|message|><atem:function_calls>\n<atem:invoke name=\"{n}\">\n" + "".join(
            f'<atem:parameter name="{k}">{text_value(v)}</atem:parameter>\n' for k, v in a.items())
        + "</atem:invoke>\n</atem:function_calls>" for n, a in calls),
    "kimi_k2": lambda c, calls: c + "<|tool_calls_section_begin|>" + "".join(
        f"<|tool_call_begin|>functions.{n}:{i}<|tool_call_argument_begin|>{js(a)}<|tool_call_end|>" for i, (n, a) in enumerate(calls))
        + "<|tool_calls_section_end|>",
    "minimax_m2": lambda c, calls: "hm\n</think>\n\n" + c + "\n<minimax:tool_call>\n" + "".join(
        f'<invoke name="{n}">\n' + "".join(f'<parameter name="{k}">{text_value(v)}</parameter>\n' for k, v in a.items())
        + "</invoke>\n" for n, a in calls) + "</minimax:tool_call>",
    # Command: a call turn is thinking plus the action list (no answer text)
    "command": lambda c, calls: "<|START_THINKING|>hm<|END_THINKING|><|START_ACTION|>[\n" + ",\n".join(
        "    " + js({"tool_call_id": str(i), "tool_name": n, "parameters": a}) for i, (n, a) in enumerate(calls)) + "\n]<|END_ACTION|>",
    "llama4_pythonic": lambda c, calls: (c + "\n" if c else "") + "[" + ", ".join(
        f"{n}(" + ", ".join(f"{k}={py_value(v)}" for k, v in a.items()) + ")" for n, a in calls) + "]",
}  # fmt: skip
NO_TEXT_BESIDE_CALLS = {"atem", "command"}
# Dialects a parser reads besides the one its writer writes: name -> (parser, writer). GLM-4.7 and GLM-5
# write calls with no newlines, after the reasoning block their prompt opens (empty: "</think>" only).
DIALECTS: dict[str, tuple[str, Callable[[str, list[Call]], str]]] = {
    "glm5": ("glm4", lambda c, calls: "</think>" + c + "".join(
        f"<tool_call>{n}" + "".join(f"<arg_key>{k}</arg_key><arg_value>{text_value(v)}</arg_value>" for k, v in a.items())
        + "</tool_call>" for n, a in calls)),
}  # fmt: skip
VARIANTS = {**{name: (name, writer) for name, writer in WRITERS.items()}, **DIALECTS}
ONE_CALL_PER_TURN: set[str] = set()  # gpt_oss writes each call as its own message: the parser reads all


def test_every_parser_has_a_writer() -> None:
    assert set(WRITERS) == set(available_parsers())


CASES: dict[str, tuple[str, list[Call]]] = {
    "well-formed": ("", [("get_weather", TYPED)]),
    "parallel": ("Checking both.", [("get_weather", {"city": "Paris"}), ("search", {"q": "flights to Lyon"})]),
    "nested arguments": ("", [("flights", NESTED)]),
    "unicode": ("Voilà 🙂", [("get_weather", UNICODE)]),
}


def typed(value: Any) -> Any:
    """A value with its JSON types visible (so 1 != 1.0 != True)."""
    if isinstance(value, dict):
        return {k: typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [typed(v) for v in value]
    return (type(value).__name__, value)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_written_calls_parse_back(variant: str, case: str) -> None:
    family, writer = VARIANTS[variant]
    content, calls = CASES[case]
    content = "" if family in NO_TEXT_BESIDE_CALLS else content
    text = writer(content, calls)
    result = get_parser(family).parse_with_tools(text, TOOLS)
    assert result.issues == [], (text, result.issues)
    assert [(c.name, typed(c.arguments)) for c in result.tool_calls] == [(n, typed(a)) for n, a in calls], text
    assert result.content == content.strip()
    json.dumps(result.to_message())


# Where a family's first call opens: a cut before it is text the model may still be writing.
OPENERS = {
    "hermes": "<tool_call>", "qwen3": "<tool_call>", "qwen3_xml": "<tool_call>", "llama3": "\"name\":", "mistral": "[TOOL_CALLS]",
    "deepseek_v3": DS[0], "deepseek_v31": DS[0], "deepseek_v32": f"<{DSML}function_calls>", "gpt_oss": "to=functions.",
    "lfm2": "<|tool_call_start|>", "gemma4": "<|tool_call>", "glm4": "<tool_call>", "atem": "<atem:function_calls>",
    "kimi_k2": "<|tool_calls_section_begin|>", "minimax_m2": "<minimax:tool_call>", "command": "<|START_ACTION|>",
    "llama4_pythonic": "(",
}  # fmt: skip


def test_every_writer_has_an_opener() -> None:
    assert set(OPENERS) == set(WRITERS)


def inside_a_tag(text: str) -> bool:
    """The cut falls inside a tag (``<|tool_ca``): in token space a tag is one token, never half written."""
    return text.rfind("<") > text.rfind(">")


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_streaming_cut_is_reported(variant: str) -> None:
    """Generation stopped mid-call (length cap): a cut inside the calls is an issue, and no call comes
    back with arguments other than those written unless an issue says so."""
    family, writer = VARIANTS[variant]
    content, calls = CASES["parallel"]
    content = "" if family in NO_TEXT_BESIDE_CALLS else content
    text = writer(content, calls)
    start = text.index(OPENERS[family]) + len(OPENERS[family])
    expected = dict(calls)
    silent = []
    for cut in range(start, len(text) - 1):
        part = text[:cut]
        result = get_parser(family).parse_with_tools(part, TOOLS)
        json.dumps(result.to_message())
        for call in result.tool_calls:
            if call.arguments is not None and call.name in expected and call.arguments != expected[call.name]:
                assert result.issues, (part, call)  # a partial value is never silent
        if not result.issues and len(result.tool_calls) < len(calls) and not inside_a_tag(part):
            silent.append(part[start:])
    # Only where the first call is complete and nothing of the second is written yet can a cut read
    # as a turn with fewer calls (families without a closing block tag): a few positions at most.
    assert len(silent) <= 4, silent
