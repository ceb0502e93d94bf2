"""Plain data types shared by chat formats, the tool dispatcher and environments.

Messages stay OpenAI-style dicts (what every jinja chat template expects); these dataclasses
are the parsed, typed view of a model's response.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# An OpenAI-style chat message, as every jinja chat template expects it.
Message = dict[str, Any]


@dataclass
class ToolCall:
    """One tool call as parsed from model output.

    ``arguments`` is a dict when the model produced a JSON object; ``raw_arguments`` keeps the
    exact text so that a call with invalid JSON can still be dispatched and reported as such.
    """

    name: str
    arguments: dict[str, Any] | None
    id: str | None = None
    raw_arguments: str | None = None
    error: str | None = None  # why the call could not be parsed cleanly (e.g. "bad_json")

    def to_message_dict(self) -> dict[str, Any]:
        """OpenAI-style ``tool_calls`` entry, as chat templates and the dispatcher expect."""
        arguments: Any = self.arguments if self.arguments is not None else (self.raw_arguments or "")
        out: dict[str, Any] = {"type": "function", "function": {"name": self.name, "arguments": arguments}}
        if self.id is not None:
            out["id"] = self.id
        return out


@dataclass
class ParseIssue:
    """Something unusual about a model response; parsers report, they never raise."""

    kind: str  # e.g. "bad_json", "missing_name", "unclosed_tag", "call_in_reasoning", "trailing_text"
    detail: str = ""


@dataclass
class ParsedResponse:
    """A generated assistant turn split into its parts."""

    content: str
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    issues: list[ParseIssue] = field(default_factory=list)

    @property
    def well_formed(self) -> bool:
        return not self.issues

    def to_message(self) -> dict[str, Any]:
        """The assistant message dict to append to the conversation."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning is not None:
            msg["reasoning_content"] = self.reasoning
        if self.tool_calls:
            msg["tool_calls"] = [c.to_message_dict() for c in self.tool_calls]
        return msg
