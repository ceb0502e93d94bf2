"""The parser interface, and the template probe that parsers use to recognise their family.

A parser turns decoded assistant text into a :class:`ParsedResponse`. It must never raise on model
output: anything odd becomes a :class:`ParseIssue` so that the environment can tell the model, and
training can score it, instead of a rollout crashing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from agentrl.chat.parsers.names import check_declared
from agentrl.core.messages import ParsedResponse, ParseIssue

# No real turn makes hundreds of calls; a hostile one may write a million openers. Past this many
# calls (or messages, for channel formats) a parser stops and reports the rest, which bounds both
# its time and what the dispatcher is asked to run.
MAX_CALLS = 256


def too_many_calls(where: str) -> ParseIssue:
    """The issue a parser reports when it stops at :data:`MAX_CALLS`."""
    return ParseIssue("too_many_calls", f"more than {MAX_CALLS} {where} in one turn; the rest is ignored")


@dataclass(frozen=True)
class TemplateProbe:
    """What a chat template rendered for a few fixed probe conversations.

    Each text is the part after the probe user message, so it shows only how the template writes an
    assistant turn or a generation prompt. Built by :func:`agentrl.chat.detect.probe_template`;
    parsers read it in :meth:`ResponseParser.matches` so that detection needs no per-family code.
    """

    tool_call_turn: str  # final assistant turn holding one tool call, no reasoning
    reasoning_turn: str  # final assistant turn with ``reasoning_content`` and plain content
    plain_turn: str  # final assistant turn with plain content only
    generation_prompt: str  # what ``add_generation_prompt=True`` appends
    generation_prompt_no_thinking: str  # the same with ``enable_thinking=False``
    tool_name: str = "agentrl_probe_tool"  # the name of the probe call in ``tool_call_turn``
    tools_shown: bool = True  # whether the template wrote the probe tool's schema anywhere
    prompt: str = ""  # the whole generation prompt with the probe tool (system part included)
    errors: tuple[str, ...] = field(default_factory=tuple)  # probes the template refused to render

    def adds(self, marker: str) -> bool:
        """True when the template writes ``marker`` although no probe message contained it."""
        return any(marker in t for t in (self.plain_turn, self.generation_prompt, self.generation_prompt_no_thinking))


class ResponseParser(ABC):
    """Splits one generated assistant turn (text, end-of-turn token removed) into its parts."""

    name: ClassVar[str] = ""

    @abstractmethod
    def parse(self, text: str) -> ParsedResponse:
        """Parse ``text``; report problems as issues, never raise."""

    def parse_with_tools(self, text: str, tools: Sequence[dict[str, Any]] | None) -> ParsedResponse:
        """Parse knowing the tool schemas of the prompt: untyped-argument syntaxes take argument types
        from them, and every family reports a call to a tool the prompt never declared."""
        return check_declared(self.parse(text), tools)

    @classmethod
    def matches(cls, probe: TemplateProbe) -> bool:
        """Whether a template that rendered ``probe`` writes this parser's syntax (for detection)."""
        return False


class Finder:
    """``str.find`` that remembers its last answer per substring, so a parser that keeps asking
    "where is the next closing tag after here" scans the text once instead of once per call.

    Without it, an output of a million unclosed openers makes each opener search to the end for
    its closer: quadratic time on one hostile turn, stalling every episode in flight.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self._last: dict[str, tuple[int, int]] = {}  # substring -> (searched from, found at or -1)

    def find(self, sub: str, start: int) -> int:
        hit = self._last.get(sub)
        if hit is not None and hit[0] <= start and (hit[1] == -1 or hit[1] >= start):
            return hit[1]
        pos = self.text.find(sub, start)
        self._last[sub] = (start, pos)
        return pos
