"""Checking a training template against the original it stands in for.

A training template replaces a template that rewrites history (Qwen3 drops earlier reasoning), so
that bridges between turns can be proven. It is only safe if nothing trained differs from what the
model sees at inference. :func:`training_template_problems` checks that on generated conversations,
in token space, for every assistant turn:

1. the trained tokens are the same: the last assistant turn renders to the same ids under both
   templates, and the generation prompt before it is the same;
2. everything but the assistant turns' reasoning blocks is the same (system, tools, user and tool
   turns), so only history the original would have hidden differs;
3. the training template is prefix-preserving: the render of a conversation is a token prefix of
   the render after any further messages, with a generation prompt.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from typing import Any

from agentrl.chat.base import encode_cut
from agentrl.core.messages import Message

Conversation = tuple[list[Message], list[Message] | None, dict[str, Any]]  # messages, tools, template kwargs

_TOOLS = [
    {"type": "function", "function": {"name": "lookup", "description": "Look a word up.",
     "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}},
    {"type": "function", "function": {"name": "add", "description": "Add two numbers.",
     "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}},
]  # fmt: skip
_WORDS = ["sun", "rain", "Paris", "42", "x = 1", "héllo", "a\nb", "{\"k\": 1}", "  padded  ", "end."]


def random_conversations(n: int, seed: int = 0) -> list[Conversation]:
    """``n`` seeded conversations mixing tool loops, new user turns, reasoning present / empty /
    absent, several calls per turn, and thinking switched on and off."""
    rng = random.Random(seed)
    out: list[Conversation] = []
    for _ in range(n):
        thinking = rng.random() >= 0.25
        messages: list[Message] = []
        if rng.random() < 0.5:
            messages.append({"role": "system", "content": "Be brief. " + rng.choice(_WORDS)})
        messages.append({"role": "user", "content": "Question: " + rng.choice(_WORDS)})
        for turn in range(rng.randint(1, 5)):
            reply: Message = {"role": "assistant", "content": rng.choice(["", "", "Sure.", "The answer is " + rng.choice(_WORDS)])}
            kind = rng.random() if thinking else 1.0  # thinking off: the model writes no reasoning
            if kind < 0.5:
                reply["reasoning_content"] = "Think: " + rng.choice(_WORDS)
            elif kind < 0.65:
                reply["reasoning_content"] = ""
            calls = rng.choice([0, 1, 1, 2]) if turn < 4 else 0
            if calls:
                reply["tool_calls"] = [
                    {"type": "function", "id": f"call_{turn}_{k}", "function": {
                        "name": "add", "arguments": {"a": rng.randint(-5, 5), "b": rng.choice([1.5, 2, True])}}}
                    for k in range(calls)
                ]  # fmt: skip
            elif not reply["content"]:
                reply["content"] = "Done."
            messages.append(reply)
            if calls:
                for k in range(calls):
                    messages.append({"role": "tool", "tool_call_id": f"call_{turn}_{k}", "name": "add",
                                     "content": json.dumps({"sum": rng.randint(0, 9)})})  # fmt: skip
            else:
                messages.append({"role": "user", "content": "Next: " + rng.choice(_WORDS)})
        tools = _TOOLS if rng.random() < 0.8 else None
        kwargs = {} if thinking else {"enable_thinking": False}
        out.append((messages, tools, kwargs))
    return out


def training_template_problems(
    tokenizer: Any,
    original: str,
    training: str,
    conversations: list[Conversation],
    hidden: Callable[[str], str],
    limit: int = 5,
    split_after: Callable[[Message], bool] | None = None,
    original_may_refuse: bool = False,
    original_rewrites: bool = False,
    turn_ends: tuple[str, ...] = (),
    trained_hidden: bool = False,
) -> list[str]:
    """Up to ``limit`` descriptions of where ``training`` may not stand in for ``original``.

    ``hidden(text)`` removes what the original may legitimately hide in history (for Qwen3, the
    reasoning blocks of assistant turns), so that the rest can be compared exactly.
    ``split_after(message)``: an assistant turn after which the family declares a split (harmony's
    final answer), so prefix preservation is not required there. ``original_may_refuse``: where the
    original raises on a turn (a message shape it cannot render), only the training template is
    checked (it must render, and keep prefixes). ``original_rewrites``: the original itself rewrites
    the history before the turn once the turn is added (harmony drops earlier analysis), so its
    trained turn is the tail of its render, and the training prompt must be (up to ``hidden``) the
    original's prompt or the context the original renders the turn in. ``turn_ends``: tokens that
    stop generation but that the original writes as the next message's first token (GLM-4): the
    trained turn may end with one of them beyond the original's. ``trained_hidden``: the original hides
    even the trained turn's own reasoning where the turn has no calls (Kimi K2 Thinking drops a final
    answer's), so such a turn is compared up to ``hidden``; a turn with calls, which it shows whole,
    exactly.
    """

    prompts: dict[Any, str] = {}

    def ids(template: str, messages: list[Message], tools: Any, gen: bool, kwargs: dict) -> list[int]:
        """Ids as ChatFormat.render makes them: cut after each generation prompt, as generation does."""
        text = tokenizer.apply_chat_template(
            messages, tools=tools, chat_template=template, tokenize=False, add_generation_prompt=gen, **kwargs
        )
        key = (template, tuple(sorted(kwargs.items())))
        if key not in prompts:
            prompts[key] = generation_prompt(tokenizer, template, kwargs)
        return encode_cut(lambda t: list(tokenizer(t, add_special_tokens=False)["input_ids"]), text, prompts[key])

    def text(template: str, messages: list[Message], tools: Any, kwargs: dict) -> str:
        return tokenizer.apply_chat_template(messages, tools=tools, chat_template=template, tokenize=False, **kwargs)

    problems: list[str] = []
    for c, (messages, tools, kwargs) in enumerate(conversations):
        ends = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        for end in ends:
            history, upto = messages[:end], messages[: end + 1]
            where = f"conversation {c}, assistant turn at message {end}"
            before = len(problems)
            try:
                t_prompt, t_full = ids(training, history, tools, True, kwargs), ids(training, upto, tools, False, kwargs)
            except Exception as exc:
                problems.append(f"{where}: the training template failed to render: {exc!r}")
                continue
            try:
                o_prompt, o_full = ids(original, history, tools, True, kwargs), ids(original, upto, tools, False, kwargs)
            except Exception as exc:
                if not original_may_refuse:
                    problems.append(f"{where}: the original template failed to render: {exc!r}")
                    continue
                o_prompt = o_full = None
            if o_prompt is None or o_full is None:
                pass  # the original refuses this turn: nothing to compare it with
            elif original_rewrites and o_full[: len(o_prompt)] != o_prompt:
                t_turn = t_full[len(t_prompt) :]
                dec = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
                if t_full[: len(t_prompt)] != t_prompt:
                    problems.append(f"{where}: the training template's generation prompt is not a prefix of its turn")
                elif not t_turn or o_full[len(o_full) - len(t_turn) :] != t_turn:
                    problems.append(f"{where}: the trained turn differs: {_show(tokenizer, o_full[-len(t_turn):], t_turn)}")
                elif hidden(dec(t_prompt)) not in (hidden(dec(o_prompt)), hidden(dec(o_full[: len(o_full) - len(t_turn)]))):
                    problems.append(
                        f"{where}: the training prompt is neither the original's prompt nor the context it renders the turn in"
                    )
            elif trained_hidden and not messages[end].get("tool_calls"):
                # The original drops this turn's reasoning (and, as it moves its history, earlier ones):
                # everything up to the reasoning blocks must be identical, the training prompt its prefix.
                dec = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
                if t_full[: len(t_prompt)] != t_prompt:
                    problems.append(f"{where}: the training template's generation prompt is not a prefix of its turn")
                elif hidden(dec(o_full)) != hidden(dec(t_full)):
                    problems.append(f"{where}: the trained turn differs beyond its reasoning: {_show(tokenizer, o_full, t_full)}")
                elif hidden(dec(o_prompt)) != hidden(dec(t_prompt)):
                    problems.append(f"{where}: the prompt differs beyond hidden history: {_show(tokenizer, o_prompt, t_prompt)}")
            elif o_full[: len(o_prompt)] != o_prompt or t_full[: len(t_prompt)] != t_prompt:
                problems.append(f"{where}: a generation prompt is not a prefix of its turn")
            elif o_full[len(o_prompt) :] != _without_end(tokenizer, t_full[len(t_prompt) :], o_full[len(o_prompt) :], turn_ends):
                diff = _show(tokenizer, o_full[len(o_prompt) :], t_full[len(t_prompt) :])
                problems.append(f"{where}: the trained turn differs: {diff}")
            elif hidden(tokenizer.decode(o_prompt, skip_special_tokens=False)) != hidden(
                tokenizer.decode(t_prompt, skip_special_tokens=False)
            ):
                problems.append(f"{where}: the prompt differs beyond hidden history: {_show(tokenizer, o_prompt, t_prompt)}")
            if o_full is not None and len(problems) == before and hidden(text(original, upto, tools, kwargs)) != hidden(
                text(training, upto, tools, kwargs)
            ):
                problems.append(f"{where}: turns other than reasoning differ")
            # Prefix preservation of the training template up to the next assistant turn.
            if end + 1 < len(messages) and not (split_after is not None and split_after(messages[end])):
                later = ids(training, messages[: _next_assistant(messages, end)], tools, True, kwargs)
                if later[: len(t_full)] != t_full:
                    j = next((i for i, (x, y) in enumerate(zip(t_full, later)) if x != y), len(later))
                    problems.append(f"{where}: the training template rewrites history at token {j}")
            if len(problems) >= limit:
                return problems
    return problems


def generation_prompt(tokenizer: Any, template: str, kwargs: dict[str, Any]) -> str:
    """The text ``add_generation_prompt=True`` appends under ``template`` ('' if it cannot tell)."""
    probe = [{"role": "user", "content": "agentrl probe question"}]
    try:
        on = tokenizer.apply_chat_template(probe, chat_template=template, tokenize=False, add_generation_prompt=True, **kwargs)
        off = tokenizer.apply_chat_template(probe, chat_template=template, tokenize=False, add_generation_prompt=False, **kwargs)
    except Exception:
        return ""
    return on[len(off) :] if on.startswith(off) else ""


def _without_end(tokenizer: Any, turn: list[int], original: list[int], ends: tuple[str, ...]) -> list[int]:
    """``turn`` less a final stop token from ``ends`` that the original's turn does not have."""
    if ends and len(turn) == len(original) + 1 and tokenizer.convert_ids_to_tokens(turn[-1]) in ends:
        return turn[:-1]
    return turn


def _next_assistant(messages: list[Message], end: int) -> int:
    """Index of the next assistant turn after ``end`` (or the end): what a bridge would append."""
    return next((i for i in range(end + 1, len(messages)) if messages[i]["role"] == "assistant"), len(messages))


def _show(tokenizer: Any, a: list[int], b: list[int]) -> str:
    j = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    dec = lambda ids: tokenizer.decode(ids[j : j + 8], skip_special_tokens=False)  # noqa: E731
    return f"first difference at token {j}: original {dec(a)!r} vs training {dec(b)!r}"


_THINK = re.compile(r"<think>.*?</think>\n*", re.DOTALL)  # Qwen writes two newlines after it, Nemotron one
_AFTER_HEADER = re.compile(r"(<\|im_start\|>assistant\n)\n+")


def qwen3_hidden(text: str) -> str:
    """What remains of a Qwen3 render once assistant reasoning blocks (kept or dropped) are removed."""
    return _AFTER_HEADER.sub(r"\1", _THINK.sub("", text))


# Qwen3.5 / 3.6 templates show an assistant turn's reasoning only after the last user question
# (``loop.index0 > ns.last_query_index``); a new question then rewrites history.
_LAST_QUERY_ONLY = re.compile(r"(\{%-?\s*if\b[^%]*?)loop\.index0\s*>\s*ns\.last_query_index")


def derive_qwen3_xml_training(original: str) -> str | None:
    """A prefix-preserving training template made from the tokenizer's own Qwen3.5-style template:
    the one condition that hides earlier reasoning is made always true, so every assistant turn is
    rendered as the original renders the turns after the last question. None if the template has
    no such condition (then it is used as it is)."""
    derived, n = _LAST_QUERY_ONLY.subn(r"\1true", original)
    return derived if n else None


def verify_qwen3_training(tokenizer: Any, original: str, training: str) -> str | None:
    """Quick check at ``get_chat_format`` time (a fork of Qwen3's template must not get ours)."""
    conversations = random_conversations(8, seed=0)
    problems = training_template_problems(tokenizer, original, training, conversations, qwen3_hidden, limit=1)
    return problems[0] if problems else None


def verify_qwen3_xml_training(tokenizer: Any, original: str, training: str) -> str | None:
    """The same check for a derived Qwen3.5-style training template. A template whose default
    generation prompt closes the reasoning block (Qwen3.5 non-thinking) reasons only when asked, so
    its thinking conversations pass ``enable_thinking=True``."""
    conversations = random_conversations(8, seed=0)
    if "</think>" in generation_prompt(tokenizer, original, {}):
        conversations = [(m, t, kw or {"enable_thinking": True}) for m, t, kw in conversations]
    problems = training_template_problems(tokenizer, original, training, conversations, qwen3_hidden, limit=1)
    return problems[0] if problems else None

