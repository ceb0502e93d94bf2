"""``key=value`` overrides and config files, validated into a strict config with one readable message.

Unknown keys, wrong types and conflicting settings fail at load time with a message naming the
key. ``a.b=c`` sets nested fields; values are read as JSON when they parse (``3``, ``0.5``,
``true``, ``[1,2]``, ``null``) and as strings otherwise. ``config=path.yaml|json`` loads a file
first; command-line keys override it.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any, TypeVar

import pydantic
from pydantic import BaseModel

from agentrl.core.strict import ConfigError

T = TypeVar("T", bound=BaseModel)

SHORTCUTS = {"model": "model.path", "temperature": "sampling.temperature", "generator": "generator.backend"}


def parse_overrides(args: list[str], shortcuts: dict[str, str] | None = None) -> dict[str, Any]:
    """``["a.b=1", "c=x"]`` → ``{"a": {"b": 1}, "c": "x"}``; ``config=file`` is loaded first."""
    shortcuts = SHORTCUTS if shortcuts is None else shortcuts
    result: dict[str, Any] = {}
    pairs = []
    args = list(args)
    for i, arg in enumerate(args):  # --config FILE / --config=FILE are config=FILE
        if arg == "--config" and i + 1 < len(args):
            args[i], args[i + 1] = f"config={args[i + 1]}", ""
        elif arg.startswith("--config="):
            args[i] = "config=" + arg.split("=", 1)[1]
    for arg in (a for a in args if a):
        key, sep, raw = arg.partition("=")
        if not sep or not key:
            raise ConfigError(f"expected key=value, got {arg!r}")
        if key == "config":
            result = _deep_merge(result, load_file(raw))
        else:
            pairs.append((shortcuts.get(key, key), raw))
    for key, raw in pairs:
        node = result
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{key}: {part} is a value, not a section")
        node[parts[-1]] = _value(raw)
    return result


def build(model: type[T], overrides: dict[str, Any]) -> T:
    """Validate ``overrides`` into ``model``, turning pydantic errors into one readable message."""
    try:
        return model.model_validate(overrides)
    except pydantic.ValidationError as exc:
        lines = []
        for err in exc.errors():
            key = ".".join(str(p) for p in err["loc"])
            msg = " ".join(str(err["msg"]).removeprefix("Value error, ").split())
            if err["type"] == "extra_forbidden":
                msg = "unknown key"
                close = difflib.get_close_matches(str(err["loc"][-1]), _fields_at(model, err["loc"][:-1]), n=1)
                nested = _nested_match(model, str(err["loc"][-1])) if len(err["loc"]) == 1 else None
                if nested:  # a key of a section given at the top (TRL's flat names: beta, epsilon)
                    msg += f" (did you mean {nested}?)"
                elif close:
                    msg += f" (did you mean {'.'.join([*map(str, err['loc'][:-1]), close[0]])}?)"
            lines.append(f"{key}: {msg}" if key else msg)
        raise ConfigError("invalid configuration: " + "; ".join(lines)) from None


def _nested_match(model: type[BaseModel], name: str, prefix: str = "") -> str | None:
    """The dotted key of a section's field named exactly ``name`` (``beta`` -> ``loss.beta``), if any."""
    for field_name, field in model.model_fields.items():
        section = _section_of(field.annotation)
        if section is None:
            continue
        if name in section.model_fields:
            return f"{prefix}{field_name}.{name}"
        found = _nested_match(section, name, f"{prefix}{field_name}.")
        if found:
            return found
    return None


def _section_of(annotation: Any) -> type[BaseModel] | None:
    for arg in (annotation, *(getattr(annotation, "__args__", ()) or ())):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Field names of the (nested) config section at ``loc``, for did-you-mean hints."""
    current: Any = model
    for part in loc:
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return []
        current = field.annotation
        for arg in getattr(current, "__args__", ()) or ():  # Optional[Section]
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                current = arg
    return list(getattr(current, "model_fields", {}))


def load_file(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    text = p.read_text()
    if p.suffix in (".yaml", ".yml"):
        import yaml  # transformers depends on PyYAML

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise ConfigError(f"config file {p}: invalid YAML at{where}: {problem}") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"config file {p}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping")
    return data


def _value(raw: str) -> Any:
    """JSON when it parses; a list or mapping written without quotes (``[tensorboard]``) as YAML reads it; else the string."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        pass
    if raw[:1] in "[{":
        import yaml

        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            return raw
        if isinstance(value, (list, dict)):
            return value
    return raw


def _deep_merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
