"""Generators on other ranks (``distributed.generator_ranks``): ``load_weights(WeightUpdate)`` as a broadcast.

Why through the protocol: the trainer hands every backend the same ``WeightUpdate``; for generators
that live on other processes, taking it means broadcasting its tensors from trainer 0 over the
weights group (agentrl/compute/parallel/layout.py). What is sent:

- a header (JSON, small): the version, the kind (``full`` or ``adapter``), every tensor's name,
  shape and dtype, and the wire dtype;
- then the tensors, flattened into buckets of at most ``bucket_bytes`` in the wire dtype: bf16 when
  the trainer computes in bf16 (the generation copy's dtype, as one process decodes), else the
  parameters' own dtype (fp32 on CPU, so a generator rank decodes bit-for-bit the weights one
  process would);
- for a LoRA policy only the adapter's factors (``WeightUpdate.adapter()``); the generator ranks
  hold the base model themselves.

:class:`RemoteGenerators` is the sender (trainer 0; every trainer calls it, so a sharded policy's
tensors are gathered collectively first). :func:`receive_weights` is its other end on a generator
rank, and :func:`apply_weights` copies a received version into that rank's module between batches.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from agentrl.compute.parallel.layout import DisaggregatedError, Links
from agentrl.generators.weights import WeightUpdate

BUCKET_BYTES = 64 * 2**20


@dataclass
class ReceivedWeights:
    """One policy version as a generator rank received it (host or device copies, in the wire dtype)."""

    version: int
    kind: str  # "full" | "adapter"
    tensors: list[tuple[str, torch.Tensor]] = field(default_factory=list)


@dataclass
class SyncStats:
    tensors: int = 0
    bytes: int = 0
    seconds: float = 0.0


class RemoteGenerators:
    """The generator ranks, seen from a trainer: ``load_weights(update)`` broadcasts the update.

    ``gather(tensor)`` makes a full tensor of a sharded one (collective on every trainer; the
    identity in data parallel). ``wire_dtype``: bf16 when training in bf16, None for the
    parameters' own dtype.
    """

    def __init__(self, links: Links, *, wire_dtype: torch.dtype | None, gather: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
                 bucket_bytes: int = BUCKET_BYTES) -> None:
        self.links, self.wire_dtype, self.gather, self.bucket_bytes = links, wire_dtype, gather, bucket_bytes
        self.sends = links.roles.rank == 0
        self.last = SyncStats()

    def load_weights(self, update: WeightUpdate) -> None:
        """Every trainer calls this after each optimizer step; trainer 0 broadcasts, the others only gather."""
        start = time.perf_counter()
        kind = "adapter" if update.is_adapter else "full"
        reader = update.adapter if update.is_adapter else update.full
        with reader() as named:
            tensors = [(n, self.gather(t.detach())) for n, t in named]
        if not self.sends:
            return
        stats = SyncStats(tensors=len(tensors))
        what = f"broadcasting weights version {update.version} to the generator ranks"
        self.links.doing(what)
        header = {
            "version": update.version, "kind": kind, "wire": str(self._wire(tensors)),
            "layout": [(n, tuple(t.shape), str(t.dtype)) for n, t in tensors], "bucket": self.bucket_bytes,
        }
        self.links.broadcast_object(header, what)
        for flat in _buckets(tensors, self._wire(tensors), self.bucket_bytes, self.links.device):
            self.links.broadcast(flat, what)
            stats.bytes += flat.numel() * flat.element_size()
        stats.seconds = time.perf_counter() - start
        self.last = stats

    def stop(self, error: str | None = None, timeout_s: float = 5.0) -> None:
        """Tell the generator ranks the run is over (trainer 0; errors are the caller's to ignore).
        A live generator rank's receiving thread answers at once: a short wait, so a hung one does
        not hold up the trainers' own error by another timeout."""
        if self.sends:
            what = "telling the generator ranks to stop"
            self.links.doing(what)
            header = {"version": -1, "kind": "stop", "layout": [], "wire": "", "error": error}
            self.links.broadcast_object(header, what, min(timeout_s, self.links.timeout_s))

    def _wire(self, tensors: list[tuple[str, torch.Tensor]]) -> torch.dtype:
        if self.wire_dtype is not None:
            return self.wire_dtype
        return tensors[0][1].dtype if tensors else torch.float32


def _buckets(tensors: list[tuple[str, torch.Tensor]], wire: torch.dtype, bucket_bytes: int, device: torch.device) -> Iterator[torch.Tensor]:
    """The tensors, in order, flattened into buckets of about ``bucket_bytes`` (a tensor is never split)."""
    bucket: list[torch.Tensor] = []
    size = 0
    per = torch.empty((), dtype=wire).element_size()
    for i, (_, t) in enumerate(tensors):
        bucket.append(t.reshape(-1).to(device=device, dtype=wire))
        size += t.numel() * per
        if size >= bucket_bytes or i == len(tensors) - 1:
            yield torch.cat(bucket)
            bucket, size = [], 0


def receive_weights(links: Links) -> ReceivedWeights | None:
    """The next version trainer 0 broadcasts (None: the run is over). Waits at most the timeout;
    raises when the trainers stopped because of an error (the generator rank then fails too)."""
    header = links.broadcast_object(None, "waiting for the next weights from trainer 0")
    if header["kind"] == "stop":
        if header.get("error"):
            raise DisaggregatedError(f"{links.roles.name()} of {links.roles.world}: the trainer ranks stopped with an error: {header['error']}")
        return None
    wire = getattr(torch, header["wire"].removeprefix("torch."))
    layout = header["layout"]
    out = ReceivedWeights(header["version"], header["kind"])
    per = torch.empty((), dtype=wire).element_size()
    i = 0
    while i < len(layout):  # the sender's bucketing, replayed from the shapes
        j, size = i, 0
        while j < len(layout):
            size += _numel(layout[j][1]) * per
            j += 1
            if size >= header["bucket"]:
                break
        flat = torch.empty(sum(_numel(s) for _, s, _ in layout[i:j]), dtype=wire, device=links.device)
        links.broadcast(flat, f"receiving weights version {out.version} from trainer 0")
        offset = 0
        for name, shape, _ in layout[i:j]:
            n = _numel(shape)
            out.tensors.append((name, flat[offset : offset + n].view(shape)))
            offset += n
        i = j
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def apply_weights(module: torch.nn.Module, received: ReceivedWeights) -> int:
    """Copy a received version into this rank's policy (a plain model, or a PEFT model for ``adapter``);
    returns the number of tensors copied. A name the module lacks is an error, not a silent skip."""
    if received.kind == "adapter":
        from peft import get_peft_model_state_dict

        targets = get_peft_model_state_dict(module)  # views of the adapter's parameters
    else:
        base = module.get_base_model() if hasattr(module, "get_base_model") else module
        targets = base.state_dict()
    missing = [n for n, _ in received.tensors if n not in targets]
    if missing:
        raise DisaggregatedError(f"received weights do not match this generator rank's model ({received.kind}): {missing[:5]}")
    with torch.no_grad():
        for name, tensor in received.tensors:
            targets[name].copy_(tensor)
    return len(received.tensors)
