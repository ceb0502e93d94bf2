"""``WeightUpdate``: new policy weights handed to a generator, readable in this process or from a path.

Why a type of its own: the trainer must not know how a backend takes weights (a shared module, a
bf16 copy, an in-process vLLM reload, an HTTP push). It hands every backend the same record: the
version (optimizer steps taken), whether the policy is a LoRA adapter, and two ways to read the
tensors - ``full()`` (LoRA merged, named as in the base checkpoint) and ``adapter()`` (the LoRA
factors only, PEFT names, with ``lora_config``). The tensors come from a live module in this
process (``WeightUpdate.from_module``) or from a saved folder (``WeightUpdate.from_path``); the
second form is what crosses a process boundary (a path and a few fields, all picklable), so a
generator in another process can take the same call.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

NamedTensors = list[tuple[str, torch.Tensor]]


@dataclass
class WeightUpdate:
    """New policy weights. ``module`` is the live policy (None when read from ``path``).

    ``full()`` and ``adapter()`` are context managers: the tensors may be views of the live
    module (a PEFT model stays merged only inside the block), so copy what you keep.
    """

    version: int
    module: torch.nn.Module | None = None
    path: Path | None = None
    is_adapter: bool = False
    lora_config: dict[str, Any] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if (self.module is None) == (self.path is None):
            raise ValueError("WeightUpdate needs exactly one of module= or path=")

    @classmethod
    def from_module(cls, module: torch.nn.Module, version: int) -> WeightUpdate:
        """The weights of a live policy (a plain model or a PEFT model)."""
        peft = _is_peft(module)
        config = None
        if peft:
            cfg = module.peft_config.get(getattr(module, "active_adapter", "default"))  # type: ignore[union-attr]
            config = cfg.to_dict() if cfg is not None else None
        return cls(version=version, module=module, is_adapter=peft, lora_config=config)

    @classmethod
    def from_path(cls, path: str | Path, version: int) -> WeightUpdate:
        """A saved folder: ``model.safetensors`` (full) or ``adapter_model.safetensors`` + ``adapter_config.json``."""
        folder = Path(path)
        if (folder / "adapter_model.safetensors").is_file():
            config = json.loads((folder / "adapter_config.json").read_text())
            return cls(version=version, path=folder, is_adapter=True, lora_config=config)
        if not any(folder.glob("*.safetensors")):
            raise FileNotFoundError(f"WeightUpdate.from_path: no safetensors weights in {folder}")
        return cls(version=version, path=folder)

    @contextlib.contextmanager
    def full(self) -> Iterator[NamedTensors]:
        """Every weight with LoRA merged, named as in the base checkpoint (no tied ``lm_head.weight``)."""
        if self.module is None:
            assert self.path is not None
            if self.is_adapter:
                raise ValueError(f"{self.path} holds only a LoRA adapter; full weights need its base model merged in")
            from safetensors.torch import load_file

            named: NamedTensors = []
            for file in sorted(self.path.glob("*.safetensors")):
                named.extend(load_file(str(file)).items())
            yield normalize_named_tensors(named)
            return
        with merged_weights(self.module) as named:
            yield named

    @contextlib.contextmanager
    def adapter(self) -> Iterator[NamedTensors]:
        """The LoRA factors only (PEFT names), for a backend that serves adapters natively."""
        if not self.is_adapter:
            raise ValueError("adapter(): the policy is a full model, not a LoRA adapter")
        if self.module is None:
            from safetensors.torch import load_file

            assert self.path is not None
            yield list(load_file(str(self.path / "adapter_model.safetensors")).items())
            return
        from peft import get_peft_model_state_dict

        yield [(n, t.detach()) for n, t in get_peft_model_state_dict(self.module).items()]


def _is_peft(module: Any) -> bool:
    return hasattr(module, "peft_config") and hasattr(module, "get_base_model")


def normalize_named_tensors(named: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> NamedTensors:
    """Checkpoint-style ``(name, tensor)`` pairs from a state dict or pairs, PEFT names unwrapped.

    LoRA factors are dropped (push merged weights), ``base_model.model.`` and ``.base_layer.`` are
    removed so names match the base checkpoint a separate engine loaded.
    """
    items = list(named.items()) if isinstance(named, Mapping) else list(named)
    out: NamedTensors = []
    bad = [str(n) for n, t in items if not isinstance(n, str) or not isinstance(t, torch.Tensor)]
    if bad:
        raise ValueError(f"weights must be (name: str, tensor) pairs; bad entries: {bad[:5]}")
    for name, tensor in items:
        if "lora_" in name or ".modules_to_save." in name:
            continue
        name = name.removeprefix("base_model.model.").replace(".base_layer.", ".").replace(".original_module.", ".")
        out.append((name, tensor))
    if not out:
        raise ValueError("no weights to push (only LoRA factors or nothing given); merge the adapter first")
    return out


@contextlib.contextmanager
def merged_weights(policy: Any) -> Iterator[NamedTensors]:
    """The policy's full weights, named as in its base checkpoint, valid inside the ``with`` block.

    A PEFT model has its adapters merged on entry and unmerged on exit (the tensors are views of
    the merged model: copy them before leaving the block). A tied ``lm_head.weight`` is left out:
    engines build the output layer from the embedding. No copy is made for a plain model.
    """
    merged = _is_peft(policy)
    if merged:
        policy.merge_adapter()
    try:
        base = policy.get_base_model() if merged else policy
        named = normalize_named_tensors((n, t.detach()) for n, t in base.state_dict().items())
        if bool(getattr(getattr(base, "config", None), "tie_word_embeddings", False)):
            named = [(n, t) for n, t in named if n != "lm_head.weight"]
        yield named
    finally:
        if merged:
            policy.unmerge_adapter()
