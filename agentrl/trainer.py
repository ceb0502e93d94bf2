"""The GRPO training loop: an explicit loop over accelerate, fed by the rollout engine.

One optimizer step, read top to bottom in ``Trainer.train``:

1. rollouts: ``prompts_per_step × steps_per_generation`` tasks, ``num_generations`` episodes each,
   through the same ``RolloutEngine`` that ``agentrl eval`` uses;
2. rewards (the environment's plus ``extra_rewards``) → group-relative advantages;
3. old log-probs only when the batch is reused (``num_iterations`` or ``steps_per_generation`` > 1),
   reference log-probs only when ``beta > 0`` — both chunked over the vocabulary;
4. loss steps over micro-batches with gradient accumulation, clipping, optimizer, scheduler;
5. weight sync: the transformers generator shares the policy module, so it sees new weights
   immediately (a separate generator gets ``update_weights`` with LoRA merged);
6. metrics, samples, checkpoints.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import math
import random
import time
from pathlib import Path
from typing import Any

import anyio
import torch

from agentrl.checkpoint import checkpoint_dir, load_checkpoint, open_run, prune_checkpoints, resolve_resume, save_checkpoint
from agentrl.config import require_backend, rollout_config
from agentrl.dispatch import ToolRecord
from agentrl.env import Reward, reward_context, score
from agentrl.generators import build_generator, run_with
from agentrl.generators.vllm_common import push_weights
from agentrl.logprobs import token_logprobs
from agentrl.losses import group_advantages, policy_loss
from agentrl.observe import RunLog
from agentrl.reference import Reference, is_adapter_folder, load_policy
from agentrl.registry import load_object, make
from agentrl.rollout.engine import RolloutEngine
from agentrl.rollout.metrics import rollout_metrics
from agentrl.train_config import TrainConfig
from agentrl.trajectory import Trajectory, TrajectoryGroup

# Losses whose normaliser is global (counts the whole optimizer step's tokens); the others are
# per-micro-batch means, averaged over the accumulation steps.
GLOBAL_NORMALISED = {"dapo", "cispo", "sapo"}


class Trainer:
    """Builds everything from a ``TrainConfig`` and runs ``train()``."""

    def __init__(self, cfg: TrainConfig) -> None:
        from accelerate import Accelerator

        from agentrl.chat import get_chat_format
        from agentrl.models import load_tokenizer, resolve_model

        self.cfg = cfg
        random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        self.run_dir = Path(cfg.output_dir or f"runs/{cfg.env.replace('/', '_').replace(':', '_')}-{stamp}")
        open_run(self.run_dir, cfg.resume)  # refuses another run's folder; on resume, cuts logs back
        (self.run_dir / "config.json").write_text(json.dumps(cfg.model_dump(), indent=2) + "\n")

        _check_trackers(cfg.report_to)
        require_backend(cfg.generator)
        cuda = torch.cuda.is_available()
        bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and cuda and torch.cuda.is_bf16_supported())
        self.accelerator = Accelerator(
            mixed_precision="bf16" if bf16 else "no",
            log_with=list(cfg.report_to) or None,
            project_dir=str(self.run_dir),
        )
        if cfg.report_to:
            self.accelerator.init_trackers("agentrl", config=json.loads(json.dumps(cfg.model_dump(), default=str)))
        device = str(self.accelerator.device)

        path = resolve_model(cfg.model.path)
        self.tokenizer = load_tokenizer(cfg.model.path if not is_adapter_folder(path) else path)
        self.chat_format = get_chat_format(self.tokenizer, cfg.model.chat_format)
        lora = cfg.peft.model_dump() if cfg.peft else None
        policy, kind = load_policy(path, torch.float32, device, lora)
        if cfg.gradient_checkpointing:
            # Saving/restoring the CUDA RNG state around every layer syncs the device each time
            # (H200, 0.5B model, 64 x ~300 tokens: train phase 2.0 s with it, 0.79 s without);
            # it only matters when the recomputed forward draws dropout masks.
            kwargs = {"use_reentrant": False, "preserve_rng_state": _uses_dropout(policy)}
            policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
            if hasattr(policy, "enable_input_require_grads"):
                policy.enable_input_require_grads()
        self.reference = Reference(policy, kind, cfg.loss.beta, adapter_path=path if kind == "adapter" else None)
        self.policy_kind = kind

        params = [p for p in policy.parameters() if p.requires_grad]
        if cfg.optimizer_offload:  # the moments on the host: same AdamW arithmetic (agentrl/optim_offload.py)
            from agentrl.optim_offload import OffloadedAdamW

            optimizer: torch.optim.Optimizer = OffloadedAdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay, betas=cfg.adam_betas)
        else:  # fused: one kernel for the whole update on CUDA (same math as the default implementation)
            optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay, betas=cfg.adam_betas, fused=cuda or None)
        from transformers import get_scheduler

        scheduler = get_scheduler(cfg.lr_scheduler, optimizer, num_warmup_steps=cfg.warmup_steps, num_training_steps=cfg.max_steps)
        self.policy, self.optimizer, self.scheduler = self.accelerator.prepare(policy, optimizer, scheduler)
        self.loss_cfg = cfg.loss.to_loss_config()

        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.chat_format.stop_token_ids[0]
        self.pad_id = int(pad)
        gen_model = self.accelerator.unwrap_model(self.policy)
        self._generation_copy: torch.nn.Module | None = None
        if cfg.generator.backend != "transformers":
            # vLLM loads the base checkpoint itself; merged weights are pushed after every optimizer step
            self.generator = build_generator(
                cfg.generator, model_path=_generation_base(path, kind), pad_token_id=self.pad_id,
                max_context=cfg.rollout.max_context, seed=cfg.seed,
            )
        else:
            if cuda and bf16 and kind == "full":
                # Decode from a bf16 copy rather than the fp32 master weights under autocast: half the
                # bytes read per token and no per-step weight casts. Cast again before every rollout.
                gen_model = copy.deepcopy(gen_model).to(torch.bfloat16).eval().requires_grad_(False)
                self._generation_copy = gen_model
            self.generator = build_generator(
                cfg.generator, model=gen_model, model_path=str(path), pad_token_id=self.pad_id, max_context=None,
            )
        self.engine = RolloutEngine(self.generator, self.chat_format, rollout_config(cfg.sampling, cfg.rollout))
        self.env = make(cfg.env, **cfg.env_args)
        self.extra_rewards = [_load_reward(r) for r in cfg.extra_rewards]
        train = self.env.dataset("train")
        self.order = list(range(len(train)))
        random.Random(cfg.seed).shuffle(self.order)
        self.train_data = train
        self.step = 0
        self.data_pos = 0
        self.epoch = 0
        self.history: list[dict[str, Any]] = []
        self.eval_results: dict[int, list[float | None]] = {}  # step -> per-task reward, test order
        if cfg.resume:
            self._resume(cfg.resume)
        if cfg.resume or kind == "adapter":
            self._sync_generator()  # a separate generator holds the checkpoint's base weights

    # -- the loop ------------------------------------------------------------------------------

    def train(self) -> dict[str, Any]:
        cfg = self.cfg
        with RunLog(self.run_dir, self.accelerator) as log:
            if cfg.eval_every and self.step == 0:  # the "before" number, on the same tasks and seeds
                before = self.evaluate(cfg.eval_tasks)
                self.history.append({"step": 0, **before})
                log.log(0, before)
            while self.step < cfg.max_steps:
                t_start = time.perf_counter()
                tasks = self._next_tasks(cfg.prompts_per_step * cfg.steps_per_generation)
                groups, rollout_s = self._rollout(tasks, seed=cfg.seed * 1_000_003 + self.step * 7919)
                rollout_peak = _peak_memory_gib()
                batch, reward_metrics = self._make_batch(groups)
                for metrics in self._optimize(batch):
                    self.step += 1
                    if rollout_peak is not None:
                        metrics["perf/peak_gib_rollout"] = rollout_peak
                        metrics["perf/peak_gib_train"] = _peak_memory_gib()
                    metrics.update(reward_metrics)
                    metrics.update({f"rollout/{k}": v for k, v in rollout_metrics(groups, rollout_s).items()})
                    step_s = time.perf_counter() - t_start
                    metrics["perf/step_s"] = step_s
                    metrics["perf/sampled_tokens_per_s"] = metrics.get("rollout/sampled_tokens_per_s", 0.0)
                    metrics["perf/eta_s"] = step_s * (cfg.max_steps - self.step)
                    if cfg.eval_every and self.step % cfg.eval_every == 0:
                        metrics.update(self.evaluate(cfg.eval_tasks))
                    self.history.append({k: metrics[k] for k in ("reward/mean", "accuracy", "eval/reward") if k in metrics} | {"step": self.step})
                    if self.step % cfg.log_every == 0 or self.step == cfg.max_steps:
                        log.log(self.step, metrics)
                        sample = [t for g in groups for t in g.ok][: cfg.samples_per_log]
                        log.samples(self.step, sample, self.chat_format.decode)
                    if (cfg.save_every and self.step % cfg.save_every == 0) or (self.step == cfg.max_steps and cfg.save_final):
                        self.save()
                    t_start = time.perf_counter()
                    if self.step >= cfg.max_steps:
                        break
        anyio.run(self.generator.close)
        self._write_curve()
        if self.cfg.report_to:
            self.accelerator.end_training()
        return self.history[-1] if self.history else {}

    def _rollout(self, tasks: list[dict[str, Any]], seed: int, n: int | None = None, engine: RolloutEngine | None = None) -> tuple[list[TrajectoryGroup], float]:
        self.policy.eval()
        start = time.perf_counter()
        n = self.cfg.num_generations if n is None else n
        engine = engine or self.engine
        self._generation_weights(present=True)
        groups = run_with(self.generator, lambda: engine.run(self.env, tasks, n=n, seed=seed))
        if self.cfg.generator.enable_sleep_mode:  # free vLLM's GPU memory for the training step
            self.generator.sleep()
        if torch.cuda.is_available() and hasattr(self.generator, "release_memory"):
            self.generator.release_memory()  # the static KV cache is not needed while training
        self._generation_weights(present=False)
        return groups, time.perf_counter() - start

    def _generation_weights(self, present: bool) -> None:
        """Give the bf16 generation copy its weights for a rollout (cast from the policy), or free them.

        The copy exists only while generating, so the training phase does not carry 2 bytes per
        parameter it never reads. Casting is one pass over the weights (~1 ms per 0.5B on an
        H200); the generator recaptures its graphs every rollout anyway (``release_memory``).
        """
        copy = self._generation_copy
        if copy is None:
            return
        policy = self.accelerator.unwrap_model(self.policy)
        with torch.no_grad():
            for (name, p), (other, q) in zip(policy.named_parameters(), copy.named_parameters(), strict=True):
                assert name == other, f"generation copy out of step with the policy: {name} != {other}"
                q.data = p.detach().to(q.dtype) if present else torch.empty(0, dtype=q.dtype, device=q.device)

    def evaluate(self, n: int) -> dict[str, float]:
        """Mean reward on the first ``n`` test tasks, one episode each at ``eval_temperature``."""
        tasks = list(self.env.dataset("test"))[:n]
        sampling = self.cfg.sampling.model_copy(update={"temperature": self.cfg.eval_temperature})
        engine = RolloutEngine(self.generator, self.chat_format, rollout_config(sampling, self.cfg.rollout))
        groups, _ = self._rollout(tasks, seed=10_000_019, n=1, engine=engine)
        self.eval_results[self.step] = [g.trajectories[0].reward if g.trajectories[0].ok else None for g in groups]
        rewards = [t.reward for g in groups for t in g.ok]
        out = {"eval/reward": sum(rewards) / max(1, len(rewards))}
        correct = [t.rewards.get("correct") for g in groups for t in g.ok if t.rewards.get("correct") is not None]
        if correct:
            out["eval/accuracy"] = sum(correct) / len(correct)
        return out

    # -- rewards and batches ----------------------------------------------------------------------

    def _make_batch(self, groups: list[TrajectoryGroup]) -> tuple[dict[str, Any], dict[str, float]]:
        trajs: list[Trajectory] = []
        group_ids: list[int] = []
        for g, group in enumerate(groups):
            for t in group.ok:
                trajs.append(t)
                group_ids.append(g)
        if not trajs:
            raise RuntimeError("every episode of this generation batch failed; see the rollout errors in samples.jsonl")
        if self.extra_rewards:
            anyio.run(self._score_extra, trajs)
        rewards = torch.tensor([t.reward for t in trajs], dtype=torch.float32)
        adv, adv_metrics = group_advantages(rewards, torch.tensor(group_ids), scale=self.cfg.advantage_scale)
        metrics: dict[str, float] = {"reward/mean": float(rewards.mean()), "reward/std": float(rewards.std()) if len(trajs) > 1 else 0.0}
        components = sorted({k for t in trajs for k in t.rewards})
        for name in components:
            values = [t.rewards[name] for t in trajs if t.rewards.get(name) is not None]
            if values:
                metrics[f"reward/{name}"] = sum(values) / len(values)
        if "reward/correct" in metrics:
            metrics["accuracy"] = metrics["reward/correct"]
        metrics.update({f"adv/{k}": v for k, v in adv_metrics.items()})

        rows = [(s, float(adv[i]), t.truncated) for i, t in enumerate(trajs) for s in t.samples if s.num_sampled > 0]
        batch = self._collate(rows)
        # the trajectories samples.jsonl will show get the trainer's logprobs next to the sampler's
        batch["logged"] = {id(s) for t in trajs[: self.cfg.samples_per_log] for s in t.samples}
        return batch, metrics

    async def _score_extra(self, trajs: list[Trajectory]) -> None:
        """Add the ``extra_rewards`` to each trajectory's reward and components."""
        for t in trajs:
            records = [ToolRecord(**r) for turn in t.turns for r in turn.tool_records]
            context = reward_context(t.task, t.messages, {}, len(t.turns), records)
            total, components = await score(self.extra_rewards, context, per_turn=True, episode=True)
            t.rewards.update(components)
            t.reward += total

    def _collate(self, rows: list[tuple[Any, float, bool]]) -> dict[str, Any]:
        """Left-padded prompts, right-padded completions, so completions align for ``logits_to_keep``."""
        P = max(len(s.prompt_ids) for s, _, _ in rows)
        C = max(len(s.completion_ids) for s, _, _ in rows)
        B = len(rows)
        ids = torch.full((B, P + C), self.pad_id, dtype=torch.long)
        attn = torch.zeros((B, P + C), dtype=torch.long)
        mask = torch.zeros((B, C), dtype=torch.float32)
        sampler = torch.zeros((B, C), dtype=torch.float32)
        for i, (s, _, _) in enumerate(rows):
            p, c = len(s.prompt_ids), len(s.completion_ids)
            ids[i, P - p : P] = torch.tensor(s.prompt_ids)
            ids[i, P : P + c] = torch.tensor(s.completion_ids)
            attn[i, P - p : P + c] = 1
            mask[i, :c] = torch.tensor(s.loss_mask, dtype=torch.float32)
            sampler[i, :c] = torch.tensor(s.logprobs, dtype=torch.float32)
        return {
            "input_ids": ids,
            "attention_mask": attn,
            "mask": mask,
            "sampler_logprobs": sampler,
            "advantages": torch.tensor([a for _, a, _ in rows], dtype=torch.float32),
            "truncated": torch.tensor([tr for _, _, tr in rows], dtype=torch.bool),
            "completion_len": C,
            "samples": [s for s, _, _ in rows],
        }

    # -- optimisation --------------------------------------------------------------------------

    def _logprobs(self, model: Any, batch: dict[str, Any], idx: torch.Tensor, entropy: bool = False) -> Any:
        dev = self.accelerator.device
        ids = batch["input_ids"][idx].to(dev)
        attn = batch["attention_mask"][idx].to(dev)
        # trim columns that are padding for every row of this micro-batch
        width = int(attn.sum(0).nonzero().max()) + 1
        start = int(attn.sum(0).nonzero().min())
        keep = batch["completion_len"] - (ids.shape[1] - width)
        ids, attn = ids[:, start:width], attn[:, start:width]
        with self.accelerator.autocast():
            out = token_logprobs(
                model, ids, attn, logits_to_keep=keep, temperature=self.cfg.sampling.temperature,
                chunk_size=self.cfg.logprob_chunk_size, return_entropy=entropy,
            )
        return out, keep

    def _no_grad_logprobs(self, model: Any, batch: dict[str, Any]) -> torch.Tensor:
        B, C = batch["mask"].shape
        out = torch.zeros((B, C))
        with torch.no_grad():
            for start in range(0, B, self.cfg.micro_batch_size):
                idx = torch.arange(start, min(B, start + self.cfg.micro_batch_size))
                lp, keep = self._logprobs(model, batch, idx)
                out[idx, :keep] = lp.float().cpu()
        return out

    def _optimize(self, batch: dict[str, Any]):
        """Yield one metrics dict per optimizer step taken on this generation batch."""
        cfg = self.cfg
        self.policy.train()
        B = batch["mask"].shape[0]
        reuse = cfg.num_iterations > 1 or cfg.steps_per_generation > 1
        old = self._no_grad_logprobs(self.policy, batch) if reuse else None
        ref = None
        if self.reference.enabled:
            with self.reference.active() as ref_model:
                ref = self._no_grad_logprobs(ref_model, batch)
        if old is not None:
            _keep_trainer_logprobs(batch, torch.arange(B), old)
        chunks = torch.arange(B).chunk(cfg.steps_per_generation)
        for _ in range(cfg.num_iterations):
            for chunk in chunks:
                if len(chunk) == 0:
                    continue
                yield self._optimizer_step(batch, chunk, old, ref)

    def _optimizer_step(self, batch: dict[str, Any], chunk: torch.Tensor, old: Any, ref: Any) -> dict[str, Any]:
        cfg, dev = self.cfg, self.accelerator.device
        t0 = time.perf_counter()
        micro = chunk.split(cfg.micro_batch_size)
        active = batch["mask"][chunk] * (~batch["truncated"][chunk])[:, None] if cfg.mask_truncated_completions else batch["mask"][chunk]
        num_items = self.accelerator.reduce(torch.tensor(float(active.sum()), device=dev), reduction="sum")
        sums: dict[str, float] = {}
        trained_tokens = 0
        for idx in micro:
            (lp, ent), keep = self._logprobs(self.policy, batch, idx, entropy=True)
            if old is None:  # a single pass: these are the logprobs under the sampling weights
                _keep_trainer_logprobs(batch, idx, lp)
            sl = slice(0, keep)
            loss, m = policy_loss(
                lp.float(),
                None if old is None else old[idx][:, sl].to(dev),
                batch["advantages"][idx].to(dev),
                batch["mask"][idx][:, sl].to(dev),
                self.loss_cfg,
                ref_logprobs=None if ref is None else ref[idx][:, sl].to(dev),
                sampler_logprobs=batch["sampler_logprobs"][idx][:, sl].to(dev),
                truncated=batch["truncated"][idx].to(dev) if cfg.mask_truncated_completions else None,
                num_items_in_batch=num_items,
                max_completion_length=batch["completion_len"],
                entropies=ent.float(),
            )
            if self.loss_cfg.loss_type not in GLOBAL_NORMALISED:
                loss = loss / len(micro)
            self.accelerator.backward(loss)
            trained_tokens += int(batch["mask"][idx].sum())
            for k, v in m.items():
                sums[k] = sums.get(k, 0.0) + v / len(micro)
        # max_norm inf: the total norm without clipping, for the finiteness check below
        limit = cfg.max_grad_norm if cfg.max_grad_norm is not None else math.inf
        grad_norm = float(self.accelerator.clip_grad_norm_(self.policy.parameters(), limit))
        skipped = not math.isfinite(grad_norm)
        if skipped:  # a NaN/inf gradient would poison the weights and every later rollout: drop it
            print(f"step {self.step + 1}: non-finite gradient norm ({grad_norm}); update skipped", flush=True)
        else:
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._sync_generator()
        if cfg.ref_mix_alpha is not None and (self.step + 1) % cfg.ref_mix_every == 0:
            self.reference.mix(cfg.ref_mix_alpha)
        train_s = time.perf_counter() - t0
        out = {f"loss/{k}": v for k, v in sums.items()}
        out.update({"lr": self.scheduler.get_last_lr()[0], "perf/train_s": train_s, "perf/trained_tokens_per_s": trained_tokens / train_s})
        out["train/skipped_nonfinite"] = float(skipped)
        if math.isfinite(grad_norm):
            out["grad_norm"] = grad_norm
        return out

    def _sync_generator(self) -> None:
        """Push the new weights to a generator that does not share the policy module."""
        if self._generation_copy is not None:
            return  # cast from the policy at the start of the next rollout (_generation_weights)
        if self.cfg.generator.backend != "transformers":  # vLLM: full weights, LoRA merged, base names
            with push_weights(self.accelerator.unwrap_model(self.policy)) as named:
                self.generator.update_weights(named)

    # -- data, checkpoints, curves -----------------------------------------------------------------

    def _next_tasks(self, n: int) -> list[dict[str, Any]]:
        out = []
        for _ in range(n):
            if self.data_pos >= len(self.order):  # new epoch, new order, still reproducible
                self.data_pos = 0
                self.epoch += 1
                random.Random(self.cfg.seed + self.epoch).shuffle(self.order)
            out.append(dict(self.train_data[self.order[self.data_pos]]))
            self.data_pos += 1
        return out

    def save(self) -> Path:
        path = checkpoint_dir(self.run_dir, self.step)
        model = self.accelerator.unwrap_model(self.policy)
        state = {"step": self.step, "data_pos": self.data_pos, "epoch": self.epoch, "order": self.order, "history": self.history, "policy_kind": self.policy_kind}
        save_checkpoint(path, model, self.tokenizer, self.optimizer, self.scheduler, state)
        prune_checkpoints(self.run_dir, self.cfg.keep_checkpoints)  # this run's own, by step number
        return path

    def _resume(self, resume: str) -> None:
        path = resolve_resume(resume, self.run_dir)
        state = load_checkpoint(path, self.accelerator.unwrap_model(self.policy), self.optimizer, self.scheduler)
        self.step, self.data_pos, self.epoch = state["step"], state["data_pos"], state["epoch"]
        self.order, self.history = state["order"], state["history"]
        print(f"resumed from {path} at step {self.step}", flush=True)

    def _write_curve(self) -> None:
        try:
            from agentrl.plot import smooth, write_curve_png
        except ImportError:
            return
        series: dict[str, list[tuple[float, float]]] = {}
        for key in ("reward/mean", "accuracy", "eval/reward"):
            points = [(h["step"], h[key]) for h in self.history if key in h]
            if points:
                series[key] = points
        if series.get("accuracy") == series.get("reward/mean"):  # the only reward is correctness
            series.pop("accuracy", None)
        if "reward/mean" in series and len(series["reward/mean"]) > 3:
            ys = smooth([y for _, y in series["reward/mean"]], 0.3)
            series["reward (smoothed)"] = [(x, y) for (x, _), y in zip(series["reward/mean"], ys)]
        write_curve_png(self.run_dir / "reward_curve.png", series, title=f"agentrl train {self.cfg.env}", y_label="reward")


def _keep_trainer_logprobs(batch: dict[str, Any], idx: torch.Tensor, logprobs: torch.Tensor) -> None:
    """Store the trainer's logprobs on the logged samples (only those: it costs a device sync)."""
    for j, row in enumerate(idx.tolist()):
        sample = batch["samples"][row]
        if id(sample) in batch["logged"]:
            values = logprobs[j, : len(sample.completion_ids)].detach().float().cpu().tolist()
            sample.trainer_logprobs = [v if m else 0.0 for v, m in zip(values, sample.loss_mask)]


def _generation_base(path: str, kind: str) -> str:
    """The checkpoint a separate generator loads: the policy's, or an adapter's base model."""
    if kind != "adapter":
        return path
    from agentrl.models import resolve_model

    return resolve_model(json.loads((Path(path) / "adapter_config.json").read_text())["base_model_name_or_path"])


def _uses_dropout(model: torch.nn.Module) -> bool:
    """Whether any dropout is active in training (a module with p > 0, or a config dropout > 0)."""
    if any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules()):
        return True
    config = getattr(model, "config", None)
    values = vars(config).items() if config is not None else ()
    return any("dropout" in k and isinstance(v, (int, float)) and v > 0 for k, v in values)


def _peak_memory_gib() -> float | None:
    """Peak CUDA memory allocated since the last call (then reset), so each phase reports its own."""
    if not torch.cuda.is_available():
        return None
    peak = torch.cuda.max_memory_allocated() / 2**30
    torch.cuda.reset_peak_memory_stats()
    return peak


def _check_trackers(names: list[str]) -> None:
    """Asked-for trackers must be installed: fail at start-up, not after the first step."""
    import importlib.util

    from agentrl.config import ConfigError

    modules = {"tensorboard": ("tensorboard", "tensorboardX"), "wandb": ("wandb",), "trackio": ("trackio",)}
    for name in names:
        if not any(importlib.util.find_spec(m) for m in modules[name]):
            raise ConfigError(f"report_to: {name} is not installed (pip install {modules[name][0]})")


def _load_reward(spec: Any) -> Reward:
    fn = load_object(spec.fn)
    return Reward(fn, weight=spec.weight, name=spec.name or getattr(fn, "__name__", spec.fn))
