"""Hostile model outputs for every chat format: what the fuzz tests and the parse benchmark feed in.

A policy being trained writes anything: a tag repeated a million times, JSON nested thousands of
levels deep, a call that never closes. Parsing must stay linear in the length of the output and
must never raise (see ``ChatFormat.parse``). The generators here build such text from each
format's own markup, so each parser is attacked with the pieces it actually looks for.
"""

from __future__ import annotations

import random

# The markup each format's parser looks for (its tags and the JSON pieces around them).
_JSON = ['{', '}', '[', ']', '"', ':', ',', '\\', 'null', 'true', '1.5e3', '"name"', '"arguments"',
         '"parameters"', '{"name": "f", "arguments": {', '{"name": "f", "parameters": {', '"\\u00e9"']  # fmt: skip
_THINK = ["<think>", "</think>"]
MARKUP: dict[str, list[str]] = {
    "hermes": ["<tool_call>", "</tool_call>", "<tool_response>", *_THINK],
    "qwen3": ["<tool_call>", "</tool_call>", *_THINK],
    "qwen3_xml": ["<tool_call>", "</tool_call>", "<function=", "<function=f>", "</function>", "<parameter=",
                  "<parameter=a>", "</parameter>", ">", *_THINK],  # fmt: skip
    "llama3": ["<|python_tag|>", '\n{"name":', "\n", ";"],
    "mistral": ["[TOOL_CALLS]", "[ARGS]", "[INST]", "[/INST]", "f[ARGS]"],
    "deepseek_v3": ["<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
                    "<｜tool▁sep｜>", "function<｜tool▁sep｜>f\n```json\n", "```", *_THINK],  # fmt: skip
    "gpt_oss": ["<|start|>assistant", "<|channel|>analysis", "<|channel|>commentary to=functions.f", "<|channel|>",
                "<|message|>", "<|end|>", "<|constrain|>json", "to=functions.", "<|call|>"],  # fmt: skip
    "lfm2": ["<|tool_call_start|>", "<|tool_call_end|>", "<|tool_call_start|>[", "[f(", "f(a=", "a='", "'", "\\'", ")",
             "]", ", ", "=", "True", "None", "[", "{", *_THINK],  # fmt: skip
    "atem": ["<|start|>assistant", " to=self", " to=f", " to=user", "<|message|>", "<|eom|>", "<atem:function_calls>",
             "</atem:function_calls>", '<atem:invoke name="f">', "</atem:invoke>", '<atem:parameter name="a">',
             "</atem:parameter>", "\n"],  # fmt: skip
    # GLM-4.5 writes newlines between the parts of a call; GLM-4.7 and GLM-5 write none, after "<think></think>".
    "glm4": ["<tool_call>", "</tool_call>", "<tool_call>f\n", "<tool_call>f", "<arg_key>", "</arg_key>", "<arg_value>",
             "</arg_value>", "<arg_key>a</arg_key>", "<arg_key>a</arg_key><arg_value>1</arg_value>", "<think></think>",
             "\n", *_THINK],  # fmt: skip
    "deepseek_v31": ["<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
                     "<｜tool▁sep｜>", "<｜tool▁call▁begin｜>f<｜tool▁sep｜>", "function<｜tool▁sep｜>", *_THINK],  # fmt: skip
    "kimi_k2": ["<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
                "<|tool_call_argument_begin|>", "<|tool_call_end|>", "functions.f:0", "functions.", ":0", *_THINK],  # fmt: skip
    "minimax_m2": ["<minimax:tool_call>", "</minimax:tool_call>", '<invoke name="f">', "<invoke name=", "</invoke>",
                   '<parameter name="a">', "</parameter>", '"', ">", "\n", *_THINK],  # fmt: skip
    "command": ["<|START_ACTION|>", "<|END_ACTION|>", "<|START_THINKING|>", "<|END_THINKING|>", "<|START_RESPONSE|>",
                "<|END_RESPONSE|>", "<|START_TEXT|>", "<|END_TEXT|>", '[{"tool_call_id": "0", "tool_name": "f", "parameters": {', '"tool_name"', '"parameters"'],  # fmt: skip
    "llama4_pythonic": ["\n[", "[f(", "f(a=", "a='", "'", "\\'", ")", "]", ", ", "=", "True", "None", "{", "\"",
                        "<|python_start|>", "<|python_end|>"],  # fmt: skip
    "deepseek_v32": ["<｜DSML｜function_calls>", "</｜DSML｜function_calls>", '<｜DSML｜invoke name="f">', "</｜DSML｜invoke>",
                     '<｜DSML｜parameter name="a" string="true">', '<｜DSML｜parameter name="a" string="false">',
                     "</｜DSML｜parameter>", "<｜DSML｜", '"', *_THINK],  # fmt: skip
    "gemma4": ["<|tool_call>", "<tool_call|>", "<|tool_call>call:f{", "call:", '<|"|>', "a:", ":", ",", "{", "}", "[", "]",
               "true", "null", "<|channel>thought\n", "<channel|>", "<|tool_response>"],  # fmt: skip
}
_NOISE = ["a", " ", "\n", "\t", "é", "日本", "\u200b", "\x00", "\ud7ff", "🙂", "<", ">", "=", "`"]


def markup(format_name: str) -> list[str]:
    """The tags of ``format_name`` plus JSON fragments; unknown formats get Hermes' tags."""
    return MARKUP.get(format_name, MARKUP["hermes"]) + _JSON


def hostile_outputs(format_name: str, count: int, seed: int = 0, max_pieces: int = 60) -> list[str]:
    """``count`` seeded random outputs: the format's tags, JSON pieces, noise and deep nesting mixed."""
    rng = random.Random(f"{format_name}:{seed}")
    pieces = markup(format_name)
    out: list[str] = []
    for _ in range(count):
        parts: list[str] = []
        for _ in range(rng.randint(0, max_pieces)):
            r = rng.random()
            if r < 0.55:
                parts.append(rng.choice(pieces))
            elif r < 0.85:
                parts.append(rng.choice(_NOISE) * rng.randint(1, 4))
            elif r < 0.97:
                parts.append(rng.choice(pieces) * rng.randint(2, 40))
            else:  # deep nesting, past the JSON decoder's recursion limit now and then
                parts.append(rng.choice(["[", "{\"a\":", "[{\"a\":"]) * rng.choice([50, 500, 1500]))
        out.append("".join(parts))
    return out


def worst_cases(format_name: str, size: int) -> dict[str, str]:
    """Named texts of about ``size`` characters meant to hit a parser's slowest path."""
    cases: dict[str, str] = {}
    tags = MARKUP.get(format_name, MARKUP["hermes"])
    for piece in markup(format_name):
        cases[f"{piece!r} repeated"] = _repeat(piece, size)
        cases[f"{tags[0]!r} then {piece!r} repeated"] = tags[0] + _repeat(piece, size)
    for a in tags:
        for b in ("{", '{"name": "f", "arguments": {"a": "', "[", " ", "x"):
            cases[f"{a + b!r} repeated"] = _repeat(a + b, size)
    for a in tags:  # every pair of tags: opener then closer is a malformed (empty or garbage) call repeated
        for b in tags:
            if a != b:
                for middle in ("", "x", "{}"):
                    cases[f"{a + middle + b!r} repeated"] = _repeat(a + middle + b, size)
    cases["deep ["] = tags[0] + "[" * size
    cases["deep {"] = tags[0] + '{"a":' * (size // 5)
    cases["one long string"] = tags[0] + '{"name": "f", "arguments": {"s": "' + "x" * size
    cases["random mix"] = "".join(hostile_outputs(format_name, 4000, seed=99))[:size]
    return cases


def _repeat(piece: str, size: int) -> str:
    return piece * max(1, size // max(1, len(piece)))
