"""Load models and tokenizers by spec: ``"default"`` (the bundled model), a local folder or a hub id.

The bundled model is just a folder inside the package, so it goes through exactly the same
``from_pretrained`` path as any other model.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from collections.abc import Sequence
from typing import Any

DEFAULT_MODEL = "default"


def bundled_model_path() -> Path:
    """Folder of the bundled default model inside the installed package."""
    path = Path(str(files("agentrl.bundled") / "default_model"))
    if not (path / "config.json").exists():
        raise FileNotFoundError(
            f"the bundled model is missing from {path}; rebuild it with `python scripts/train_default_model.py`"
        )
    return path


def resolve_model(spec: str | Path) -> str:
    """``"default"`` → the bundled folder; anything else is passed to ``from_pretrained`` unchanged."""
    if str(spec) == DEFAULT_MODEL:
        return str(bundled_model_path())
    return str(spec)


def pad_token_id(tokenizer: Any, stop_token_ids: Sequence[int]) -> int:
    """The tokenizer's pad token, else the first stop token (padded positions are masked, so any id works)."""
    return int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_token_ids[0])


def load_tokenizer(spec: str | Path, **kwargs: Any) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model(spec), **kwargs)


def load_model(spec: str | Path, dtype: Any = None, device: str | None = None, **kwargs: Any) -> Any:
    """A causal LM in eval mode; ``dtype`` defaults to float32 on CPU and bfloat16 on CUDA."""
    import torch
    from transformers import AutoModelForCausalLM

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dtype is None:
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = AutoModelForCausalLM.from_pretrained(resolve_model(spec), dtype=dtype, **kwargs)
    return model.to(device).eval()
