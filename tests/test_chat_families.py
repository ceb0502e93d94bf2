"""Every chat format, on its family's real tokenizer (and real template where one is offline).

For each family: detection by render probes (also of a fork of the template), render equal to
``apply_chat_template(tokenize=True)``, a parse round trip that keeps argument types, a
multi-round bridge proven in token space (or the declared fallback: a refusal the engine turns into
a counted split), and parsers that never raise on hand-written malformed and seeded corrupted output.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from chat_fixtures import (
    build_tiny_tokenizer,
    llamacpp_template,
    load_asset_tokenizer,
    tokenizer_with,
    tool_call,
    tool_result,
    trl_family_tokenizer,  # fmt: skip
)
from glm5_template import GLM5_TEMPLATE
from test_chat_parsers import ARGS, KNOWN_KINDS, check_invariants, corrupt, typed

from agentrl.chat import ChatFormat, available_formats, detect_format, format_spec, get_chat_format, get_parser
from agentrl.chat.formats import read_template

FAMILY_KINDS = KNOWN_KINDS | {
    "text_before_call", "python_code", "call_in_content", "not_a_list", "missing_arguments", "unopened_calls",
    "missing_message_tag", "missing_channel", "unknown_channel", "duplicate_parameter", "bad_value",
    "recipient_mismatch",
}  # fmt: skip

MISTRAL_SPECIAL = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                   "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[ARGS]"]  # fmt: skip


def schema(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """A tool schema whose parameter types are those of ``args`` (Qwen3.5 XML needs them)."""
    kinds = {bool: "boolean", int: "integer", float: "number", str: "string", dict: "object", list: "array",
             type(None): "null"}  # fmt: skip
    props = {k: {"type": kinds[type(v)]} for k, v in args.items()}
    return {"type": "function", "function": {"name": name, "description": f"{name}.",
            "parameters": {"type": "object", "properties": props}}}  # fmt: skip


TOOLS = [schema("get_weather", {"city": "Paris"}), schema("add", ARGS)]
CASE_TOOLS = [*TOOLS, *(schema(name, {}) for name in ("f", "g", "h"))]  # the hand-written cases call f, g, h
SYSTEM = {"role": "system", "content": "Be brief."}
USER = {"role": "user", "content": "Weather in Paris, and add these?"}


@dataclass
class Family:
    name: str
    tokenizer: Callable[[Path], Any]
    real_template: bool  # the tokenizer's own template is the one used
    reasoning: bool = False
    # Valid outputs for the corruption test, and (text, issue kinds, number of calls) cases.
    valid: list[str] = field(default_factory=list)
    cases: list[tuple[str, set[str], int]] = field(default_factory=list)


def _mistral_tokenizer(path: Path) -> Any:
    return build_tiny_tokenizer(path, read_template("mistral_tools.jinja"), MISTRAL_SPECIAL, [], eos="</s>", bos="<s>")


FAMILIES = {
    "hermes": Family("hermes", lambda p: build_tiny_tokenizer(p), True,
                     valid=['<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>']),
    "qwen3": Family("qwen3", lambda p: load_asset_tokenizer("qwen3"), True, reasoning=True),
    "chatml_tools": Family("chatml_tools", lambda p: load_asset_tokenizer("smollm2"), False),
    "qwen3_xml": Family("qwen3_xml", lambda p: load_asset_tokenizer("qwen3"), False, reasoning=True, valid=[
        "<think>\nhm\n</think>\n\n<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>",
        "Sure.\n<tool_call>\n<function=g>\n<parameter=s>\nx y\n</parameter>\n<parameter=n>\n[1, 2]\n</parameter>\n"
        "</function>\n</tool_call>",
    ], cases=[
        ("<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>", set(), 1),
        ("<tool_call>\n<function=f>\n<parameter=a>\n1\n</function>\n</tool_call>", {"unclosed_tag"}, 1),
        ("<tool_call>\n<parameter=a>\n1\n</parameter>\n</tool_call>", {"missing_name"}, 0),
        ("<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>", {"unclosed_tag"}, 1),
        ("<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n<parameter=a>\n2\n</parameter>\n</function>\n"
         "</tool_call>", {"duplicate_parameter"}, 1),
        ("<tool_call></tool_call>", {"empty_call"}, 0),
        ("<think>\n<tool_call>\n<function=f>\n</function>\n</tool_call>\n</think>\n\nNo.", {"call_in_reasoning"}, 0),
        ("<tool_call>\n<function=f>\n</function>\n</tool_call> and more", {"trailing_text"}, 1),
        ("", {"empty"}, 0),
    ]),
    "llama3": Family("llama3", lambda p: load_asset_tokenizer("llama3"), False, valid=[
        '{"name": "f", "parameters": {"a": 1}}', '<|python_tag|>{"name": "f", "parameters": {}}',
        'Sure.\n{"name": "f", "parameters": {"a": [1, 2]}}\n{"name": "g", "parameters": {}}',
    ], cases=[
        ('{"name": "f", "parameters": {"a": 1}}', set(), 1),
        ('<|python_tag|>{"name": "f", "parameters": {"a": 1}}', set(), 1),
        ('{"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {}}', set(), 2),
        ('{"name": "f", "parameters": {"a": 1,}}', {"bad_json"}, 1),
        ('{"parameters": {"a": 1}}', {"missing_name"}, 0),
        ('{"name": "f", "parameters": {"a": 1}} thanks', {"trailing_text"}, 1),
        ("<|python_tag|>brave_search.call(query='x')", {"python_code"}, 0),
        ('Hi <|python_tag|>{"name": "f", "parameters": {}}', {"text_before_call"}, 1),
        ('Let me see.\n{"name": "f", "parameters": {"a": ', {"call_in_content"}, 0),
        ("Just text.", set(), 0),
        ("", {"empty"}, 0),
    ]),
    "mistral": Family("mistral", _mistral_tokenizer, False, valid=[
        '[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}, "id": "abc123xyz"}]',
        'Ok.[TOOL_CALLS]f[ARGS]{"a": 1}[TOOL_CALLS]g[ARGS]{}',
    ], cases=[
        ('[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]', set(), 2),
        ('[TOOL_CALLS]f[ARGS]{"a": 1}', set(), 1),
        ('[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1,}}]', {"bad_json"}, 1),
        ('[TOOL_CALLS] {"name": "f"}', {"missing_arguments"}, 0),
        ("[TOOL_CALLS] []", {"empty_call"}, 0),
        ('[TOOL_CALLS] [{"arguments": {}}]', {"missing_name"}, 0),
        ("[TOOL_CALLS]f[ARGS]{bad", {"bad_json"}, 1),
        ('[TOOL_CALLS][ARGS]{"a": 1}', {"missing_name"}, 0),
        ('[TOOL_CALLS] [{"name": "f", "arguments": {}}] done', {"trailing_text"}, 1),
        ("Hi [INST] more", {"stray_tag"}, 0),
        ("", {"empty"}, 0),
    ]),
    "deepseek_v3": Family("deepseek_v3", lambda p: load_asset_tokenizer("deepseek_v3"), False, valid=[
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": 1}\n```<｜tool▁call▁end｜>"
        "<｜tool▁calls▁end｜>",
    ], cases=[
        ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": 1}\n```<｜tool▁call▁end｜>"
         "<｜tool▁calls▁end｜>", set(), 1),
        ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": 1}\n```<｜tool▁call▁end｜>",
         {"unclosed_tag"}, 1),
        ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": }\n```<｜tool▁call▁end｜>"
         "<｜tool▁calls▁end｜>", {"bad_json"}, 1),
        ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function f\n{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
         {"missing_name"}, 0),
        ("<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n```<｜tool▁call▁end｜>", {"unopened_calls",
                                                                                               "unclosed_tag"}, 1),
        ("<｜tool▁calls▁begin｜><｜tool▁calls▁end｜>", {"empty_call"}, 0),
        ("text <｜tool▁sep｜>", {"stray_tag"}, 0),
        ("", {"empty"}, 0),
    ]),
    "gpt_oss": Family("gpt_oss", lambda p: load_asset_tokenizer("gpt_oss"), False, reasoning=True, valid=[
        "<|channel|>analysis<|message|>Need it.<|end|><|start|>assistant<|channel|>commentary to=functions.f "
        '<|constrain|>json<|message|>{"a": 1}',
        "<|channel|>final<|message|>It is 42.",
    ], cases=[
        ("<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>final<|message|>42", set(), 0),
        ('<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": 1}', set(), 1),
        ('<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": ', {"bad_json"}, 1),
        ("<|channel|>final 42", {"missing_message_tag"}, 0),
        ("<|message|>42", {"missing_channel"}, 0),
        ("<|channel|>secret<|message|>42", {"unknown_channel"}, 0),
        ("", {"empty"}, 0),
    ]),
    # GPT-OSS on its own (TRL-vendored) template: the derived training template is used.
    "gpt_oss_own": Family("gpt_oss", lambda p: trl_family_tokenizer("gptoss"), True, reasoning=True, valid=[
        "<|channel|>analysis<|message|>Need it.<|end|><|start|>assistant to=functions.f<|channel|>commentary json"
        '<|message|>{"a": 1}',
    ], cases=[
        ('<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant to=functions.f<|channel|>commentary json<|message|>'
         '{"a": 1}', set(), 1),
        ("<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{bad", {"bad_json"}, 1),
    ]),
    # LFM2.5 on its own template (derived training template), and LFM2 v2 (escaped strings).
    "lfm2": Family("lfm2", lambda p: trl_family_tokenizer("lfm2_2_5"), True, reasoning=True, valid=[
        "<think>Need it.</think>Sure.<|tool_call_start|>[f(a=1, s='x y', l=['a', 'b'], o={\"k\": null})]<|tool_call_end|>",
        "<|tool_call_start|>[f(), g(flag=True, n=None, x=-2.5e3)]<|tool_call_end|>Checking.",
        "<|tool_call_start|>[f(s='it\\'s\\n', t='C:\\\\x')]<|tool_call_end|>",
    ], cases=[
        ("<|tool_call_start|>[f(a=1, b='x')]<|tool_call_end|>", set(), 1),
        ("<|tool_call_start|>[f(a=1), g(b=[1, 2])]<|tool_call_end|>", set(), 2),
        ("<think>hm</think>ok<|tool_call_start|>[f()]<|tool_call_end|>", set(), 1),
        ("<|tool_call_start|>[f(a=1)", {"unclosed_tag"}, 1),
        ("<|tool_call_start|>[f(a=1", {"unclosed_tag", "bad_value"}, 1),
        ("<|tool_call_start|>f(a=1)<|tool_call_end|>", {"not_a_list"}, 0),
        ("<|tool_call_start|>[f(a=x)]<|tool_call_end|>", {"bad_value"}, 1),
        ("<|tool_call_start|>[f(a='x)]<|tool_call_end|>", {"bad_value"}, 1),
        ("<|tool_call_start|>[(a=1)]<|tool_call_end|>", {"missing_name"}, 0),
        ("<|tool_call_start|>[f(a=1, a=2)]<|tool_call_end|>", {"duplicate_parameter"}, 1),
        ("<|tool_call_start|>[]<|tool_call_end|>", {"empty_call"}, 0),
        ("<|tool_call_start|>[f()] x<|tool_call_end|>", {"trailing_text"}, 1),
        ("done<|tool_call_end|>", {"stray_tag"}, 0),
        ("<think><|tool_call_start|>[f()]<|tool_call_end|></think>No.", {"call_in_reasoning"}, 0),
        ("", {"empty"}, 0),
    ]),
    "lfm2_v2": Family("lfm2", lambda p: trl_family_tokenizer("lfm2_v2"), True),
    # LFM2's first template renders no tool_calls: the format writes them into the content.
    "lfm2_content": Family("lfm2_content", lambda p: trl_family_tokenizer("lfm2"), True),
    # GLM-4 MoE on its own template (Qwen3's tokenizer with GLM's control tokens added).
    "glm4": Family("glm4", lambda p: trl_family_tokenizer("glm4moe"), True, reasoning=True, valid=[
        "\n<think>Need it.</think>\nSure.\n<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n"
        "<arg_key>s</arg_key>\n<arg_value>x y</arg_value>\n</tool_call>",
        "\n<think></think>\n<tool_call>g\n<arg_key>o</arg_key>\n<arg_value>{\"k\": [1, null]}</arg_value>\n</tool_call>"
        "\n<tool_call>h\n</tool_call>",
    ], cases=[
        ("<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n</tool_call>", set(), 1),
        ("<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n</tool_call>\n<tool_call>g\n</tool_call>", set(), 2),
        ("<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>", {"unclosed_tag"}, 1),
        ("<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1\n</tool_call>", {"unclosed_tag"}, 1),
        ("<tool_call>\n<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>", {"missing_name"}, 0),
        ("<tool_call></tool_call>", {"empty_call"}, 0),
        ("<tool_call>add\n<arg_key>int</arg_key>\n<arg_value>seven</arg_value>\n</tool_call>", {"bad_value"}, 1),
        ("<tool_call>f\n<arg_key>a</arg_key><arg_value>1</arg_value><arg_key>a</arg_key><arg_value>2</arg_value></tool_call>",
         {"duplicate_parameter"}, 1),
        ("<tool_call>f\n</tool_call> and more", {"trailing_text"}, 1),
        ("done</tool_call>", {"stray_tag"}, 0),
        ("<think><tool_call>f\n</tool_call></think>No.", {"call_in_reasoning"}, 0),
        ("", {"empty"}, 0),
    ]),
    # Muse Glimmer (ATEM) on its own template (Qwen3's tokenizer with ATEM's control tokens added).
    "atem": Family("atem", lambda p: trl_family_tokenizer("muse_glimmer"), True, reasoning=True, valid=[
        " to=self<|message|>Need it.<|eom|><|start|>assistant to=f<|message|><atem:function_calls>\n"
        '<atem:invoke name="f">\n<atem:parameter name="a">1</atem:parameter>\n<atem:parameter name="s">x y</atem:parameter>\n'
        "</atem:invoke>\n</atem:function_calls>",
        " to=user<|message|>It is 42.",
    ], cases=[
        (' to=f<|message|><atem:function_calls>\n<atem:invoke name="f">\n<atem:parameter name="a">1</atem:parameter>\n'
         "</atem:invoke>\n</atem:function_calls>", set(), 1),
        (" to=self<|message|>hm<|eom|><|start|>assistant to=user<|message|>42", set(), 0),
        (' to=f<|message|><atem:function_calls>\n<atem:invoke name="f">\n<atem:parameter name="a">1', {"unclosed_tag"}, 1),
        (' to=f<|message|><atem:function_calls>\n<atem:invoke name="g">\n</atem:invoke>\n</atem:function_calls>',
         {"recipient_mismatch"}, 1),
        (" to=f<|message|>just text", {"missing_name"}, 0),
        (" to=f<|message|><atem:function_calls></atem:function_calls>", {"empty_call"}, 0),
        (' to=add<|message|><atem:function_calls>\n<atem:invoke name="add">\n<atem:parameter name="int">seven'
         "</atem:parameter>\n</atem:invoke>\n</atem:function_calls>", {"bad_value"}, 1),
        (" to=user 42", {"missing_message_tag"}, 0),
        ("<|message|>42", {"missing_channel"}, 0),
        ("", {"empty"}, 0),
    ]),
    # Gemma 4 on its own template (Gemma 3's tokenizer with Gemma 4's control tokens added).
    "gemma4": Family("gemma4", lambda p: trl_family_tokenizer("gemma4"), True, reasoning=True, valid=[
        '<|channel>thought\nNeed it.\n<channel|><|tool_call>call:f{a:1,s:<|"|>x, y: z<|"|>,o:{k:null,l:[1,<|"|>b<|"|>]}}'
        "<tool_call|>",
        "<|tool_call>call:f{}<tool_call|><|tool_call>call:g{flag:true,x:-2.5e3}<tool_call|>Checking.",
        "Just an answer.",
    ], cases=[
        ('<|tool_call>call:f{a:1,b:<|"|>x<|"|>}<tool_call|>', set(), 1),
        ("<|tool_call>call:f{a:1}<tool_call|><|tool_call>call:g{b:[1,2]}<tool_call|>", set(), 2),
        ("<|channel>thought\nhm\n<channel|>ok<|tool_call>call:f{}<tool_call|>", set(), 1),
        ("<|tool_call>call:f{a:1}", {"unclosed_tag"}, 1),
        ("<|tool_call>call:f{a:1<tool_call|>", {"bad_value"}, 1),
        ("<|tool_call>f{a:1}<tool_call|>", {"missing_name"}, 0),
        ("<|tool_call>call:f{a:x}<tool_call|>", {"bad_value"}, 1),
        ('<|tool_call>call:f{a:<|"|>x}<tool_call|>', {"bad_value"}, 1),
        ("<|tool_call>call:f{a:1,a:2}<tool_call|>", {"bad_value"}, 1),
        ("<|tool_call>call:f{} extra<tool_call|>", {"trailing_text"}, 1),
        ("done<tool_call|>", {"stray_tag"}, 0),
        ("<|channel>thought\n<|tool_call>call:f{}<tool_call|><channel|>No.", {"call_in_reasoning"}, 0),
        ("", {"empty"}, 0),
    ]),
}  # fmt: skip


# ------------------------------------------------------------------ families added in issue 42
# Real templates from llama.cpp's models/templates (tests/chat_fixtures.py); where no offline tokenizer
# of the family exists, Qwen3's (or DeepSeek V3's) with the family's control tokens added.
DS31_TOKENS = ("<think>", "</think>")  # DeepSeek V3.1's tokenizer is V3's with these two
KIMI_TOKENS = ("<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<|tool_calls_section_begin|>",
               "<|tool_calls_section_end|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>")
DS31 = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
KIMI = "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\": 1}<|tool_call_end|>" \
       "<|tool_calls_section_end|>"
COHERE_TOKENS = ("<BOS_TOKEN>", "<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "<|SYSTEM_TOKEN|>", "<|USER_TOKEN|>",
                 "<|CHATBOT_TOKEN|>", "<|START_RESPONSE|>", "<|END_RESPONSE|>", "<|START_ACTION|>", "<|END_ACTION|>",
                 "<|START_TOOL_RESULT|>", "<|END_TOOL_RESULT|>", "<|START_THINKING|>", "<|END_THINKING|>")
COMMAND = '<|START_THINKING|><|END_THINKING|><|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "f", "parameters": {"a": 1}}\n]<|END_ACTION|>'
L4_TOKENS = ("<|header_start|>", "<|header_end|>", "<|eot|>", "<|eom|>", "<|python_start|>", "<|python_end|>")
# A Llama 4 tokenizer whose template shows no tools (no offline Llama 4 template writes calls): the
# format supplies agentrl's pythonic template, found by Llama 4's header markers.
L4_PLAIN = ("{{- bos_token }}{%- for m in messages %}{{- '<|header_start|>' + m.role + '<|header_end|>\\n\\n' + m.content"
            " + '<|eot|>' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|header_start|>assistant<|header_end|>\\n\\n' }}"
            "{%- endif %}")
L4 = "[f(a=1, s='x y')]"
GLM_TOKENS = ("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>", "<arg_key>", "</arg_key>",
              "<arg_value>", "</arg_value>", "/nothink")
LFM_TOKENS = ("<|startoftext|>", "<|tool_list_start|>", "<|tool_list_end|>", "<|tool_call_start|>", "<|tool_call_end|>",
              "<|tool_response_start|>", "<|tool_response_end|>")
DS32 = '\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="a" string="false">1</｜DSML｜parameter>\n' \
       '<｜DSML｜parameter name="s" string="true">x y</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>'
MINIMAX_TOKENS = ("]~!b[", "]~b]", "[e~[", "<minimax:tool_call>", "</minimax:tool_call>")
MINIMAX = '<minimax:tool_call>\n<invoke name="f">\n<parameter name="a">1</parameter>\n</invoke>\n</minimax:tool_call>'
FAMILIES |= {
    "deepseek_v31": Family("deepseek_v31", lambda p: tokenizer_with("deepseek_v3", DS31_TOKENS, llamacpp_template(
        "deepseek-ai-DeepSeek-V3.1")), False, valid=[DS31, "Sure." + DS31, "reasoning</think>It is 42."], cases=[
        (DS31, set(), 1),
        ("Ok." + DS31.replace("<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>g<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
         set(), 2),
        ("hm</think>" + DS31, set(), 1),
        (DS31.replace("<｜tool▁calls▁end｜>", ""), {"unclosed_tag"}, 1),
        (DS31.replace('{"a": 1}', '{"a": }'), {"bad_json"}, 1),
        (DS31.replace("f<｜tool▁sep｜>", "function<｜tool▁sep｜>f\n```json\n"), {"bad_json", "undeclared_tool"}, 1),  # V3 syntax
        (DS31.replace("f<｜tool▁sep｜>", ""), {"missing_name"}, 0),
        (DS31.replace("f<｜tool▁sep｜>", '{"f"}<｜tool▁sep｜>'), {"bad_name"}, 0),
        (DS31.replace(">f<", ">nope<"), {"undeclared_tool"}, 1),
        ("<｜tool▁calls▁begin｜><｜tool▁calls▁end｜>", {"empty_call"}, 0),
        ("text <｜tool▁sep｜>", {"stray_tag"}, 0),
        ("", {"empty"}, 0),
    ]),
    "kimi_k2": Family("kimi_k2", lambda p: tokenizer_with("qwen3", KIMI_TOKENS, llamacpp_template("moonshotai-Kimi-K2")),
                      True, valid=[KIMI, "Sure." + KIMI, "<think>hm</think>It is 42."], cases=[
        (KIMI, set(), 1),
        ("Ok." + KIMI.replace("<|tool_calls_section_end|>", "<|tool_call_begin|>functions.g:1<|tool_call_argument_begin|>{}"
                              "<|tool_call_end|><|tool_calls_section_end|>"), set(), 2),
        ("<think>hm</think>" + KIMI, set(), 1),
        (KIMI.replace("<|tool_calls_section_end|>", ""), {"unclosed_tag"}, 1),
        (KIMI.replace('{"a": 1}', '{"a": '), {"bad_json"}, 1),
        (KIMI.replace("functions.f:0", "f"), {"bad_name"}, 0),
        (KIMI.replace("<|tool_call_argument_begin|>", ""), {"missing_arguments"}, 0),
        (KIMI.replace("functions.f:", "functions.nope:"), {"undeclared_tool"}, 1),
        (KIMI + " done", {"trailing_text"}, 1),
        ("<|tool_calls_section_begin|><|tool_calls_section_end|>", {"empty_call"}, 0),
        ("done<|tool_call_end|>", {"stray_tag"}, 0),
        ("<think>" + KIMI + "</think>No.", {"call_in_reasoning"}, 0),
        ("", {"empty"}, 0),
    ]),
    "minimax_m2": Family("minimax_m2", lambda p: tokenizer_with("qwen3", MINIMAX_TOKENS, llamacpp_template("MiniMax-M2")),
                         True, reasoning=True, valid=[MINIMAX, "hm\n</think>\n\nSure.\n" + MINIMAX, "hm\n</think>\n\n42"],
                         cases=[
        (MINIMAX, set(), 1),
        ("Ok." + MINIMAX.replace("</invoke>\n</minimax", '</invoke>\n<invoke name="g">\n</invoke>\n</minimax'), set(), 2),
        ("hm\n</think>\n\n" + MINIMAX, set(), 1),
        (MINIMAX.replace("</minimax:tool_call>", ""), {"unclosed_tag"}, 1),
        (MINIMAX.replace("</parameter>", ""), {"unclosed_tag"}, 1),
        (MINIMAX.replace('<invoke name="f">', '<invoke name="">'), {"missing_name"}, 0),
        (MINIMAX.replace('<invoke name="f">', "<invoke>"), {"missing_name"}, 0),
        (MINIMAX.replace("</parameter>\n", '</parameter>\n<parameter name="a">2</parameter>\n'), {"duplicate_parameter"}, 1),
        (MINIMAX.replace('"f"', '"add"').replace('"a">1', '"int">seven'), {"bad_value"}, 1),
        (MINIMAX.replace('"f"', '"nope"'), {"undeclared_tool"}, 1),
        (MINIMAX + " done", {"trailing_text"}, 1),
        ("<minimax:tool_call></minimax:tool_call>", {"empty_call"}, 0),
        ("done</minimax:tool_call>", {"stray_tag"}, 0),
        ("", {"empty"}, 0),
    ]),
    "command": Family("command", lambda p: tokenizer_with("qwen3", COHERE_TOKENS, llamacpp_template(
        "CohereForAI-c4ai-command-r7b-12-2024-tool_use")), True, valid=[COMMAND, "<|START_RESPONSE|>It is 42.<|END_RESPONSE|>",
        "<|START_THINKING|>hm<|END_THINKING|><|START_RESPONSE|>42<|END_RESPONSE|>"], cases=[
        (COMMAND, set(), 1),
        (COMMAND.replace("}}\n]", '}}, {"tool_call_id": "1", "tool_name": "g", "parameters": {}}\n]'), set(), 2),
        ("<|START_RESPONSE|>42<|END_RESPONSE|>", set(), 0),
        ("plain 42", set(), 0),
        (COMMAND.replace("<|END_ACTION|>", ""), {"unclosed_tag"}, 1),
        (COMMAND.replace('{"a": 1}}', '{"a": 1}'), {"bad_json"}, 1),
        (COMMAND.replace('"tool_name": "f", ', ""), {"missing_name"}, 0),
        (COMMAND.replace('"f"', '"f g"'), {"bad_name"}, 0),
        (COMMAND.replace('"f"', '"nope"'), {"undeclared_tool"}, 1),
        (COMMAND.replace("[\n", "{\n"), {"not_a_list"}, 1),  # the name is salvaged: the model is told
        ("<|START_THINKING|><|END_THINKING|><|START_ACTION|>[]<|END_ACTION|>", {"empty_call"}, 0),
        (COMMAND + " done", {"trailing_text"}, 1),
        ("<|START_RESPONSE|>42", {"unclosed_tag"}, 0),
        ("done<|END_ACTION|>", {"stray_tag"}, 0),
        ("", {"empty"}, 0),
    ]),
    "llama4_pythonic": Family("llama4_pythonic", lambda p: tokenizer_with("llama3", L4_TOKENS, L4_PLAIN), False, valid=[
        L4, "Sure.\n[f(a=[1, 2], o={\"k\": null}), g(flag=True, n=None, x=-2.5e3)]", "It is 42."], cases=[
        (L4, set(), 1),
        ("Let me check.\n[f(a=1), g(b='it\\'s')]", set(), 2),
        ("<|python_start|>[f(a=1)]<|python_end|>", set(), 1),
        ("Just text, [not a call] here.", set(), 0),
        ("[f(a=1)", {"unclosed_tag"}, 1),
        ("[f(a=1", {"bad_value"}, 1),
        ("[f(a=x)]", {"bad_value"}, 1),
        ("[f(a={1, 2})]", {"bad_value"}, 1),
        ("[f(a=1, a=2)]", {"duplicate_parameter"}, 1),
        ("[nope()]", {"undeclared_tool"}, 1),
        ("[f()] and more", {"trailing_text"}, 1),
        ("<|python_start|>[f()]", {"unclosed_tag"}, 1),
        ("done<|python_end|>", {"stray_tag"}, 0),
        ("", {"empty"}, 0),
    ]),
    # GLM-4.7 (GLM-5 keeps its markup) on its real template: calls without newlines, a derived training template.
    "glm47": Family("glm4", lambda p: tokenizer_with("qwen3", GLM_TOKENS, llamacpp_template("GLM-4.7-Flash")), True,
                    reasoning=True, valid=["hm</think><tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>"]),
    # GLM-5.3 on agentrl's test vector of its grammar (tests/glm5_template.py; no registry ships one).
    "glm5": Family("glm4", lambda p: tokenizer_with("qwen3", GLM_TOKENS, GLM5_TEMPLATE), True, reasoning=True,
                   valid=["hm</think><tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>"]),
    # LFM2.5 Instruct (llama.cpp's template): reasoning and calls in the content, keep_past_thinking derived on.
    "lfm2_5_content": Family("lfm2_5_content", lambda p: tokenizer_with("qwen3", LFM_TOKENS, llamacpp_template(
        "LFM2.5-Instruct"), bos="<|startoftext|>"), True, reasoning=True),
    # DeepSeek V3.2 ships an encoder, no chat template: a tokenizer without one gets agentrl's.
    "deepseek_v32": Family("deepseek_v32", lambda p: tokenizer_with("deepseek_v3", DS31_TOKENS, None), False,
                           valid=[DS32, "Sure." + DS32, "hm</think>It is 42."], cases=[
        (DS32, set(), 1),
        ("Ok." + DS32.replace("</｜DSML｜function_calls>", '<｜DSML｜invoke name="g">\n</｜DSML｜invoke>\n</｜DSML｜function_calls>'),
         set(), 2),
        ("hm</think>" + DS32, set(), 1),
        (DS32.replace("</｜DSML｜function_calls>", ""), {"unclosed_tag"}, 1),
        (DS32.replace('string="false">1', 'string="false">{1'), {"bad_value"}, 1),
        (DS32.replace('name="f"', 'name=""'), {"missing_name"}, 0),
        (DS32.replace('name="f"', 'name="f g"'), {"bad_name"}, 0),
        (DS32.replace('name="f"', 'name="nope"'), {"undeclared_tool"}, 1),
        (DS32.replace('"add"', '"add"').replace('name="f"', 'name="add"').replace('name="a" string="false">1',
         'name="int" string="false">"x"'), {"bad_value"}, 1),
        (DS32 + " done", {"trailing_text"}, 1),
        ("<｜DSML｜function_calls></｜DSML｜function_calls>", {"empty_call"}, 0),
        ("done</｜DSML｜function_calls>", {"stray_tag"}, 0),
        ("", {"empty"}, 0),
    ]),
}  # fmt: skip


def test_every_format_has_a_family_here() -> None:
    assert {f.name for f in FAMILIES.values()} == set(available_formats())


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Family, ChatFormat]:
    fam = FAMILIES[request.param]
    tok = fam.tokenizer(tmp_path_factory.mktemp(fam.name))
    fmt = get_chat_format(tok, fam.name)
    return fam, fmt


def turn_ids(fmt: ChatFormat, history: list[dict], reply: dict) -> tuple[list[int], list[int]]:
    """(prompt ids, the ids a model would sample to write ``reply``, through its end token)."""
    prompt = fmt.render(history, TOOLS)
    full = fmt.render([*history, reply], TOOLS, add_generation_prompt=False)
    assert full[: len(prompt)] == prompt, "the generation prompt is not a prefix of the rendered turn"
    last = max(i for i, t in enumerate(full) if t in fmt.eot_token_ids)
    return prompt, full[len(prompt) : last + 1]


def call_turn(family: Family, content: str = "", **kw: Any) -> dict[str, Any]:
    """An assistant turn with two calls (harmony ends a turn at its first call, so one there)."""
    calls = [tool_call("get_weather", {"city": kw.get("city", "Paris")}, "call_0"), tool_call("add", ARGS, "call_1")]
    msg: dict[str, Any] = {"role": "assistant", "content": content, "tool_calls": calls[1:] if family.name == "gpt_oss" else calls}
    if family.reasoning:
        msg["reasoning_content"] = "Two tools.\nBoth now."
    return msg


def test_detected_by_behaviour(family: tuple[Family, ChatFormat]) -> None:
    """The template in use writes the family's syntax (a supplied ChatML template writes 'hermes')."""
    fam, fmt = family
    template = fmt.chat_template or fmt.tokenizer.chat_template
    spec = format_spec(fam.name)
    expected = fam.name if spec.prompt_markers else spec.parser  # calls as content: told by the tool list
    assert detect_format(fmt.tokenizer, template) == expected
    # A fork: other instructions, other blank lines; the calls are written the same way.
    fork = template.replace("\\n\\n", "\\n\\n\\n", 1).replace("{{- bos_token", "{{- 'Forked.\\n' ~ bos_token", 1)
    fork = fork.replace("<|im_start|>system\\n", "<|im_start|>system\\nForked.\\n", 1)
    fork = fork.replace("You may call one or more functions", "Forked. You may call one or more functions", 1)
    fork = fork.replace("You are a helpful assistant", "You are a forked, helpful assistant", 1)  # Kimi K2
    fork = fork if fork != template else fork.replace("You are", "Forked. You are", 1)  # Command R7B
    assert fork != template
    assert detect_format(fmt.tokenizer, fork) == expected


@pytest.mark.parametrize(("asset", "expected"), [("qwen3", "qwen3"), ("smollm2", "chatml_tools"), ("llama3", "llama3"),
                                                 ("deepseek_v3", "deepseek_v3")])  # fmt: skip
def test_real_templates_are_detected(asset: str, expected: str) -> None:
    """Each family's own template (Llama 3's and SmolLM2's render no tools: their turn markers tell)."""
    assert get_chat_format(load_asset_tokenizer(asset)).name == expected


def test_template_source(family: tuple[Family, ChatFormat]) -> None:
    fam, fmt = family
    if fam.real_template:
        assert fmt.template_source.startswith(("tokenizer", "training template"))
    else:
        # (the tiny Mistral tokenizer carries agentrl's Mistral template as its own)
        assert fmt.template_source.startswith("agentrl ") or fam.name == "mistral"
        spec = format_spec(fam.name)
        assert (fmt.chat_template or fmt.tokenizer.chat_template) == read_template(spec.template)


def test_render_equals_apply_chat_template(family: tuple[Family, ChatFormat]) -> None:
    fam, fmt = family
    conv = [SYSTEM, USER, call_turn(fam), tool_result("sunny", call_id="call_0"), tool_result("3", "add", "call_1")]
    for gen in (True, False):
        messages = conv if gen else conv[:3]
        adapted = fmt._adapt(list(messages)) if fmt._adapt is not None else messages  # the format's message shape
        expected = fmt.tokenizer.apply_chat_template(
            adapted, tools=TOOLS, chat_template=fmt.chat_template, add_generation_prompt=gen
        )["input_ids"]
        assert fmt.render(messages, TOOLS, add_generation_prompt=gen) == expected


@pytest.mark.parametrize("content", ["", "Let me check."])
def test_round_trip_keeps_calls_and_types(family: tuple[Family, ChatFormat], content: str) -> None:
    fam, fmt = family
    reply = call_turn(fam, content)
    if fam.name == "deepseek_v3":
        pass  # content before calls is kept by our template and read back
    _, sampled = turn_ids(fmt, [SYSTEM, USER], reply)
    parsed = fmt.parse(sampled, TOOLS)
    assert parsed.issues == [], parsed.issues
    expected = [("get_weather", typed({"city": "Paris"})), ("add", typed(ARGS))]
    assert [(c.name, typed(c.arguments)) for c in parsed.tool_calls] == expected[len(expected) - len(reply["tool_calls"]) :]
    # ATEM's and Command's templates here write no text beside calls (a declared limit of both); Mistral
    # declares it for Nemo's template, but agentrl's mistral_tools.jinja tested here writes the text.
    dropped = fam.name in ("atem", "command")
    assert not dropped or "text_beside_calls" in format_spec(fam.name).limits
    assert parsed.content == ("" if dropped else content)
    if fam.reasoning:
        assert parsed.reasoning == "Two tools.\nBoth now."
    # The parsed message renders back to the same ids (what the bridge relies on).
    again = fmt.render([SYSTEM, USER, parsed.to_message()], TOOLS, add_generation_prompt=False)
    assert again == fmt.render([SYSTEM, USER, reply], TOOLS, add_generation_prompt=False)


def test_multi_round_bridge_is_proven(family: tuple[Family, ChatFormat]) -> None:
    """assistant -> tool -> assistant -> tool, parse + bridge only; equal to one full render."""
    fam, fmt = family
    messages = [SYSTEM, USER]
    ids = fmt.render(messages, TOOLS)
    for city in ("Paris", "Lyon"):
        reply = call_turn(fam, city=city)
        _, sampled = turn_ids(fmt, messages, reply)
        parsed = fmt.parse(sampled, TOOLS)
        assert parsed.issues == [] and parsed.tool_calls
        message = parsed.to_message()
        for k, call in enumerate(message["tool_calls"]):
            call["id"] = f"call_{k}"  # the engine names calls the same way when the model gives no id
        messages.append(message)
        ids += sampled
        new = [tool_result("3", call["function"]["name"], call["id"]) for call in message["tool_calls"]]
        result = fmt.bridge(messages, new, ids, TOOLS)
        assert result.proven, result.reason
        ids += result.ids
        messages += new
    assert ids == fmt.render(messages, TOOLS)


DECLARED_SPLITS = {
    # family: (reply, the sampled end token replacing the rendered one or None, new messages, reason part)
    "mistral": ({"role": "assistant", "content": "Sunny."}, None, [{"role": "user", "content": "Tomorrow?"}],
                "first differ at token"),
    # harmony: the final answer ends with <|return|> (as the model writes it) but is <|end|> in history
    "gpt_oss": ({"role": "assistant", "content": "Sunny."}, "<|return|>", [{"role": "user", "content": "Tomorrow?"}],
                "rewrites earlier turns"),
    "llama3": (None, "<|eom_id|>", [tool_result("sunny", call_id="call_0")], "not with the template's end of turn"),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(DECLARED_SPLITS))
def test_declared_fallback_is_a_refusal(name: str, tmp_path: Path) -> None:
    """Where a family's format rewrites history, the bridge refuses (the engine splits and counts)."""
    fam = FAMILIES[name]
    fmt = get_chat_format(fam.tokenizer(tmp_path), name)
    reply, end_token, new, reason = DECLARED_SPLITS[name]
    reply = reply or call_turn(fam)
    prompt = fmt.render([SYSTEM, USER], TOOLS)
    full = fmt.render([SYSTEM, USER, reply], TOOLS, add_generation_prompt=False)
    sampled = full[len(prompt) :]
    if end_token is not None:  # the model ends this turn with another token than history shows
        end_id = fmt.tokenizer.convert_tokens_to_ids(end_token)
        sampled = sampled[:-1] + [end_id] if sampled[-1] in fmt.eot_token_ids or name == "gpt_oss" else sampled
        assert end_id in fmt.stop_token_ids
    result = fmt.bridge([SYSTEM, USER, reply], new, prompt + sampled, TOOLS)
    assert not result.proven and reason in result.reason, result.reason


def test_hand_written_malformed_outputs(family: tuple[Family, ChatFormat]) -> None:
    fam, fmt = family
    parser = fmt.parser
    for text, kinds, n_calls in fam.cases:
        result = parser.parse_with_tools(text, CASE_TOOLS)
        check_family_invariants(result)
        assert ({i.kind for i in result.issues}, len(result.tool_calls)) == (kinds, n_calls), (text, result.issues)


def check_family_invariants(result: Any) -> None:
    for issue in result.issues:
        assert issue.kind in FAMILY_KINDS, issue
    base = copy.copy(result)
    base.issues = [i for i in result.issues if i.kind in KNOWN_KINDS]  # check_invariants knows the base kinds
    check_invariants(base)


# families without their own valid samples share a parser that test_chat_parsers corrupts already
@pytest.mark.parametrize("family", sorted(n for n, f in FAMILIES.items() if f.valid), indirect=True)
def test_seeded_corruptions_never_raise(family: tuple[Family, ChatFormat]) -> None:
    fam, fmt = family
    rng = random.Random(fam.name)
    markers = [m for text in fam.valid for m in ("<|python_tag|>", "[TOOL_CALLS]", "[ARGS]", "<function=",
               "</parameter>", "<|channel|>", "<|message|>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "```", "<|tool_call_start|>",
               "<|tool_call_end|>", "(", "'", "<|tool_call>", "<tool_call|>", '<|"|>', "{", ":", "<arg_key>",
               "</arg_value>", "<tool_call>", "<|eom|>", "<atem:invoke", "</atem:parameter>", "<invoke name=",
               "</parameter>", "<minimax:tool_call>", "<|START_ACTION|>", "<|END_ACTION|>", '"tool_name"', "<｜DSML｜invoke", "</｜DSML｜parameter>",
               'string="') if m in text]  # fmt: skip
    kinds: set[str] = set()
    for _ in range(300):
        text = corrupt(rng.choice(fam.valid), rng)
        if markers and rng.random() < 0.3:
            i = rng.randint(0, len(text))
            text = text[:i] + rng.choice(markers) + text[i:]
        for result in (fmt.parser.parse(text), fmt.parser.parse_with_tools(text, TOOLS)):
            check_family_invariants(result)
            kinds |= {i.kind for i in result.issues}
            fmt.render_text([SYSTEM, USER, result.to_message()], TOOLS)  # the template accepts what we return
    assert len(kinds) >= 3, kinds  # the corruptions reached the error paths


def test_corrupted_token_ids_never_raise(family: tuple[Family, ChatFormat]) -> None:
    fam, fmt = family
    rng = random.Random(1)
    eot = fmt.eot_token_ids[0]
    for text in fam.valid or ["Hello"]:
        for _ in range(20):
            ids = fmt.encode(corrupt(text, rng).encode("utf-8", "replace").decode("utf-8")) + rng.choice([[eot], [], [eot, 5]])
            if rng.random() < 0.3:
                ids.insert(rng.randint(0, len(ids)), rng.choice([len(fmt.tokenizer) + 3, -1]))
            check_family_invariants(fmt.parse(ids, TOOLS))


# ------------------------------------------------------------------ real templates of the families
def test_deepseek_template_equals_the_real_one_without_calls(tmp_path: Path) -> None:
    """Our DeepSeek V3 template renders plain conversations exactly as DeepSeek's own."""
    tok = load_asset_tokenizer("deepseek_v3")
    ours = get_chat_format(tok, "deepseek_v3")
    convs = [
        [USER],
        [SYSTEM, USER, {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "Tomorrow?"}],
        [SYSTEM, {"role": "system", "content": "Second."}, USER, {"role": "assistant", "content": "A"}],
    ]
    for messages in convs:
        for gen in (True, False):
            real = tok.apply_chat_template(messages, add_generation_prompt=gen)["input_ids"]
            assert ours.render(messages, add_generation_prompt=gen) == real


def test_deepseek_real_template_cannot_render_calls() -> None:
    """Why the format supplies a template: the real one fails on a tool-call turn here."""
    tok = load_asset_tokenizer("deepseek_v3")
    call = {"role": "assistant", "content": None, "tool_calls": [tool_call("get_weather", '{"city": "Paris"}')]}
    with pytest.raises(Exception):
        tok.apply_chat_template([USER, call], tokenize=False)
    assert detect_format(tok) == "deepseek_v3"  # by its turn markers


def test_llama3_tokenizer_has_the_31_tokens() -> None:
    tok = load_asset_tokenizer("llama3")
    ids = tok.convert_tokens_to_ids(["<|python_tag|>", "<|eom_id|>", "<|eot_id|>"])
    assert ids == [128010, 128008, 128009]
    fmt = get_chat_format(tok)
    assert fmt.name == "llama3" and fmt.eot_token_ids[:2] == [128009, 128008]


def test_gpt_oss_parses_a_whole_harmony_turn() -> None:
    fmt = get_chat_format(load_asset_tokenizer("gpt_oss"), "gpt_oss")
    text = ("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
            'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>')  # fmt: skip
    parsed = fmt.parse(fmt.encode(text))
    assert parsed.issues == [] and parsed.reasoning == "Need the weather."
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("get_weather", {"city": "Paris"})]
    final = fmt.parse(fmt.encode("<|channel|>final<|message|>Sunny.<|return|>"))
    assert final.issues == [] and final.content == "Sunny."
    assert "<|end|>" not in [fmt.decode([i]) for i in fmt.stop_token_ids]  # <|end|> closes a message, not the turn


def test_xml_types_come_from_the_schema() -> None:
    parser = get_parser("qwen3_xml")
    text = "<tool_call>\n<function=add>\n<parameter=text>\n7\n</parameter>\n<parameter=int>\n7\n</parameter>\n" \
           "<parameter=true>\nTrue\n</parameter>\n</function>\n</tool_call>"  # fmt: skip
    typed_call = parser.parse_with_tools(text, TOOLS).tool_calls[0]
    assert typed_call.arguments == {"text": "7", "int": 7, "true": True}
    assert isinstance(typed_call.arguments["text"], str)
    untyped = parser.parse(text).tool_calls[0]  # no schema: JSON-looking values are JSON
    assert untyped.arguments == {"text": 7, "int": 7, "true": True}
    bad = parser.parse_with_tools(text.replace("\n7\n</parameter>\n<parameter=true>", "\nseven\n</parameter>\n"
                                                "<parameter=true>"), TOOLS)  # fmt: skip
    assert [i.kind for i in bad.issues] == ["bad_value"] and bad.tool_calls[0].error == "bad_value"


def test_string_arguments_are_rendered_as_objects_by_xml() -> None:
    fmt = get_chat_format(load_asset_tokenizer("qwen3"), "qwen3_xml")
    as_text = {"role": "assistant", "content": "", "tool_calls": [tool_call("add", json.dumps({"int": 3}))]}
    assert "<parameter=int>\n3\n</parameter>" in fmt.render_text([USER, as_text], TOOLS)
