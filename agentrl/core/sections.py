"""Config sections merge, never reset: a command's own section defaults stay under the keys a user sets.

A command may give a section other defaults than the section's class (training samples at
temperature 0.7, ``SamplingConfig``'s default is 1.0). Validating ``{"sampling": {"top_p": 0.9}}``
would build a fresh ``SamplingConfig`` from the class defaults and lose the 0.7; here every config
model first lays the values its section defaults set (``default_factory`` instances) under what
the user gave, key by key, so setting one key keeps the command's defaults for the others.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


def section_defaults(model: type[BaseModel]) -> dict[str, Any]:
    """For each section field whose default instance sets values itself, those values (by key)."""
    out: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        if field.default_factory is None:
            continue
        default = field.default_factory()  # type: ignore[call-arg]
        if isinstance(default, BaseModel) and default.model_fields_set:
            out[field.alias or name] = default.model_dump(include=default.model_fields_set, by_alias=True)
    return out


def under(defaults: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with ``defaults`` filled in where it sets nothing (nested mappings merged key by key)."""
    out = dict(data)
    for key, value in defaults.items():
        if key not in out:
            out[key] = value
        elif isinstance(value, dict) and isinstance(out[key], dict):
            out[key] = under(value, out[key])
    return out
