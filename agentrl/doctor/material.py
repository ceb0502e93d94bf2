"""The conversations the doctor renders: tools, tool calls with awkward arguments, multi-turn episodes.

Fixed material, so that two runs of the doctor (or two templates) are compared on the same input.
Argument values are chosen to catch the usual template bugs: ints turned into floats or strings,
booleans written as Python ``True``, nested objects flattened, quotes/newlines/unicode mangled.
"""

from __future__ import annotations

from typing import Any

from agentrl.core.messages import Message

SYSTEM = "You are a travel assistant. Answer briefly."
USER = "Find me a flight from Paris and tell me the weather there."

TOOLS: list[Message] = [
    {
        "type": "function",
        "function": {
            "name": "search_flights",
            "description": "Search flights leaving an airport.",
            "parameters": {
                "type": "object",
                "properties": {
                    "origin": {"type": "string", "description": "IATA airport code"},
                    "max_stops": {"type": "integer", "description": "most stops allowed"},
                    "budget": {"type": "number", "description": "price cap in euros"},
                    "refundable": {"type": "boolean", "description": "only refundable fares"},
                    "loyalty_id": {"type": "string", "description": "frequent-flyer number"},
                    "filters": {"type": "object", "description": "extra constraints"},
                    "tags": {"type": "array", "items": {"type": "string"}, "description": "labels for the search"},
                    "note": {"type": "string", "description": "free text for the agent"},
                },
                "required": ["origin"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "city name"},
                    "days": {"type": "integer", "description": "forecast length"},
                },
                "required": ["city"],
            },
        },
    },
]

# Call ids of 9 alphanumeric characters: the strictest template rule known (Mistral's).
NOTE = 'He said "window seat, not aisle".\nSecond line: café, 東京, 🚀, a backslash \\ and a tab\t.'
TYPED_ARGUMENTS: dict[str, Any] = {
    "origin": "CDG",
    "max_stops": 1,
    "budget": 249.5,
    "refundable": True,
    "loyalty_id": "00427",
    "filters": {"airlines": ["AF", "KL"], "depart": {"after": 6, "before": 22.5}, "direct_only": False, "seat": None},
    "tags": [],
    "note": NOTE,
}


def call(name: str, arguments: dict[str, Any], call_id: str) -> Message:
    return {"type": "function", "id": call_id, "function": {"name": name, "arguments": arguments}}


def assistant(content: str = "", calls: list[Message] | None = None, reasoning: str | None = None) -> Message:
    msg: Message = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = calls
    if reasoning is not None:
        msg["reasoning_content"] = reasoning
    return msg


def tool_message(content: str, name: str, call_id: str) -> Message:
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}


def history() -> list[Message]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]


def round_trip_cases(with_reasoning: bool) -> list[tuple[str, Message]]:
    """(label, assistant turn) pairs whose tool calls must survive render -> parse unchanged."""
    cases = [
        ("typed arguments", assistant(calls=[call("search_flights", TYPED_ARGUMENTS, "call00001")])),
        (
            "text then two calls",
            assistant(
                "Checking both cities.",
                [call("get_weather", {"city": "Paris"}, "call00001"), call("get_weather", {"city": "São Paulo", "days": 3}, "call00002")],
            ),
        ),
    ]
    if with_reasoning:
        cases.append((
            "reasoning then a call",
            assistant(calls=[call("search_flights", {"origin": "LHR", "max_stops": 0}, "call00001")],
                      reasoning="The user wants a flight.\nI will search first."),
        ))  # fmt: skip
    return cases


Round = tuple[Message, list[Message] | None]


def tool_loop(reasoning: bool) -> list[Round]:
    """assistant -> tool -> assistant (text and a call) -> tool -> final answer.

    One call per turn: some templates (Llama 3.1) refuse parallel calls; the round trip tests those.
    """

    def r(text: str) -> str | None:
        return text if reasoning else None

    return [
        (
            assistant(calls=[call("get_weather", {"city": "Paris"}, "call00001")], reasoning=r("Weather first.")),
            [tool_message('{"temp_c": 21, "sky": "sunny"}', "get_weather", "call00001")],
        ),
        (
            assistant(
                "Now the flights.",
                [call("search_flights", {"origin": "CDG", "max_stops": 0}, "call00002")],
                reasoning=r("Sunny. Now the flights."),
            ),
            [tool_message("[]", "search_flights", "call00002")],
        ),
        (assistant("Sunny in Paris (21 C); no direct flights from CDG.", reasoning=r("Both results are in.")), None),
    ]


def user_turn(reasoning: bool) -> list[Round]:
    """A final answer, then a new user message, then a tool call and another answer."""

    def r(text: str) -> str | None:
        return text if reasoning else None

    return [
        (assistant("It is sunny in Paris.", reasoning=r("Answer from memory.")), [{"role": "user", "content": "And tomorrow?"}]),
        (
            assistant(calls=[call("get_weather", {"city": "Paris", "days": 2}, "call00001")], reasoning=r("Need a forecast.")),
            [tool_message('{"tomorrow": "rain"}', "get_weather", "call00001")],
        ),
        (assistant("Rain tomorrow.", reasoning=r("Done.")), None),
    ]
