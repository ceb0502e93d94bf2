"""The GRPO training loop: an explicit loop over accelerate, fed by the rollout engine.

One optimizer step, read top to bottom in ``Trainer.train``:

1. rollouts: ``prompts_per_step × steps_per_generation`` tasks, ``num_generations`` episodes each,
   through the same ``RolloutEngine`` that ``agentrl eval`` uses, between the generator's
   ``begin_rollout`` and ``end_rollout``; which tasks, and which groups are kept, is
   ``GroupDraw``'s (agentrl/train/draw.py: curriculum, dynamic sampling, rollouts ahead);
2. ``build_batch``: the typed ``Batch`` (rewards per turn, group-relative advantages per token);
3. ``Learner.learn``: old/reference log-probs when needed, micro-batches, loss, optimizer step;
4. ``generator.load_weights``: the new weights, however the backend takes them;
5. metrics, samples, checkpoints; Ctrl-C finishes the step, saves and stops.

From Python: ``Trainer(env=MyEnv(), model="default", max_steps=20).train()`` takes the same keys
as ``agentrl train`` (dotted keys through ``**{"loss.beta": 0.04}``).
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import torch

from agentrl.compute.compile_layers import compile_layers
from agentrl.compute.parallel.distributed import any_rank, gather, peer_failures, share
from agentrl.compute.parallel.strategy import make_strategy
from agentrl.compute.reference import Reference
from agentrl.core.strict import ConfigError
from agentrl.core.trajectory import TrajectoryGroup
from agentrl.env.environment import Environment
from agentrl.generators import WeightUpdate, build_generator, run_with
from agentrl.generators.config import require_backend
from agentrl.generators.gathered import over_copy
from agentrl.learn.batch import Batch, build_batch, reward_metrics
from agentrl.learn.learner import Learner
from agentrl.observe.curve import write_reward_curve
from agentrl.observe.runlog import RunLog
from agentrl.rollout.ahead import RolloutAhead
from agentrl.rollout.engine import RolloutEngine
from agentrl.rollout.metrics import rollout_metrics
from agentrl.train.build import (
    build_optimizer,
    check_trackers,
    config_from,
    enable_gradient_checkpointing,
    generation_base,
    learner_config,
    load_environment,
    peak_memory_gib,
    start_run,
    take_reward_objects,
    with_guidance,
)
from agentrl.train.config import TrainConfig, skipped_bundled_defaults
from agentrl.train.disaggregated import RemoteRollouts, trainer_links
from agentrl.train.draw import GroupDraw, train_seed
from agentrl.train.interrupt import stop_on_interrupt
from agentrl.train.model_source import load_planned, plan_model, take_model_objects
from agentrl.train.state import TrainState, resume_run, save_run
from agentrl.train.warm_start import run_warm_start


class Trainer:
    """Builds everything from a ``TrainConfig`` (or the same keys as keyword arguments) and runs ``train()``.

    ``env``: a registered name, a ``module:Class`` spec, or an ``Environment`` instance. ``model``: a
    folder, hub id or ``"default"``, or a loaded ``PreTrainedModel``/``PeftModel`` (with
    ``tokenizer=``, else its ``name_or_path``'s is loaded); ``peft``: ``peft.*`` keys or a
    ``peft.LoraConfig`` (docs/training.md, the model).
    """

    def __init__(self, config: TrainConfig | None = None, /, *, env: str | Environment | None = None, **keys: Any) -> None:
        from agentrl.chat import get_chat_format
        from agentrl.compute.models import load_tokenizer, pad_token_id
        from agentrl.train.preflight import preflight_train

        instance = env if isinstance(env, Environment) else None
        keys, module, tokenizer = take_model_objects(keys)  # model=<PreTrainedModel>: its name_or_path in config.json
        keys, reward_objects = take_reward_objects(keys)  # extra_rewards=[Reward(...), fn]: Python objects, not config
        cfg = self.cfg = config_from(config, env, keys)
        skipped = skipped_bundled_defaults(cfg)
        if skipped:  # never silent: the user sees what the environment tuned on the bundled model and this run does not use
            print(f"env={cfg.env}: not applying its defaults tuned on the bundled model ({', '.join(f'{k}={v}' for k, v in skipped.items())}) to model={cfg.model.path}; "
                  f"this run uses {', '.join(f'{k}={getattr(cfg, k)}' for k in skipped)} (set them to override)", flush=True)
        random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        # the CLI's pre-checks and the environment first: their mistakes must not cost a model load or a run folder
        built = preflight_train(cfg, instance, tokenizer=tokenizer)
        self.env, self.train_data = load_environment(cfg, built, reward_objects)
        plan = plan_model(cfg, module)  # kind, dtype, an adapter's base: checked before the run folder
        check_trackers(cfg.report_to)
        require_backend(cfg.generator)
        self.links = trainer_links(cfg)  # generator_ranks: the trainers' own process group, before accelerate starts
        self.accelerator, self.run_dir, bf16 = start_run(cfg)
        self.is_main = self.accelerator.is_main_process  # rank 0 alone writes logs, samples, checkpoints, the curve
        path = plan.path
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(path)
        self.chat_format = get_chat_format(self.tokenizer, cfg.model.chat_format)
        strategy, why = make_strategy(cfg.distributed.strategy, self.accelerator.num_processes)
        if why and self.is_main:
            print(why, flush=True)
        self.strategy = strategy
        policy, kind = load_planned(plan, cfg, strategy.load_device(self.accelerator.device))
        self.base_model = plan.given_base  # what adapter checkpoints record as their base (agentrl/compute/adapters.py)
        if cfg.gradient_checkpointing:
            enable_gradient_checkpointing(policy)
        self.reference = Reference(policy, kind, cfg.loss.beta, adapter_path=path if kind == "adapter" else None)
        self.policy_kind = kind
        generation_model = strategy.generation_model(policy, torch.bfloat16 if bf16 else None, self.accelerator.device)
        policy = strategy.wrap(policy, self.accelerator.device, bf16)
        optimizer, scheduler, why = build_optimizer(cfg, policy, torch.cuda.is_available(), strategy, full_finetune=kind == "full")
        if why and self.is_main:
            print(why, flush=True)
        self.policy, self.optimizer, self.scheduler = strategy.prepare(self.accelerator, policy, optimizer, scheduler)
        compiled, why = compile_layers(policy, cfg.compile_learner, strategy, cuda=self.accelerator.device.type == "cuda", full_finetune=kind == "full")
        if why and self.is_main:
            print(why, flush=True)
        self.learner = Learner(self.accelerator, self.policy, self.optimizer, self.scheduler, self.reference, cfg.loss, learner_config(cfg), compiled, strategy)

        self.pad_id = pad_token_id(self.tokenizer, self.chat_format.stop_token_ids)
        generator = build_generator(
            cfg.generator, model=generation_model if generation_model is not None else self._module(), model_path=generation_base(path, kind, plan.base),
            pad_token_id=self.pad_id, max_context=cfg.rollout.max_context, seed=cfg.seed, train_dtype=torch.bfloat16 if bf16 else None,
        )
        self.generator = over_copy(generator, self.policy, generation_model)  # FSDP2: decodes an unsharded copy
        # the training rollouts: the engine, with guidance's demonstrated episodes plugged in when asked
        self.engine = with_guidance(RolloutEngine(self.generator, self.chat_format, cfg.rollout, cfg.sampling), cfg.guidance)
        self.state = TrainState.start(len(self.train_data), cfg.seed)
        self.eval_results: dict[int, list[float | None]] = {}  # step -> per-task reward, test order
        self.warm_start_history: list[dict[str, Any]] = []  # one row per warm-start step (agentrl/train/warm_start.py)
        self.warm_start_eval: list[float | None] | None = None  # per-task reward after the warm start, with eval_every
        self.interrupted = False
        self.ahead: RolloutAhead | RemoteRollouts | None = None  # background rollouts (rollout/ahead.py) or the generator ranks (train/disaggregated.py)
        self._last_saved = -1  # the step this process last checkpointed (every rank knows it)
        if cfg.resume:
            with self._checkpoint_objects(saving=False) as (model, optimizer):
                where, saved_world = resume_run(cfg.resume, self.run_dir, self.state, model, optimizer, self.scheduler)
            if self.is_main:
                print(f"resumed from {where} at step {self.step}", flush=True)
                if saved_world != self.accelerator.num_processes:  # the batch and data order are global: it continues the same run
                    print(f"resume: written by {saved_world} process(es), continuing with {self.accelerator.num_processes}", flush=True)
        if cfg.resume or kind == "adapter":
            self._sync_weights()  # a separate generator holds the base checkpoint's weights
        if cfg.max_staleness or self.links is not None:
            self.ahead = self._rollouts_ahead(path, bf16)
        # which tasks each step rolls out and which groups it keeps (curriculum, dynamic sampling, rollouts ahead)
        self.draw = GroupDraw(cfg, self.train_data, self.state, lambda tasks, seed: self._rollout_shared(tasks, seed), self.ahead)

    @property
    def step(self) -> int:
        return self.state.step

    @property
    def data_pos(self) -> int:
        return self.state.data_pos

    @property
    def history(self) -> list[dict[str, Any]]:
        return self.state.history

    # -- the loop ------------------------------------------------------------------------------

    def train(self) -> dict[str, Any]:
        """Run to ``max_steps`` (or a Ctrl-C); returns the last step's headline metrics."""
        cfg, state = self.cfg, self.state
        stopping = False
        run_start = time.time()
        try:
            with RunLog(self.run_dir, self.accelerator) as log, stop_on_interrupt() as stop, peer_failures(self.accelerator, cfg.distributed_timeout_s):
                if cfg.eval_every and state.step == 0:  # the "before" number, on the same tasks and seeds
                    before = self.evaluate(cfg.eval_tasks)
                    state.history.append({"step": 0, **before})
                    log.log(0, before)
                if cfg.warm_start.steps and state.step == 0 and not cfg.resume:
                    self.warm_start_history = self._warm_start()
                out_of_time = False
                while state.step < cfg.max_steps and not (stopping := any_rank(self.accelerator, stop.is_set())):
                    t_start = time.perf_counter()
                    drawn = self.draw.next()
                    rollout_peak = peak_memory_gib()
                    batch = build_batch(drawn.train, pad_id=self.pad_id, scale=cfg.advantage_scale, log_episodes=cfg.samples_per_log, mode=cfg.advantage,
                                        guided_weight=cfg.guidance.weight, accuracy=self.env.accuracy_reward)
                    for metrics in self.learner.learn(batch, state.step):
                        state.step += 1
                        metrics.update(self._sync_weights())
                        metrics.update(drawn.metrics)
                        if rollout_peak is not None:
                            metrics["perf/peak_gib_rollout"], metrics["perf/peak_gib_train"] = rollout_peak, peak_memory_gib()
                        self._finish_step(log, metrics, batch, drawn.drawn, drawn.seconds, time.perf_counter() - t_start)
                        t_start = time.perf_counter()
                        if state.step >= cfg.max_steps or (stopping := any_rank(self.accelerator, stop.is_set())):
                            break
                        if (out_of_time := self._past_time_limit(run_start)):
                            break
                    if out_of_time:
                        break
                if out_of_time and not stopping:
                    saved = self._checkpoint_dir() if self._saved_now() else self.save()
                    if self.is_main:
                        print(f"time limit: stopped after step {state.step} of {cfg.max_steps} at {(time.time() - run_start) / 60:.1f} min "
                              f"(time_limit_min={cfg.time_limit_min:g}), checkpoint {saved}; continue with resume=latest output_dir={self.run_dir}", flush=True)
                if stopping:
                    self.interrupted = True
                    saved = self._checkpoint_dir() if self._saved_now() else self.save()
                    if self.is_main:
                        print(f"interrupted: stopped after step {state.step}, checkpoint {saved}; continue with resume=latest output_dir={self.run_dir}", flush=True)
        finally:
            if self.ahead is not None:
                self.ahead.close()
            anyio.run(self.generator.close)
        if self.is_main:
            write_reward_curve(state.history, self.run_dir / "reward_curve.png", title=f"agentrl train {cfg.env}")
        if cfg.report_to:
            self.accelerator.end_training()
        return state.history[-1] if state.history else {}

    def _past_time_limit(self, run_start: float) -> bool:
        """Whether ``time_limit_min`` has passed since ``train()`` began (every rank agrees: one
        rank's clock decides for all, through the same collective as a Ctrl-C)."""
        limit = self.cfg.time_limit_min
        return limit is not None and any_rank(self.accelerator, time.time() - run_start > 60 * limit)

    def _warm_start(self) -> list[dict[str, Any]]:
        """``warm_start.steps`` supervised steps on demonstrations, through a learner of their own
        (own AdamW and constant learning rate, no reference: agentrl/train/warm_start.py); the rows go
        to ``warm_start.jsonl``, and with ``eval_every`` the eval after them to its last row."""
        import json

        from agentrl.learn.learner import Learner, LearnerConfig
        from agentrl.learn.losses import LossConfig

        cfg = self.cfg
        ws = cfg.warm_start
        lr = ws.learning_rate or cfg.learning_rate
        opt_cfg = cfg.model_copy(update={"learning_rate": lr, "lr_scheduler": "constant", "warmup_steps": 0, "max_steps": ws.steps})
        optimizer, scheduler, _ = build_optimizer(opt_cfg, self._module(), torch.cuda.is_available(), full_finetune=self.policy_kind == "full")
        optimizer, scheduler = self.accelerator.prepare(optimizer, scheduler)
        settings = LearnerConfig(
            micro_batch_size=cfg.micro_batch_size, num_iterations=1, steps_per_generation=1, temperature=1.0, logprob_chunk_size=cfg.logprob_chunk_size,
            max_grad_norm=cfg.max_grad_norm, mask_truncated_completions=False, ref_mix_alpha=None, ref_mix_every=0,
        )
        learner = Learner(self.accelerator, self.policy, optimizer, scheduler, Reference(self._module(), self.policy_kind, 0.0), LossConfig(loss_type="dapo"), settings, self.learner.compiled)
        path = self.run_dir / "warm_start.jsonl"

        def write(row: dict[str, Any]) -> None:
            if self.is_main:
                with open(path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(row, default=float) + "\n")

        history = run_warm_start(ws, learner, self.engine, self.env, self.train_data, seed=cfg.seed, pad_id=self.pad_id, log=write, echo=self.is_main)
        del learner, optimizer, scheduler
        self._sync_weights()
        if cfg.save_every:  # checkpoints/step-0: the warm-started model, before any RL step
            self.save()
        if cfg.eval_every:
            base = self.eval_results.get(0)
            after = {f"warm_start/{k}": v for k, v in self.evaluate(cfg.eval_tasks).items()}
            self.warm_start_eval = self.eval_results.pop(0)  # kept apart: eval_results[0] stays the base model's
            if base is not None:
                self.eval_results[0] = base
            history[-1].update(after)
            write(after)
        return history

    def _finish_step(self, log: RunLog, metrics: dict[str, Any], batch: Batch, groups: list[TrajectoryGroup], rollout_s: float, step_s: float) -> None:
        """Metrics, eval, history, logs, samples and the periodic checkpoint of the step just taken."""
        cfg, step = self.cfg, self.state.step
        metrics.update(batch.metrics)
        if cfg.dynamic_sampling.enabled:  # the policy's reward is the one of every drawn group, not of the kept (varied) ones
            metrics["reward/kept_mean"] = batch.metrics["reward/mean"]
            metrics.update(reward_metrics([t for g in groups for t in g.ok], self.env.accuracy_reward))
        metrics.update({f"rollout/{k}": v for k, v in rollout_metrics(groups, rollout_s).items()})
        metrics["perf/step_s"] = step_s
        metrics["perf/sampled_tokens_per_s"] = metrics.get("rollout/sampled_tokens_per_s", 0.0)
        metrics["perf/eta_s"] = step_s * (cfg.max_steps - step)
        if cfg.eval_every and step % cfg.eval_every == 0:
            metrics.update(self.evaluate(cfg.eval_tasks))
        self.state.history.append({k: metrics[k] for k in ("reward/mean", "accuracy", "eval/reward") if k in metrics} | {"step": step})
        if step % cfg.log_every == 0 or step == cfg.max_steps:
            log.log(step, metrics)
            log.samples(step, batch.trajectories[: cfg.samples_per_log], self.chat_format.decode)
        if (cfg.save_every and step % cfg.save_every == 0) or (step == cfg.max_steps and cfg.save_final):
            self.save()

    def _rollout_shared(self, tasks: list[dict[str, Any]], seed: int, n: int | None = None, engine: RolloutEngine | None = None) -> tuple[list[TrajectoryGroup], float]:
        """Every rank rolls out its contiguous block of ``tasks`` (environment seed ``seed + global
        index``, as one process would) and receives everyone's groups in task order; the time is the
        slowest rank's. On one process this is ``_rollout``."""
        start, stop = share(len(tasks), self.accelerator.process_index, self.accelerator.num_processes)
        groups, seconds = self._rollout(tasks[start:stop], seed=seed + start, n=n, engine=engine)
        if self.accelerator.num_processes == 1:
            return groups, seconds
        for g, group in enumerate(groups):
            for t in group.trajectories:
                t.group = start + g
        parts = gather(self.accelerator, (groups, seconds))
        return [g for part, _ in parts for g in part], max(s for _, s in parts)

    def _rollout(self, tasks: list[dict[str, Any]], seed: int, n: int | None = None, engine: RolloutEngine | None = None) -> tuple[list[TrajectoryGroup], float]:
        self.policy.eval()
        start = time.perf_counter()
        n = self.cfg.num_generations if n is None else n
        engine = engine or self.engine
        self.generator.begin_rollout()
        try:
            groups = run_with(self.generator, lambda: engine.run(self.env, tasks, n=n, seed=seed))
        finally:
            self.generator.end_rollout()
        return groups, time.perf_counter() - start

    def _sync_weights(self) -> dict[str, float]:
        """Hand the generator the policy's new weights (a no-op for one that shares the module)."""
        start = time.perf_counter()
        update = WeightUpdate.from_module(self._module(), version=self.state.step)
        self.generator.load_weights(update)
        out = {"perf/weight_sync_s": time.perf_counter() - start}
        if self.ahead is not None:  # the rollouts-ahead copy takes them through the same protocol call
            self.ahead.load_weights(update)
            out.update(self.ahead.step_metrics(self.state.step))
        return out

    def _rollouts_ahead(self, path: str, bf16: bool) -> RolloutAhead | RemoteRollouts:
        """The background generator of ``max_staleness > 0``: a copy of the policy on ``rollout_device``,
        or the generator ranks of ``distributed.generator_ranks``."""
        cfg = self.cfg
        if self.links is not None:  # on the generator ranks (agentrl/train/disaggregated.py)
            return RemoteRollouts(self.links, cfg, self._module(), self.state, self.strategy, torch.bfloat16 if bf16 else None)
        if self.accelerator.num_processes > 1:
            raise ConfigError("max_staleness > 0 runs in one process for now; launch it without torchrun / accelerate launch")
        return RolloutAhead(
            self._module(), env=self.env, num_generations=cfg.num_generations,
            make_generator=lambda module: build_generator(
                cfg.generator, model=module, model_path=str(path), pad_token_id=self.pad_id, max_context=None, seed=cfg.seed, host_rollouts=True,
                training_alongside=True,
            ),
            engine_of=lambda generator: with_guidance(RolloutEngine(generator, self.chat_format, cfg.rollout, cfg.sampling), cfg.guidance),
            tasks_per_batch=cfg.prompts_per_step * cfg.steps_per_generation, steps_per_generation=cfg.steps_per_generation,
            max_staleness=cfg.max_staleness, max_steps=cfg.max_steps, seed_of=lambda step: train_seed(cfg.seed, step), version=self.state.step,
            device=torch.device(cfg.rollout_device) if cfg.rollout_device else self.accelerator.device, dtype=torch.bfloat16 if bf16 else None,
            timeout_s=cfg.distributed_timeout_s,
        )

    def evaluate(self, n: int) -> dict[str, float]:
        """Mean reward on the first ``n`` test tasks, one episode each at ``eval_temperature``."""
        tasks = list(self.env.dataset("test"))[:n]
        sampling = self.cfg.sampling.model_copy(update={"temperature": self.cfg.eval_temperature})
        engine = RolloutEngine(self.generator, self.chat_format, self.cfg.rollout, sampling)
        groups, _ = self._rollout_shared(tasks, seed=self.cfg.eval_seed, n=1, engine=engine)
        self.eval_results[self.state.step] = [g.trajectories[0].reward if g.trajectories[0].ok else None for g in groups]
        rewards = [t.reward for g in groups for t in g.ok]
        out = {"eval/reward": sum(rewards) / max(1, len(rewards))}
        name = self.env.accuracy_reward
        correct = [t.rewards[name] for g in groups for t in g.ok if name is not None and t.rewards.get(name) is not None]
        if correct:
            out["eval/accuracy"] = sum(correct) / len(correct)
        return out

    # -- checkpoints ---------------------------------------------------------------------------

    def save(self) -> Path:
        """Checkpoint the run (rank 0 writes; sharded weights and optimizer state are gathered to it first)."""
        self._last_saved = self.state.step
        with self._checkpoint_objects(saving=True) as (model, optimizer):
            if not self.is_main:
                return self._checkpoint_dir()
            return save_run(
                self.run_dir, self.state, self.policy_kind, model, self.tokenizer, optimizer, self.scheduler, self.cfg.keep_checkpoints,
                world_size=self.accelerator.num_processes, base_model=self.base_model,
            )

    def save_model(self, path: str | Path, merged: bool = False) -> Path:
        """Write the policy to ``path`` with its tokenizer, for use outside agentrl.

        Full fine-tuning: a transformers folder (``merged`` changes nothing). LoRA: ``merged=False``
        writes the adapter folder (``adapter_config.json``, ``adapter_model.safetensors`` and
        ``base_model.json``, where its base is recorded as given); ``merged=True`` writes a plain
        transformers folder with the adapter folded into a copy of the base weights (the training
        module is untouched), loadable by ``AutoModelForCausalLM.from_pretrained``. Every rank must
        call it (sharded weights are gathered); rank 0 writes.
        """
        from agentrl.compute.adapters import merged_model, record_base

        out = Path(path)
        with self._checkpoint_objects(saving=True) as (model, _):
            if not self.is_main:
                return out
            if out.exists() and not out.is_dir():
                raise ConfigError(f"save_model: {out} is a file, not a folder")
            out.mkdir(parents=True, exist_ok=True)
            if merged and self.policy_kind != "full":
                merged_model(model).save_pretrained(out, safe_serialization=True)
            else:
                model.save_pretrained(out, safe_serialization=True)
                if self.policy_kind != "full":
                    record_base(out, self.base_model)
            self.tokenizer.save_pretrained(out)
        return out

    @contextlib.contextmanager
    def _checkpoint_objects(self, saving: bool) -> Iterator[tuple[Any, Any]]:
        """The model and optimizer checkpoint.py reads and writes (the strategy's views: full state dicts when sharded)."""
        with self.strategy.checkpoint_objects(self._module(), self.policy, self.optimizer, saving) as views:
            yield views

    def _checkpoint_dir(self) -> Path:
        from agentrl.train.checkpoint import checkpoint_dir

        return checkpoint_dir(self.run_dir, self.state.step)

    def _saved_now(self) -> bool:
        # the step this process saved (known to every rank: a sharded save is collective), or one on disk
        return self._last_saved == self.state.step or (self._checkpoint_dir() / "trainer_state.json").is_file()

    def _module(self) -> Any:
        return self.accelerator.unwrap_model(self.policy)

