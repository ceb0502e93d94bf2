"""The Triton split-KV decode attention (``generator.decode_attention=split``) against float32 SDPA.

On this CPU the kernel runs through Triton's interpreter (in a subprocess: ``TRITON_INTERPRET`` is
read when Triton compiles a kernel's launcher); the GPU group checks it compiled, in bf16 and
through a captured decode (tests/test_generator_cuda.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from agentrl.generators import decode_kernel

CHECK = textwrap.dedent(
    """
    import json, torch, torch.nn.functional as F
    from agentrl.generators.decode_kernel import split_kv_attention, split_columns
    torch.manual_seed(0)
    out = []
    # (rows, KV heads, query heads per KV head, head size, active columns, cache columns, dtype)
    for B, KV, G, D, A, C, dt in [(3, 2, 7, 64, 300, 385, torch.float16), (4, 2, 2, 128, 130, 257, torch.float16),
                                  (2, 1, 4, 32, 64, 65, torch.float32), (2, 2, 16, 64, 520, 640, torch.float32)]:
        q = torch.randn(B, KV, G, D, dtype=dt)
        cache_k, cache_v = torch.randn(B, KV, C, D, dtype=dt), torch.randn(B, KV, C, D, dtype=dt)
        k, v = cache_k[:, :, :A], cache_v[:, :, :A]  # a static cache's active columns: strided
        start = torch.randint(0, A // 2, (B,))
        start[0] = A  # row 0 attends to nothing
        valid = torch.arange(A)[None] >= start[:, None]
        bias = torch.zeros(B, 1, 1, C, dtype=dt).masked_fill(~torch.nn.functional.pad(valid, (0, C - A))[:, None, None], float("-inf"))
        got = split_kv_attention(q, k, v, bias[..., :A])
        ref = F.scaled_dot_product_attention(q[1:].double(), k[1:].double(), v[1:].double(), attn_mask=valid[1:, None, None])
        splits = -(-A // split_columns(B * KV, A, q.device))
        out.append(dict(dtype=str(dt), splits=splits, shape=list(got.shape), out_dtype=str(got.dtype),
                        err=(got[1:].double() - ref).abs().max().item(), empty=got[0].abs().max().item()))
    print("RESULT " + json.dumps(out))
    """
)


def test_split_kv_kernel_matches_float32_attention_in_triton_interpreter():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, env=env, timeout=600, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stderr[-3000:]
    import json

    results = json.loads(lines[-1][7:])
    assert [r["splits"] for r in results] == [3, 2, 1, 5]  # the merge across splits is exercised
    for r in results:
        assert r["out_dtype"] == r["dtype"]
        assert r["err"] < (2e-3 if r["dtype"] == "torch.float16" else 1e-5), r
        assert r["empty"] == 0.0, r  # a row with no column gets zeros, not NaN


def test_split_kv_kernel_takes_only_what_it_computes_right():
    q = torch.zeros(2, 2, 7, 64, dtype=torch.bfloat16)
    k = torch.zeros(2, 2, 100, 64, dtype=torch.bfloat16)
    float_mask = torch.zeros(2, 1, 1, 100, dtype=torch.bfloat16)
    assert decode_kernel.supports(q, k, float_mask) == decode_kernel.available()
    assert not decode_kernel.supports(q, k, float_mask > 0)  # boolean masks: SDPA
    assert not decode_kernel.supports(q.float(), k.float(), float_mask.float())  # float32: SDPA (no tf32 dots)
    assert not decode_kernel.supports(q[..., :48], k[..., :48], float_mask)  # head size 48: no power of two
    assert not decode_kernel.supports(q, k, float_mask.expand(2, 14, 1, 100))  # a mask per head


def test_decode_attention_setting_is_checked():
    from agentrl.config import GeneratorSettings
    from agentrl.generators.static_decode import StaticDecoder
    from agentrl.models import load_model

    assert GeneratorSettings().decode_attention == "sdpa"
    with pytest.raises(ValueError, match="decode_attention"):
        GeneratorSettings(decode_attention="flash")
    with pytest.raises(ValueError, match="decode_attention: only for backend=transformers"):
        GeneratorSettings(backend="vllm", decode_attention="split")
    with pytest.raises(ValueError, match="attention must be"):
        StaticDecoder(load_model("default", dtype=torch.float32, device="cpu"), 0, attention="flash")
