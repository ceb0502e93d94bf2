"""``agentrl <command> --help``: every key of a command's config model, read from pydantic's field info.

The listing is generated, so it cannot drift from what the command accepts: a key appears here
exactly when ``build`` would accept it, with the type, default and description the model declares.
"""

from __future__ import annotations

import types
import typing
from typing import Any, Literal, Union

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined


def config_keys(model: type[BaseModel], prefix: str = "", defaults: BaseModel | None = None) -> list[tuple[str, str, str, str]]:
    """``(dotted key, type, default, description)`` for every leaf key; sections are expanded.

    ``defaults``: the section's default instance when the parent overrides its defaults (train's
    ``rollout`` section is shorter than eval's), so the listing shows what this command uses.
    """
    rows: list[tuple[str, str, str, str]] = []
    for name, field in model.model_fields.items():
        key = prefix + (field.alias if field.alias and field.alias != name else name)
        default = getattr(defaults, name) if defaults is not None else _default_value(field)
        section = _section(field.annotation)
        if section is not None:
            if _allows_none(field.annotation):
                doc = _description(field) or f"off unless a {key}.* key is set"
                rows.append((key, "section | null", _show(default), doc))
            rows.extend(config_keys(section, key + ".", default if isinstance(default, BaseModel) else None))
            continue
        rows.append((key, type_name(field.annotation), _show(default), _description(field)))
    return rows


def format_help(
    usage: str, model: type[BaseModel] | None, shortcuts: dict[str, str] | None = None, config_files: bool = True, defaults: BaseModel | None = None
) -> str:
    """The usage line, then one block per key: ``key  type  (default: x)`` and its description.
    ``config_files``: the command takes ``config=file.yaml`` (every key=value command but ``view``);
    ``defaults``: a validated config whose values are shown as the defaults (keys given with --help)."""
    lines = [usage.rstrip(), ""]
    if model is None:
        lines.append("This command takes no keys.")
        return "\n".join(lines)
    lines.append("keys (key=value; nested keys with dots; config=file.yaml|json loads a file first):" if config_files else "keys (key=value):")
    for key, kind, default, doc in config_keys(model, defaults=defaults):
        lines.append(f"  {key}  {kind}  (default: {default})")
        if doc:
            lines.append(f"      {doc}")
    if shortcuts:
        lines.append("")
        lines.append("shortcuts: " + ", ".join(f"{short}= means {full}=" for short, full in shortcuts.items()))
    return "\n".join(lines)


def type_name(annotation: Any) -> str:
    """A short, readable type: ``int``, ``float | null``, ``one of: grpo, dapo``, ``list[str]``."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        return "one of: " + ", ".join(str(a) for a in args)
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if annotation is type(None):
        return "null"
    if origin is not None:
        inner = ", ".join(type_name(a) for a in args if a is not Ellipsis)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation)


def _section(annotation: Any) -> type[BaseModel] | None:
    """The nested model of a section field (``Model`` or ``Model | None``), else None."""
    candidates = typing.get_args(annotation) if typing.get_origin(annotation) in (Union, types.UnionType) else (annotation,)
    for arg in candidates:
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def _allows_none(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (Union, types.UnionType) and type(None) in typing.get_args(annotation)


_REQUIRED = object()


def _default_value(field: FieldInfo) -> Any:
    if field.default is not PydanticUndefined:
        return field.default
    if field.default_factory is not None:
        return field.default_factory()  # type: ignore[call-arg]
    return _REQUIRED


def _show(value: Any) -> str:
    if value is _REQUIRED:
        return "required"
    if isinstance(value, BaseModel):
        return "see below"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, str) and value == "" else str(value)


def _description(field: FieldInfo) -> str:
    return (field.description or "").strip()
