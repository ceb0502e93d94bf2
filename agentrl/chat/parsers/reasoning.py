"""Splitting a reasoning block (``<think>...</think>`` style) off the front of a response.

Shared by every family that reasons in tags. It copes with templates that open the block in the
prompt (Qwen3 thinking variants, QwQ), in which case the output has a closing tag but no opening one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agentrl.chat.types import ParseIssue


@dataclass
class ReasoningSplit:
    reasoning: str | None  # None when the output had no reasoning block at all
    rest: str  # the text outside the block, for the tool-call parser
    closed: bool = True  # False when the block was never closed (length cap, model rambling)
    issues: list[ParseIssue] = field(default_factory=list)


def split_reasoning(text: str, open_tag: str = "<think>", close_tag: str = "</think>") -> ReasoningSplit:
    """Cut the first reasoning block out of ``text``; never raises."""
    start, end = text.find(open_tag), text.find(close_tag)
    if start == -1 and end == -1:
        return ReasoningSplit(None, text)
    issues: list[ParseIssue] = []
    if start != -1 and (end == -1 or start < end):
        before = text[:start]
        if before.strip():
            issues.append(ParseIssue("text_before_reasoning", f"text before {open_tag}: {before.strip()[:80]!r}"))
        body_start = start + len(open_tag)
        if end == -1:
            issues.append(ParseIssue("unclosed_tag", f"{open_tag} is never closed by {close_tag}"))
            return ReasoningSplit(text[body_start:].strip(), before, closed=False, issues=issues)
        reasoning, rest = text[body_start:end], before + text[end + len(close_tag) :]
    else:  # closing tag without an opening one: the prompt opened the block
        reasoning, rest = text[:end], text[end + len(close_tag) :]
    for tag in (open_tag, close_tag):
        if tag in rest:
            issues.append(ParseIssue("stray_tag", f"{tag} after the reasoning block ({rest.count(tag)}x)"))
    return ReasoningSplit(reasoning.strip(), rest, issues=issues)
