"""Splitting a reasoning block (``<think>...</think>`` style) off the front of a response.

Shared by every family that reasons in tags. It copes with templates that open the block in the
prompt (Qwen3 thinking variants, QwQ), in which case the output has a closing tag but no opening one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agentrl.core.messages import ParseIssue


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


@dataclass
class CallText:
    """A response cut up for a parser of tagged calls: what the calls' scan needs."""

    reasoning: str | None
    rest: str  # the text outside the reasoning block
    first: int  # where the first call opens in ``rest`` (-1: none)
    content: str  # the text before the first call
    issues: list[ParseIssue]


def split_calls(text: str, open_tag: str, close_tag: str) -> CallText:
    """Split off the reasoning, then the content before the first ``open_tag``; a call opened
    inside the reasoning and a ``close_tag`` in the content are issues. Never raises."""
    split = split_reasoning(text)
    issues = list(split.issues)
    if split.reasoning and open_tag in split.reasoning:
        issues.append(ParseIssue("call_in_reasoning", f"{open_tag} inside the reasoning (not executed)"))
    first = split.rest.find(open_tag)
    content = split.rest if first == -1 else split.rest[:first]
    if close_tag in content:
        issues.append(ParseIssue("stray_tag", f"{close_tag} without a matching {open_tag}"))
    return CallText(split.reasoning, split.rest, first, content, issues)
