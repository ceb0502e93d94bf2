"""Find where the CUDA-graph decode path turns a training run non-finite (open problem, docs/performance.md).

    python benchmarks/diagnose_nonfinite.py <mode> [--model <folder>]

Runs three agentrl steps of the gpu_vs_trl.py 8x8x256 single-turn setup with
``generator.cuda_graphs=true`` and prints, per step, whether the sampler logprobs of the rollout
and the policy after the update are finite. Modes isolate one suspect each:
``default``; ``norelease`` (static caches and graphs kept between rollout and training);
``sync`` (device synchronised after each decode batch); ``nogqa`` (transformers' SDPA for the
decode token instead of the grouped-query attention).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_vs_trl as bench  # noqa: E402

import agentrl.trainer as T  # noqa: E402
from agentrl.generators import transformers as TG
ap = argparse.ArgumentParser()
ap.add_argument("mode", choices=["default", "norelease", "sync", "nogqa"])
ap.add_argument("--model", default="/tmp/q05")
args = ap.parse_args()
mode = args.mode
orig_sync = T.Trainer._sync_generator
def sync(self):
    pol = self.accelerator.unwrap_model(self.policy)
    bad = sum(not torch.isfinite(p).all() for p in pol.parameters())
    orig_sync(self)
    print(f"[{mode}] after optimizer step {self.step + 1}: non-finite policy tensors={bad}", flush=True)
T.Trainer._sync_generator = sync
orig_mb = T.Trainer._make_batch
def make_batch(self, groups):
    batch, m = orig_mb(self, groups)
    s = batch["sampler_logprobs"]; mask = batch["mask"] > 0
    print(f"[{mode}] rollout before step {self.step + 1}: sampler logprobs non-finite={int((~torch.isfinite(s[mask])).sum())} min={float(s[mask].min()):.3g}", flush=True)
    return batch, m
T.Trainer._make_batch = make_batch
if mode == "norelease":
    TG.TransformersGenerator.release_memory = lambda self: None
if mode == "sync":
    orig_dec = TG.TransformersGenerator._decode_static
    def dec(self, reqs):
        out = orig_dec(self, reqs); torch.cuda.synchronize(); return out
    TG.TransformersGenerator._decode_static = dec
if mode == "nogqa":
    import agentrl.generators.static_decode as sd
    sd._register_gqa_decode = lambda: False
r = bench.run_agentrl(args.model, 8, 8, 256, 3, False)
print(mode, {k: r[k] for k in ("step_s", "gen_s")})
