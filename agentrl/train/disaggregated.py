"""Generation on its own ranks (``distributed.generator_ranks=K``): both sides of the loop.

Why here: a generator rank composes the rollout side (environment, chat format, generator,
engine) with the weights that come from training, which only ``train/`` may import together.

- **Trainer ranks** keep the trainer's loop. :class:`RemoteRollouts` takes the slot that rollouts
  ahead take in one process (``GroupDraw``'s ``ahead``): ``take`` receives the step's groups from
  every generator rank, ``load_weights`` sends each new policy version (through
  ``RemoteGenerators``, agentrl/generators/remote.py), ``step_metrics`` logs the staleness.
- **Generator ranks** run :func:`serve`: the run's task order from trainer 0, then for each
  generation batch its share of the tasks (the contiguous block of data parallel, so environment
  seeds and GRPO groups are one process's), sampled by the newest weights they hold, sent to every
  trainer with the version that sampled them.

The staleness bound is the one of rollouts ahead (agentrl/rollout/ahead.py): the batch a trainer
uses at step ``t`` (``t`` optimizer steps taken) may start only once weights of version
``t - max_staleness`` or newer have arrived, so every trajectory's lag ``t - version`` is at most
``max_staleness``; the loss's sampler importance-sampling correction weighs the stale tokens.
``max_staleness=0`` is the synchronous loop spread over processes: the batch of step ``t`` is
sampled by exactly the weights after step ``t``, as one process samples it.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import threading
import time
from typing import Any

import torch

from agentrl.compute.parallel.distributed import share
from agentrl.compute.parallel.layout import DisaggregatedError, LayoutError, Links, connect, roles_from_env
from agentrl.core.trajectory import TrajectoryGroup
from agentrl.generators import WeightUpdate, build_generator, run_with
from agentrl.generators.remote import ReceivedWeights, RemoteGenerators, apply_weights, receive_weights
from agentrl.train.build import compute_bf16
from agentrl.train.config import TrainConfig


def trainer_links(cfg: TrainConfig) -> Links | None:
    """This trainer rank's links (None without generator ranks). Must run before the accelerator
    starts: it gives the trainers a default group of their own."""
    if not cfg.distributed.generator_ranks:
        return None
    links = connect(roles_from_env(cfg.distributed.generator_ranks), cfg.distributed_timeout_s)
    if links.roles.is_generator:
        raise LayoutError(f"{links.roles.name()} generates: it runs agentrl.train.disaggregated.serve (agentrl train does), not a Trainer")
    return links


class RemoteRollouts:
    """The trainer's view of the generator ranks (see the module docstring).

    Built on every trainer rank after the policy is prepared; trainer 0 first sends the run's task
    position and the current weights (the generator ranks loaded the base checkpoint; a resumed
    run or a fresh LoRA adapter differs from it).
    """

    def __init__(self, links: Links, cfg: TrainConfig, module: Any, state: Any, strategy: Any, wire_dtype: torch.dtype | None) -> None:
        self.links, self.cfg, self.roles, self.strategy = links, cfg, links.roles, strategy
        self.generators = RemoteGenerators(links, wire_dtype=wire_dtype, gather=strategy.full_tensor)
        self.last: dict[str, float] = {}
        if self.roles.rank == 0:
            start = {"seed": state.seed, "order": list(state.order), "step": state.step, "data_pos": state.data_pos, "epoch": state.epoch}
            self.links.doing("sending the run's start to the generator ranks")
            self.links.broadcast_object(start, "sending the run's start to the generator ranks")
        self.load_weights(WeightUpdate.from_module(module, version=state.step))

    def take(self, step: int, source: Any, tasks: list[dict[str, Any]], seed: int) -> tuple[list[TrajectoryGroup], float]:
        """The groups of the batch for step ``step`` (its tasks ``tasks``, drawn by the trainer from
        ``source``, rollout seed ``seed``), from every generator rank in rank order."""
        t0 = time.perf_counter()
        parts = []
        for rank in self.roles.generator_ranks:
            what = f"waiting for the batch of step {step + 1} from {self.roles.name(rank)}"
            self.links.doing(what)
            parts.append((rank, self.links.recv_object(rank, what)))
        self.links.doing(f"training on the batch of step {step + 1}")  # until the next note: the learner, the sync, the logs
        groups: list[TrajectoryGroup] = []
        versions = []
        for rank, part in parts:
            if part["error"] is not None:
                raise DisaggregatedError(f"{self.roles.name(rank)}: the rollout of the batch of step {step + 1} failed: {part['error']}")
            if part["target"] != step or part["seed"] != seed:
                raise DisaggregatedError(
                    f"{self.roles.name(rank)} sent the batch of step {part['target'] + 1}, the trainer is at step {step + 1}: the ranks are out of step"
                )
            staleness = step - part["version"]
            if not 0 <= staleness <= self.cfg.max_staleness:  # the generator's wait guarantees it: a broken bound is a bug
                raise DisaggregatedError(f"{self.roles.name(rank)}: the batch of step {step + 1} was sampled by version {part['version']}: staleness {staleness} > {self.cfg.max_staleness}")
            groups.extend(TrajectoryGroup.from_dict(g) for g in part["groups"])
            versions.append(part["version"])
        if [g.task for g in groups] != tasks:
            raise DisaggregatedError(f"the generator ranks rolled out other tasks than the trainer drew for step {step + 1}: the ranks are out of step")
        oldest = min(versions)
        self.last = {"async/policy_version": float(oldest), "async/wait_s": time.perf_counter() - t0, "async/staleness": float(step - oldest)}
        return groups, max(part["seconds"] for _, part in parts)

    def load_weights(self, update: WeightUpdate) -> None:
        """The generator protocol's weight channel, across processes: trainer 0 broadcasts (the
        causal LM's weights, named as the generator ranks' checkpoint names them, also under FSDP2)."""
        if update.module is not None:
            update = WeightUpdate.from_module(self.strategy.weights_module(update.module), version=update.version)
        self.generators.load_weights(update)

    def step_metrics(self, step: int) -> dict[str, float]:
        """Staleness of the update that took the run to ``step`` and what the last weight sync moved."""
        out: dict[str, float] = {}
        if self.last:
            out = {**self.last, "async/staleness": float(step - 1 - self.last["async/policy_version"])}
        if self.roles.rank == 0:
            sync = self.generators.last
            out.update({"sync/weight_tensors": float(sync.tensors), "sync/weight_bytes": float(sync.bytes), "sync/weight_broadcast_s": sync.seconds})
        return out

    def close(self) -> None:
        """Tell the generator ranks to stop (best effort: one may be gone already). Called from the
        trainer's ``finally``: an error on its way out is passed on, so the generators fail with it."""
        failing = sys.exc_info()[1]
        error = None if failing is None or isinstance(failing, KeyboardInterrupt) else f"{type(failing).__name__}: {failing}"
        try:
            self.generators.stop(error)
        except Exception:  # noqa: BLE001 - the run's own error (if any) is the one to report
            pass


# -- generator ranks ------------------------------------------------------------------------------


class WeightInbox:
    """A generator rank's receiving thread: always waiting at the weights broadcast, so trainer 0
    never waits for a busy generator; the newest version waits here until the next batch starts
    (one batch, one version). A failure to receive (trainer 0 died or hung) stops this process
    with the one-line error, whatever the main thread is doing."""

    def __init__(self, links: Links) -> None:
        self.links = links
        self.cond = threading.Condition()
        self.newest: ReceivedWeights | None = None
        self.stopped = False
        self.main_done = threading.Event()
        self.thread = threading.Thread(target=self._receive, name="agentrl-weight-inbox", daemon=True)
        self.thread.start()

    def wait_for(self, version: int) -> ReceivedWeights | None:
        """The newest weights once their version is at least ``version``; None when the run stopped."""
        with self.cond:
            while not self.stopped and (self.newest is None or self.newest.version < version):
                self.cond.wait()
            return None if self.stopped else self.newest

    def _receive(self) -> None:
        if self.links.device.type == "cuda":  # the current device is per thread: NCCL must see this rank's GPU
            torch.cuda.set_device(self.links.device)
        try:
            while True:
                received = receive_weights(self.links)
                with self.cond:
                    if received is None:
                        self.stopped = True
                    else:
                        self.newest = received
                    self.cond.notify_all()
                if received is None:
                    break
        except Exception as exc:  # noqa: BLE001 - reported in one line, then this rank ends
            error = exc if isinstance(exc, DisaggregatedError) else self.links.failure("waiting for weights from trainer 0", 0, exc)
            print(f"agentrl train: {error}", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(1)
        # the trainers are done with this rank: let the main thread finish (a send nobody will take may block it)
        self.main_done.wait(30)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def serve(cfg: TrainConfig) -> int:
    """A generator rank's whole run: build the rollout side, then roll out this rank's share of
    every generation batch until the trainers stop (see the module docstring)."""
    from agentrl.chat import get_chat_format
    from agentrl.compute.models import load_tokenizer, pad_token_id
    from agentrl.rollout.engine import RolloutEngine
    from agentrl.train.build import generation_base, load_environment, with_guidance
    from agentrl.train.draw import train_seed
    from agentrl.train.model_source import load_planned, plan_model
    from agentrl.train.state import TrainState

    links = connect(roles_from_env(cfg.distributed.generator_ranks), cfg.distributed_timeout_s)
    roles = links.roles
    if not roles.is_generator:
        raise LayoutError(f"{roles.name()} trains: serve() runs on generator ranks only")
    # a Ctrl-C reaches every process of the terminal: the trainers finish the step, save, and stop this rank
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    links.doing("loading the environment and the model")
    env, data = load_environment(cfg, None)
    plan = plan_model(cfg)  # the trainers' own plan: the same dtype, kind and adapter base
    path = plan.path
    tokenizer = load_tokenizer(path)
    chat_format = get_chat_format(tokenizer, cfg.model.chat_format)
    policy, kind = load_planned(plan, cfg, str(links.device))
    policy.eval()
    bf16 = compute_bf16(cfg)
    generator = build_generator(
        cfg.generator, model=policy, model_path=generation_base(path, kind, plan.base), pad_token_id=pad_token_id(tokenizer, chat_format.stop_token_ids),
        max_context=cfg.rollout.max_context, seed=cfg.seed, train_dtype=torch.bfloat16 if bf16 else None,
    )
    engine = with_guidance(RolloutEngine(generator, chat_format, cfg.rollout, cfg.sampling), cfg.guidance)
    links.doing("waiting for the run's start from trainer 0")
    start = links.broadcast_object(None, "waiting for the run's start from trainer 0")
    state = TrainState(**start)
    inbox = WeightInbox(links)
    index, count = roles.generator_index(), roles.generators
    per_batch = cfg.prompts_per_step * cfg.steps_per_generation
    trainers = list(range(roles.trainers))
    version = -1  # the weights' version this rank's model holds (none received yet)
    target = state.step
    try:
        while target < cfg.max_steps:
            tasks = state.next_tasks(data, per_batch)
            lo, hi = share(len(tasks), index, count)
            seed = train_seed(cfg.seed, target)
            links.doing(f"waiting for weights version {target - cfg.max_staleness} or newer for the batch of step {target + 1}")
            received = inbox.wait_for(target - cfg.max_staleness)
            if received is None:
                break
            if received.version != version:  # between batches only: one batch, one version
                apply_weights(policy, received)
                received.tensors = []  # copied: the buffers go
                generator.load_weights(WeightUpdate.from_module(policy, version=received.version))
                version = received.version
            links.doing(f"rolling out the batch of step {target + 1} ({hi - lo} tasks, weights version {version})")
            t0 = time.perf_counter()
            groups: list[TrajectoryGroup] = []
            error = None
            try:
                generator.begin_rollout()
                try:
                    groups = run_with(generator, lambda: engine.run(env, tasks[lo:hi], n=cfg.num_generations, seed=seed + lo))  # noqa: B023 - called at once
                finally:
                    generator.end_rollout()
            except Exception as exc:  # noqa: BLE001 - the trainers report it (one line) and stop
                error = f"{type(exc).__name__}: {exc}"
            for g, group in enumerate(groups):
                for t in group.trajectories:
                    t.group, t.policy_version = lo + g, version
            message = {"target": target, "seed": seed, "version": version, "groups": [g.to_dict() for g in groups], "seconds": time.perf_counter() - t0, "error": error}
            what = f"sending the batch of step {target + 1} to the trainer ranks"
            links.doing(what)
            try:
                links.send_objects(message, trainers, what)
            except DisaggregatedError:
                if inbox.stopped:  # the trainers stopped (a Ctrl-C) before taking a batch sampled ahead: nothing lost
                    break
                raise
            if error is not None:
                raise DisaggregatedError(f"{roles.name()}: the rollout of the batch of step {target + 1} failed: {error}")
            target += cfg.steps_per_generation
        links.doing("done: waiting for the trainers to stop")
        inbox.wait_for(1 << 62)  # returns at the stop message
    finally:
        inbox.main_done.set()
    return 0


def serve_if_generator(cfg: TrainConfig) -> bool:
    """On a generator rank: :func:`serve` until the trainers stop, then True. On a trainer rank: False."""
    if roles_from_env(cfg.distributed.generator_ranks).is_generator:
        serve(cfg)
        return True
    return False
