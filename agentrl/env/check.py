"""``check_env``: catch environment mistakes before a training run does, and name them precisely.

In the spirit of gymnasium's env checker: API shapes of ``reset`` and ``step``, seeding
determinism, tool schemas, misuse handling and instance independence: two interleaved episodes
from ``spawn()`` must share no mutable state (``agentrl.env.isolation``). Every problem found is
collected; the raised ``EnvCheckError`` lists them all.
"""

from __future__ import annotations

import math
import re
from typing import Any

import anyio

from agentrl.core.errors import UserError
from agentrl.core.step import StepResult
from agentrl.env.environment import EnvError, Environment
from agentrl.env.episode_copy import SpawnError
from agentrl.env.isolation import bound_to, changed, shared_between, snapshot
from agentrl.env.tool import ToolDefinitionError

ROLES = {"system", "user", "assistant", "tool"}
TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class EnvCheckError(UserError, AssertionError):
    """The environment breaks the contract; ``problems`` lists every finding."""

    def __init__(self, env_name: str, problems: list[str]) -> None:
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{env_name} failed check_env with {len(problems)} problem(s):\n{lines}")


def check_env(env: Any, seed: int = 0) -> None:
    """Check ``env`` from synchronous code; raises ``EnvCheckError`` listing every problem."""
    try:
        import asyncio

        asyncio.get_running_loop()
    except RuntimeError:
        anyio.run(acheck_env, env, seed)
        return
    raise RuntimeError("check_env was called inside a running event loop; use `await acheck_env(env)` there")


async def acheck_env(env: Any, seed: int = 0) -> None:
    """The async form of ``check_env``."""
    name = type(env).__name__
    if not isinstance(env, Environment):
        raise EnvCheckError(name, [f"{name} is not an agentrl.Environment subclass"])
    problems: list[str] = []
    problems += _check_tools(env)

    fresh = env.spawn()
    try:
        await fresh.step({"role": "assistant", "content": "hi"})
        problems.append("step() before reset() did not raise; it should raise EnvError")
    except EnvError:
        pass
    except Exception as exc:
        problems.append(f"step() before reset() raised {type(exc).__name__} instead of a clear EnvError: {exc}")

    first = await _reset(env, seed, problems)
    if first is None:
        raise EnvCheckError(name, problems)
    again = await _reset(env.spawn(), seed, problems)
    if again is not None and again[0] != first[0]:
        problems.append(f"reset(seed={seed}) is not deterministic: two resets gave different messages")

    other = env.spawn()
    await _reset(other, seed + 1, problems)
    await _check_step(env, problems)
    if env is not other and getattr(env, "episode", None) is not None and env.episode is other.episode:
        problems.append("spawn() returned an instance sharing episode state with the original")
    problems += await _check_isolation(env, seed)
    if problems:
        raise EnvCheckError(name, problems)


_FIX = "create it in reset() (or keep it in the injected `state` dict), or list it in the class's `shared = (...)` if sharing is meant"


async def _check_isolation(env: Environment, seed: int) -> list[str]:
    """Two episodes from ``spawn()``, interleaved: neither may see what the other writes."""
    try:
        a, b = env.spawn(), env.spawn()
    except SpawnError as exc:
        return [str(exc)]
    problems = [
        f"{name} is a bound method of the instance spawn() was called on, so every episode writes to that one instance; "
        "override spawn() only through agentrl's (it rebinds them) or use FactoryEnvironment"
        for name in bound_to(a, env)
    ]
    problems += [f"two episodes from spawn() share the mutable {path}; {_FIX}" for path in shared_between(a, b)[:5]]
    if await _reset(a, seed, problems) is None or await _reset(b, seed + 1, problems) is None:
        return problems
    for acting, watching in ((a, b), (b, a)):
        before = snapshot(watching)
        try:
            await acting.step({"role": "assistant", "content": "", "tool_calls": _valid_calls(acting)})
        except Exception:  # _check_step reports a step that raises
            continue
        problems += [f"a step of one episode changed {path}, which a concurrent episode sees; {_FIX}" for path in changed(before, snapshot(watching))[:5]]
    return sorted(set(problems), key=problems.index)


def _valid_calls(env: Environment) -> list[dict[str, Any]]:
    """One call to every tool with arguments its schema accepts, so the tools really run."""
    calls = []
    for t in env.tools:
        try:
            params = t.schema["function"].get("parameters", {})
        except ToolDefinitionError:
            continue
        props = params.get("properties", {})
        args = {name: _example(props.get(name, {})) for name in params.get("required", [])}
        calls.append({"type": "function", "id": f"isolation-{t.tool_name}", "function": {"name": t.tool_name, "arguments": args}})
    return calls


def _example(prop: dict[str, Any]) -> Any:
    if prop.get("enum"):
        return prop["enum"][0]
    return {"string": "1", "integer": 1, "number": 1.0, "boolean": False, "array": [], "object": {}}.get(prop.get("type"), "1")


def _check_tools(env: Environment) -> list[str]:
    problems: list[str] = []
    seen: set[str] = set()
    try:
        tools = env.tools
    except Exception as exc:
        return [f"env.tools raised {type(exc).__name__}: {exc}"]
    for t in tools:
        try:
            schema = t.schema
        except ToolDefinitionError as exc:
            problems.append(f"tool schema invalid: {exc}")
            continue
        fn = schema.get("function", {}) if isinstance(schema, dict) else {}
        tname = fn.get("name", "")
        if schema.get("type") != "function" or not fn:
            problems.append(f"tool {t!r}: schema must be {{'type': 'function', 'function': {{...}}}}")
            continue
        if not TOOL_NAME_RE.match(str(tname)):
            problems.append(f"tool name {tname!r} must match {TOOL_NAME_RE.pattern}")
        if tname in seen:
            problems.append(f"two tools are named {tname!r}; names must be unique")
        seen.add(tname)
        params = fn.get("parameters", {})
        props = params.get("properties", {})
        if params.get("type") != "object" or not isinstance(props, dict):
            problems.append(f"tool {tname!r}: parameters must be a JSON-schema object with properties")
        missing = [r for r in params.get("required", []) if r not in props]
        if missing:
            problems.append(f"tool {tname!r}: required parameters {missing} are not in properties")
    return problems


async def _reset(env: Environment, seed: int, problems: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
    try:
        out = await env.reset(seed=seed)
    except Exception as exc:
        problems.append(f"reset(seed={seed}) raised {type(exc).__name__}: {exc}")
        return None
    if not (isinstance(out, tuple) and len(out) == 2):
        problems.append(f"reset() must return (messages, info), got {type(out).__name__}")
        return None
    messages, info = out
    problems += _check_messages(messages, "reset()")
    if not messages:
        problems.append("reset() returned no messages; the model needs a prompt")
    if not isinstance(info, dict):
        problems.append(f"reset() info must be a dict, got {type(info).__name__}")
    return messages, info


def _check_messages(messages: Any, where: str) -> list[str]:
    if not isinstance(messages, list):
        return [f"{where} messages must be a list of dicts, got {type(messages).__name__}"]
    problems = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            problems.append(f"{where} message {i} must be a dict, got {type(m).__name__}")
            continue
        if m.get("role") not in ROLES:
            problems.append(f"{where} message {i} has role {m.get('role')!r}; expected one of {sorted(ROLES)}")
        if not isinstance(m.get("content"), str):
            problems.append(f"{where} message {i} content must be a string, got {type(m.get('content')).__name__}")
    return problems


async def _check_step(env: Environment, problems: list[str]) -> None:
    calls = []
    for t in env.tools:
        try:
            calls.append({"type": "function", "id": f"check-{t.tool_name}", "function": {"name": t.tool_name, "arguments": {"__not_an_argument__": 1}}})
        except ToolDefinitionError:
            pass
    if calls:
        try:
            out = await env.step({"role": "assistant", "content": "", "tool_calls": calls})
        except Exception as exc:
            problems.append(f"step() with an invalid tool call raised {type(exc).__name__}: {exc}; it must answer with a tool message")
            return
        if _check_step_result(out, problems, "step(tool call)") and out[2] is False and len(out[0]) != len(calls):
            problems.append(f"step() answered {len(calls)} tool call(s) with {len(out[0])} message(s)")
        if out[2] or out[3]:
            return
    try:
        out = await env.step({"role": "assistant", "content": "The answer is 0."})
    except Exception as exc:
        problems.append(f"step() with a plain answer raised {type(exc).__name__}: {exc}")
        return
    _check_step_result(out, problems, "step(answer)")


def _check_step_result(out: Any, problems: list[str], where: str) -> bool:
    if not (isinstance(out, StepResult) or (isinstance(out, tuple) and len(out) == 5)):
        problems.append(f"{where} must return a StepResult or (messages, reward, terminated, truncated, info), got {out!r:.80}")
        return False
    messages, reward, terminated, truncated, info = out
    ok = True
    for p in _check_messages(messages, where):
        problems.append(p)
        ok = False
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        problems.append(f"{where} reward must be a finite float, got {reward!r}")
        ok = False
    for flag, value in (("terminated", terminated), ("truncated", truncated)):
        if not isinstance(value, bool):
            problems.append(f"{where} {flag} must be a bool, got {type(value).__name__}")
            ok = False
    if not isinstance(info, dict):
        problems.append(f"{where} info must be a dict, got {type(info).__name__}")
        ok = False
    return ok
