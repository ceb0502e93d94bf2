"""The policy and its reference model, PEFT-aware.

Which reference a run gets, and why (no more memory than needed):

- ``beta == 0`` → none: the KL term is off, so nothing is loaded.
- a LoRA config given → the policy is the base model wrapped with a fresh adapter; the reference
  is the same module with adapters disabled (zero extra memory).
- the model already carries a trained adapter → that adapter keeps training and a frozen copy of
  it, loaded under the name ``"ref"``, is the reference (switching adapters, not models).
- a full model → a frozen deep copy; optionally mixed toward the policy every ``sync_steps``
  optimizer steps (TR-DPO style: ref ← alpha·policy + (1-alpha)·ref).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

REF_ADAPTER = "ref"


def is_adapter_folder(path: str | Path) -> bool:
    return (Path(path) / "adapter_config.json").is_file()


def load_policy(
    path: str, dtype: torch.dtype, device: str, lora: dict[str, Any] | None, *, base: str | None = None, module: Any = None
) -> tuple[Any, str]:
    """The trainable policy and its kind: "full", "lora" (new adapter, or a given PEFT model's) or "adapter" (an adapter folder's).

    ``dtype``: the base weights' dtype (a new adapter's own weights stay float32: peft upcasts
    them). ``lora``: the ``peft`` section's fields; ``load_in_4bit`` loads the base in NF4 (QLoRA).
    ``base``: where an adapter folder's base model is (default: its recorded base,
    agentrl/compute/adapters.py). ``module``: a model already loaded, trained as it is (its dtype
    and, for a PEFT model, its adapter).
    """
    from transformers import AutoModelForCausalLM

    from agentrl.compute.adapters import adapter_base, lora_config, quantization_config

    if module is not None:
        if hasattr(module, "peft_config"):
            if lora:
                raise ValueError("the model given already carries a LoRA adapter; drop the peft settings to keep training it")
            return _to(module, device), "lora"
        if lora:
            from peft import get_peft_model

            return get_peft_model(_to(module, device), lora_config(lora)), "lora"
        return _to(module, device), "full"
    if is_adapter_folder(path):
        from peft import PeftModel

        if lora:
            raise ValueError(f"{path} already holds a LoRA adapter; drop the peft settings to keep training it")
        base_model = AutoModelForCausalLM.from_pretrained(base or adapter_base(path), dtype=dtype)
        model = PeftModel.from_pretrained(base_model, path, is_trainable=True)
        return model.to(device), "adapter"
    if lora and lora.get("load_in_4bit"):
        from peft import get_peft_model, prepare_model_for_kbit_training

        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, quantization_config=quantization_config(dtype), device_map={"": device})
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)  # the trainer's gradient_checkpointing key decides that
        return get_peft_model(model, lora_config(lora)), "lora"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    if lora:
        from peft import get_peft_model

        return get_peft_model(model, lora_config(lora)), "lora"
    return model, "full"


def _to(module: Any, device: str) -> Any:
    """A given module on ``device``; one placed by a device map (quantized) stays where it is."""
    if getattr(module, "hf_device_map", None) or getattr(module, "is_loaded_in_4bit", False) or getattr(module, "is_loaded_in_8bit", False):
        return module
    return module.to(device)


class Reference:
    """Computes reference log-probabilities through whichever mechanism fits the policy."""

    def __init__(self, policy: Any, kind: str, beta: float, adapter_path: str | None = None) -> None:
        self.policy = policy
        self.kind = "none" if beta == 0 else {"full": "copy", "lora": "disabled-adapter", "adapter": "ref-adapter"}[kind]
        self.model: Any = None
        if self.kind == "copy":
            self.model = copy.deepcopy(policy).eval()
            for p in self.model.parameters():
                p.requires_grad_(False)
        elif self.kind == "ref-adapter":
            assert adapter_path is not None
            policy.load_adapter(adapter_path, adapter_name=REF_ADAPTER, is_trainable=False)
            policy.set_adapter("default")
            _freeze_adapter(policy, REF_ADAPTER)

    @property
    def enabled(self) -> bool:
        return self.kind != "none"

    @contextlib.contextmanager
    def active(self) -> Iterator[Any]:
        """A module whose forward pass is the reference model."""
        if self.kind == "copy":
            yield self.model
        elif self.kind == "disabled-adapter":
            with self.policy.disable_adapter():
                yield self.policy
        elif self.kind == "ref-adapter":
            previous = self.policy.active_adapter
            self.policy.set_adapter(REF_ADAPTER)
            try:
                yield self.policy
            finally:
                self.policy.set_adapter(previous)
                _freeze_adapter(self.policy, REF_ADAPTER)
                _unfreeze_adapter(self.policy, previous)
        else:
            raise RuntimeError("no reference model (beta == 0)")

    @torch.no_grad()
    def mix(self, alpha: float) -> None:
        """TR-DPO soft update of a full-copy reference toward the policy."""
        if self.kind != "copy":
            raise ValueError(f"reference mixing needs a full-model reference, not {self.kind!r}")
        for ref_p, pol_p in zip(self.model.parameters(), self.policy.parameters()):
            ref_p.mul_(1 - alpha).add_(pol_p.detach(), alpha=alpha)


def _freeze_adapter(model: Any, name: str) -> None:
    for n, p in model.named_parameters():
        if f".{name}." in n:
            p.requires_grad_(False)


def _unfreeze_adapter(model: Any, name: str) -> None:
    for n, p in model.named_parameters():
        if f".{name}." in n:
            p.requires_grad_(True)
