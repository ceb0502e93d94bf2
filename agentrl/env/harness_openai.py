"""The OpenAI chat-completions wire shape of a harness episode: requests in, replies out, checked.

A harness sends OpenAI-style JSON; agentrl keeps messages as the dicts chat templates expect. This
module is the one translation between the two, and the one place a request is judged: anything the
endpoint cannot honour exactly (streaming, n > 1, a forced tool choice, penalties) is refused with a
message naming the field, never half-honoured. It also defines the *canonical* form of a message,
which is how a request's history is compared with what the episode actually sampled.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from agentrl.core.errors import AgentrlError
from agentrl.core.messages import Message

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
MAX_STOP = 16
# Fields a client may send that change nothing about what is sampled: accepted and ignored.
NEUTRAL = frozenset(
    {
        "model",
        "user",
        "metadata",
        "store",
        "parallel_tool_calls",
        "stream_options",
        "service_tier",
        "reasoning_effort",
        "prompt_cache_key",
        "safety_identifier",
    }
)
# Fields that would change sampling: accepted only at the value that changes nothing.
NEUTRAL_VALUES: dict[str, tuple[Any, ...]] = {
    "frequency_penalty": (None, 0, 0.0),
    "presence_penalty": (None, 0, 0.0),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "n": (None, 1),
    "stream": (None, False),
    "logit_bias": (None, {}),
}


class RequestError(AgentrlError, ValueError):
    """A request the endpoint refuses; ``param`` names the offending field (OpenAI's error shape)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None) -> None:
        super().__init__(message)
        self.param, self.status, self.code = param, status, code

    def body(self) -> dict[str, Any]:
        return {
            "error": {"message": str(self), "type": "invalid_request_error", "param": self.param, "code": self.code}
        }


@dataclass
class ChatRequest:
    """One validated ``/v1/chat/completions`` request, messages already in agentrl's shape."""

    messages: list[Message]
    tools: list[dict[str, Any]] | None
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    model: str = ""


def parse_request(data: Any) -> ChatRequest:
    """Validate a decoded JSON body; raises ``RequestError`` naming the first problem."""
    if not isinstance(data, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(data).__name__}")
    known = {
        "messages",
        "tools",
        "tool_choice",
        "temperature",
        "top_p",
        "max_tokens",
        "max_completion_tokens",
        "stop",
        "seed",
    }
    for key, value in data.items():
        if key in known or key in NEUTRAL:
            continue
        if key in NEUTRAL_VALUES:
            if value not in NEUTRAL_VALUES[key]:
                hint = " (streaming is not supported yet: send stream=false)" if key == "stream" else ""
                raise RequestError(f"{key}={value!r} is not supported by the agentrl endpoint{hint}", key)
            continue
        raise RequestError(f"unknown or unsupported field {key!r}", key)
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list", "messages")
    tools = _tools(data.get("tools"))
    choice = data.get("tool_choice")
    if choice not in (None, "auto") and not (choice == "none" and not tools):
        raise RequestError(
            f"tool_choice={choice!r} is not supported: the policy samples unconstrained, so only 'auto' is honoured exactly",
            "tool_choice",
        )
    max_tokens = data.get("max_completion_tokens", data.get("max_tokens"))
    if max_tokens is not None and (not _is_int(max_tokens) or max_tokens < 1):
        raise RequestError(f"max_tokens must be a positive integer, got {max_tokens!r}", "max_tokens")
    return ChatRequest(
        messages=[_message(m, i) for i, m in enumerate(messages)],
        tools=tools,
        temperature=_number(data.get("temperature"), "temperature", 0.0, 2.0),
        top_p=_number(data.get("top_p"), "top_p", 0.0, 1.0),
        max_tokens=max_tokens,
        stop=_stop(data.get("stop")),
        seed=data.get("seed") if _is_int(data.get("seed")) else _none_or_fail(data.get("seed"), "seed"),
        model=str(data.get("model") or ""),
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _none_or_fail(value: Any, name: str) -> None:
    if value is not None:
        raise RequestError(f"{name} must be an integer, got {value!r}", name)


def _number(value: Any, name: str, low: float, high: float) -> float | None:
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        raise RequestError(f"{name} must be a number in [{low}, {high}], got {value!r}", name)
    return float(value)


def _stop(value: Any) -> list[str]:
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or len(stops) > MAX_STOP or not all(isinstance(s, str) and s for s in stops):
        raise RequestError(
            f"stop must be a non-empty string or a list of at most {MAX_STOP} of them, got {value!r:.200}", "stop"
        )
    return list(stops)


def _tools(value: Any) -> list[dict[str, Any]] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise RequestError("tools must be a list", "tools")
    for i, tool in enumerate(value):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(tool, dict)
            or tool.get("type", "function") != "function"
            or not isinstance(fn, dict)
            or not isinstance(fn.get("name"), str)
        ):
            raise RequestError(
                f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}",
                f"tools[{i}]",
            )
    return [dict(t, type="function") for t in value] or None


def _text(content: Any, where: str) -> str:
    """Message content as text: a string, None, or a list of text parts (other parts are refused)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(f"{where}.content: only text parts are supported, got {part!r:.100}", where)
            parts.append(part["text"])
        return "".join(parts)
    raise RequestError(f"{where}.content must be a string or a list of text parts, got {type(content).__name__}", where)


def _message(m: Any, i: int) -> Message:
    where = f"messages[{i}]"
    if not isinstance(m, dict) or m.get("role") not in ROLES:
        raise RequestError(f"{where} must be an object with a role in {sorted(ROLES)}", where)
    role = "system" if m["role"] == "developer" else m["role"]
    out: Message = {"role": role, "content": _text(m.get("content"), where)}
    if role == "assistant":
        reasoning = m.get("reasoning_content", m.get("reasoning"))
        if isinstance(reasoning, str):
            out["reasoning_content"] = reasoning
        calls = m.get("tool_calls")
        if calls:
            if not isinstance(calls, list):
                raise RequestError(f"{where}.tool_calls must be a list", where)
            out["tool_calls"] = [_call(c, f"{where}.tool_calls[{k}]") for k, c in enumerate(calls)]
    elif role == "tool":
        call_id = m.get("tool_call_id")
        if not isinstance(call_id, str):
            raise RequestError(f"{where}: a tool message needs its tool_call_id", where)
        out["tool_call_id"] = call_id
        if isinstance(m.get("name"), str):
            out["name"] = m["name"]
    return out


def _call(c: Any, where: str) -> dict[str, Any]:
    fn = c.get("function") if isinstance(c, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise RequestError(
            f"{where} must be {{'id': ..., 'type': 'function', 'function': {{'name': ..., 'arguments': ...}}}}", where
        )
    args = fn.get("arguments")
    if isinstance(args, str):  # the wire form; templates expect the object
        try:
            parsed = json.loads(args) if args.strip() else {}
            args = parsed if isinstance(parsed, dict) else args
        except (ValueError, RecursionError):
            pass
    out = {"type": "function", "function": {"name": fn["name"], "arguments": args if args is not None else {}}}
    if isinstance(c.get("id"), str):
        out["id"] = c["id"]
    return out


def canonical(m: Message) -> tuple[Any, ...]:
    """What must be equal for a sent message to be the one the episode holds.

    Reasoning is left out (a client that does not echo it has not changed what the model saw: the
    episode keeps its tokens); tool-call arguments compare as JSON values, not as text.
    """
    calls = tuple(
        (c.get("id"), c["function"]["name"], _json_key(c["function"].get("arguments")))
        for c in m.get("tool_calls") or ()
    )
    return (m["role"], m.get("content") or "", m.get("tool_call_id"), calls)


def _json_key(args: Any) -> str:
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            return "raw:" + args
    return json.dumps(args, sort_keys=True, ensure_ascii=False, default=str)


def wire_message(message: Message) -> dict[str, Any]:
    """An assistant message as the OpenAI API returns it (arguments as JSON text, content None
    when there is only a call)."""
    calls = []
    for k, c in enumerate(message.get("tool_calls") or []):
        fn = c.get("function", {})
        args = fn.get("arguments")
        text = args if isinstance(args, str) else json.dumps(args if args is not None else {}, ensure_ascii=False)
        calls.append(
            {
                "id": c.get("id") or f"call_{k}",
                "type": "function",
                "function": {"name": fn.get("name", ""), "arguments": text},
            }
        )
    out: dict[str, Any] = {
        "role": "assistant",
        "content": (message.get("content") or None) if calls else (message.get("content") or ""),
    }
    if message.get("reasoning_content") is not None:
        out["reasoning_content"] = message["reasoning_content"]
    if calls:
        out["tool_calls"] = calls
    return out


def completion(
    message: Message, finish_reason: str, model: str, prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    """The ``chat.completion`` object for one sampled turn."""
    wire = wire_message(message)
    if finish_reason == "stop" and wire.get("tool_calls"):
        finish_reason = "tool_calls"
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": wire, "finish_reason": finish_reason, "logprobs": None}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
