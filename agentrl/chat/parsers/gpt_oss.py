"""GPT-OSS (OpenAI harmony): a turn is a sequence of messages on channels.

After the prompt's ``<|start|>assistant`` the model writes, for example::

    <|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary
    to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>

``analysis`` is reasoning, ``final`` the answer, and a message addressed ``to=functions.NAME`` is a
tool call whose body is JSON. Generation stops on ``<|call|>`` or ``<|return|>`` (``<|end|>`` only
closes one message), so those are the format's end-of-turn tokens.
"""

from __future__ import annotations

import re

from agentrl.chat.parsers.base import MAX_CALLS, ResponseParser, TemplateProbe, too_many_calls
from agentrl.chat.parsers.calls import call_from_object, loads
from agentrl.chat.parsers.names import bad_name
from agentrl.chat.parsers.registry import register_parser
from agentrl.core.messages import ParsedResponse, ParseIssue, ToolCall

START, CHANNEL, MESSAGE, END = "<|start|>", "<|channel|>", "<|message|>", "<|end|>"
_RECIPIENT = re.compile(r"to=functions\.([^\s<]+)")
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
_SEPARATOR = re.compile(r"<\|end\|>\s*(?:<\|start\|>\s*assistant)?|<\|start\|>\s*assistant")


@register_parser("gpt_oss")
class GptOssParser(ResponseParser):
    @classmethod
    def matches(cls, probe: TemplateProbe) -> bool:
        return f"to=functions.{probe.tool_name}" in probe.tool_call_turn

    def parse(self, text: str) -> ParsedResponse:
        if not text.strip():
            return ParsedResponse(content="", issues=[ParseIssue("empty", "no message")])
        issues: list[ParseIssue] = []
        reasoning: list[str] = []
        content: list[str] = []
        calls: list[ToolCall] = []
        # Messages are separated by <|end|><|start|>assistant; the first has no <|start|>.
        chunks = _SEPARATOR.split(text, MAX_CALLS + 1)
        for k, chunk in enumerate(c for c in chunks if c.strip()):
            where = f"message {k}"
            if k == MAX_CALLS:
                issues.append(too_many_calls("messages"))
                break
            if MESSAGE not in chunk:
                issues.append(ParseIssue("missing_message_tag", f"{where}: no {MESSAGE} in {chunk.strip()[:80]!r}"))
                content.append(chunk.strip())
                continue
            header, _, body = chunk.partition(MESSAGE)
            opens = [at for at in (header.find(CHANNEL), header.find("to="), header.find("<|constrain|>")) if at != -1]
            before = header[: min(opens)].strip() if opens else ""
            if before and before != "assistant":  # text outside any message: kept, and said so
                issues.append(ParseIssue("text_outside_message", f"{where}: {before[:80]!r} before the message header"))
                content.append(before)
            if MESSAGE in body:
                issues.append(ParseIssue("stray_tag", f"{where}: {MESSAGE} twice"))
            channel = _CHANNEL.search(header)
            recipient = _RECIPIENT.search(header)
            if channel is None:
                issues.append(ParseIssue("missing_channel", f"{where}: no {CHANNEL} in the header {header.strip()[:60]!r}"))
            if recipient is not None:
                calls_here, more = self._call(recipient.group(1), body, f"{where}")
                calls.extend(calls_here)
                issues.extend(more)
            elif channel is not None and channel.group(1) == "analysis":
                reasoning.append(body.strip())
            else:
                if channel is not None and channel.group(1) not in ("final", "commentary"):
                    issues.append(ParseIssue("unknown_channel", f"{where}: channel {channel.group(1)!r}"))
                content.append(body.strip())
        return ParsedResponse(
            content="\n\n".join(c for c in content if c),
            reasoning="\n\n".join(reasoning) if reasoning else None,
            tool_calls=calls,
            issues=issues,
        )

    @staticmethod
    def _call(name: str, body: str, where: str) -> tuple[list[ToolCall], list[ParseIssue]]:
        if (problem := bad_name(name, where)) is not None:
            return [], [problem]
        if not body.strip():  # harmony writes {} for no arguments: an empty body is a call cut short
            return [ToolCall(name, None, raw_arguments="", error="empty_call")], [
                ParseIssue("empty_call", f"{where} ({name}): no arguments written (a call with none writes {{}})")
            ]
        value, err = loads(body.strip())
        if err is not None:
            return [ToolCall(name, None, raw_arguments=body.strip(), error="bad_json")], [
                ParseIssue("bad_json", f"{where} ({name}): {err}")
            ]
        call, issues = call_from_object({"name": name, "arguments": value}, where)
        if call is not None:
            call.raw_arguments = body.strip()
        return ([call] if call else []), issues
