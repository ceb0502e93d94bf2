"""Find where a multi-turn GPU training run turns non-finite (issue: skipped steps with CUDA graphs).

    python benchmarks/diagnose_multiturn.py --model <sft folder> --mode graphs|dynamic [--steps 12]

Runs the multi-turn calculator row of gpu_vs_trl.py (benchmarks/multiturn_bench.py) with checks
at every stage: the rollout's sampler log-probs (non-finite, positive, their gap to the trainer's),
each micro-batch's trainer log-probs and loss, and the gradients after every micro-batch's
backward. At the first non-finite gradient it replays that micro-batch row by row (same autocast,
then float32, then without gradient checkpointing) to find the rows and the stage that produce it,
and saves the micro-batch to ``$OUT/bad_batch_<mode>.pt`` when ``OUT`` is set.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def _finite_grads(model: torch.nn.Module) -> tuple[bool, list[str]]:
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    return not bad, bad


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--mode", choices=["graphs", "dynamic"], default="graphs")
    ap.add_argument("--steps", type=int, default=12)
    args = ap.parse_args()
    sys.path.insert(0, HERE)
    import accelerate
    import multiturn_bench

    import agentrl.learn.learner as L

    mode = args.mode

    def say(msg: str) -> None:
        print(f"[{mode}] {msg}", flush=True)

    state: dict[str, Any] = {"found": 0, "analysed": False, "step": 0, "micro": 0}

    orig_learn = L.Learner.learn

    def learn(self: Any, batch: Any, step: int) -> Any:
        s, mask = batch.sampler_logprobs, batch.loss_mask > 0
        v = s[mask]
        fin = torch.isfinite(v)
        say(f"rollout {step + 1}: rows={mask.shape[0]} active={int(mask.sum())} sampler nan={int(v.isnan().sum())} "
            f"inf={int((~fin & ~v.isnan()).sum())} positive={int((v > 1e-6).sum())} min={float(v[fin].min()):.3g} "
            f"C={batch.completion_len} W={batch.input_ids.shape[1]}")
        state["trainer"] = self
        return orig_learn(self, batch, step)

    L.Learner.learn = learn

    orig_tlp = L.completion_logprobs

    def completion_logprobs(model: Any, ids: torch.Tensor, starts: torch.Tensor, width: int, **kw: Any) -> Any:
        if torch.is_grad_enabled():
            state["inputs"] = (ids.detach().clone(), starts.detach().clone(), dict(kw, width=width))
        return orig_tlp(model, ids, starts, width, **kw)

    L.completion_logprobs = completion_logprobs

    orig_loss = L.policy_loss

    def policy_loss(lp: torch.Tensor, old: Any, adv: torch.Tensor, mask: torch.Tensor, cfg: Any, **kw: Any) -> Any:
        m = mask > 0
        smp = kw.get("sampler_logprobs")
        loss, out = orig_loss(lp, old, adv, mask, cfg, **kw)
        gap = (lp.detach() - smp)[m] if smp is not None else torch.zeros(1)
        state["loss_inputs"] = {"lp": lp.detach().clone(), "mask": mask.clone(), "sampler": None if smp is None else smp.clone(),
                                "adv": adv.clone(), "old": None if old is None else old.clone()}
        state["micro"] += 1
        if not torch.isfinite(loss) or not torch.isfinite(lp[m]).all() or not torch.isfinite(gap).all() or float(gap.abs().max()) > 5:
            say(f"  micro {state['micro']}: loss={float(loss):.4g} lp nonfinite(active)={int((~torch.isfinite(lp[m])).sum())} "
                f"lp nonfinite(all)={int((~torch.isfinite(lp)).sum())} |lp-sampler| max={float(gap.abs().max()):.3g}")
        return loss, out

    L.policy_loss = policy_loss

    orig_backward = accelerate.Accelerator.backward

    def backward(self: Any, loss: torch.Tensor, **kw: Any) -> None:
        orig_backward(self, loss, **kw)
        trainer = state.get("trainer")
        if trainer is None:
            return
        policy = self.unwrap_model(trainer.policy)  # trainer: the Learner
        ok, bad = _finite_grads(policy)
        if ok and not (os.environ.get("DIAG_FORCE") and not state["analysed"]):  # DIAG_FORCE: exercise the replay
            return
        state["found"] += 1
        say(f"  NON-FINITE GRADIENT after micro {state['micro']} (loss {float(loss):.4g}): {len(bad)} tensors, first {bad[:3]}")
        if not state["analysed"]:
            state["analysed"] = True
            analyse(trainer, policy)

    accelerate.Accelerator.backward = backward

    def analyse(trainer: Any, policy: torch.nn.Module) -> None:
        ids, starts, kw = state["inputs"]
        li = state["loss_inputs"]
        saved = {n: p.grad.clone() if p.grad is not None else None for n, p in policy.named_parameters()}
        out_dir = os.environ.get("OUT")
        if out_dir:
            torch.save({"ids": ids.cpu(), "starts": starts.cpu(), "kw": {k: v for k, v in kw.items() if not callable(v)},
                        **{k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in li.items()}},
                       os.path.join(out_dir, f"bad_batch_{mode}.pt"))
        mask = li["mask"]
        for r in range(ids.shape[0]):
            act = mask[r] > 0
            lp_r, smp_r = li["lp"][r], li["sampler"][r] if li["sampler"] is not None else None
            say(f"    row {r}: prompt={int(starts[r])} width={ids.shape[1]} active={int(act.sum())} "
                f"lp(active) min={float(lp_r[act].min()) if act.any() else 0:.3g} lp nonfinite(all)={int((~torch.isfinite(lp_r)).sum())} "
                f"sampler(active) min={float(smp_r[act].min()) if smp_r is not None and act.any() else 0:.3g} "
                f"adv={float(li['adv'][r]):.3g} max id={int(ids[r].max())}")
        variants = [("autocast+ckpt", True, True), ("fp32+ckpt", False, True), ("autocast, no ckpt", True, False)]
        for name, autocast, ckpt in variants:
            bad_rows = []
            for r in range(ids.shape[0]):
                policy.zero_grad(set_to_none=True)
                if not ckpt:
                    policy.gradient_checkpointing_disable()
                with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=autocast):
                    lp = orig_tlp(policy, ids[r : r + 1], starts[r : r + 1], **{k: v for k, v in kw.items() if k != "return_entropy"})
                m = mask[r : r + 1, : lp.shape[1]].to(lp.device)
                loss = torch.where(m > 0, lp, 0.0).sum()
                loss.backward()
                if not ckpt:
                    policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False, "preserve_rng_state": False})
                fwd_bad = int((~torch.isfinite(lp)).sum())
                ok, _ = _finite_grads(policy)
                if not ok or fwd_bad:
                    bad_rows.append((r, fwd_bad))
            say(f"    replay {name}: rows with non-finite grad or forward: {bad_rows}")
        with torch.no_grad():
            for r in range(ids.shape[0]):
                out = policy.model(input_ids=ids[r : r + 1], output_hidden_states=True, use_cache=False)
                firsts = [i for i, h in enumerate(out.hidden_states) if not torch.isfinite(h).all()]
                if firsts:
                    h = out.hidden_states[firsts[0]]
                    cols = (~torch.isfinite(h)).any(-1)[0].nonzero().flatten().tolist()
                    say(f"    row {r}: fp32 forward first non-finite hidden state at layer {firsts[0]}, columns {cols[:10]}")
        for n, p in policy.named_parameters():
            p.grad = saved[n]
        del saved

    os.environ.setdefault("AGENTRL_BENCH_EXTRA", "")
    if mode == "dynamic":
        os.environ["AGENTRL_BENCH_EXTRA"] += " generator.cuda_graphs=false generator.compile_decode=false"
    r = multiturn_bench.run_agentrl(args.model, 8, 8, args.steps)
    say(f"RESULT skipped={r['skipped_steps']} non-finite micro-batch gradients={state['found']} reward={r['reward']:.3f} "
        f"well_formed={r['well_formed']:.3f} calls/ep={r['tool_calls_per_episode']:.2f} step_s={r['step_s']:.2f}")


if __name__ == "__main__":
    main()
