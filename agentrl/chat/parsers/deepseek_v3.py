"""DeepSeek V3 tool calls, as the model writes them::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

Text before the calls is the content. Also reads an optional ``<think>`` block (R1-style) first.
"""

from __future__ import annotations

from agentrl.chat.parsers.base import MAX_CALLS, ResponseParser, TemplateProbe, too_many_calls
from agentrl.chat.parsers.calls import call_body, call_from_object, loads
from agentrl.chat.parsers.names import bad_name
from agentrl.chat.parsers.reasoning import split_reasoning
from agentrl.chat.parsers.registry import register_parser
from agentrl.core.messages import ParsedResponse, ParseIssue, ToolCall

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


@register_parser("deepseek_v3")
class DeepSeekV3Parser(ResponseParser):
    @classmethod
    def matches(cls, probe: TemplateProbe) -> bool:
        return f"{CALL_BEGIN}function{SEP}{probe.tool_name}" in probe.tool_call_turn  # V3.1 writes no "function"

    def parse(self, text: str) -> ParsedResponse:
        if not text.strip():
            return ParsedResponse(content="", issues=[ParseIssue("empty", "no content and no tool call")])
        split = split_reasoning(text)
        issues = list(split.issues)
        rest = split.rest
        start = rest.find(CALLS_BEGIN)
        first_call = rest.find(CALL_BEGIN)
        if start == -1 and first_call == -1:
            for tag in (CALLS_END, CALL_END, SEP):
                if tag in rest:
                    issues.append(ParseIssue("stray_tag", f"{tag} without {CALLS_BEGIN}"))
            return ParsedResponse(content=rest.strip(), reasoning=split.reasoning, issues=issues)
        if start == -1 or (first_call != -1 and first_call < start):
            issues.append(ParseIssue("unopened_calls", f"{CALL_BEGIN} without {CALLS_BEGIN}"))
            start = first_call
        content, body = rest[:start], rest[start:].replace(CALLS_BEGIN, "", 1)
        end = body.find(CALLS_END)
        if end == -1:
            issues.append(ParseIssue("unclosed_tag", f"{CALLS_BEGIN} is never closed by {CALLS_END}"))
        else:
            if body[end + len(CALLS_END) :].strip():
                issues.append(ParseIssue("trailing_text", f"after {CALLS_END}: {body[end + len(CALLS_END):].strip()[:80]!r}"))
            body = body[:end]
        calls: list[ToolCall] = []
        pieces = body.split(CALL_BEGIN, MAX_CALLS + 1)
        if len(pieces) > MAX_CALLS + 1:
            pieces = pieces[: MAX_CALLS + 1]
            issues.append(too_many_calls("tool calls"))
        if pieces[0].strip():
            issues.append(ParseIssue("text_between_calls", f"{pieces[0].strip()[:80]!r}"))
        for k, piece in enumerate(pieces[1:]):
            call, more = self._call(piece, f"tool call {k}")
            issues.extend(more)
            if call is not None:
                calls.append(call)
        if not pieces[1:]:
            issues.append(ParseIssue("empty_call", "no call inside the tool-calls block"))
        return ParsedResponse(content=content.strip(), reasoning=split.reasoning, tool_calls=calls, issues=issues)

    @staticmethod
    def _call(piece: str, where: str) -> tuple[ToolCall | None, list[ParseIssue]]:
        body, issues = call_body(piece, CALL_BEGIN, CALL_END, where)
        if SEP not in body:
            return None, [*issues, ParseIssue("missing_name", f"{where}: no {SEP} before the function name")]
        kind, _, after = body.partition(SEP)
        name, _, args = after.partition("\n")
        name = name.strip()
        if not name:
            return None, [*issues, ParseIssue("missing_name", f"{where}: empty function name")]
        if (problem := bad_name(name, where)) is not None:
            if kind.strip() != "function" and bad_name(kind.strip(), where) is None:
                problem.detail += f" (DeepSeek V3.1 writes NAME{SEP}ARGUMENTS: chat_format=deepseek_v31 reads it)"
            return None, [*issues, problem]
        args = args.strip()
        if args.startswith("```"):
            args = args[3:]
            args = args[4:] if args.startswith("json") else args
            if args.rstrip().endswith("```"):
                args = args.rstrip()[:-3]
            else:
                issues.append(ParseIssue("unclosed_tag", f"{where} ({name}): the ```json block is never closed"))
        value, err = loads(args.strip() or "{}")
        if err is not None:
            return ToolCall(name, None, raw_arguments=args.strip(), error="bad_json"), [*issues, ParseIssue("bad_json", f"{where} ({name}): {err}")]
        call, more = call_from_object({"name": name, "arguments": value}, where)
        if call is not None:
            call.raw_arguments = args.strip()
        return call, issues + more
