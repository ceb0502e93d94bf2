"""The parallel strategy: one object per layout (one process, data parallel, FSDP2) that the builder,
the trainer and the learner ask to load, wrap, run a forward, reduce and checkpoint the policy.

Why an object: the loop's shape is the same in every layout, and what differs (where the policy is
loaded, whether accelerate wraps it, which forward the learner runs, who averages gradients, how
checkpoints see the weights, what the generator decodes with) is a handful of answers. Asking the
strategy for them keeps ``isinstance`` on the policy and ``sharded=`` flags inside this folder.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from agentrl.compute.generation_copy import generation_copy
from agentrl.compute.logprobs import completion_logprobs
from agentrl.compute.packed import PackedRows, packed_logprobs
from agentrl.compute.parallel.distributed import average_gradients

__all__ = ["DataParallel", "Sharded", "SingleProcess", "Strategy", "make_strategy"]


class Strategy:
    """One process: the policy as loaded, accelerate's prepare, gradients as the backward leaves them."""

    name = "single"
    #: bitsandbytes' 8-bit moments take plain parameters (not FSDP2's sharded DTensors)
    takes_8bit_moments = True

    def __init__(self, num_processes: int = 1) -> None:
        self.num_processes = num_processes

    def load_device(self, device: torch.device) -> str:
        """Where the policy's weights are loaded before :meth:`wrap`."""
        return str(device)

    def compile_by_default(self, full_finetune: bool) -> tuple[bool, str]:
        """Whether ``compile_learner=null`` compiles the layers on CUDA, and why not when it does not."""
        if not full_finetune:
            return False, "a PEFT adapter"
        return True, ""

    def generation_model(self, policy: torch.nn.Module, dtype: torch.dtype | None, device: torch.device) -> torch.nn.Module | None:
        """A separate module generation decodes with (made before :meth:`wrap`), or None: the policy itself."""
        return None

    def wrap(self, policy: torch.nn.Module, device: torch.device, bf16: bool) -> torch.nn.Module:
        """The policy as this layout trains it (before accelerate's prepare)."""
        return policy

    def prepare(self, accelerator: Any, policy: Any, optimizer: Any, scheduler: Any) -> tuple[Any, Any, Any]:
        return accelerator.prepare(policy, optimizer, scheduler)

    def learner_model(self, accelerator: Any, policy: Any) -> Any:
        """The module the learner's log-prob path runs."""
        return policy

    def logprobs(self, model: Any, ids: torch.Tensor, starts: torch.Tensor, keep: int, *, compiled: bool, **kwargs: Any) -> Any:
        """Completion log-probs (and entropy) of one micro-batch; the learner only ever calls ``.backward()``,
        so the head may write its weight gradient itself; its tiles compile where the layers do."""
        training = torch.is_grad_enabled()
        return completion_logprobs(model, ids, starts, keep, grad_into_leaf=training, compiled_head=training and compiled, **kwargs)

    def packed_logprobs(self, model: Any, packed: PackedRows, keep: int, *, compiled: bool, **kwargs: Any) -> Any:
        """:meth:`logprobs` for one packed micro-batch (agentrl/compute/packed.py)."""
        training = torch.is_grad_enabled()
        return packed_logprobs(model, packed, keep, grad_into_leaf=training, compiled_head=training and compiled, **kwargs)

    def lockstep(self, micro: list[torch.Tensor], device: torch.device) -> list[tuple[torch.Tensor, bool]]:
        """``(rows, real)`` per forward this rank runs."""
        return [(m, True) for m in micro]

    def average_gradients(self, model: Any) -> None:
        """Make the step's gradient the mean over ranks (nothing to do in one process)."""

    def full_tensor(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def weights_module(self, module: Any) -> Any:
        """The causal LM inside what :meth:`wrap` returned: its weights are named as in its checkpoint."""
        return module

    @contextlib.contextmanager
    def checkpoint_objects(self, module: Any, policy: Any, optimizer: Any, saving: bool) -> Iterator[tuple[Any, Any]]:
        """The model and optimizer checkpoint.py reads and writes."""
        yield module, optimizer


SingleProcess = Strategy


class DataParallel(Strategy):
    """Every rank holds the whole model (DDP through accelerate). The log-prob path calls the decoder
    and the head directly, never DDP's forward, so DDP's hooks stay idle and the gradients are
    averaged here, once per step."""

    name = "ddp"

    def learner_model(self, accelerator: Any, policy: Any) -> Any:
        return accelerator.unwrap_model(policy, keep_fp32_wrapper=True)

    def average_gradients(self, model: Any) -> None:
        # each rank's loss is its share x num_processes: the mean is the step's gradient
        average_gradients(model.parameters(), self.num_processes)


class Sharded(Strategy):
    """FSDP2 (agentrl/compute/parallel/fsdp.py): loaded on the host, each layer moved to the device as
    it is sharded; the sharded root's forward is the log-prob path and its reduce-scatter averages
    the gradients; every forward is collective; generation decodes an unsharded copy."""

    name = "fsdp"
    takes_8bit_moments = False

    def load_device(self, device: torch.device) -> str:
        return "cpu"  # no whole fp32 model on one card

    def compile_by_default(self, full_finetune: bool) -> tuple[bool, str]:
        return False, "FSDP2 sharding" if full_finetune else "a PEFT adapter"

    def generation_model(self, policy: torch.nn.Module, dtype: torch.dtype | None, device: torch.device) -> torch.nn.Module | None:
        return generation_copy(policy, dtype, device, empty=True)

    def wrap(self, policy: torch.nn.Module, device: torch.device, bf16: bool) -> torch.nn.Module:
        from agentrl.compute.parallel.fsdp import shard_policy

        return shard_policy(policy, device, bf16)

    def prepare(self, accelerator: Any, policy: Any, optimizer: Any, scheduler: Any) -> tuple[Any, Any, Any]:
        optimizer, scheduler = accelerator.prepare(optimizer, scheduler)  # sharded already: accelerate must not wrap it in DDP
        return policy, optimizer, scheduler

    def logprobs(self, model: Any, ids: torch.Tensor, starts: torch.Tensor, keep: int, *, compiled: bool, **kwargs: Any) -> Any:
        # FSDP2 reduce-scatters the leaves' gradients: nothing is written into them directly
        return model(ids, starts.to(ids.device), keep, **kwargs)

    def packed_logprobs(self, model: Any, packed: PackedRows, keep: int, *, compiled: bool, **kwargs: Any) -> Any:
        return model(packed, None, keep, **kwargs)  # the sharded root's forward runs the packed path (fsdp.py)

    def lockstep(self, micro: list[torch.Tensor], device: torch.device) -> list[tuple[torch.Tensor, bool]]:
        """Every rank runs as many forwards as the busiest (each is collective); the extra ones rerun
        a row with zero weight (``real`` False)."""
        from agentrl.compute.parallel.fsdp import lockstep_count

        out = [(m, True) for m in micro]
        extra = lockstep_count(len(micro), device) - len(micro)
        return out + [(micro[-1][:1], False)] * extra

    def full_tensor(self, t: torch.Tensor) -> torch.Tensor:
        from agentrl.compute.parallel.fsdp import full_tensor

        return full_tensor(t)

    def weights_module(self, module: Any) -> Any:
        return module.model  # the ShardedPolicy root holds the causal LM as ``model``

    @contextlib.contextmanager
    def checkpoint_objects(self, module: Any, policy: Any, optimizer: Any, saving: bool) -> Iterator[tuple[Any, Any]]:
        from agentrl.compute.parallel.fsdp import checkpoint_views

        with checkpoint_views(policy, optimizer, saving) as views:
            yield views


def make_strategy(name: str, num_processes: int) -> tuple[Strategy, str]:
    """The strategy for ``distributed.strategy`` on ``num_processes`` ranks, and a line to print ('' if none)."""
    if num_processes == 1:
        why = "distributed.strategy=fsdp: one process, nothing to shard; training unsharded" if name == "fsdp" else ""
        return SingleProcess(1), why
    if name == "fsdp":
        return Sharded(num_processes), ""
    return DataParallel(num_processes), ""
