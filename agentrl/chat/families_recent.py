"""Chat formats of the tool-calling families added in issue 42 (DeepSeek V3.1, ...), one FormatSpec each.

Kept apart from :mod:`agentrl.chat.families` so each family here is one small, self-contained block:
its parser, the template agentrl supplies where the family's own cannot be used, and its limits.
See docs/chat_formats.md for which real template each was checked against.
"""

from __future__ import annotations

import re
from typing import Any

from agentrl.chat.families import arguments_as_objects, calls_into_content, mapping_arguments
from agentrl.chat.formats import FormatSpec, register_format
from agentrl.chat.training import random_conversations, training_template_problems

_THINK_BLOCK = re.compile(r"<think>\n.*?\n</think>\n\n", re.DOTALL)  # exactly as MiniMax M2 writes it


def without_reasoning(text: str) -> str:
    """A render without its reasoning blocks: what the original may hide in history."""
    return _THINK_BLOCK.sub("", text)


def reasoning_conversations(n: int) -> list[tuple[list[dict[str, Any]], Any, dict[str, Any]]]:
    """:func:`random_conversations` with non-empty reasoning on every assistant turn and no thinking
    switch: for templates whose every generation prompt opens ``<think>`` (so the model always reasons)."""
    out = []
    for messages, tools, _ in random_conversations(n, seed=0):
        messages = [
            {**m, "reasoning_content": "Think."} if m.get("role") == "assistant" and not m.get("reasoning_content") else m
            for m in messages
        ]
        out.append((messages, tools, {}))
    return out


def verify_minimax_training(tokenizer: Any, original: str, training: str) -> str | None:
    """The Qwen3 check (trained turns identical, everything but reasoning identical, prefixes kept), on
    conversations whose every turn reasons: these prompts open ``<think>``, so a model always does."""
    problems = training_template_problems(tokenizer, original, training, reasoning_conversations(8), without_reasoning, limit=1)
    return problems[0] if problems else None


# MiniMax M2 shows a turn's reasoning only after the last user message.
_MINIMAX_LAST_USER = re.compile(r"(\{%-?\s*if\s+reasoning_content)\s+and\s+loop\.index0\s*>\s*ns\.last_user_index(\s*-?%\})")


def derive_minimax_training(original: str) -> str | None:
    """MiniMax M2's template with every turn's reasoning kept; None where the condition is not there."""
    derived, n = _MINIMAX_LAST_USER.subn(r"\1\2", original)
    return derived if n == 1 else None


DEEPSEEK_V31 = register_format(
    FormatSpec(
        name="deepseek_v31",
        parser="deepseek_v31",
        models="DeepSeek V3.1 (NAME<｜tool▁sep｜>JSON calls)",
        template="deepseek_v31_tools.jinja",
        adapt_messages=arguments_as_objects,
    )
)


# Kimi K2 Thinking renders every message up to the last assistant turn without calls as history, with
# its reasoning dropped (``<think></think>``), and only the turns after it with their reasoning: so a
# final answer loses even its own reasoning, although the model wrote it after its generation prompt.
_KIMI_LAST_ANSWER = re.compile(r"\{%-?\s*set ns\.last_non_tool_call_assistant_msg = idx\s*-?%\}")
_KIMI_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


def derive_kimi_training(original: str) -> str | None:
    """K2 Thinking's template with no turn counted as history: every assistant turn, a final answer
    too, renders as the turns after the last answer do (``<think>reasoning</think>``). None for a
    template without that split (K2 and K2 Instruct render no reasoning)."""
    derived, n = _KIMI_LAST_ANSWER.subn("", original)
    return derived if n == 1 else None


def kimi_hidden(text: str) -> str:
    """A Kimi render with every reasoning block written empty, as its history writes it."""
    return _KIMI_THINK.sub("<think></think>", text)


def verify_kimi_training(tokenizer: Any, original: str, training: str) -> str | None:
    """The Qwen3 check on conversations that reason every turn; a final answer, whose reasoning the
    original drops even on the trained turn, is compared up to its reasoning, a call turn exactly."""
    problems = training_template_problems(
        tokenizer, original, training, reasoning_conversations(8), kimi_hidden, limit=1, trained_hidden=True
    )
    return problems[0] if problems else None


KIMI_K2 = register_format(
    FormatSpec(
        name="kimi_k2",
        parser="kimi_k2",
        models="Kimi K2 Instruct / Thinking (functions.NAME:INDEX calls)",
        thinking=True,
        end_tokens=("<|im_end|>",),
        derive_training=derive_kimi_training,
        verify_training=verify_kimi_training,
        derivation="every turn keeps its reasoning, a final answer too",
    )
)


MINIMAX_M2 = register_format(
    FormatSpec(
        name="minimax_m2",
        parser="minimax_m2",
        models="MiniMax M2 (<minimax:tool_call> XML invocations)",
        thinking=True,
        adapt_messages=mapping_arguments,
        end_tokens=("[e~[",),
        derive_training=derive_minimax_training,
        verify_training=verify_minimax_training,
    )
)
# Command R7B's generation prompt closes an empty thinking block (thinking off by default), but its
# render of an answer has no thinking block at all: the prompt is no prefix of any answer it trained.
_COMMAND_ANSWER = re.compile(r"(\{%-?\s*else\s*-?%\})(<\|START_RESPONSE\|>\{\{\s*message\.content\s*\}\})")
# ... and it writes that prompt after every render, asked for or not: the derived template asks.
_COMMAND_PROMPT = re.compile(
    r"(\{%-?\s*endfor\s*-?%\})(<\|START_OF_TURN_TOKEN\|><\|CHATBOT_TOKEN\|>\{%-?\s*if not enable_thinking\s*-?%\}"
    r"<\|START_THINKING\|><\|END_THINKING\|>\{%-?\s*endif\s*-?%\})\s*$"
)
_COMMAND_THINKING = re.compile(r"<\|START_THINKING\|>.*?<\|END_THINKING\|>", re.DOTALL)


def derive_command_training(original: str) -> str | None:
    """Command R7B's template with an answer written after the thinking block its prompt opens (empty
    when the turn has no reasoning), as the model generates it, and the generation prompt written only
    when asked for; None where either place differs."""
    patch = r"\1<|START_THINKING|>{{ message.reasoning_content or '' }}<|END_THINKING|>\2"
    derived, n = _COMMAND_ANSWER.subn(patch, _gate_prompt(original) or "")
    return derived if n == 1 else None


def _gate_prompt(template: str) -> str | None:
    """The template with its trailing generation prompt written only when asked for (None: not there)."""
    gated, n = _COMMAND_PROMPT.subn(r"\1{%- if add_generation_prompt %}\2{%- endif %}", template)
    return gated if n == 1 else None


def verify_command_training(tokenizer: Any, original: str, training: str) -> str | None:
    """The Qwen3 check with thinking blocks as the hidden history, on conversations without reasoning
    (the default prompt closes the thinking block); the original's trained turn is the tail of its
    render, since its prompt is not a prefix of it. The original is compared with its generation prompt
    gated too: written after a finished conversation it is no part of any turn, so no turn can match it."""
    gated = _gate_prompt(original)
    if gated is None:
        return "the template's trailing generation prompt is not where the derivation expects it"
    conversations = [
        ([{k: v for k, v in m.items() if k != "reasoning_content"} for m in messages], tools, {})
        for messages, tools, _ in random_conversations(8, seed=0)
    ]
    problems = training_template_problems(
        tokenizer, gated, training, conversations, lambda t: _COMMAND_THINKING.sub("", t), limit=1, original_rewrites=True
    )
    return problems[0] if problems else None


COMMAND = register_format(
    FormatSpec(
        name="command",
        parser="command",
        models="Cohere Command R7B, Command A (<|START_ACTION|> JSON list calls)",
        thinking=True,
        end_tokens=("<|END_OF_TURN_TOKEN|>",),
        derive_training=derive_command_training,
        verify_training=verify_command_training,
        limits={
            "text_beside_calls": "Command's templates write a turn with tool calls as thinking plus the action list; "
            "an answer text beside the calls is not rendered",
        },
    )
)


LLAMA4_PYTHONIC = register_format(
    FormatSpec(
        name="llama4_pythonic",
        parser="llama4_pythonic",
        models="Llama 4 Scout / Maverick (pythonic [f(a=1), g()] calls)",
        template="llama4_pythonic_tools.jinja",
        markers=("<|header_start|>assistant<|header_end|>",),
        adapt_messages=arguments_as_objects,
        end_tokens=("<|eot|>", "<|eom|>"),
    )
)


# LFM2.5 Instruct's template (llama.cpp's copy) renders only an assistant's content, where the model
# writes its reasoning and calls, and strips the reasoning of every assistant turn but the last one
# unless ``keep_past_thinking``: a turn is rewritten as soon as another assistant turn follows it.
_KEEP_PAST = re.compile(r"keep_past_thinking\s*\|\s*default\(\s*false\s*\)")
_CONTENT_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
_BEFORE_END = re.compile(r"\s+(?=<\|im_end\|>)")


def reasoning_and_calls_into_content(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """As :func:`calls_into_content`, with the turn's reasoning first, ``<think>...</think>``, as the
    model writes it (these templates render only the content)."""
    out = []
    for m in calls_into_content(messages):
        if m.get("role") == "assistant" and m.get("reasoning_content"):
            m = {**m, "content": f"<think>{m['reasoning_content']}</think>" + (m.get("content") or "")}
        out.append(m)
    return out


def derive_keep_past_thinking(original: str) -> str | None:
    """The template with ``keep_past_thinking`` on by default (every turn keeps its reasoning); None
    for a template without that switch."""
    derived, n = _KEEP_PAST.subn("keep_past_thinking | default(true)", original)
    return derived if n == 1 else None


def _content_hidden(text: str) -> str:
    """A render without reasoning blocks, and without the blanks the original trims where it cut one."""
    return _BEFORE_END.sub("", _CONTENT_THINK.sub("", text))


def verify_keep_past_thinking(tokenizer: Any, original: str, training: str) -> str | None:
    """The Qwen3 check on conversations written as the format renders them (reasoning and calls in the content)."""
    conversations = [(reasoning_and_calls_into_content(m), t, {}) for m, t, _ in random_conversations(8, seed=0)]
    problems = training_template_problems(
        tokenizer, original, training, conversations, _content_hidden, limit=1, original_rewrites=True
    )  # the original strips the previous turn's reasoning as soon as the next turn is rendered
    return problems[0] if problems else None


LFM25_CONTENT = register_format(
    FormatSpec(
        name="lfm2_5_content",
        parser="lfm2",
        models="LFM2.5 Instruct, template listing 'List of tools: [...]' (reasoning and calls written in the content)",
        thinking=True,
        adapt_messages=reasoning_and_calls_into_content,
        prompt_markers=("List of tools: [",),
        derive_training=derive_keep_past_thinking,
        verify_training=verify_keep_past_thinking,
    )
)


# llama.cpp's community V3.2 template prompts with "<think></think>" when thinking is off, but renders
# such a turn (and DeepSeek's published encoder writes it) as "</think>": its prompt is no prefix of any
# turn. The derived template prompts with what the turn starts with.
_V32_PROMPT = re.compile(r"\{\{-?\s*thinking_start_token \+ thinking_end_token\s*-?\}\}")
_V32_TOOL_PROMPT = re.compile(r"\{\{-?\s*'\\n\\n' \+ thinking_start_token \+ thinking_end_token\s*-?\}\}")


def derive_deepseek_v32_training(original: str) -> str | None:
    """The template whose non-thinking generation prompt (after a user message and after tool results)
    is ``</think>``, as it renders the turn; None where either prompt is written otherwise."""
    derived, n = _V32_PROMPT.subn("{{- thinking_end_token -}}", original)
    derived, m = _V32_TOOL_PROMPT.subn(lambda _: "{{- '\\n\\n' + thinking_end_token -}}", derived)
    return derived if n == 1 and m == 1 else None


def verify_deepseek_v32_training(tokenizer: Any, original: str, training: str) -> str | None:
    """The Qwen3 check with thinking off (the default: thinking mode drops earlier reasoning after a new
    question, in the original and in DeepSeek's encoder alike); the original's trained turn is the tail
    of its render, since its prompt is no prefix of it."""
    conversations = [(m, t, {}) for m, t, _ in random_conversations(8, seed=0)]
    problems = training_template_problems(tokenizer, original, training, conversations, lambda t: t, limit=1, original_rewrites=True)
    return problems[0] if problems else None


DEEPSEEK_V32 = register_format(
    FormatSpec(
        name="deepseek_v32",
        parser="deepseek_v32",
        models="DeepSeek V3.2 (DSML <｜DSML｜invoke> calls)",
        template="deepseek_v32_tools.jinja",
        adapt_messages=mapping_arguments,
        derive_training=derive_deepseek_v32_training,
        verify_training=verify_deepseek_v32_training,
        derivation="the non-thinking generation prompt written as the turn starts, '</think>'",
    )
)
