"""Find where the CUDA-graph decode path turns a training run non-finite (docs/performance.md).

    python benchmarks/diagnose_nonfinite.py <mode> [<mode> ...] [--model <folder>] [--steps 3]

Runs agentrl steps of the gpu_vs_trl.py 8x8x256 single-turn setup and prints, per step: the
sampler logprobs of the rollout (non-finite count, minimum), the largest sampled token id, what
goes into the loss (trainer logprobs, entropies, the loss itself) and the gradient norm. Modes
isolate one suspect each: ``default`` (``generator.cuda_graphs=true``); ``dynamic`` (the dynamic
cache, the control); ``eager`` (the static cache without graphs); ``norelease`` (static caches
and graphs kept between rollout and training); ``sync`` (device synchronised after each decode
batch); ``nogqa`` (transformers' SDPA for the decode token instead of the grouped-query attention).
Each mode runs in its own process.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

MODES = ["default", "dynamic", "eager", "norelease", "sync", "nogqa"]


def run(mode: str, model: str, steps: int) -> None:
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gpu_vs_trl as bench

    import agentrl.learn.learner as L
    import agentrl.train.trainer as T
    from agentrl.generators.hf import generator as TG
    def say(msg: str) -> None:
        print(f"[{mode}] {msg}", flush=True)

    orig_mb = T.build_batch

    def make_batch(groups, **kw):  # type: ignore[no-untyped-def]
        batch = orig_mb(groups, **kw)
        v = batch.sampler_logprobs[batch.loss_mask > 0]
        say(f"rollout: sampler lp nan={int(v.isnan().sum())} -inf={int(v.isneginf().sum())} "
            f"min={float(v[torch.isfinite(v)].min()):.3g} mean={float(v[torch.isfinite(v)].mean()):.3g} "
            f"max id={int(batch.input_ids.max())}")
        return batch

    T.build_batch = make_batch
    orig_loss = L.policy_loss

    def policy_loss(lp, old, adv, mask, cfg, **kw):  # type: ignore[no-untyped-def]
        m = mask > 0
        smp = kw.get("sampler_logprobs")
        ent = kw.get("entropies")
        diff = (lp.detach() - smp)[m] if smp is not None else None
        loss, out = orig_loss(lp, old, adv, mask, cfg, **kw)
        say(f"  micro: lp nonfinite={int((~torch.isfinite(lp[m])).sum())} min={float(lp[m].min()):.3g} "
            f"ent nonfinite={int((~torch.isfinite(ent[m])).sum()) if ent is not None else '-'} "
            f"|lp-sampler| max={float(diff.abs().max()) if diff is not None else '-'} "
            f"mean={float(diff.mean()) if diff is not None else '-'} adv nonfinite={int((~torch.isfinite(adv)).sum())} "
            f"loss={float(loss):.4g}")
        return loss, out

    L.policy_loss = policy_loss
    orig_step = L.Learner._optimizer_step

    def opt_step(self, *a, **k):  # type: ignore[no-untyped-def]
        out = orig_step(self, *a, **k)
        pol = self.accelerator.unwrap_model(self.policy)
        bad = sum(not torch.isfinite(p).all() for p in pol.parameters())
        say(f"step {a[-1]}: grad_norm={out.get('grad_norm')} skipped={out.get('train/skipped_nonfinite')} "
            f"non-finite policy tensors={bad}")
        return out

    L.Learner._optimizer_step = opt_step
    extra = os.environ.get("AGENTRL_BENCH_EXTRA", "")
    if mode == "dynamic":
        extra += " generator.cuda_graphs=false"
    if mode == "eager":
        from agentrl.generators.hf import static_decode as sd
        init = sd.StaticDecoder.__init__

        def eager_init(self, *a, **k):  # type: ignore[no-untyped-def]
            k["use_graphs"] = False
            init(self, *a, **k)

        sd.StaticDecoder.__init__ = eager_init
    if mode == "norelease":
        TG.TransformersGenerator.release_memory = lambda self: None
    if mode == "sync":
        orig_dec = TG.TransformersGenerator._decode_static

        def dec(self, reqs):  # type: ignore[no-untyped-def]
            out = orig_dec(self, reqs)
            torch.cuda.synchronize()
            return out

        TG.TransformersGenerator._decode_static = dec
    if mode == "nogqa":
        from agentrl.generators.hf import static_decode as sd
        sd._register_gqa_decode = lambda: False
    os.environ["AGENTRL_BENCH_EXTRA"] = extra
    r = bench.run_agentrl(model, 8, 8, 256, steps, False)
    say(str({k: r[k] for k in ("step_s", "gen_s", "static_decode")}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("modes", nargs="+", choices=MODES)
    ap.add_argument("--model", default="/tmp/q05")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        run(args.modes[0], args.model, args.steps)
        return
    for mode in args.modes:  # one process per mode: no state leaks between them
        subprocess.run([sys.executable, __file__, mode, "--model", args.model, "--steps", str(args.steps), "--inner"], check=False)


if __name__ == "__main__":
    main()
