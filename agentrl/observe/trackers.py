"""What trackers receive: a run's configuration as flat scalars (TensorBoard's hparams take nothing else).

accelerate hands ``init_trackers(config=...)`` to every tracker; TensorBoard's ``add_hparams`` refuses
nested sections, lists and None ("value should be one of int, float, str, bool, or torch.Tensor",
issue 41). Here the config becomes ``section.key`` names with scalar values: lists and mappings as
their JSON text, None as the string "null". W&B and trackio read the same flat mapping.
"""

from __future__ import annotations

import json
from typing import Any

Scalar = int | float | str | bool


def flat_hparams(config: dict[str, Any], prefix: str = "") -> dict[str, Scalar]:
    """``{"sampling": {"temperature": 0.7}}`` -> ``{"sampling.temperature": 0.7}``; every value a scalar."""
    out: dict[str, Scalar] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flat_hparams(value, name + "."))
        elif isinstance(value, bool | int | float | str):
            out[name] = value
        elif value is None:
            out[name] = "null"
        else:
            out[name] = json.dumps(value, default=str)
    return out
