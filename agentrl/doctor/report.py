"""The doctor's report: one line per check, details and token diffs under it; plain, rich or JSON."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any, TextIO

from agentrl.doctor.checks import FAIL, PASS, SKIP, WARN, Check

_STYLE = {PASS: "bold green", WARN: "bold yellow", FAIL: "bold red", SKIP: "dim"}
_TEXT_LINES = 40  # longer texts (a rendered prompt) are cut in the readable report, never in JSON


@dataclass
class Report:
    model: str
    tokenizer: str
    chat_format: str | None
    how: str
    template: str
    end_of_turn: str
    checks: list[Check] = field(default_factory=list)
    strict: bool = False
    bad_input: bool = False  # the input itself was unusable (exit code 2)

    def counts(self) -> dict[str, int]:
        return {s: sum(c.status == s for c in self.checks) for s in (PASS, WARN, FAIL, SKIP)}

    @property
    def status(self) -> str:
        counts = self.counts()
        return FAIL if counts[FAIL] else WARN if counts[WARN] else PASS

    @property
    def exit_code(self) -> int:
        """1 on any FAIL (and, with strict=true, on any WARN), 2 for bad input, else 0: usable as a gate."""
        if self.bad_input:
            return 2
        return 1 if self.status == FAIL or (self.strict and self.status == WARN) else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "tokenizer": self.tokenizer,
            "chat_format": self.chat_format,
            "how": self.how,
            "template": self.template,
            "end_of_turn": self.end_of_turn,
            "status": self.status,
            "strict": self.strict,
            "exit_code": self.exit_code,
            "counts": self.counts(),
            "checks": [c.to_dict() for c in self.checks],
        }


def text_lines(report: Report) -> list[tuple[str | None, str]]:
    """(status to colour or None, line) pairs of the readable report."""
    out: list[tuple[str | None, str]] = [
        (None, f"agentrl doctor  model={report.model}"),
        (None, f"  tokenizer:   {report.tokenizer}"),
        (None, f"  chat format: {report.chat_format or '(none)'} ({report.how})"),
        (None, f"  template:    {report.template}"),
        (None, f"  end of turn: {report.end_of_turn}"),
        (None, ""),
    ]
    width = max((len(c.name) for c in report.checks), default=10)
    for c in report.checks:
        out.append((c.status, f"{c.status}  {c.name:<{width}}  {c.summary}"))
        for line in c.details:
            out.append((None, f"      {line}"))
        for diff in c.diffs:
            out += [(None, f"      {line}") for line in diff.lines()]
        for title, text in c.texts.items():
            lines = text.splitlines() or [""]
            out.append((None, f"      {title}:"))
            out += [(None, f"      | {line}") for line in lines[:_TEXT_LINES]]
            if len(lines) > _TEXT_LINES:
                out.append((None, f"      | ... ({len(lines) - _TEXT_LINES} more lines; json=true has all)"))
    counts = report.counts()
    tally = ", ".join(f"{counts[s]} {s.lower()}" for s in (PASS, WARN, FAIL, SKIP) if counts[s])
    gate = " (strict: warnings fail)" if report.strict else ""
    out += [(None, ""), (report.status, f"{report.status}  {tally}; exit code {report.exit_code}{gate}")]
    return out


def write(report: Report, as_json: bool, stream: TextIO | None = None) -> None:
    """JSON, or the readable report: coloured with rich on a terminal, plain text otherwise."""
    stream = stream or sys.stdout
    if as_json:
        stream.write(json.dumps(report.to_dict(), indent=2, ensure_ascii=False) + "\n")
        return
    lines = text_lines(report)
    if stream.isatty():
        from rich.console import Console
        from rich.text import Text

        console = Console(file=stream, highlight=False, soft_wrap=True)
        for status, line in lines:
            text = Text(line)
            if status is not None:
                text.stylize(_STYLE[status], 0, len(status))
            console.print(text)
        return
    stream.write("\n".join(line for _, line in lines) + "\n")
