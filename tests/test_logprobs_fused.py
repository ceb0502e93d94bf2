"""The fused linear + log-softmax head against the checkpointed head and a naive full-logits computation.

Tolerances are the largest differences measured on this CPU with some headroom: float32 log-probs
and entropies agree to ~2e-6 (asserted 1e-5), float32 gradients to ~1e-5 relative; under bf16
autocast the fused head differs from the checkpointed one by bf16 rounding only (~1e-6 on
log-probs, 1e-3 asserted; gradients within bf16 noise, and no further from float32 than the
checkpointed head's, which rounds each chunk's weight gradient to bf16 where the fused head sums in
float32).
"""

from __future__ import annotations

import pytest
import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode

from agentrl.compute import logprobs
from agentrl.compute.logprobs import completion_logprobs, linear_logprobs, token_logprobs
from agentrl.train.build import enable_gradient_checkpointing

V = 300


def model(seed: int = 0, softcap: float | None = None) -> transformers.Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = transformers.Qwen2Config(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=1, head_dim=32, intermediate_size=128)
    m = transformers.Qwen2ForCausalLM(cfg).float()
    m.config.final_logit_softcapping = softcap  # read by both heads (Gemma-style capping)
    return m


def run(head: str, temperature: float, softcap: float | None, chunk: int, autocast: bool = False):
    m = model(softcap=softcap)
    ids = torch.randint(0, V, (3, 17), generator=torch.Generator().manual_seed(1))
    weights = torch.randn(3, 16, generator=torch.Generator().manual_seed(2))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        lp, ent = token_logprobs(m, ids, chunk_size=chunk, temperature=temperature, head=head, return_entropy=True)
    (lp * weights).sum().backward()
    return lp.detach(), ent, {n: p.grad.clone() for n, p in m.named_parameters()}


@pytest.mark.parametrize(("temperature", "softcap", "chunk"), [(1.0, None, 5), (0.7, None, 1000), (1.3, 5.0, 3)])
def test_fused_head_matches_checkpointed_head_fp32(temperature, softcap, chunk):
    ref_lp, ref_ent, ref_grads = run("checkpoint", temperature, softcap, chunk)
    lp, ent, grads = run("fused", temperature, softcap, chunk)
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=0)
    for name, g in ref_grads.items():
        torch.testing.assert_close(grads[name], g, atol=2e-5, rtol=1e-4, msg=name)


def test_fused_head_matches_checkpointed_head_bf16_autocast():
    """Measured: log-probs 1e-6 apart, gradients up to 2.2% of each tensor's largest entry apart
    (bf16 noise: both are ~0.5% from float32), the fused head's total error no larger."""
    ref_lp, ref_ent, ref_grads = run("checkpoint", 0.9, None, 7, autocast=True)
    lp, ent, grads = run("fused", 0.9, None, 7, autocast=True)
    _, _, exact = run("checkpoint", 0.9, None, 7, autocast=False)
    assert (lp - ref_lp).abs().max() < 1e-3
    assert (ent - ref_ent).abs().max() < 1e-3
    for name, g in ref_grads.items():  # bf16 products: compare relative to the gradient's scale
        assert (grads[name] - g).abs().max() <= 4e-2 * g.abs().max() + 1e-6, name

    def error(gs: dict) -> float:
        return float(sum(((gs[n] - e) ** 2).sum() for n, e in exact.items()).sqrt())

    assert error(grads) <= 1.1 * error(ref_grads)


def test_linear_logprobs_against_naive_with_bias_softcap_and_tiny_tiles():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(37, 16, generator=g, requires_grad=True)
    w = torch.randn(50, 16, generator=g, requires_grad=True)
    b = torch.randn(50, generator=g, requires_grad=True)
    t = torch.randint(0, 50, (37,), generator=g)
    lp, ent = linear_logprobs(h, w, t, bias=b, temperature=0.9, softcap=3.0, tile_rows=8, tile_cols=7, return_entropy=True)
    logits = torch.tanh((h @ w.t() + b) / 3.0) * 3.0 / 0.9
    logp = torch.log_softmax(logits, -1)
    ref = logp.gather(1, t[:, None]).squeeze(1)
    torch.testing.assert_close(lp, ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, -(logp.exp() * logp).sum(-1), atol=1e-5, rtol=0)
    assert not ent.requires_grad
    got = torch.autograd.grad((lp + lp**2).sum(), (h, w, b))
    want = torch.autograd.grad((ref + ref**2).sum(), (h, w, b))
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e, atol=5e-5, rtol=1e-4)


@pytest.mark.parametrize("pieces", [1, 2, 3])
@pytest.mark.parametrize("softcap", [None, 3.0])
def test_bf16_tiles_in_pieces_give_the_products_numbers(monkeypatch, pieces, softcap):
    """A bf16 tile's product and gradient are made a few columns at a time; the numbers are those
    of whole-tile products (the same bf16 rounding), in any number of pieces."""
    monkeypatch.setattr(logprobs, "PIECES", pieces)
    g = torch.Generator().manual_seed(3)
    h = torch.randn(29, 8, generator=g).bfloat16().requires_grad_()
    w = torch.randn(40, 8, generator=g).bfloat16().requires_grad_()
    t = torch.randint(0, 40, (29,), generator=g)
    lp, ent = linear_logprobs(h, w, t, temperature=1.2, softcap=softcap, tile_rows=11, tile_cols=9, return_entropy=True)
    y = (h @ w.t()).float()  # bf16 products, as the head and nn.Linear under autocast make them
    if softcap:
        y = torch.tanh(y / softcap) * softcap
    logp = torch.log_softmax(y / 1.2, -1)
    ref = logp.gather(1, t[:, None]).squeeze(1)
    torch.testing.assert_close(lp, ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, -(logp.exp() * logp).sum(-1), atol=1e-5, rtol=0)
    got = torch.autograd.grad((lp * torch.arange(29.0)).sum(), (h, w))
    want = torch.autograd.grad((ref * torch.arange(29.0)).sum(), (h, w))
    for x, e in zip(got, want):  # bf16 gradients: one rounding apart at most
        assert (x.float() - e.float()).abs().max() <= 1e-2 * e.float().abs().max(), (x, e)


class _Made(TorchDispatchMode):
    """Records the dtype and size of every new tensor any op makes (not in-place results or views,
    which are no larger than the tensors they came from)."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[tuple[torch.dtype, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        given = {a.untyped_storage().data_ptr() for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)}
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in given:
                self.made.append((t.dtype, t.numel()))
        return out

    def count(self, dtype: torch.dtype, at_least: int) -> int:
        return sum(1 for d, n in self.made if d == dtype and n >= at_least)


def test_a_bf16_tile_has_one_float32_copy_and_half_tile_pieces():
    """Per tile and pass: one float32 tile, no second one (the head before made a second float32
    tile for the entropy) and no whole bf16 tile (it made the bf16 product whole, and in backward
    a whole bf16 copy of the gradient beside the float32 one)."""
    g = torch.Generator().manual_seed(8)
    h = torch.randn(64, 4, generator=g).bfloat16().requires_grad_()
    w = torch.randn(1000, 4, generator=g).bfloat16().requires_grad_()
    t = torch.randint(0, 1000, (64,), generator=g)
    tile, tiles = 64 * 500, 2
    with _Made() as fwd:
        lp, _ = linear_logprobs(h, w, t, tile_rows=64, tile_cols=500, return_entropy=True)
    with _Made() as bwd:
        lp.sum().backward()
    for seen in (fwd, bwd):
        assert seen.count(torch.float32, tile) == tiles
        assert seen.count(torch.bfloat16, tile // logprobs.PIECES + 1) == 0
    naive = torch.log_softmax((h.float() @ w.float().t()), -1).gather(1, t[:, None]).squeeze(1)
    assert (lp.detach() - naive).abs().max() < 0.1  # bf16 products


def _head_run(compiled: bool, bf16: bool, bias: bool = False, softcap: float | None = None, into_leaf: bool = False):
    """Log-probs, entropies and gradients of a head with short last tiles in rows and columns."""
    g = torch.Generator().manual_seed(11)
    h = torch.randn(70, 16, generator=g).requires_grad_()
    w = (0.3 * torch.randn(500, 16, generator=g)).requires_grad_()
    b = (0.1 * torch.randn(500, generator=g)).requires_grad_() if bias else None
    t = torch.randint(0, 500, (70,), generator=g)
    weights = torch.randn(70, generator=g)
    for _ in range(2 if into_leaf else 1):  # two micro-batches: the second adds into w.grad itself
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            lp, ent = linear_logprobs(h, w, t, bias=b, temperature=0.8, softcap=softcap, tile_rows=32, tile_cols=150,
                                      return_entropy=True, grad_into_leaf=into_leaf, compiled=compiled)
        (lp * weights).sum().backward()
    return [lp.detach(), ent, h.grad, w.grad] + ([b.grad] if bias else [])


@pytest.mark.parametrize("bf16", [False, True])
def test_compiled_tiles_give_the_eager_tiles_numbers(bf16):
    """``compiled=True`` (the learner's head when its layers compile): each tile's work after the
    product is one compiled function. Measured on this CPU: float32 within 2e-6 of the eager tiles;
    under bf16 autocast log-probs and entropies within 2e-6 (the same bf16 products), gradients one
    bf16 rounding of the logits' gradient apart at most."""
    eager, compiled = _head_run(False, bf16), _head_run(True, bf16)
    for name, a, c in zip(("log-probs", "entropies"), eager, compiled):
        torch.testing.assert_close(c, a, atol=1e-5, rtol=0, msg=name)
    for name, a, c in zip(("hidden grad", "weight grad"), eager[2:], compiled[2:]):
        tol = (1e-2 if bf16 else 1e-5) * a.abs().max().item()
        assert (c - a).abs().max().item() <= tol, name
    assert not torch.equal(compiled[0], torch.zeros_like(compiled[0]))


def test_compiled_tiles_add_into_the_leafs_grad():
    torch.testing.assert_close(_head_run(True, False, into_leaf=True)[3], _head_run(False, False, into_leaf=True)[3], atol=1e-5, rtol=1e-5)


def test_compiled_tiles_compile_once_for_any_number_of_positions():
    """A micro-batch's sampled positions set the last row block's size; one of 1 row (here 65 =
    2 x 32 + 1) would make the compiled functions specialise and compile again mid-run. Such a
    block takes the eager tiles: two graphs in all, the same numbers."""
    import torch._dynamo as dynamo

    dynamo.reset()
    before = dynamo.utils.counters["stats"]["unique_graphs"]
    g = torch.Generator().manual_seed(12)
    w = (0.3 * torch.randn(500, 16, generator=g)).requires_grad_()
    for n in (70, 65, 33, 40):
        h = torch.randn(n, 16, generator=g).requires_grad_()
        t = torch.randint(0, 500, (n,), generator=g)
        out = {}
        for compiled in (False, True):
            lp, ent = linear_logprobs(h, w, t, temperature=0.8, tile_rows=32, tile_cols=150, return_entropy=True, compiled=compiled)
            out[compiled] = (lp.detach(), ent, *torch.autograd.grad(lp.sum(), (h, w)))
        for a, c in zip(out[False], out[True]):
            torch.testing.assert_close(c, a, atol=1e-5, rtol=1e-5)
    assert dynamo.utils.counters["stats"]["unique_graphs"] - before == 2


@pytest.mark.parametrize(("bias", "softcap"), [(True, None), (False, 3.0)])
def test_compiled_tiles_leave_heads_with_bias_or_softcap_to_the_eager_tiles(monkeypatch, bias, softcap):
    """The compiled tiles cover plain heads; a bias or softcap takes the eager tiles, the same numbers."""
    asked = []
    monkeypatch.setattr(logprobs.head_tiles, "compiled", lambda name: asked.append(name))
    got, want = _head_run(True, False, bias, softcap), _head_run(False, False, bias, softcap)
    assert asked == []
    for a, c in zip(want, got):
        assert torch.equal(a, c)


def test_grad_into_leaf_accumulates_like_autograd():
    """Two micro-batches: the second adds its weight gradient into the leaf's .grad directly."""
    g = torch.Generator().manual_seed(4)
    hs = [torch.randn(9, 8, generator=g) for _ in range(2)]
    ts = [torch.randint(0, 20, (9,), generator=g) for _ in range(2)]
    grads = []
    for into in (False, True):
        w = torch.randn(20, 8, generator=torch.Generator().manual_seed(5)).requires_grad_()
        for h, t in zip(hs, ts):
            lp, _ = linear_logprobs(h, w, t, tile_rows=4, tile_cols=6, grad_into_leaf=into)
            lp.sum().backward()
        grads.append(w.grad.clone())
    torch.testing.assert_close(grads[1], grads[0], atol=1e-6, rtol=1e-6)


def test_fused_head_never_makes_a_positions_by_vocab_tensor():
    h = torch.randn(64, 16, requires_grad=True)
    w = torch.randn(1000, 16, requires_grad=True)
    t = torch.randint(0, 1000, (64,))
    with _Made() as seen:
        lp, _ = linear_logprobs(h, w, t, tile_rows=16, tile_cols=100, return_entropy=True)
        lp.sum().backward()
    # the weight and its gradient are [V, H] = 16,000; a tile is 16 x 100; the full logits 64,000
    assert max(n for _, n in seen.made) <= 1000 * 16


def test_completion_logprobs_only_scores_asked_positions():
    m = model()
    ids = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(6))
    starts = torch.tensor([3, 5])
    only = torch.zeros(2, 7, dtype=torch.bool)
    only[0, [0, 1, 4]] = True
    only[1, [2, 6]] = True
    with torch.no_grad():
        full, full_ent = completion_logprobs(m, ids, starts, 7, return_entropy=True)
        part, part_ent = completion_logprobs(m, ids, starts, 7, return_entropy=True, only=only)
    torch.testing.assert_close(part[only], full[only], atol=1e-6, rtol=0)
    torch.testing.assert_close(part_ent[only], full_ent[only], atol=1e-6, rtol=0)
    assert (part[~only] == 0).all() and (part_ent[~only] == 0).all()
    none = torch.zeros_like(only)
    for head in ("fused", "checkpoint"):  # nothing to score: zeros, still on the graph
        lp = completion_logprobs(m, ids, starts, 7, only=none, head=head)
        assert (lp == 0).all()
        lp.sum().backward()
    with pytest.raises(ValueError, match="only"):
        completion_logprobs(m, ids, starts, 7, only=only[:, :3])
    with pytest.raises(ValueError, match="head"):
        completion_logprobs(m, ids, starts, 7, head="triton")  # type: ignore[arg-type]


def test_autocast_without_weight_cache_is_bit_identical():
    """The learner turns autocast's weight cache off (the cached bf16 copies of every weight stay
    alive until the forward ends); a cast is a cast, so log-probs and gradients are unchanged."""
    ids = torch.randint(0, V, (2, 15), generator=torch.Generator().manual_seed(7))
    out = []
    for cache in (True, False):
        m = model()
        enable_gradient_checkpointing(m)  # as the trainer does
        m.train()
        with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=cache):
            lp = completion_logprobs(m, ids, torch.tensor([4, 6]), 9)
        lp.sum().backward()
        out.append((lp.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}))
    assert torch.equal(out[0][0], out[1][0])
    for name, g in out[0][1].items():
        assert torch.equal(out[1][1][name], g), name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("compiled", "tiles"), [(False, 1.5), (True, 0.75)])
def test_fused_head_peak_on_cuda_in_float32_tiles(compiled, tiles):
    """Under bf16 autocast the head's peak, forward and backward with entropies, stays under 1.5x
    the bytes of one float32 tile (one float32 tile, half a bf16 one, the [V, H] gradient). The
    head before held two float32 tiles in the entropy's forward, 2x and more. The compiled tiles
    hold one bf16 tile (the product, overwritten by the gradient): under 0.75x."""
    N, H, V = 4096, 256, 65536
    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(N, H, device="cuda", generator=g).bfloat16().requires_grad_()
    w = (0.02 * torch.randn(V, H, device="cuda", generator=g)).requires_grad_()
    t = torch.randint(0, V, (N,), device="cuda", generator=g)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        lp, ent = linear_logprobs(h, w, t, tile_rows=N, tile_cols=V, return_entropy=True, compiled=compiled)
    lp.sum().backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    assert torch.isfinite(lp).all() and torch.isfinite(ent).all() and torch.isfinite(w.grad).all()
    assert peak < tiles * N * V * 4, f"head peak {peak / 2**20:.0f} MiB, one float32 tile {N * V * 4 / 2**20:.0f} MiB"
