"""The built-in chat formats, one :class:`FormatSpec` each (see docs/chat_formats.md)."""

from __future__ import annotations

import json
from typing import Any

from agentrl.chat.derived import (
    GLM_STOPS,
    derive_gemma4_training,
    derive_glm_training,
    derive_lfm2_training,
    derive_mistral_training,
    derive_nemotron_training,
    thinking_from_reasoning,
    verify_gemma4_training,
    verify_glm_training,
    verify_lfm2_training,
    verify_mistral_training,
    verify_nemotron_training,
)
from agentrl.chat.formats import FormatSpec, register_format
from agentrl.chat.harmony_training import derive_gpt_oss_training, verify_gpt_oss_training
from agentrl.chat.training import derive_qwen3_xml_training, verify_qwen3_training, verify_qwen3_xml_training


def arguments_as_objects(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Templates that write each argument separately need them as a mapping, not a JSON string."""
    out = []
    for m in messages:
        calls = m.get("tool_calls") if m.get("role") == "assistant" else None
        if calls and any(isinstance(c.get("function", c).get("arguments"), str) for c in calls):
            fixed = []
            for c in calls:
                fn = dict(c.get("function", c))
                if isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"])
                    except ValueError:
                        pass  # left as text; the template writes no parameters for it
                fixed.append({**c, "function": fn})
            m = {**m, "tool_calls": fixed}
        out.append(m)
    return out


def mapping_arguments(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """LFM2's and GLM-4's templates iterate over each call's arguments: a call whose arguments could
    not be parsed (kept as text) is rendered with none, not a crash. LFM2.5 reads reasoning from
    ``thinking``, so it is copied there too."""
    out = []
    for m in arguments_as_objects(thinking_from_reasoning(messages)):
        calls = m.get("tool_calls") if m.get("role") == "assistant" else None
        if calls and any(not isinstance(c.get("function", c).get("arguments"), dict) for c in calls):
            fixed = []
            for c in calls:
                fn = dict(c.get("function", c))
                fn["arguments"] = fn.get("arguments") if isinstance(fn.get("arguments"), dict) else {}
                fixed.append({**c, "function": fn})
            m = {**m, "tool_calls": fixed}
        out.append(m)
    return out


def derive_xml_training(original: str) -> str | None:
    """Qwen3.5/3.6/3.8's condition, else Nemotron 3's switch (both hide earlier reasoning)."""
    return derive_qwen3_xml_training(original) or derive_nemotron_training(original)


def verify_xml_training(tokenizer: Any, original: str, training: str) -> str | None:
    """The check that fits the derivation :func:`derive_xml_training` applied."""
    if derive_qwen3_xml_training(original) is not None:
        return verify_qwen3_xml_training(tokenizer, original, training)
    return verify_nemotron_training(tokenizer, original, training)


def _python_value(value: Any) -> str:
    """An argument value as LFM2 writes it: a quoted escaped string, JSON for objects and lists,
    Python's spelling otherwise (True, None, 2.5)."""
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n").replace("\r", "\\r")
        return f"'{escaped}'"
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def calls_into_content(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """LFM2's first template renders only an assistant's content: its model writes the calls there,
    ``<|tool_call_start|>[name(key=value, ...)]<|tool_call_end|>`` before the text, so that is where
    the calls go (LFM2's later templates render ``tool_calls`` the same way)."""
    out = []
    for m in mapping_arguments(messages):
        calls = m.get("tool_calls") if m.get("role") == "assistant" else None
        if calls:
            written = []
            for c in calls:
                fn = c.get("function", c)
                args = ", ".join(f"{k}={_python_value(v)}" for k, v in (fn.get("arguments") or {}).items())
                written.append(f"{fn.get('name')}({args})")
            text = "<|tool_call_start|>[" + ", ".join(written) + "]<|tool_call_end|>"
            m = {**m, "content": text + (m.get("content") or "")}
        out.append(m)
    return out


HERMES = register_format(FormatSpec(name="hermes", parser="hermes", models="Qwen2.5, Hermes 2/3, agentrl's bundled model"))
QWEN3 = register_format(
    FormatSpec(
        name="qwen3",
        parser="qwen3",
        models="Qwen3 (thinking on and off)",
        thinking=True,
        training_template="qwen3_training.jinja",
        verify_training=verify_qwen3_training,
    )
)
CHATML_TOOLS = register_format(
    FormatSpec(
        name="chatml_tools",
        parser="hermes",
        models="SmolLM2 and other ChatML templates without a tools section",
        template="chatml_tools.jinja",
        markers=("<|im_start|>assistant",),
    )
)
QWEN3_XML = register_format(
    FormatSpec(
        name="qwen3_xml",
        parser="qwen3_xml",
        models="Qwen3.5, Qwen3-Coder (XML parameter calls)",
        template="qwen3_xml_tools.jinja",
        thinking=True,
        adapt_messages=arguments_as_objects,
        derive_training=derive_xml_training,
        verify_training=verify_xml_training,
    )
)
LLAMA3 = register_format(
    FormatSpec(
        name="llama3",
        parser="llama3",
        models="Llama 3.1, 3.2, 3.3 (JSON tool calls)",
        template="llama3_tools.jinja",
        markers=("<|start_header_id|>assistant<|end_header_id|>",),
        end_tokens=("<|eot_id|>", "<|eom_id|>"),
        limits={"parallel_calls": "Llama 3.1/3.2's own templates refuse more than one tool call per turn"},
    )
)
MISTRAL = register_format(
    FormatSpec(
        name="mistral",
        parser="mistral",
        models="Mistral 7B v0.3, Nemo, Small ([TOOL_CALLS]; v11+ name[ARGS] calls are parsed too)",
        template="mistral_tools.jinja",
        markers=("[/INST]",),
        derive_training=derive_mistral_training,
        verify_training=verify_mistral_training,
        derivation="the system prompt kept with the last user message, as the tool list",
        limits={
            "text_beside_calls": "Mistral Nemo's template writes a turn with tool calls as the call list only; "
            "an answer text beside the calls is not rendered",
            "new_question": "Mistral's format writes the tool list and the system prompt with the last user message, "
            "so a new user message moves them",
        },
    )
)
DEEPSEEK_V3 = register_format(
    FormatSpec(
        name="deepseek_v3",
        parser="deepseek_v3",
        models="DeepSeek V3",
        template="deepseek_v3_tools.jinja",
        markers=("<｜Assistant｜>",),
    )
)
GPT_OSS = register_format(
    FormatSpec(
        name="gpt_oss",
        parser="gpt_oss",
        models="GPT-OSS 20B / 120B (harmony)",
        template="gpt_oss_tools.jinja",
        thinking=True,
        markers=("<|start|>assistant", "<|channel|>"),
        end_tokens=("<|call|>", "<|return|>"),
        adapt_messages=thinking_from_reasoning,
        derive_training=derive_gpt_oss_training,
        verify_training=verify_gpt_oss_training,
        limits={
            "parallel_calls": "harmony ends a turn at each call's <|call|>, so a turn holds one call",
            "new_question": "harmony ends a final answer with <|return|> but history writes <|end|> "
            "(and drops its analysis), so a new user turn after a final answer starts a new sample",
        },
    )
)
LFM2 = register_format(
    FormatSpec(
        name="lfm2",
        parser="lfm2",
        models="LFM2 (v2 template), LFM2.5, LFM2.5-VL (Python-style calls)",
        thinking=True,
        adapt_messages=mapping_arguments,
        derive_training=derive_lfm2_training,
        verify_training=verify_lfm2_training,
    )
)
GEMMA4 = register_format(
    FormatSpec(
        name="gemma4",
        parser="gemma4",
        models="Gemma 4 (all template revisions), DiffusionGemma",
        thinking=True,
        end_tokens=("<turn|>", "<|tool_response>"),
        derive_training=derive_gemma4_training,
        verify_training=verify_gemma4_training,
        limits=dict.fromkeys(
            ("tool_result", "new_question"),  # the new-question episode has a tool result too
            "DiffusionGemma's template opens a new model turn after tool results, which its generation prompt "
            "does not open, so a fresh render differs from the bridged ids (the engine keeps the sampled ids; "
            "DiffusionGemma is a diffusion model, not sampled token by token)",
        ),
    )
)
GLM4 = register_format(
    FormatSpec(
        name="glm4",
        parser="glm4",
        models="GLM-4.5 / 4.6 / 4.7, GLM-5 / 5.1 / 5.2 / 5.3 (GLM-4 MoE: <arg_key>/<arg_value> calls)",
        thinking=True,
        adapt_messages=mapping_arguments,
        end_tokens=GLM_STOPS,
        derive_training=derive_glm_training,
        verify_training=verify_glm_training,
        derivation="every turn keeps its reasoning, and a final assistant turn ends with the token the model stops on",
    )
)
LFM2_CONTENT = register_format(
    FormatSpec(
        name="lfm2_content",
        parser="lfm2",
        models="LFM2, first template (renders no tool_calls: the model writes calls as content)",
        adapt_messages=calls_into_content,
        prompt_markers=("<|tool_list_start|>", "<|tool_list_end|>"),
    )
)
ATEM = register_format(
    FormatSpec(
        name="atem",
        parser="atem",
        models="Muse Glimmer (ATEM: messages addressed to self, a tool, or the user)",
        thinking=True,
        adapt_messages=mapping_arguments,
        end_tokens=("<|eot|>",),
        limits={
            "text_beside_calls": "ATEM addresses text to the user, which ends the turn; a turn with tool calls "
            "carries no text (Muse Glimmer's template drops it)",
        },
    )
)
