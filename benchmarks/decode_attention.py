"""One decode step's attention alone, over a left-padded KV cache: which kernel reads it fastest.

    python benchmarks/decode_attention.py [--batch 256 --columns 256,512,640 --heads 14 --kv-heads 2]

The static decoder's step gives every layer one query token per row, the cache's active columns
and a boolean mask of the columns each row attends to (left padding; admitted rows). Call 13 of
benchmarks/RESULTS.md measured the memory-efficient SDPA kernel at 49 us per layer for 67 MB of
keys and values (256 rows x 512 columns, Qwen2.5-0.5B shape, H100), ~2.5x the bandwidth bound.
This times the candidates on the same inputs and checks each against float32 math:

- ``sdpa_bool``: what the decoder runs now (query heads grouped under their KV head, bool mask);
- ``sdpa_float``: the same with an additive float mask made once (as a step could, for all layers);
- ``math``: grouped matmul, masked softmax in float32, matmul (cuBLAS batched GEMMs);
- ``math_compiled``: that under ``torch.compile`` (inductor fuses the mask and softmax);
- ``graph24_bool`` / ``graph24_float``: SDPA with either mask, 24 calls captured in one CUDA graph
  and replayed (per-call time without launches, as inside the captured decode step);
- ``flex``: ``flex_attention`` compiled with the mask as a score modification (flex decoding's
  split-KV kernel for short queries).

Prints microseconds per call, the bytes of keys and values read, the achieved bandwidth, and the
largest difference from the float32 reference.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F


def bench(fn, n: int = 200) -> float:
    """Microseconds per call, from CUDA events around ``n`` calls after warm-up."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--columns", default="256,512,640")
    ap.add_argument("--heads", type=int, default=14)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    args = ap.parse_args()
    from torch.nn.attention.flex_attention import flex_attention

    B, H, KV, D = args.batch, args.heads, args.kv_heads, args.head_dim
    flex = torch.compile(flex_attention, dynamic=False)

    def math(q, k, v, mask):
        s = (q @ k.transpose(-1, -2)).float() * q.shape[-1] ** -0.5  # bf16 GEMM, float32 softmax
        s = s.masked_fill(~mask, float("-inf"))
        return s.softmax(-1).to(v.dtype) @ v

    math_compiled = torch.compile(math, dynamic=False)
    for A in [int(c) for c in args.columns.split(",")]:
        columns(A, B, H, KV, D, flex, math, math_compiled)


def graphed(fn, layers: int):
    """``fn`` called ``layers`` times inside one CUDA graph; the returned callable replays it and
    gives the last output, so ``bench`` divided by ``layers`` is one call's time without launches."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(layers):
            out = fn()

    def replay():
        graph.replay()
        return out

    replay.layers = layers
    return replay


def columns(A: int, B: int, H: int, KV: int, D: int, flex, math, math_compiled) -> None:
    """Time every candidate at ``A`` active columns and print one line each."""
    dev, G = torch.device("cuda"), H // KV
    torch.manual_seed(0)
    q = torch.randn(B, KV, G, D, device=dev, dtype=torch.bfloat16)  # grouped: G query heads per KV head
    k = torch.randn(B, KV, A, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, KV, A, D, device=dev, dtype=torch.bfloat16)
    start = torch.randint(0, A // 4, (B,), device=dev)  # left padding of up to a quarter
    valid = torch.arange(A, device=dev)[None] >= start[:, None]  # [B, A]
    mask = valid[:, None, None, :]  # [B, 1, 1, A]
    bias = torch.zeros(B, 1, 1, A, device=dev, dtype=torch.bfloat16).masked_fill(~mask, float("-inf"))
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)  # float32 reference

    def score_mod(score, b, h, q_idx, kv_idx):
        return torch.where(valid[b, kv_idx], score, -float("inf"))

    qh = q.reshape(B, H, 1, D)  # query head h reads KV head h // G
    candidates = {
        "sdpa_bool": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
        "sdpa_float": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias),
        "math": lambda: math(q, k, v, mask),
        "math_compiled": lambda: math_compiled(q, k, v, mask),
        "flex": lambda: flex(qh, k, v, score_mod=score_mod, enable_gqa=True).reshape(B, KV, G, D),
    }
    for kind, m in (("bool", mask), ("float", bias)):  # as a decode step runs them: 24 layers in one replayed graph
        candidates[f"graph24_{kind}"] = graphed(lambda m=m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), 24)
    nbytes = 2 * k.numel() * k.element_size()
    for name, fn in candidates.items():
        try:
            err = (fn().float() - ref).abs().max().item()
            us = bench(fn) / getattr(fn, "layers", 1)
            print(json.dumps({"columns": A, "kernel": name, "us": round(us, 1), "kv_mb": round(nbytes / 1e6, 1),
                              "gb_per_s": round(nbytes / us / 1e3, 0), "max_err": float(f"{err:.2e}")}), flush=True)
        except Exception as e:  # noqa: BLE001 - a candidate that fails is reported, the others still run
            print(json.dumps({"columns": A, "kernel": name, "error": f"{type(e).__name__}: {str(e)[:300]}"}), flush=True)


if __name__ == "__main__":
    main()
