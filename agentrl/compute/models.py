"""Load models and tokenizers by spec: ``"default"`` (the bundled model), a local folder or a hub id.

The bundled model is just a folder inside the package, so it goes through exactly the same
``from_pretrained`` path as any other model.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib.resources import files
from pathlib import Path
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


def decoder_layers(model: Any, *, by_no_split: bool = False) -> list[Any] | None:
    """The repeated blocks of a transformers causal LM (``get_decoder().layers``), or None.

    ``by_no_split``: where there is no such list, the modules named in ``_no_split_modules``
    (what FSDP2 shards one by one)."""
    import torch

    get = getattr(model, "get_decoder", None)
    decoder = get() if callable(get) else None
    layers = getattr(decoder, "layers", None)
    if isinstance(layers, torch.nn.ModuleList) and len(layers):
        return list(layers)
    if by_no_split:
        names = set(getattr(model, "_no_split_modules", None) or ())
        return [m for m in model.modules() if type(m).__name__ in names] or None
    return None

