"""A prefix-preserving training template for GPT-OSS (harmony), derived from the tokenizer's own.

GPT-OSS's shipped template cannot be trained on turn by turn as it is:

* it drops the analysis (reasoning) of a tool-call turn as soon as a later final answer exists,
  so the answer rewrites the history the earlier turns were sampled on;
* it refuses an assistant message holding reasoning, a preamble and a call together, although the
  model writes exactly that (an ``analysis`` message, a ``commentary`` preamble, then the call);
* it renders only the first of several tool calls and silently drops the others.

:func:`derive_gpt_oss_training` patches those three places of the tokenizer's own text (so its system,
developer and tool parts stay byte for byte the model's) and returns None when any patch does not
apply: a fork then keeps its template, and the doctor says why. :func:`verify_gpt_oss_training` checks
the result with :func:`agentrl.chat.training.training_template_problems`, as for Qwen3.

What stays a declared split: harmony ends a final answer with ``<|return|>`` (the model's stop token)
but history writes it ``<|end|>`` and drops its reasoning, so a new user turn after a final answer is a
new sample. Inventing ``<|return|>`` in history would show the model a context it never sees at
inference; a counted split does not.
"""

from __future__ import annotations

import re
from typing import Any

from agentrl.chat.derived import thinking_from_reasoning
from agentrl.chat.training import random_conversations, training_template_problems
from agentrl.core.messages import Message

# Each patch: (what it fixes, pattern in the original, replacement). All must apply exactly once.
_KEEP_ANALYSIS = re.compile(r"\bnot\s+future_final_message\.found\b")
_BOTH_RAISE = re.compile(r"\{\{-?\s*raise_exception\(\s*\"Cannot pass both content and thinking[^\"]*\"\s*\)\s*-?\}\}")
_BOTH_RENDER = (
    '{{- "<|start|>assistant<|channel|>analysis<|message|>" + message.thinking + "<|end|>" }}'
    '{{- "<|start|>assistant<|channel|>commentary<|message|>" + message.content + "<|end|>" }}'
)
_FIRST_CALL = re.compile(
    r"\{%-?\s*set tool_call = message\.tool_calls\[0\]\s*-?%\}\s*"
    r"\{%-?\s*if tool_call\.function\s*-?%\}\s*\{%-?\s*set tool_call = tool_call\.function\s*-?%\}\s*\{%-?\s*endif\s*-?%\}"
)
_CALL_BLOCK = re.compile(r"(\{\{-?\s*\"<\|start\|>assistant to=\"\s*-?\}\}.*?\{%-?\s*set last_tool_call\.name = tool_call\.name\s*-?%\})", re.DOTALL)
_EACH_CALL = "{%- for each_call in message.tool_calls %}{%- set tool_call = each_call.function if each_call.function else each_call %}"


def derive_gpt_oss_training(original: str) -> str | None:
    """The tokenizer's harmony template with analysis kept, reasoning + preamble + call rendered
    (reasoning on ``analysis``, the preamble on ``commentary``), and every call rendered; None when
    the template is not one these patches fit."""
    derived, kept = _KEEP_ANALYSIS.subn("true", original)
    derived, both = _BOTH_RAISE.subn(lambda _: _BOTH_RENDER, derived)
    derived, first = _FIRST_CALL.subn("", derived)
    derived, block = _CALL_BLOCK.subn(lambda m: _EACH_CALL + m.group(1) + "{%- endfor %}", derived)
    if kept != 2 or both != 1 or first != 1 or block != 1:
        return None
    return derived


def harmony_hidden(text: str) -> str:
    """A harmony render without assistant analysis messages (what the original may drop from history)."""
    return _ANALYSIS.sub("", text)


_ANALYSIS = re.compile(r"<\|start\|>assistant<\|channel\|>analysis<\|message\|>.*?<\|end\|>", re.DOTALL)


def final_answer(message: Message) -> bool:
    """An assistant turn without tool calls: harmony ends it with ``<|return|>`` (a declared split)."""
    return message.get("role") == "assistant" and not message.get("tool_calls")


def one_call_conversations(n: int, seed: int = 0) -> list[tuple[list[Message], Any, dict[str, Any]]]:
    """:func:`random_conversations` with one call per turn (generation stops at a harmony call's
    ``<|call|>``, so a sampled turn never holds two) and ``thinking`` set as GPT-OSS reads it."""
    out = []
    for messages, tools, kwargs in random_conversations(n, seed):
        kept: list[Message] = []
        dropped: set[str] = set()
        for m in messages:
            if m.get("role") == "assistant" and len(m.get("tool_calls") or []) > 1:
                dropped |= {c["id"] for c in m["tool_calls"][1:]}
                m = {**m, "tool_calls": m["tool_calls"][:1]}
            if m.get("role") == "tool" and m.get("tool_call_id") in dropped:
                continue
            kept.append(m)
        out.append((thinking_from_reasoning(kept), tools, kwargs))
    return out


def verify_gpt_oss_training(tokenizer: Any, original: str, training: str, n: int = 8) -> str | None:
    """The Qwen3 check for a derived harmony template: trained turns and prompts identical to the
    original's, everything but analysis identical, prefix-preserving except after a final answer.
    Conversations the original refuses (reasoning and a preamble beside a call) are checked on the
    training template alone."""
    problems = training_template_problems(
        tokenizer, original, training, one_call_conversations(n, seed=0), harmony_hidden, limit=1,
        split_after=final_answer, original_may_refuse=True, original_rewrites=True,
    )  # fmt: skip
    return problems[0] if problems else None
