"""Split-KV attention for one decode token per row (flash decoding), written in Triton.

A decode step's attention reads every active key and value once and does little arithmetic on
them, so it is bound by memory bandwidth. SDPA's memory-efficient kernel gives each (row, KV head)
one program that walks all columns in turn: at 256 rows x 512 columns of the Qwen2.5-0.5B shape it
read 33.5 MB in 39 us inside a CUDA graph (H200), ~0.9 TB/s of ~4.8. Here each (row, KV head)'s
columns are cut into splits that run as separate programs; every program holds the query heads of
its KV head as rows of one tile (grouped-query attention without copying the cache), keeps a
running max and sum, and writes its partial output and log-sum-exp. The splits are then merged by
their log-sum-exps (a few element-wise torch ops that ``torch.compile`` fuses).

Used by ``static_decode.grouped_decode_attention`` on CUDA when Triton is importable; everything
else keeps SDPA. The kernel also runs under Triton's interpreter (``TRITON_INTERPRET=1``) on the
CPU, which is how the default test suite checks its numbers.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # no Triton (a CPU-only torch): SDPA decodes
    triton = None

BLOCK_N = 64  # columns per inner step


def available() -> bool:
    """Whether the kernel can be used (Triton importable)."""
    return triton is not None


def supports(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor) -> bool:
    """Whether ``split_kv_attention`` takes these inputs: one head size Triton's dot takes, up to 64
    query heads per KV head, an additive float mask of one row per batch row."""
    D = query.shape[-1]
    return (
        available() and query.dtype in (torch.bfloat16, torch.float16)
        and D in (16, 32, 64, 128, 256) and query.shape[2] <= 64 and key.dtype == query.dtype
        and mask.is_floating_point() and mask.dim() == 4 and mask.shape[1] == 1 and mask.shape[2] == 1
    )


_SMS: dict[int, int] = {}


def _processors(device_index: int) -> int:
    if device_index not in _SMS:
        _SMS[device_index] = torch.cuda.get_device_properties(device_index).multi_processor_count
    return _SMS[device_index]


def split_columns(programs: int, columns: int, device: torch.device) -> int:
    """Columns per split: enough programs to fill the GPU about four times over, in whole ``BLOCK_N``
    steps, no fewer than two steps per program (a split's merge costs about one step's reads)."""
    sms = _processors(device.index or 0) if device.type == "cuda" else 132
    splits = max(1, -(-4 * sms // max(programs, 1)))
    per = -(-columns // splits)
    return max(2 * BLOCK_N, -(-per // BLOCK_N) * BLOCK_N)


if triton is not None:

    @triton.jit
    def _split_kernel(
        Q, K, V, M, O, L,
        stride_qb, stride_qh, stride_qg,
        stride_kb, stride_kh, stride_kn,
        stride_vb, stride_vh, stride_vn,
        stride_mb, stride_mn,
        kv_heads, columns, per_split, scale,
        G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
    ):
        bh = tl.program_id(0)
        split = tl.program_id(1)
        splits = tl.num_programs(1)
        b = bh // kv_heads
        h = bh % kv_heads
        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, D)
        q = tl.load(Q + b * stride_qb + h * stride_qh + g[:, None] * stride_qg + d[None, :], mask=g[:, None] < G, other=0.0)
        lo = split * per_split
        hi = tl.minimum(lo + per_split, columns)
        m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, D], tl.float32)
        for start in range(0, per_split, BLOCK_N):
            n = lo + start + tl.arange(0, BLOCK_N)
            inside = n < hi
            k = tl.load(K + b * stride_kb + h * stride_kh + n[:, None] * stride_kn + d[None, :], mask=inside[:, None], other=0.0)
            v = tl.load(V + b * stride_vb + h * stride_vh + n[:, None] * stride_vn + d[None, :], mask=inside[:, None], other=0.0)
            bias = tl.load(M + b * stride_mb + n * stride_mn, mask=inside, other=float("-inf")).to(tl.float32)
            s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale + bias[None, :]
            m_new = tl.maximum(m_i, tl.max(s, 1))
            base = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing yet: no NaN from -inf - -inf
            p = tl.exp(s - base[:, None])
            alpha = tl.exp(m_i - base)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
            m_i = m_new
        has = l_i > 0
        out = acc / tl.where(has, l_i, 1.0)[:, None]
        lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
        row = (bh * splits + split) * G + g
        tl.store(O + row[:, None] * D + d[None, :], out, mask=g[:, None] < G)
        tl.store(L + row, lse, mask=g < G)


def split_kv_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                       scale: float | None = None) -> torch.Tensor:
    """Attention of ``query`` [B, KV, G, D] (the G query heads of each KV head as rows) over ``key``
    and ``value`` [B, KV, A, D] (any strides with a unit last one, e.g. a slice of a static cache)
    with an additive ``mask`` [B, 1, 1, A] (0 or -inf; float). Returns [B, KV, G, D] in the query's
    dtype. A row whose mask is -inf everywhere gets zeros (SDPA would give NaN)."""
    return _split_kv(query, key, value, mask, float(scale) if scale is not None else query.shape[-1] ** -0.5)


def _split_kv_eager(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    B, KV, G, D = query.shape
    A = key.shape[2]
    query = query.contiguous()
    per = split_columns(B * KV, A, query.device)
    splits = -(-A // per)
    parts = torch.empty(B * KV, splits, G, D, device=query.device, dtype=torch.float32)
    lse = torch.empty(B * KV, splits, G, device=query.device, dtype=torch.float32)
    _launch(_split_kernel)[(B * KV, splits)](
        query, key, value, mask, parts, lse,
        query.stride(0), query.stride(1), query.stride(2),
        key.stride(0), key.stride(1), key.stride(2),
        value.stride(0), value.stride(1), value.stride(2),
        mask.stride(0), mask.stride(3),
        KV, A, per, scale,
        G=G, BLOCK_G=max(16, triton.next_power_of_2(G)), D=D, BLOCK_N=BLOCK_N,
    )
    top = lse.amax(1, keepdim=True)
    weight = torch.exp(lse - torch.where(torch.isinf(top), 0.0, top))  # [B*KV, S, G]; -inf splits weigh 0
    total = weight.sum(1)
    out = (parts * weight[..., None]).sum(1) / torch.where(total > 0, total, 1.0)[..., None]
    return out.reshape(B, KV, G, D).to(query.dtype)


if triton is not None and hasattr(torch.library, "triton_op"):
    # a custom op: torch.compile treats it as one node (inductor still sees the kernel), so the
    # compiled decode step stays one graph whatever the active length
    _launch = torch.library.wrap_triton
    _split_kv = torch.library.triton_op("agentrl::split_kv_attention", _split_kv_eager, mutates_args=())
else:
    def _launch(kernel):  # an older torch: plain launches
        return kernel

    _split_kv = _split_kv_eager
