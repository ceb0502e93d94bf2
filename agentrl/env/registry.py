"""Find environments by name: built-ins, registered names, entry points, or import specs.

``make("calculator")`` — a registered name; ``make("mypkg.envs:MyEnv")`` — module and class;
``make("path/to/file.py:MyEnv")`` — a file; third-party packages register through the
``agentrl.environments`` entry-point group (``name = "module:Class"``).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from agentrl.core.errors import UserError
from agentrl.core.loading import SpecError, load_spec
from agentrl.core.registry import Registry

ENTRY_POINT_GROUP = "agentrl.environments"



class UnknownEnvironment(UserError, LookupError):
    """No environment matches a spec; the message lists what is known."""


_REGISTRY: Registry[str | Callable[..., Any]] = Registry("environment", UnknownEnvironment)
for _name, _target in {
    "calculator": "agentrl.environments.calculator:CalculatorEnv",
    "math_python": "agentrl.environments.math_python:MathPythonEnv",
    "sokoban": "agentrl.environments.sokoban:SokobanEnv",
    "search": "agentrl.environments.search:SearchEnv",
}.items():
    _REGISTRY.add(_name, _target)


def register(name: str, target: str | Callable[..., Any], *, overwrite: bool = False) -> None:
    """Register ``target`` (a class, a factory or a ``"module:Class"`` string) under ``name``."""
    try:
        _REGISTRY.add(name, target, overwrite=overwrite)
    except ValueError as exc:
        raise ValueError(f"{exc}; pass overwrite=True to replace it") from None


def registered() -> list[str]:
    """Names known to ``make``: built-ins, ``register`` calls and installed entry points."""
    return sorted(set(_REGISTRY) | {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def make(spec: str, **kwargs: Any) -> Any:
    """Build an environment from a name or an import spec, passing ``kwargs`` to its constructor."""
    return resolve(spec)(**kwargs)


def resolve(spec: str) -> Callable[..., Any]:
    """The class or factory behind ``spec``."""
    if not isinstance(spec, str) or not spec:
        raise UnknownEnvironment(f"environment spec must be a non-empty string, got {spec!r}")
    if spec in _REGISTRY:
        target = _REGISTRY[spec]
        return load_object(target) if isinstance(target, str) else target
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == spec:
            return ep.load()
    if ":" in spec:
        return load_object(spec)
    raise UnknownEnvironment(
        f"unknown environment {spec!r}. Known: {', '.join(registered())}. "
        "Or give 'package.module:Class' or 'path/to/file.py:Class'."
    )


def train_defaults(spec: Any, attribute: str = "train_defaults") -> dict[str, Any]:
    """The ``agentrl train`` settings an environment class recommends (its ``train_defaults``, or
    with ``attribute="bundled_train_defaults"`` those tuned on the bundled model), or {}.

    Looked up without building the environment, for registered names, entry points and
    ``module:Class`` specs (a ``file.py:Class`` spec is not imported twice for this). Any problem
    gives {}: the environment's own errors are reported where it is built.
    """
    if not isinstance(spec, str) or (":" in spec and spec.partition(":")[0].endswith(".py")):
        return {}
    try:
        found = getattr(resolve(spec), attribute, None)
    except Exception:
        return {}
    return dict(found) if isinstance(found, dict) else {}


def load_object(target: str) -> Callable[..., Any]:
    """The object named by ``"module:attr"`` or ``"path/to/file.py:attr"`` (environments, reward functions)."""
    try:
        return load_spec(target)
    except SpecError as exc:
        raise UnknownEnvironment(str(exc)) from exc.__cause__
