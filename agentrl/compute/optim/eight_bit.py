"""AdamW with 8-bit moments (bitsandbytes): the default optimizer of full fine-tuning on CUDA.

Why: full fine-tuning with float32 weights, float32 gradients and AdamW's two float32 moments keeps
16 bytes per parameter on the GPU, which alone is ~0.83x of TRL's whole peak on a 0.5B model.
bitsandbytes' block-wise 8-bit moments (Dettmers et al., "8-bit Optimizers via Block-wise
Quantization", 2022; ``optim="adamw_bnb_8bit"`` in transformers) take the moments from 8 to 2 bytes
per parameter. The update is still computed in float32 from dequantized moments, and the weights and
gradients stay float32, so only the optimizer's memory of past gradients is rounded.

Embedding matrices keep 32-bit moments, as transformers' Trainer does for its 8-bit AdamW: a
vocabulary row sees a gradient only when its token occurs, a pattern that 256-value blocks sharing
one scale represent worst. With tied embeddings that includes the output head.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["adamw_8bit", "choose_optimizer", "optimizer_kind"]


def choose_optimizer(wanted: str, *, offload: bool, cuda: bool, full_finetune: bool, takes_8bit: bool = True) -> tuple[str, str]:
    """The optimizer to build (``adamw`` or ``adamw_8bit``) for the ``optimizer`` key, and one
    line to print saying what ``auto`` chose and why ('' when there is nothing to say).

    ``auto`` is 8-bit for full fine-tuning on CUDA; float32 moments on CPU (where memory is rarely the
    limit and the bundled model's runs are measured with them), for LoRA adapters (a few million
    parameters), where the parallel strategy's parameters are not plain tensors (``takes_8bit`` False:
    FSDP2's sharded parameters, which bitsandbytes does not take), with
    ``optimizer_offload=true`` (the moments are on the host already), and where bitsandbytes is not
    installed.
    """
    if wanted != "auto":
        return wanted, ""
    if offload or not cuda or not full_finetune or not takes_8bit:
        return "adamw", ""
    if importlib.util.find_spec("bitsandbytes") is None:
        return "adamw", (
            "optimizer: AdamW with float32 moments, because bitsandbytes is not installed "
            "(pip install 'agentrl[gpu]' for 8-bit moments: 6 bytes less GPU memory per parameter)"
        )
    return "adamw_8bit", "optimizer: AdamW with 8-bit moments (bitsandbytes; embeddings at 32 bits); optimizer=adamw keeps float32 moments"


def adamw_8bit(model: torch.nn.Module, params: list[torch.nn.Parameter], **hyper: Any) -> torch.optim.Optimizer:
    """bitsandbytes' 8-bit AdamW over ``params``, with 32-bit moments for ``model``'s embedding matrices.

    ``hyper``: ``lr``, ``betas``, ``eps``, ``weight_decay`` as for ``torch.optim.AdamW``.
    """
    # its CPU backend warns on import about a 4-bit matmul kernel package the optimizer never uses
    quiet = logging.getLogger("bitsandbytes.backends.cpu.ops")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        import bitsandbytes as bnb
    except Exception as exc:  # noqa: BLE001 - missing, or installed and broken (its native library): one error either way
        raise ImportError(f"optimizer=adamw_8bit needs a working bitsandbytes (pip install bitsandbytes): {type(exc).__name__}: {exc}") from None
    finally:
        quiet.setLevel(level)

    class AdamW8bit(bnb.optim.AdamW8bit):
        """Per-parameter 32-bit override kept on the optimizer itself, not in bitsandbytes'
        process-wide manager, whose (group, index) keys would leak into other optimizers."""

        kind = "adamw_8bit"  # read by checkpoint resume (``optimizer_kind``)

        def __init__(self, params: Iterable[torch.Tensor], keep_32bit: set[int], **kw: Any) -> None:
            super().__init__(params, **kw)
            self.keep_32bit = keep_32bit

        def get_config(self, gindex: int, pindex: int, group: dict[str, Any]) -> dict[str, Any]:
            config = super().get_config(gindex, pindex, group)
            if id(group["params"][pindex]) in self.keep_32bit:
                config["optim_bits"] = 32
            return config

    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    return AdamW8bit(params, keep_32bit=embeddings, **hyper)


def optimizer_kind(state: dict[str, Any]) -> str | None:
    """Which optimizer wrote ``state`` (an optimizer's ``state_dict()``): 'adamw', 'adamw_8bit', or
    None when it holds no per-parameter state yet. Resuming across the two is refused by name."""
    for entry in state.get("state", {}).values():
        if "exp_avg" in entry:
            return "adamw"
        if "state1" in entry or any(str(k).startswith("__bnb") for k in entry):  # bitsandbytes wraps its moments in state_dict()
            return "adamw_8bit"
    return None
