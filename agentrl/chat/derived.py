"""Training templates derived from a tokenizer's own template: one small patch per family.

Where a family's template rewrites history only through a switch or a condition it already has,
the training template is that template with the switch set, not a copy of anyone's text: every
other byte (system prompt, tool list, turn markup) stays what the checkpoint ships. Each derived
template is used only after :func:`agentrl.chat.training.training_template_problems` accepts it
(trained turns identical to the original's, everything but reasoning identical, prefixes kept).
"""

from __future__ import annotations

import re
from typing import Any

from agentrl.chat.training import qwen3_hidden, random_conversations, training_template_problems
from agentrl.core.messages import Message

# LFM2.5 shows a turn's reasoning only after the last user message unless ``preserve_thinking``.
_LFM2_PRESERVE = re.compile(r"preserve_thinking\s*\|\s*default\(\s*false\s*\)")
_LFM2_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


def derive_lfm2_training(original: str) -> str | None:
    """LFM2.5's template with ``preserve_thinking`` on by default (every turn keeps its reasoning);
    None for a template without that switch (LFM2 v2 renders no reasoning at all)."""
    derived, n = _LFM2_PRESERVE.subn("preserve_thinking | default(true)", original)
    return derived if n == 1 else None


def verify_lfm2_training(tokenizer: Any, original: str, training: str) -> str | None:
    """The Qwen3 check for a derived LFM2.5 template (reasoning given as ``thinking``, as it reads it)."""
    conversations = [(thinking_from_reasoning(m), t, {}) for m, t, _ in random_conversations(8, seed=0)]
    problems = training_template_problems(tokenizer, original, training, conversations, lambda t: _LFM2_THINK.sub("", t), limit=1)
    return problems[0] if problems else None


def thinking_from_reasoning(messages: list[Message]) -> list[Message]:
    """GPT-OSS's and LFM2.5's templates read an assistant turn's reasoning from ``thinking``; parsers
    return ``reasoning_content``. Copied across where only the latter is set."""
    out = []
    for m in messages:
        if m.get("role") == "assistant" and m.get("reasoning_content") is not None and "thinking" not in m:
            m = {**m, "thinking": m["reasoning_content"]}
        out.append(m)
    return out


# Nemotron 3 truncates the reasoning of turns before the last user message unless the caller passes
# ``truncate_history_thinking=false``.
_NEMOTRON_TRUNCATE = re.compile(r"(truncate_history_thinking if truncate_history_thinking is defined else )True\b")


def derive_nemotron_training(original: str) -> str | None:
    """Nemotron 3's template with ``truncate_history_thinking`` off by default (every turn keeps its
    reasoning); None for a template without that switch."""
    derived, n = _NEMOTRON_TRUNCATE.subn(r"\1False", original)
    return derived if n == 1 else None


# Where Nemotron truncates a turn's reasoning it also writes the turn's text unstripped.
_NEMOTRON_TEXT_END = re.compile(r"[ \t]+(?=\n<tool_call>|<\|im_end\|>)")


def nemotron_hidden(text: str) -> str:
    """A Nemotron render without reasoning blocks and without trailing blanks of a turn's text."""
    return _NEMOTRON_TEXT_END.sub("", qwen3_hidden(text))


def nemotron_conversations(n: int, seed: int = 0) -> list[tuple[list[Message], Any, dict[str, Any]]]:
    """:func:`random_conversations` where every turn written with thinking on has reasoning: Nemotron
    prompts with ``<think>\n`` but renders empty reasoning as ``<think></think>``, which no model
    prompted that way can write."""
    out = []
    for messages, tools, kwargs in random_conversations(n, seed):
        if not kwargs:  # thinking on
            messages = [
                {**m, "reasoning_content": "Think."} if m.get("role") == "assistant" and not m.get("reasoning_content") else m
                for m in messages
            ]
        out.append((messages, tools, kwargs))
    return out


def verify_nemotron_training(tokenizer: Any, original: str, training: str) -> str | None:
    """The Qwen3 check for a derived Nemotron 3 template."""
    problems = training_template_problems(tokenizer, original, training, nemotron_conversations(8), nemotron_hidden, limit=1)
    return problems[0] if problems else None


# Gemma 4 writes a model turn's calls, then the results of the tool messages that follow (inside the
# same turn), then the turn's text: so a turn with text and a call is rewritten when its results
# arrive (the model wrote the text before <|tool_response>, where the last-turn render has it). The
# revisions after the first also show reasoning only after the last user message, and the latest
# one closes a turn whose calls got results with <turn|> when nothing follows, although its
# generation prompt then opens no new turn (the prompt is no prefix of the answered turn).
_GEMMA_RESULTS = re.compile(r"\{%-?\s*set ns_tr_out = namespace\(flag=false\)\s*-?%\}")
_GEMMA_TEXT = re.compile(r"\{%-?\s*(?:set captured_content|if message(?:\['content'\]|\.get\('content'\)) is string)\s*-?%\}")
_GEMMA_HAS_CONTENT = re.compile(r"\{%-?\s*set has_content = [^%]*-?%\}")
_GEMMA_END = re.compile(r"\{%-?\s*if ns\.prev_message_type == 'tool_call' and not ns_tr_out\.flag\s*-?%\}")
_GEMMA_CLOSE = re.compile(r"not \(ns_tr_out\.flag and not (?:has_content|message\.get\('content'\))(?: and not next_nt\.found)?\)")
_GEMMA_GATES = (
    (re.compile(r"\(loop\.index0 > ns_turn\.last_user_idx\) or \(preserve_thinking and message\.get\('tool_calls'\)\)"), "true"),
    (re.compile(r"thinking_text and loop\.index0 > ns_turn\.last_user_idx and message\.get\('tool_calls'\)"),
     "thinking_text and message.get('tool_calls')"),
)  # fmt: skip
_GEMMA_CONTINUES = re.compile(r"\{%-?\s*elif continues_into_next\s*-?%\}")
_GEMMA_THOUGHT = re.compile(r"<\|channel>thought\n.*?<channel\|>", re.DOTALL)
_GEMMA_INNER_CLOSE = re.compile(r"<turn\|>\n(?!<\|turn>)")
_GEMMA_CALL_TEXT = re.compile(r"(<tool_call\|>)[^<]*(?=<\|tool_response>)")
_GEMMA_RESULT_TEXT = re.compile(r"(<tool_response\|>)[^<]*")


def gemma4_hidden(text: str) -> str:
    """A Gemma 4 render without thought channels, without a <turn|> that does not end a turn, and
    without the free text beside calls and results (which the original and the training template
    place differently; the trained turns themselves are compared exactly)."""
    text = _GEMMA_INNER_CLOSE.sub("", _GEMMA_THOUGHT.sub("", text))
    return _GEMMA_RESULT_TEXT.sub(r"\1", _GEMMA_CALL_TEXT.sub(r"\1", text))


def derive_gemma4_training(original: str) -> str | None:
    """The tokenizer's Gemma 4 template with a turn's text written before its tool results (where the
    model writes it), the turn left open after results for the answer that continues it, and every
    call turn's reasoning kept (every turn's, in the latest revision); None for a template these
    patches do not fit (the release revision closes each call turn and needs none)."""
    results, text, end = _GEMMA_RESULTS.search(original), None, _GEMMA_END.search(original)
    if results is not None:
        text = _GEMMA_TEXT.search(original, results.end())
    if results is None or text is None or end is None or not results.start() < text.start() < end.start():
        return None
    has_content = _GEMMA_HAS_CONTENT.search(original, text.start(), end.start())
    stop = has_content.end() if has_content else end.start()  # the latest revision scans ahead after it
    derived = (
        original[: results.start()] + original[text.start() : stop]
        + original[results.start() : text.start()] + original[stop:]
    )  # fmt: skip
    derived, closed = _GEMMA_CLOSE.subn("not ns_tr_out.flag", derived)
    for gate, replacement in _GEMMA_GATES:
        derived = gate.sub(replacement, derived)
    derived = _GEMMA_CONTINUES.sub("{%- elif false -%}", derived)
    return derived if closed == 1 else None


def verify_gemma4_training(tokenizer: Any, original: str, training: str) -> str | None:
    """The Qwen3 check with thought channels and text placement as the hidden history; where the
    original's own prompt is not a prefix of its answered turn, the turn is compared as its tail."""
    conversations = [(m, t, {}) for m, t, _ in random_conversations(8, seed=0)]
    problems = training_template_problems(
        tokenizer, original, training, conversations, gemma4_hidden, limit=1, original_rewrites=True
    )
    return problems[0] if problems else None


# GLM-4 MoE shows reasoning only after the last user message, and writes no end of turn at all: the
# token that stops generation (<|observation|> after calls, <|user|> after an answer) is written as
# the first token of the next message. The derived template keeps every turn's reasoning and, for a
# conversation that ends with an assistant turn, writes that stop token after it, as the model does;
# the next message then starts right after it, so renders are token prefixes of later ones.
_GLM_LAST_USER = re.compile(r"(\{%-?\s*if\s+)loop\.index0\s*>\s*ns\.last_user_index\s+and\s+(reasoning_content\s*-?%\})")
_GLM_TOOL_BRANCH = re.compile(r"(\{%-?\s*elif m\.role == 'tool'\s*-?%\})")
_GLM_STOP = "{%- if loop.last and not add_generation_prompt %}{{- '<|observation|>' if m.tool_calls else '<|user|>' }}{%- endif %}"
GLM_STOPS = ("<|observation|>", "<|user|>")


def derive_glm4_training(original: str) -> str | None:
    """GLM-4 MoE's template with every turn's reasoning kept and a final assistant turn closed by the
    token the model stops on; None when the template is not one these patches fit."""
    derived, kept = _GLM_LAST_USER.subn(r"\1\2", original)
    derived, closed = _GLM_TOOL_BRANCH.subn(lambda m: _GLM_STOP + m.group(1), derived)
    return derived if kept == 1 and closed == 1 else None


_GLM_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
_GLM_END = re.compile(r"(?:<\|observation\|>|<\|user\|>)$")


def glm4_hidden(text: str) -> str:
    """A GLM render without reasoning and without a stop token ending it."""
    return _GLM_END.sub("", _GLM_THINK.sub("", text))


def verify_glm4_training(tokenizer: Any, original: str, training: str) -> str | None:
    """The Qwen3 check; the trained turn may end with the stop token the original leaves to the next message."""
    conversations = random_conversations(8, seed=0)
    problems = training_template_problems(
        tokenizer, original, training, conversations, glm4_hidden, limit=1, turn_ends=GLM_STOPS
    )
    return problems[0] if problems else None


# GLM-4.7 (and GLM-5, 5.1 and 5.2, whose templates keep 4.7's markup) shows reasoning only after the
# last user message unless ``clear_thinking=false``, writes a hidden turn's reasoning as a bare
# ``</think>`` (5.2: ``<think></think>``), and, like GLM-4.5, writes no end of turn. The derived template keeps reasoning unless
# ``clear_thinking=true`` is passed, and closes a final assistant turn with the model's stop token.
_GLM47_CLEAR = re.compile(
    r"\(\(clear_thinking is defined and not clear_thinking\) or loop\.index0 > ns\.last_user_index\) and reasoning_content"
)
# GLM-5.2 and later write every tool message through ``elif m.role == 'tool' or m.role == 'observation'``.
_GLM47_TOOL_BRANCH = re.compile(r"(\{%-?\s*elif m\.role == 'tool'(?:\s+or\s+m\.role == 'observation')?\s*-?%\})")


def derive_glm47_training(original: str) -> str | None:
    """GLM-4.7's template with every turn's reasoning kept (unless ``clear_thinking=true``) and a final
    assistant turn closed by its stop token; None when the template is not one these patches fit."""
    derived, kept = _GLM47_CLEAR.subn("(not (clear_thinking is defined and clear_thinking)) and reasoning_content", original)
    derived, closed = _GLM47_TOOL_BRANCH.subn(lambda m: _GLM_STOP + m.group(1), derived)
    return derived if kept == 1 and closed == 1 else None


_GLM47_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


def glm47_hidden(text: str) -> str:
    """A GLM-4.7 / GLM-5 render with every reasoning block written as a bare ``</think>`` (how 4.7 hides
    one; 5.x writes ``<think></think>``, which this maps the same way) and no stop token ending it."""
    return _GLM_END.sub("", _GLM47_THINK.sub("</think>", text))


def verify_glm47_training(tokenizer: Any, original: str, training: str) -> str | None:
    """The Qwen3 check on conversations that reason every turn (the prompt opens ``<think>``)."""
    conversations = []
    for messages, tools, _ in random_conversations(8, seed=0):
        messages = [
            {**m, "reasoning_content": "Think."} if m.get("role") == "assistant" and not m.get("reasoning_content") else m
            for m in messages
        ]
        conversations.append((messages, tools, {}))
    problems = training_template_problems(
        tokenizer, original, training, conversations, glm47_hidden, limit=1, turn_ends=GLM_STOPS
    )
    return problems[0] if problems else None


# GLM-5.3 keeps every turn's reasoning unless ``clear_thinking=true`` (the switch defaults to false, so
# its gate reads ``not clear_thinking or ...``) and writes a hidden block as ``<think></think>``; like
# every GLM it writes no end of turn. Its derivation only closes a final assistant turn.
_GLM5_DEFAULT = re.compile(r"set clear_thinking = clear_thinking if clear_thinking is defined else false")
_GLM5_KEEP = re.compile(r"\(not clear_thinking or loop\.index0 > ns\.last_user_index\) and reasoning_content")


def derive_glm5_training(original: str) -> str | None:
    """GLM-5.3's template with a final assistant turn closed by its stop token; None when the template
    does not keep reasoning by default (``clear_thinking`` defaulting to false) or the patch does not fit."""
    if _GLM5_DEFAULT.search(original) is None or len(_GLM5_KEEP.findall(original)) != 1:
        return None
    derived, closed = _GLM47_TOOL_BRANCH.subn(lambda m: _GLM_STOP + m.group(1), original)
    return derived if closed == 1 else None


def derive_glm_training(original: str) -> str | None:
    """GLM-4.5/4.6's derivation, else GLM-4.7's (GLM-5, 5.1, 5.2), else GLM-5.3's."""
    return derive_glm4_training(original) or derive_glm47_training(original) or derive_glm5_training(original)


def verify_glm_training(tokenizer: Any, original: str, training: str) -> str | None:
    """The check that fits the derivation :func:`derive_glm_training` applied."""
    if derive_glm4_training(original) is not None:
        return verify_glm4_training(tokenizer, original, training)
    return verify_glm47_training(tokenizer, original, training)


# Mistral Nemo's template writes the system prompt into the last user message only while that message
# is the last of the conversation (``loop.last``): as soon as the model's reply follows, the system
# prompt is gone from history, so its generation prompt is no prefix of any turn it renders. Mistral's
# published v3 format (and agentrl's mistral_tools.jinja) keeps it with the last user message, where
# the same template already puts the tool list (``message == user_messages[-1]``).
_NEMO_SYSTEM = re.compile(r"(\{%-?\s*if\s+)loop\.last(\s+and\s+system_message\s+is\s+defined\s*-?%\})")


def derive_mistral_training(original: str) -> str | None:
    """Nemo's template with the system prompt kept in the last user message, as its tool list is;
    None where that condition is not there (v3 templates that already do so, agentrl's own)."""
    if "user_messages[-1]" not in original:
        return None
    derived, n = _NEMO_SYSTEM.subn(r"\1message == user_messages[-1]\2", original)
    return derived if n == 1 else None


def mistral_conversations(n: int) -> list[tuple[list[Message], Any, dict[str, Any]]]:
    """:func:`random_conversations` with nine-character call ids (the only ones Nemo's template takes)."""

    def nine(call_id: str) -> str:
        return (call_id.replace("_", "") + "000000000")[:9]

    out = []
    for messages, tools, kwargs in random_conversations(n, seed=0):
        fixed = []
        for m in messages:
            if m.get("tool_calls"):
                m = {**m, "tool_calls": [{**c, "id": nine(c["id"])} for c in m["tool_calls"]]}
            if m.get("tool_call_id"):
                m = {**m, "tool_call_id": nine(m["tool_call_id"])}
            fixed.append(m)
        out.append((fixed, tools, kwargs))
    return out


def verify_mistral_training(tokenizer: Any, original: str, training: str) -> str | None:
    """The Qwen3 check with the system prompt as the hidden history (the original drops it once the
    model replies); the original's trained turn is the tail of its render. After an answer comes a new
    user message, which moves the tool list and system prompt: a declared split, as in the v3 format."""
    conversations = mistral_conversations(8)
    systems = {m["content"] + "\n\n" for messages, _, _ in conversations for m in messages if m["role"] == "system"}

    def hidden(text: str) -> str:
        for system in systems:
            text = text.replace(system, "")
        return text

    problems = training_template_problems(tokenizer, original, training, conversations, hidden, limit=1, original_rewrites=True,
                                          split_after=lambda m: not m.get("tool_calls"))  # fmt: skip
    return problems[0] if problems else None
