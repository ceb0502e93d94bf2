"""Tools: typed Python callables the model may call, with a JSON schema and validated arguments.

``@tool`` wraps a function; subclass ``Tool`` for stateful or configurable tools (implement
``run``). The schema comes from the type hints and the docstring's Args section through
``transformers.utils.get_json_schema`` (the same schema every HF chat template already renders),
and arguments are validated by a pydantic model built from the same signature before the call.
Running tools safely (timeouts, caps, concurrency, errors as messages) is ``dispatch.py``'s job.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from typing import Any, get_type_hints

import anyio
import pydantic
from transformers.utils import get_json_schema
from transformers.utils.chat_template_utils import DocstringParsingException, TypeHintParsingException

from agentrl.core.errors import AgentrlError, UserError
from agentrl.env.episode_copy import per_episode_copy
from agentrl.env.tool_threads import ThreadBudget

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MAX_OUTPUT_CHARS = 4000
DEFAULT_MAX_CONCURRENCY = 32


class ToolError(AgentrlError):
    """Raise from a tool to send the model a plain error message (no exception type prefix)."""


class ToolDefinitionError(UserError, ValueError):
    """A tool cannot be built from the given function (missing docs, unsupported hints...)."""


class Tool:
    """A tool the model can call.

    Subclasses implement ``run`` (sync or async) with typed, documented parameters. Parameters
    named in ``injected`` are hidden from the model's schema and filled by the environment from
    episode state at dispatch time (for example ``state`` or ``task``).

    Limits: ``timeout`` seconds per call (waiting for a free slot included, unless an async tool
    sets ``timeout_includes_queue = False``: then the clock starts when the call gets its slot, for
    tools whose every call is bounded by a limit of its own, such as a sandbox's time limit, so a
    long queue is not a failure), ``max_output_chars``
    characters of output or error text (longer text is cut with a visible marker),
    ``max_concurrency`` calls of this tool in flight at once across all episodes sharing the
    instance; for a sync tool, threads alive at once, a hung call keeping its thread until it ends.

    Each concurrent episode gets its own copy of a tool (``Environment.spawn``): attributes a
    subclass sets are per episode unless listed in ``shared`` (a corpus, a sandbox pool); the
    concurrency limits stay common to all copies.
    """

    name: str = ""
    description: str = ""
    injected: tuple[str, ...] = ()
    timeout: float = DEFAULT_TIMEOUT_S
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY
    timeout_includes_queue: bool = True
    shared: tuple[str, ...] = ()

    def run(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__}.run is not implemented")

    # -- schema and validation -------------------------------------------------------------

    def _fn(self) -> Callable[..., Any]:
        return self.run

    def _tool_name(self) -> str:
        return self.name or _snake(type(self).__name__)

    @property
    def schema(self) -> dict[str, Any]:
        """OpenAI-style ``{"type": "function", "function": {...}}`` schema (cached)."""
        cached = self.__dict__.get("_schema")
        if cached is None:
            cached = build_schema(self._fn(), self._tool_name(), self.injected, self.description)
            self.__dict__["_schema"] = cached
        return cached

    @property
    def tool_name(self) -> str:
        return self.schema["function"]["name"]

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self._fn())

    @property
    def args_model(self) -> type[pydantic.BaseModel]:
        cached = self.__dict__.get("_args_model")
        if cached is None:
            cached = build_args_model(self._fn(), self._tool_name(), self.injected)
            self.__dict__["_args_model"] = cached
        return cached

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Validated keyword arguments; raises ``pydantic.ValidationError`` on bad input."""
        model = self.args_model.model_validate(arguments)
        return {name: getattr(model, name) for name in type(model).model_fields}

    def limiter(self) -> anyio.CapacityLimiter:
        """The concurrency limiter of this async tool for the running event loop."""
        with _LIMITER_LOCK:
            limiters = self.__dict__.setdefault("_limiters", {})
            key = _loop_key()
            if key not in limiters:
                limiters[key] = anyio.CapacityLimiter(self.max_concurrency)
            return limiters[key]

    def thread_budget(self) -> ThreadBudget:
        """The threads this sync tool may keep alive at once (``max_concurrency``, hung ones included),
        shared by every event loop: a hung tool holds its own slots, never another tool's."""
        with _LIMITER_LOCK:
            budget = self.__dict__.get("_thread_budget")
            if budget is None:
                budget = self.__dict__["_thread_budget"] = ThreadBudget(self.max_concurrency)
            return budget

    def __deepcopy__(self, memo: dict[int, Any]) -> Tool:
        """A per-episode copy: own state, the original's limiters, thread budget and schema caches."""
        with _LIMITER_LOCK:
            self.__dict__.setdefault("_limiters", {})
        self.thread_budget()
        return per_episode_copy(self, memo, keep=_COMMON_TO_COPIES)

    def __repr__(self) -> str:
        return f"<Tool {self._tool_name()}>"


# What every per-episode copy of a tool shares with the original: limits are across all episodes.
_COMMON_TO_COPIES = ("_limiters", "_thread_budget", "_schema", "_args_model")


class FunctionTool(Tool):
    """A tool made from a plain function by ``@tool``."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        injected: tuple[str, ...] = (),
        timeout: float = DEFAULT_TIMEOUT_S,
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
    ) -> None:
        self.fn = fn
        self.name = name or fn.__name__
        self.description = description or ""
        self.injected = tuple(injected)
        self.timeout = timeout
        self.max_output_chars = max_output_chars
        self.max_concurrency = max_concurrency
        _ = self.schema, self.args_model  # fail at definition time, not at the first call

    def _fn(self) -> Callable[..., Any]:
        return self.fn

    def run(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calling the tool directly calls the function (handy in tests and scripts)."""
        return self.fn(*args, **kwargs)


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    injected: tuple[str, ...] = (),
    timeout: float = DEFAULT_TIMEOUT_S,
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
) -> Any:
    """Turn a typed, documented function (sync or async) into a ``Tool``.

    Usable bare (``@tool``) or with options (``@tool(timeout=5, injected=("state",))``).
    """

    def wrap(f: Callable[..., Any]) -> FunctionTool:
        return FunctionTool(
            f,
            name=name,
            description=description,
            injected=injected,
            timeout=timeout,
            max_output_chars=max_output_chars,
            max_concurrency=max_concurrency,
        )

    return wrap(fn) if fn is not None else wrap


def as_tool(obj: Tool | Callable[..., Any]) -> Tool:
    """Accept a Tool or a plain function wherever tools are declared."""
    if isinstance(obj, Tool):
        return obj
    if callable(obj):
        return FunctionTool(obj)
    raise ToolDefinitionError(f"expected a Tool or a function, got {type(obj).__name__}")


# -- helpers ---------------------------------------------------------------------------------


def build_schema(
    fn: Callable[..., Any], name: str, injected: tuple[str, ...] = (), description: str = ""
) -> dict[str, Any]:
    """OpenAI function schema of ``fn`` without its injected parameters.

    Delegates to ``get_json_schema`` so the schema is exactly what HF chat templates expect; its
    non-OpenAI ``return`` entry is dropped.
    """
    _check_injected(fn, name, injected)
    try:
        schema = get_json_schema(_public_view(fn, name, injected))
    except (DocstringParsingException, TypeHintParsingException) as exc:
        raise ToolDefinitionError(f"tool {name!r}: {exc}") from None
    function = schema["function"]
    function.pop("return", None)
    function["name"] = name
    if description:
        function["description"] = description
    if not function.get("description"):
        raise ToolDefinitionError(f"tool {name!r}: the docstring needs a description line before its Args section")
    return schema


def build_args_model(fn: Callable[..., Any], name: str, injected: tuple[str, ...] = ()) -> type[pydantic.BaseModel]:
    """A pydantic model of the model-visible parameters; unknown keys are rejected."""
    hints = get_type_hints(fn)
    fields: dict[str, Any] = {}
    for param in inspect.signature(fn).parameters.values():
        if param.name in injected or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (hints.get(param.name, Any), default)
    config = pydantic.ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    return pydantic.create_model(f"{_camel(name)}Arguments", __config__=config, **fields)


def _public_view(fn: Callable[..., Any], name: str, injected: tuple[str, ...]) -> Callable[..., Any]:
    """A stand-in function whose signature lacks the injected parameters, for schema building."""
    sig = inspect.signature(fn)
    for param in sig.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolDefinitionError(f"tool {name!r}: *args/**kwargs cannot be described to a model")
    hints = {k: v for k, v in get_type_hints(fn).items() if k not in injected}

    def view(*args: Any, **kwargs: Any) -> None:  # pragma: no cover - never called
        return None

    view.__signature__ = sig.replace(parameters=[p for p in sig.parameters.values() if p.name not in injected])  # type: ignore[attr-defined]
    view.__annotations__ = hints
    view.__doc__ = inspect.getdoc(fn)
    view.__name__ = name
    return view


def _check_injected(fn: Callable[..., Any], name: str, injected: tuple[str, ...]) -> None:
    params = inspect.signature(fn).parameters
    missing = [p for p in injected if p not in params]
    if missing:
        raise ToolDefinitionError(f"tool {name!r}: injected parameter(s) {missing} are not parameters of the function")


def _snake(name: str) -> str:
    out = []
    for i, ch in enumerate(name):
        if ch.isupper() and i and not name[i - 1].isupper():
            out.append("_")
        out.append(ch.lower())
    return "".join(out)


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.replace("-", "_").split("_")) or "Tool"


_LIMITER_LOCK = threading.Lock()


def _loop_key() -> int:
    import asyncio

    try:
        return id(asyncio.get_running_loop())
    except RuntimeError:
        return 0
