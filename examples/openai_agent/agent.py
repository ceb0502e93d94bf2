"""An ordinary tool-calling agent on the ``openai`` client: no agentrl in it.

This is the code a team already has. ``harness_env.py`` trains it with agentrl without changing a
line here; run this file on its own against any OpenAI-compatible server:

    OPENAI_BASE_URL=http://localhost:8000/v1 OPENAI_API_KEY=... python agent.py "What is 12 * 7?"
"""

from __future__ import annotations

import json
import re
import sys
from fractions import Fraction

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": 'The expression, e.g. "12 * 7".'}},
                "required": ["expression"],
            },
        },
    }
]
BINARY = re.compile(r"\s*(-?\d+(?:\.\d+)?)\s*([-+*/])\s*(-?\d+(?:\.\d+)?)\s*")


def calculator(expression: str) -> str:
    """One operation per call, exact: ``a op b``."""
    match = BINARY.fullmatch(expression or "")
    if match is None:
        return "Error: write one operation, like 12 * 7"
    a, op, b = Fraction(match.group(1)), match.group(2), Fraction(match.group(3))
    if op == "/" and b == 0:
        return "Error: division by zero"
    value = {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else a}[op]
    return str(value.numerator) if value.denominator == 1 else f"{float(value):.10f}".rstrip("0").rstrip(".")


async def solve(client, question: str, model: str = "gpt-4o-mini", max_turns: int = 6) -> str:
    """Ask, run the calls the model makes, send the results back, until it answers."""
    messages = [{"role": "user", "content": question}]
    for _ in range(max_turns):
        response = await client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
        message = response.choices[0].message
        messages.append(message)
        if not message.tool_calls:
            return message.content or ""
        for call in message.tool_calls:
            try:
                result = calculator(json.loads(call.function.arguments).get("expression", ""))
            except (ValueError, AttributeError):
                result = "Error: the arguments must be a JSON object with an expression"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return ""


if __name__ == "__main__":
    import asyncio

    import openai

    print(asyncio.run(solve(openai.AsyncOpenAI(), " ".join(sys.argv[1:]) or "What is 12 * 7?")))
