"""What happened to one tool call: the typed record that travels from the dispatcher to the trajectory,
the viewer and the metrics (plain data, so every side can read it without importing the tool runtime)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

Outcome = Literal["ok", "error", "timeout", "unknown_tool", "bad_json", "bad_args", "oversized", "bad_output"]
FAILURES: frozenset[str] = frozenset({"error", "timeout", "unknown_tool", "bad_json", "bad_args", "bad_output"})
# Failures that mean the model wrote a broken call (as opposed to a tool failing on a good call).
MALFORMED: frozenset[str] = frozenset({"bad_json", "bad_args", "unknown_tool"})


@dataclass
class ToolRecord:
    """What happened to one call; ``kind`` is "ok" or one of the failure kinds."""

    tool: str
    kind: str
    latency_s: float
    call_id: str | None = None
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.kind in FAILURES

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
