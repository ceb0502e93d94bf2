"""Sharded full fine-tuning with FSDP2 (``distributed.strategy=fsdp``), for models that do not fit one card.

Why its own module: data parallel (agentrl/compute/parallel/distributed.py) keeps a whole model, its gradients and
AdamW's two moments on every rank (16 bytes per parameter in fp32); FSDP2 cuts all four into
``world`` shards. The rest of the loop keeps its shape: the same global batch, the same row split
per optimizer step, the same normalisers; only these pieces change.

- :func:`shard_policy` applies ``torch.distributed.fsdp.fully_shard`` to every decoder layer and
  then to a :class:`ShardedPolicy` root whose ``forward`` *is* the chunked log-prob path. Why a
  root of our own (and not accelerate's FSDP plugin, which shards the model's own top module): the
  log-prob path never calls the causal LM's ``forward`` (it runs the decoder, then the output head
  over chunks, so no B x T x V logits exist), and FSDP2 unshards a module's parameters only in that
  module's forward. With the root's forward being the log-prob path, the embeddings, the final
  norm and the head (tied or not) are gathered once per micro-batch, and FSDP's own reduce-scatter
  averages the gradients (so :func:`agentrl.compute.parallel.distributed.average_gradients` is not used).
- Every forward is collective, so every rank must run the same number of them:
  :func:`lockstep_count` says how many, and a rank with fewer real micro-batches runs a
  zero-weighted one.
- Generation uses a **gathered copy**: :class:`agentrl.generators.gathered.GatheredGenerator` wraps the generator of an
  unsharded copy of the model (bf16 when training in bf16) and, at the first ``begin_rollout``
  after ``load_weights``, all-gathers the sharded weights into it one tensor at a time; at
  ``end_rollout`` the copy's weights are freed, so the training step never carries them. Why not
  decode the sharded model directly: every decoded token would all-gather every layer (hundreds
  of latency-bound collectives per token); the copy costs one all-gather per policy version and
  2 bytes per parameter only while rolling out.
- Checkpoints stay ordinary: :func:`checkpoint_views` gives ``checkpoint.py`` a model and an
  optimizer that read and write *full* state dicts (gathered to rank 0 on the host when saving,
  re-sharded from the file on every rank when loading), so rank 0 writes a normal model folder
  that one process, ``from_pretrained`` or vLLM loads, and a sharded run resumes from a
  one-process checkpoint and back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from agentrl.compute.logprobs import completion_logprobs
from agentrl.compute.models import decoder_layers
from agentrl.compute.packed import PackedRows, packed_logprobs
from agentrl.core.errors import AgentrlError

__all__ = ["ShardedPolicy", "ShardingError", "checkpoint_views", "lockstep_count", "shard_policy"]


class ShardingError(AgentrlError, RuntimeError):
    """The model cannot be sharded as asked (no decoder layers found, no process group)."""


class ShardedPolicy(torch.nn.Module):
    """The FSDP2 root: holds the causal LM as ``model``; ``forward`` is ``completion_logprobs`` (``packed_logprobs``
    when ``input_ids`` is a ``PackedRows``)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor | PackedRows, starts: torch.Tensor | None, width: int, *, temperature: float = 1.0,
        chunk_size: int = 1024, return_entropy: bool = False, only: torch.Tensor | None = None, head: str = "fused",
    ) -> Any:
        if isinstance(input_ids, PackedRows):
            return packed_logprobs(
                self.model, input_ids, width, temperature=temperature, chunk_size=chunk_size, return_entropy=return_entropy, only=only, head=head,
            )
        return completion_logprobs(
            self.model, input_ids, starts, width, temperature=temperature, chunk_size=chunk_size,
            return_entropy=return_entropy, only=only, head=head,  # type: ignore[arg-type]
        )

    @property
    def config(self) -> Any:
        return getattr(self.model, "config", None)


def _layers_to_shard(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks to shard one by one."""
    layers = decoder_layers(model, by_no_split=True)
    if not layers:
        raise ShardingError(f"{type(model).__name__}: no decoder layers to shard (no get_decoder().layers, no _no_split_modules)")
    return layers


def shard_policy(model: torch.nn.Module, device: torch.device, bf16: bool = False) -> ShardedPolicy:
    """Shard ``model`` (loaded whole on ``device``, fp32 master weights) over all ranks with FSDP2.

    Each decoder layer is its own FSDP unit (gathered just before its forward, freed after, and
    again for backward); the root holds the rest. ``bf16``: parameters are all-gathered in bf16
    and gradients reduced in fp32 (``MixedPrecisionPolicy``); the master weights and the optimizer
    state stay fp32 shards.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if not (dist.is_available() and dist.is_initialized()):
        raise ShardingError("distributed.strategy=fsdp needs a process group: launch with torchrun or accelerate launch")
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    for layer in _layers_to_shard(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    root = ShardedPolicy(model)
    fully_shard(root, mesh=mesh, mp_policy=mp)
    return root


def lockstep_count(local: int, device: torch.device) -> int:
    """The largest ``local`` over all ranks: how many forwards each rank runs so FSDP's collectives pair up."""
    import torch.distributed as dist

    t = torch.tensor([local], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's whole value on every rank (an all-gather); a plain tensor as it is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def gather_into(policy: ShardedPolicy, target: torch.nn.Module) -> None:
    """All-gather every sharded parameter and buffer into ``target`` (same names), one tensor at a
    time, cast to ``target``'s dtypes. Collective: every rank calls it, in the same order."""
    with torch.no_grad():
        sources = dict(policy.model.named_parameters())
        for name, q in target.named_parameters():
            if name not in sources:
                raise ShardingError(f"generation copy out of step with the policy: no parameter {name}")
            q.data = full_tensor(sources[name].detach()).to(device=q.device, dtype=q.dtype)
        buffers = dict(policy.model.named_buffers())
        for name, b in target.named_buffers():
            if name in buffers:
                b.copy_(full_tensor(buffers[name]).to(b.dtype))


# -- checkpoints: full state dicts in, full state dicts out -----------------------------------------

def _options(**kw: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kw)


class _FullModel:
    """The sharded policy as ``checkpoint.py`` sees a model: ``save_pretrained`` writes the gathered
    full weights (rank 0; ``state_dict`` was gathered by :func:`checkpoint_views`), and
    ``load_state_dict`` re-shards a full state dict on every rank."""

    def __init__(self, policy: ShardedPolicy, full: dict[str, torch.Tensor] | None) -> None:
        self._policy, self._full = policy, full

    def save_pretrained(self, folder: Any, **kwargs: Any) -> None:
        assert self._full is not None, "the full state dict is gathered only for saving"
        self._policy.model.save_pretrained(folder, state_dict=self._full, **kwargs)

    def load_state_dict(self, state: dict[str, torch.Tensor], strict: bool = True) -> Any:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        named = {f"model.{k}": v for k, v in state.items()}
        result = set_model_state_dict(self._policy, named, options=_options(strict=False))
        missing = [k.removeprefix("model.") for k in result.missing_keys]
        unexpected = [k.removeprefix("model.") for k in result.unexpected_keys]
        if strict and (missing or unexpected):
            raise RuntimeError(f"state dict does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
        return type(result)(missing, unexpected)

    def __getattr__(self, name: str) -> Any:  # _tied_weights_keys, config, ...
        return getattr(self._policy.model, name)


class _FullOptimizer:
    """The sharded AdamW as ``checkpoint.py`` sees an optimizer: its state keyed by parameter name,
    full tensors (gathered to rank 0 on the host for saving, re-sharded on loading)."""

    def __init__(self, policy: ShardedPolicy, optimizer: Any, full: dict[str, Any] | None) -> None:
        self._policy, self._optimizer, self._full = policy, optimizer, full

    def state_dict(self) -> dict[str, Any]:
        assert self._full is not None, "the full optimizer state is gathered only for saving"
        return self._full

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(self._policy, _inner(self._optimizer), by_name(self._policy, state), options=_options())


def by_name(policy: ShardedPolicy, state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state keyed by parameter name. One written by an unsharded run is keyed by the
    parameter's index in the optimizer, which is its index among the model's trainable parameters
    (``build_optimizer``'s order): those indices are mapped to the sharded root's names."""
    groups = state.get("param_groups", [])
    if all(isinstance(i, str) for g in groups for i in g["params"]):
        return state
    names = [n for n, p in policy.named_parameters() if p.requires_grad]
    count = sum(len(g["params"]) for g in groups)
    if count != len(names):
        raise ValueError(f"the checkpoint's optimizer holds {count} parameters, this model trains {len(names)}")
    return {
        "state": {names[i]: v for i, v in state["state"].items()},
        "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in groups],
    }


def _inner(optimizer: Any) -> torch.optim.Optimizer:
    return getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps it


@contextlib.contextmanager
def checkpoint_views(policy: ShardedPolicy, optimizer: Any, saving: bool) -> Iterator[tuple[_FullModel, _FullOptimizer]]:
    """A model and an optimizer for ``checkpoint.save_checkpoint`` / ``load_checkpoint``.

    ``saving``: gathers the full weights and optimizer state to rank 0's host memory first (a
    collective: every rank enters; only rank 0 should write). Loading needs no gather: every rank
    reads the checkpoint folder and keeps its own shard.
    """
    model_sd = optim_sd = None
    if saving:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        full = get_model_state_dict(policy, options=_options(cpu_offload=True))
        # a tied weight is one parameter under two names: keep the name named_parameters() gives it
        kept = {n for n, _ in policy.named_parameters()} | {n for n, _ in policy.named_buffers()}
        model_sd = {k.removeprefix("model."): v for k, v in full.items() if k in kept}
        optim_sd = get_optimizer_state_dict(policy, _inner(optimizer), options=_options(cpu_offload=True))
    yield _FullModel(policy, model_sd), _FullOptimizer(policy, optimizer, optim_sd)
