"""The base of every config model, at the bottom of the import layers.

Lower layers (the generator protocol, the rollout engine) define their own user-facing settings
with it, so each concept has one class that both the command line and the code use.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from agentrl.core.errors import ConfigError
from agentrl.core.sections import section_defaults, under

__all__ = ["ConfigError", "Strict"]


class Strict(BaseModel):
    """Unknown keys and wrong types are errors; assignments are validated too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @model_validator(mode="before")
    @classmethod
    def _section_defaults(cls, data: Any) -> Any:
        """Setting one key of a section keeps this command's defaults for the section's others."""
        if not isinstance(data, dict):
            return data
        return under(cls.layered_defaults(data), data)

    @classmethod
    def layered_defaults(cls, data: dict[str, Any]) -> dict[str, Any]:
        """What lies under the user's keys: the command's own section defaults (``agentrl.core.sections``)."""
        return section_defaults(cls)
