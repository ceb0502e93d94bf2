"""The learning side of a step: log-probs of a ``Batch`` and the optimizer steps taken on it.

Why its own module: the trainer's loop should read as rollouts -> batch -> learn -> sync. This
owns everything between a ``Batch`` and updated weights: old/reference log-probs (chunked over the
vocabulary), micro-batches with gradient accumulation, the one ``policy_loss`` call, clipping,
the non-finite-gradient guard, optimizer and scheduler, and the TR-DPO reference mix.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from typing import Any

import torch
from accelerate.utils import AutocastKwargs

from agentrl.compute.compile_layers import CAPTURE_LOCK, CompiledLayers
from agentrl.compute.packed import packing_refusal
from agentrl.compute.parallel.distributed import learner_rows, mean_over_ranks
from agentrl.compute.parallel.strategy import Strategy, make_strategy
from agentrl.compute.reference import Reference
from agentrl.learn import packing
from agentrl.learn.batch import Batch
from agentrl.learn.config import LearnerConfig
from agentrl.learn.losses import LossConfig, StepCounts, local_counts, policy_loss

# Compiled layers see sequence lengths padded up to a multiple of this. On CUDA inductor specialises
# on whether a length is a multiple of 8 (its alignment guard), so the first micro-batch of another
# kind compiled the layers again, mid-step (every GPU run's recompile log). The extra columns are
# right padding after every row's last token: causal attention keeps them out of every real
# position, and no log-prob is read there.
ALIGN = 8


class Learner:
    """Takes optimizer steps on batches; ``policy`` etc. are the accelerate-prepared objects."""

    def __init__(
        self, accelerator: Any, policy: Any, optimizer: Any, scheduler: Any, reference: Reference, loss: LossConfig, settings: LearnerConfig,
        compiled: CompiledLayers | None = None, strategy: Strategy | None = None,
    ) -> None:
        self.accelerator, self.policy, self.optimizer, self.scheduler = accelerator, policy, optimizer, scheduler
        self.reference, self.loss, self.settings = reference, loss, settings
        self.compiled = compiled  # compiled decoder layers for the training forward/backward (agentrl/compute/compile_layers.py)
        # how the policy is spread over ranks: which module the log-prob path runs, who averages gradients
        self.strategy = strategy if strategy is not None else make_strategy("ddp", accelerator.num_processes)[0]
        self.model = self.strategy.learner_model(accelerator, policy)
        # autocast keeps the bf16 copy of every weight it casts until the forward ends: with
        # gradient checkpointing that is the whole decoder (0.67 GiB at 0.5B) alive at the end of
        # each micro-batch's forward, the moment of the step's peak. Each weight is used once per
        # forward (the fused head casts its own), so without the cache nothing is cast twice.
        self._autocast = AutocastKwargs(cache_enabled=settings.autocast_cache)
        self.computed_tokens = 0  # decoder columns of the last step's training forwards (a metric, perf/computed_tokens)
        self.packed = settings.pack_sequences  # packed micro-batches (agentrl/learn/packing.py), unless the model cannot be
        if self.packed and (why := packing_refusal(accelerator.unwrap_model(policy))):
            print(f"pack_sequences: off, {why}; training padded micro-batches of micro_batch_size rows", flush=True)
            self.packed = False
        if accelerator.device.type == "cuda":
            # Process-wide: no cuDNN attention. Training rows run unmasked, so SDPA would pick
            # cuDNN's, which builds an execution plan on the host for every new shape, and every
            # micro-batch has a new length: 2.6 ms of host time per forward call and 3.6 ms per
            # backward, 0.82 s of a 2.16 s multi-turn training phase (H200, profile_train.py,
            # benchmarks/RESULTS.md) whose kernels took 0.2 s. Flash attention has no per-shape
            # plan. Set before the first compiled forward traces its attention (a scoped
            # ``sdpa_kernel`` preference did not reach the compiled graphs), and process-wide
            # because the checkpoint recompute in backward must pick the forward's kernel.
            torch.backends.cuda.enable_cudnn_sdp(False)

    def learn(self, batch: Batch, step: int) -> Iterator[dict[str, Any]]:
        """Yield one metrics dict per optimizer step taken on ``batch`` (``step``: steps taken before)."""
        s = self.settings
        self.policy.train()
        B = len(batch)
        # with several ranks each trains on its part of every step's rows (agentrl.compute.parallel.distributed)
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        chunks = learner_rows(B, s.steps_per_generation, rank, world, batch.group_ids if self.packed and s.share_prompt else None)
        mine = torch.cat(chunks)
        reuse = s.num_iterations > 1 or s.steps_per_generation > 1
        old = self._no_grad_logprobs(self.model, batch, mine) if reuse else None
        ref = None
        if self.reference.enabled:
            with self.reference.active() as ref_model:
                ref = self._no_grad_logprobs(ref_model, batch, mine)
        if old is not None:
            _keep_trainer_logprobs(batch, mine, old[mine])
        for _ in range(s.num_iterations):
            for chunk in chunks:
                if len(chunk) == 0:
                    continue
                step += 1
                yield self._optimizer_step(batch, chunk, old, ref, step)

    def _micro_batches(self, batch: Batch, rows: torch.Tensor) -> list[torch.Tensor]:
        """``rows`` in micro-batches; longest rows first and together when ``sort_by_length``.

        Packed (``pack_sequences``): up to ``micro_batch_tokens`` computed tokens each (agentrl/learn/packing.py).
        Otherwise each micro-batch is padded to its longest row, so mixing a 900-token multi-turn row with
        200-token ones pays for 900 x micro_batch_size. The split does not change the step's loss:
        every micro-batch loss is normalised by the step's totals and they are summed.
        """
        if self.packed:
            return packing.micro_batches(batch, rows, self.settings.micro_batch_tokens, self.settings.share_prompt)
        if self.settings.sort_by_length and len(rows) > 1:
            order = torch.sort(batch.lengths[rows], descending=True, stable=True).indices
            rows = rows[order]
        micro = list(rows.split(self.settings.micro_batch_size))
        if self.settings.micro_batch_size > 1 and len(micro) > 1 and len(micro[-1]) == 1:
            # no lone last row: the compiled layers specialise a batch of one and would compile
            # again, mid-run (seconds on a GPU), the first time rows % micro_batch_size == 1
            micro[-2:] = [micro[-2][:-1], torch.cat([micro[-2][-1:], micro[-1]])]
        return micro

    def _logprobs(self, model: Any, batch: Batch, idx: torch.Tensor, entropy: bool = False) -> tuple[Any, int]:
        s, dev = self.settings, self.accelerator.device
        width = int(batch.lengths[idx].max())  # trim the padding every row of this micro-batch has
        keep = int((batch.lengths[idx] - batch.starts[idx]).max())
        only = batch.loss_mask[idx, :keep] > 0 if s.score_sampled_only else None
        kwargs = dict(temperature=s.temperature, chunk_size=s.logprob_chunk_size, return_entropy=entropy, only=only, head=s.logprob_head)
        align = ALIGN if self.compiled is not None else 1
        if self.packed:
            rows = packing.layout(batch, idx, keep, s.share_prompt, s.micro_batch_tokens, align)
            self.computed_tokens += rows.tokens
            with self.accelerator.autocast(self._autocast):
                out = self.strategy.packed_logprobs(model, rows, keep, compiled=self.compiled is not None, **kwargs)
            return out, keep
        ids = batch.input_ids[idx, :width].to(dev)
        if width % align:
            ids = torch.nn.functional.pad(ids, (0, align - width % align))  # see ALIGN
        self.computed_tokens += ids.numel()
        with self.accelerator.autocast(self._autocast):
            out = self.strategy.logprobs(model, ids, batch.starts[idx], keep, compiled=self.compiled is not None, **kwargs)
        return out, keep

    def _lockstep(self, micro: list[torch.Tensor]) -> list[tuple[torch.Tensor, bool]]:
        """``(rows, real)`` per forward. Sharded, every rank runs as many forwards as the busiest
        (each is collective); the extra ones rerun a row with zero weight (``real`` False)."""
        return self.strategy.lockstep(micro, self.accelerator.device)

    def _no_grad_logprobs(self, model: Any, batch: Batch, rows: torch.Tensor) -> torch.Tensor:
        """[B, C] log-probs of ``rows`` (this rank's rows; the others stay 0)."""
        B, C = batch.loss_mask.shape
        out = torch.zeros((B, C))
        with torch.no_grad():
            for idx, real in self._lockstep(self._micro_batches(batch, rows)):
                lp, keep = self._logprobs(model, batch, idx)
                if real:
                    out[idx, :keep] = lp.float().cpu()
        return out

    def _optimizer_step(self, batch: Batch, chunk: torch.Tensor, old: Any, ref: Any, step: int) -> dict[str, Any]:
        """One optimizer step; if compiling the layers fails on the first one, it is taken eagerly instead."""
        if self.compiled is None or self.compiled.proven:
            return self._step(batch, chunk, old, ref, step)
        try:
            with CAPTURE_LOCK:  # compiling must not overlap a generator's graph capture on another thread
                out = self._step(batch, chunk, old, ref, step)
        except Exception as e:  # noqa: BLE001 - any failure of the first compiled step is retried eagerly, once
            reason = (str(e).strip().splitlines() or [""])[0][:200]
            print(f"compile_learner: the compiled training forward failed ({type(e).__name__}: {reason}); training eagerly", flush=True)
            self.compiled = None
            self.optimizer.zero_grad(set_to_none=True)
            return self._step(batch, chunk, old, ref, step)
        self.compiled.proven = True
        return out

    def _step(self, batch: Batch, chunk: torch.Tensor, old: Any, ref: Any, step: int) -> dict[str, Any]:
        s, dev = self.settings, self.accelerator.device
        t0, c0 = time.perf_counter(), time.process_time()
        micro = self._micro_batches(batch, chunk)
        truncated = batch.truncated if s.mask_truncated_completions else None
        # the step's totals over every micro-batch and rank: each loss normalises by them, so the
        # micro-batch losses sum to the step's loss (docs/losses.md, "the trainer contract")
        totals = local_counts(batch.loss_mask[chunk], None if truncated is None else truncated[chunk])
        totals = torch.cat([totals, torch.tensor([float(len(micro))], dtype=torch.float64)]).to(dev)
        totals = self.accelerator.reduce(totals, reduction="sum")
        counts = StepCounts.from_totals(
            totals[:3].cpu(), int(totals[3]), num_processes=self.accelerator.num_processes,
            max_completion_length=s.max_completion_tokens,
        )
        sums: dict[str, float] = {}
        trained_tokens = 0
        self.computed_tokens = 0  # decoder columns of this step's training forwards (padding and repeated prompts included)
        for idx, real in self._lockstep(list(micro)):
            # compiled layers for the forward and the backward (its checkpoint recompute included)
            with self.compiled.active() if self.compiled is not None else contextlib.nullcontext():
                (lp, ent), keep = self._logprobs(self.model, batch, idx, entropy=True)
                if not real:  # sharded: pairs up the other ranks' collectives; adds nothing to the gradient
                    self.accelerator.backward(lp.sum() * 0.0)
                    continue
                if old is None:  # a single pass: these are the logprobs under the sampling weights
                    _keep_trainer_logprobs(batch, idx, lp)
                loss, m = self._loss(batch, idx, keep, lp, ent, old, ref, counts, truncated)
                self.accelerator.backward(loss)  # the micro-batch losses sum to the step's loss
            trained_tokens += int(batch.loss_mask[idx].sum())
            for k, v in m.items():
                sums[k] = sums.get(k, 0.0) + (v if k == "loss" else v / len(micro))  # loss shares add up
        self.strategy.average_gradients(self.model)
        # max_norm inf: the total norm without clipping, for the finiteness check below
        limit = s.max_grad_norm if s.max_grad_norm is not None else math.inf
        grad_norm = float(self.strategy.full_tensor(self.accelerator.clip_grad_norm_(self.policy.parameters(), limit)))
        skipped = not math.isfinite(grad_norm)
        if skipped:  # a NaN/inf gradient would poison the weights and every later rollout: drop it
            print(f"step {step}: non-finite gradient norm ({grad_norm}); update skipped", flush=True)
        else:
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if s.ref_mix_alpha is not None and step % s.ref_mix_every == 0:
            self.reference.mix(s.ref_mix_alpha)
        train_s = time.perf_counter() - t0
        if self.accelerator.num_processes > 1:  # each rank saw its rows: the mean over ranks (loss: their sum of shares)
            sums = mean_over_ranks(self.accelerator, sums)
        out = {f"loss/{k}": v for k, v in sums.items()}
        out.update({"lr": self.scheduler.get_last_lr()[0], "perf/train_s": train_s, "perf/trained_tokens_per_s": trained_tokens / train_s})
        out["perf/computed_tokens"] = float(self.computed_tokens)
        out["perf/train_cpu_s"] = time.process_time() - c0  # this process's CPU time: steadier than wall on a shared machine
        out["train/skipped_nonfinite"] = float(skipped)
        if math.isfinite(grad_norm):
            out["grad_norm"] = grad_norm
        return out

    def _loss(
        self, batch: Batch, idx: torch.Tensor, keep: int, lp: torch.Tensor, ent: torch.Tensor, old: Any, ref: Any,
        counts: StepCounts, truncated: torch.Tensor | None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The one ``policy_loss`` call: this micro-batch's share of the step's loss."""
        dev, sl = self.accelerator.device, slice(0, keep)
        loss, metrics = policy_loss(
            lp.float(),
            None if old is None else old[idx][:, sl].to(dev),
            batch.advantages[idx][:, sl].to(dev),
            batch.loss_mask[idx][:, sl].to(dev),
            self.loss,
            counts=counts,
            ref_logprobs=None if ref is None else ref[idx][:, sl].to(dev),
            sampler_logprobs=batch.sampler_logprobs[idx][:, sl].to(dev),
            truncated=None if truncated is None else truncated[idx].to(dev),
            entropies=ent.float(),
        )
        return loss, metrics


def _keep_trainer_logprobs(batch: Batch, idx: torch.Tensor, logprobs: torch.Tensor) -> None:
    """Store the trainer's logprobs on the logged samples (only those: it costs a device sync)."""
    for j, row in enumerate(idx.tolist()):
        if not bool(batch.logged[row]):
            continue
        sample = batch.samples[row]
        values = logprobs[j, : len(sample.completion_ids)].detach().float().cpu().tolist()
        sample.trainer_logprobs = [v if m else 0.0 for v, m in zip(values, sample.loss_mask)]
