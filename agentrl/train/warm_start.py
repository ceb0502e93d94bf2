"""Warm start: supervised steps on the environment's demonstrations before the first RL step.

Why: GRPO reinforces only what the policy samples. A pretrained chat model that never writes a tool
call (SmolLM2-135M-Instruct on the calculator answers directly: 0 calls in 24 greedy episodes,
benchmarks/RESULTS.md, issue 47) gives every group the same reward, so nothing moves; guidance
adds one demonstration per group, far too little imitation per step at RL's learning rate. A few
supervised steps on demonstrated episodes teach the call syntax first, then RL takes over.

The demonstrations are the environment's own (``Environment.demonstrate``), played through the
same rollout engine, chat format, tools and rewards as guidance (``RolloutEngine.run_episode`` with
the demonstration as its turn source), so the tokens are exactly those the model would have to sample. They are trained
through the same ``Learner`` with advantage 1 on every demonstrated token and no sampler
log-probabilities: at ratio 1 the policy-gradient loss's gradient is the negative log-likelihood's,
token-averaged over the step (dapo's aggregation). Its own AdamW (``warm_start.learning_rate``,
constant), so the RL optimizer's moments and schedule start fresh. A demonstration that fails is
counted (``warm_start/failed``) and its episode left out; a step whose demonstrations all fail
stops the run with the first error.
"""

from __future__ import annotations

import math
import random
import time
from typing import Any

import anyio

from agentrl.core.trajectory import Trajectory, TrajectoryGroup
from agentrl.env.environment import Environment
from agentrl.learn.batch import Batch, build_batch
from agentrl.learn.learner import Learner
from agentrl.rollout.engine import RolloutEngine
from agentrl.rollout.guidance import GuidedRollouts, demonstration
from agentrl.train.config import WarmStartConfig

SEED_OFFSET = 7_000_003  # demonstration episode seeds, apart from the RL steps' and the eval's


class WarmStartError(RuntimeError):
    """Every demonstration of a warm-start step failed: there is nothing to imitate."""


def demonstrations(engine: RolloutEngine | GuidedRollouts, env: Environment, tasks: list[dict[str, Any]], seed: int) -> list[Trajectory]:
    """One demonstrated episode per task (episode ``i`` seeded ``seed + i``), failures included."""
    out: list[Trajectory | None] = [None] * len(tasks)

    async def one(i: int) -> None:
        traj = await engine.run_episode(env, tasks[i], seed + i, group=i, turns=demonstration)
        traj.guided = True
        out[i] = traj

    async def run() -> None:
        async with anyio.create_task_group() as tg:
            for i in range(len(tasks)):
                tg.start_soon(one, i)

    anyio.run(run)
    return [t for t in out if t is not None]


def imitation_batch(trajectories: list[Trajectory], pad_id: int) -> Batch:
    """The ``Batch`` of the successful demonstrations, advantage 1 on every demonstrated token."""
    groups = [TrajectoryGroup(task=t.task, seed=t.seed, trajectories=[t]) for t in trajectories if t.ok]
    batch = build_batch(groups, pad_id=pad_id, scale="none", log_episodes=len(groups))
    batch.advantages = batch.loss_mask.clone()
    return batch


def mean_nll(batch: Batch) -> float:
    """Mean negative log-likelihood of the demonstrated tokens under the weights before the step
    (the learner writes its log-probs back onto every logged sample)."""
    total, count = 0.0, 0
    for sample in batch.samples:
        if sample.trainer_logprobs is None:
            continue
        for lp, m in zip(sample.trainer_logprobs, sample.loss_mask):
            if m:
                total, count = total - lp, count + 1
    return total / count if count else math.nan


def run_warm_start(
    settings: WarmStartConfig, learner: Learner, engine: RolloutEngine | GuidedRollouts, env: Environment, train_data: Any, *, seed: int, pad_id: int,
    log: Any = None, echo: bool = True,
) -> list[dict[str, Any]]:
    """``settings.steps`` supervised steps on demonstrations of train tasks drawn in a seeded order
    of their own (the RL run's task order is untouched); one metrics dict per step."""
    order = list(range(len(train_data)))
    random.Random(seed + SEED_OFFSET).shuffle(order)
    history: list[dict[str, Any]] = []
    pos = 0
    for step in range(settings.steps):
        t0 = time.perf_counter()
        idx = [order[(pos + j) % len(order)] for j in range(settings.batch_size)]
        pos += settings.batch_size
        trajs = demonstrations(engine, env, [dict(train_data[i]) for i in idx], seed + SEED_OFFSET + step * settings.batch_size)
        failed = [t for t in trajs if not t.ok]
        if len(failed) == len(trajs):
            raise WarmStartError(f"warm start step {step + 1}: all {len(trajs)} demonstrations failed; first error: {failed[0].error}")
        batch = imitation_batch(trajs, pad_id)
        demo_s = time.perf_counter() - t0
        metrics = next(iter(learner.learn(batch, step)))
        row = {
            "warm_start/step": step + 1,
            "warm_start/nll": mean_nll(batch),
            "warm_start/demonstrations": len(trajs) - len(failed),
            "warm_start/failed": len(failed),
            "warm_start/tokens": int(batch.loss_mask.sum()),
            "warm_start/demo_s": demo_s,
            **{f"warm_start/{k}": v for k, v in metrics.items() if k.startswith(("perf/", "grad_norm", "lr"))},
        }
        history.append(row)
        if log is not None:
            log(row)
        if echo:
            print(
                f"warm start {step + 1}/{settings.steps}: nll {row['warm_start/nll']:.4f}, {row['warm_start/tokens']} tokens, "
                f"{row.get('warm_start/perf/trained_tokens_per_s', 0.0):.0f} tok/s, {len(failed)} failed",
                flush=True,
            )
    return history
