"""The disaggregated layout (``distributed.generator_ranks=K``): K ranks generate, the other N - K train.

Why its own process groups: the trainer ranks must keep training exactly as today (data parallel
or FSDP2, accelerate, every existing collective on the default group), so their default group
holds the trainers only; the generator ranks never join it. Beside it, from the job's rendezvous
store (torchrun's agent store, or rank 0's), two groups of our own:

- ``weights``: trainer 0 and the generator ranks (NCCL on GPUs, gloo on CPU): trainer 0
  broadcasts each policy version to every generator at once;
- ``trajectories``: every rank (gloo: trajectory groups as JSON are host data): each generator
  sends its finished groups to every trainer, point to point.

Ranks ``0 .. N-K-1`` train (rank 0 writes logs and checkpoints, as always), ranks ``N-K .. N-1``
generate, so on several machines the last nodes are the generators.

No silent hang: every operation here waits at most ``distributed_timeout_s`` (a dead peer fails at
once: gloo sees the closed connection), and each rank keeps a one-line note of what it is doing in
the store (:meth:`Links.doing`), so the survivor's error names the peer and what that peer was
doing (:meth:`Links.failure`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import time
from dataclasses import dataclass
from typing import Any

import torch

from agentrl.compute.parallel.distributed import DistributedError
from agentrl.core.errors import ConfigError


class DisaggregatedError(DistributedError):
    """A generator or trainer rank of a disaggregated job died, stalled, failed or fell out of step."""


class LayoutError(ConfigError):
    """``distributed.generator_ranks`` does not fit how the job was launched."""


@dataclass(frozen=True)
class Roles:
    """Who does what in a job of ``world`` ranks with ``generators`` generator ranks."""

    rank: int
    world: int
    generators: int

    @property
    def trainers(self) -> int:
        return self.world - self.generators

    @property
    def is_generator(self) -> bool:
        return self.rank >= self.trainers

    @property
    def generator_ranks(self) -> list[int]:
        return list(range(self.trainers, self.world))

    def generator_index(self, rank: int | None = None) -> int:
        return (self.rank if rank is None else rank) - self.trainers

    def name(self, rank: int | None = None) -> str:
        """``rank 2 (generator 0)``: how messages name a rank."""
        r = self.rank if rank is None else rank
        role = f"generator {r - self.trainers}" if r >= self.trainers else f"trainer {r}"
        return f"rank {r} ({role})"


def roles_from_env(generators: int) -> Roles:
    """The roles of this process, from the launcher's ``RANK`` / ``WORLD_SIZE``."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise LayoutError(
            f"distributed.generator_ranks={generators}: generator ranks are processes of a torchrun / accelerate launch job; "
            "start agentrl train under torchrun --nproc_per_node N (N > generator_ranks)"
        )
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world <= generators:
        raise LayoutError(
            f"distributed.generator_ranks={generators} with {world} process(es) leaves no trainer rank: launch at least {generators + 1} processes"
        )
    return Roles(rank, world, generators)


_LINKS: Links | None = None


def connected() -> Links | None:
    """This process's links once :func:`connect` ran (one job per process), else None."""
    return _LINKS


def connect(roles: Roles, timeout_s: float) -> Links:
    """Join the job: the trainers' default group (trainer ranks only, before accelerate starts) and
    the two groups of the module docstring. Idempotent: the second call returns the same links."""
    global _LINKS
    if _LINKS is not None:
        return _LINKS
    from torch.distributed.rendezvous import rendezvous

    dist = torch.distributed
    timeout = dt.timedelta(seconds=timeout_s)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    store, _, _ = next(rendezvous("env://", roles.rank, roles.world, timeout=timeout))
    cuda = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if not roles.is_generator and roles.trainers == 1:
        # one trainer: accelerate's single process (a launched world of one would wrap the policy in DDP)
        os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_WORLD_SIZE"] = "0", "1", "1"
        os.environ.pop("LOCAL_RANK", None)
    elif not roles.is_generator:
        # the trainers' world, as accelerate expects it: it finds the group initialised and uses it
        os.environ["RANK"], os.environ["WORLD_SIZE"] = str(roles.rank), str(roles.trainers)
        os.environ["LOCAL_WORLD_SIZE"] = str(min(int(os.environ.get("LOCAL_WORLD_SIZE", roles.trainers)), roles.trainers))
        dist.init_process_group("nccl" if cuda else "gloo", store=dist.PrefixStore("agentrl/trainers", store),
                                rank=roles.rank, world_size=roles.trainers, timeout=timeout)
    trajectories = dist.ProcessGroupGloo(dist.PrefixStore("agentrl/trajectories", store), roles.rank, roles.world, timeout)
    weights = None
    members = [0, *roles.generator_ranks]
    if roles.rank in members:
        prefix = dist.PrefixStore("agentrl/weights", store)
        index, size = members.index(roles.rank), len(members)
        if cuda:
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            weights = dist.ProcessGroupNCCL(prefix, index, size, options)
        else:
            weights = dist.ProcessGroupGloo(prefix, index, size, timeout)
    _LINKS = Links(roles, store, trajectories, weights, device if cuda else torch.device("cpu"), timeout_s)
    return _LINKS


def leave_job(code: int) -> None:
    """Leave a disaggregated job without the interpreter's teardown (see ``leave_process_group``:
    gloo groups alive at exit sometimes abort it); nothing happens outside such a job."""
    if _LINKS is None:
        return
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class Links:
    """The cross-role channels of one rank (see the module docstring); every wait is bounded."""

    def __init__(self, roles: Roles, store: Any, trajectories: Any, weights: Any, device: torch.device, timeout_s: float) -> None:
        self.roles, self.store, self.trajectories, self.weights = roles, store, trajectories, weights
        self.device, self.timeout_s = device, timeout_s
        self.timeout = dt.timedelta(seconds=timeout_s)
        self._now = ""

    # -- what each rank is doing ---------------------------------------------------------------

    def doing(self, what: str) -> None:
        """Note what this rank does now, for a peer's error message should this rank stop answering."""
        self._now = what
        with contextlib.suppress(Exception):  # a gone store must not turn into a second error
            self.store.set(f"agentrl/doing/{self.roles.rank}", f"{time.time():.3f} {what}")

    def peer_doing(self, rank: int) -> str:
        key = f"agentrl/doing/{rank}"
        try:
            if not self.store.check([key]):
                return "nothing recorded"
            stamp, _, what = self.store.get(key).decode().partition(" ")
            return f"{what} (since {time.time() - float(stamp):.1f}s)"
        except Exception:  # the store lived in the dead process (a launch without torchrun)
            return "unknown (the rendezvous store is gone)"

    def failure(self, waiting_for: str, peer: int | None, exc: BaseException | None = None) -> DisaggregatedError:
        """One line: this rank, what it waited for, the peer, what the peer was doing, the cause."""
        who = self.roles.name()
        cause = ""
        if exc is not None:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            cause = f" ({type(exc).__name__}: {first[:240]})"
        if peer is None:
            return DisaggregatedError(f"{who} of {self.roles.world}: {waiting_for} failed{cause}")
        return DisaggregatedError(
            f"{who} of {self.roles.world}: {waiting_for} failed: {self.roles.name(peer)} died, stalled for more than "
            f"distributed_timeout_s={self.timeout_s:g}s, or is unreachable; it was last {self.peer_doing(peer)}{cause}"
        )

    # -- trajectories: JSON messages, point to point -------------------------------------------

    def send_object(self, obj: Any, dst: int, what: str) -> None:
        """Send ``obj`` to rank ``dst`` (its ``recv_object`` must be waiting within the timeout)."""
        self.send_objects(obj, [dst], what)

    def send_objects(self, obj: Any, dsts: list[int], what: str) -> None:
        data = torch.frombuffer(bytearray(encode(obj)), dtype=torch.uint8)
        size = torch.tensor([data.numel()], dtype=torch.int64)
        for dst in dsts:
            try:
                self.trajectories.send([size], dst, 0).wait(self.timeout)
                self.trajectories.send([data], dst, 1).wait(self.timeout)
            except Exception as exc:
                raise self.failure(what, dst, exc) from exc

    def recv_object(self, src: int, what: str) -> Any:
        size = torch.zeros(1, dtype=torch.int64)
        try:
            self.trajectories.recv([size], src, 0).wait(self.timeout)
            data = torch.empty(int(size.item()), dtype=torch.uint8)
            self.trajectories.recv([data], src, 1).wait(self.timeout)
        except Exception as exc:
            raise self.failure(what, src, exc) from exc
        return decode(data.numpy().tobytes())

    # -- weights: trainer 0 broadcasts to every generator -----------------------------------------

    def broadcast(self, tensor: torch.Tensor, what: str, timeout_s: float | None = None) -> None:
        """Broadcast ``tensor`` from trainer 0 (in place on the generators)."""
        assert self.weights is not None, "broadcast on a rank outside the weights group"
        timeout = self.timeout if timeout_s is None else dt.timedelta(seconds=timeout_s)
        try:
            self.weights.broadcast(tensor, 0, timeout).wait(timeout)
        except Exception as exc:
            raise self.failure(what, None if self.roles.rank == 0 else 0, exc) from exc

    def broadcast_object(self, obj: Any, what: str, timeout_s: float | None = None) -> Any:
        """``obj`` from trainer 0 on every member of the weights group (pass None on the generators)."""
        size = torch.zeros(1, dtype=torch.int64, device=self.device)
        data = None
        if self.roles.rank == 0:
            data = torch.frombuffer(bytearray(encode(obj)), dtype=torch.uint8).to(self.device)
            size.fill_(data.numel())
        self.broadcast(size, what, timeout_s)
        if data is None:
            data = torch.empty(int(size.item()), dtype=torch.uint8, device=self.device)
        self.broadcast(data, what, timeout_s)
        return obj if self.roles.rank == 0 else decode(data.cpu().numpy().tobytes())


def encode(obj: Any) -> bytes:
    """``obj`` (dicts, lists, strings, numbers, None) as UTF-8 JSON for another rank.

    JSON, not pickle: unpickling runs whatever code the bytes name, so a rank (or anything that
    reaches the job's ports) could run code on every rank it sends to. Non-finite floats (NaN
    log-probs of demonstrated tokens) travel as JSON's NaN/Infinity extension, which ``decode``
    reads back; a value that is not plain data (a numpy scalar in a task row) travels as its
    ``tolist()`` or its text, as the results files store it."""
    return json.dumps(obj, ensure_ascii=False, allow_nan=True, default=_plain).encode()


def decode(data: bytes) -> Any:
    return json.loads(data.decode())  # NaN and Infinity included


def _plain(obj: Any) -> Any:
    return obj.tolist() if hasattr(obj, "tolist") else str(obj)
