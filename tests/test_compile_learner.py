"""``compile_learner``: compiled decoder layers give the learner's step of the eager layers, touch
nothing outside the training forward/backward, and a failing compile falls back to eager training.

CPU, float32, gradient checkpointing on (the recompute runs compiled too). Measured on this CPU:
losses, gradient norms and weights after two SGD steps agree to ~1e-7 (asserted 1e-5). The first
compile costs ~40 s on two cores (inductor's cache on disk makes later processes faster).
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import pytest
import torch
import transformers
from accelerate import Accelerator
from test_learner_fastpath import V, groups

from agentrl.compute import head_tiles
from agentrl.compute.compile_layers import CompiledLayers, compile_layers
from agentrl.compute.models import decoder_layers
from agentrl.compute.parallel.strategy import Sharded
from agentrl.compute.reference import Reference
from agentrl.learn.batch import build_batch
from agentrl.learn.config import LearnerConfig
from agentrl.learn.learner import Learner
from agentrl.learn.losses import LossConfig
from agentrl.train.build import enable_gradient_checkpointing


def tiny() -> transformers.Qwen3ForCausalLM:
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(vocab_size=V, hidden_size=64, num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1,
                                   head_dim=32, intermediate_size=128, tie_word_embeddings=True)
    model = transformers.Qwen3ForCausalLM(cfg).float().train()
    enable_gradient_checkpointing(model)  # the trainer's own call (use_reentrant=False)
    return model


def train(compiled: str, backend: Any = None) -> tuple[list[dict], dict[str, torch.Tensor], transformers.PreTrainedModel, Learner]:
    """Two optimizer steps on the same batch; ``compiled``: "no", "yes" or "broken" (every compiled
    forward raises); ``backend``: the compiled layers' torch.compile backend (inductor if None)."""
    model = tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    settings = LearnerConfig(
        micro_batch_size=3, num_iterations=2, steps_per_generation=1, temperature=0.9, logprob_chunk_size=7,
        max_grad_norm=None, mask_truncated_completions=False, ref_mix_alpha=None, ref_mix_every=1,
    )
    layers = None
    if compiled != "no":
        layers, _ = compile_layers(model, True, cuda=False, full_finetune=True)
        assert layers is not None
    if backend is not None:
        layers.forwards = [torch.compile(layer.forward, dynamic=True, backend=backend) for layer in layers.layers]
    if compiled == "broken":
        def fail(*a, **k):  # what a backend that cannot compile this model raises, at the first call
            raise RuntimeError("BackendCompilerFailed: no kernel for this op\nmore detail")
        layers.forwards = [fail] * len(layers.forwards)
    learner = Learner(Accelerator(cpu=True), model, opt, sched, Reference(model, "full", 0.0), LossConfig(loss_type="dapo"), settings, layers)
    metrics = list(learner.learn(build_batch(groups(), pad_id=0), 0))
    return metrics, {n: p.detach().clone() for n, p in model.named_parameters()}, model, learner


@pytest.fixture(scope="module")
def eager():
    return train("no")


def test_compiled_layers_give_the_eager_step(eager, monkeypatch):
    asked = []
    real = head_tiles.compiled
    monkeypatch.setattr(head_tiles, "compiled", lambda name: asked.append(name) or real(name))
    metrics, weights, model, learner = train("yes")
    assert learner.compiled is not None and learner.compiled.proven
    assert {"tile_stats", "tile_grad_"} <= set(asked)  # the head's tiles compile with the layers
    for a, b in zip(eager[0], metrics):
        assert abs(a["grad_norm"]) > 1e-4
        for key in ("loss/loss", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-8), key
    for name, w in eager[1].items():
        torch.testing.assert_close(weights[name], w, rtol=1e-5, atol=1e-6, msg=name)
    # outside the learner's forward/backward the layers are plain modules: a copy made now (the
    # generation copy, a reference model) is independent of the policy and runs eagerly
    assert all("forward" not in layer.__dict__ for layer in decoder_layers(model))
    twin = copy.deepcopy(model).eval()
    with torch.no_grad():
        model.model.layers[0].self_attn.o_proj.weight.add_(1.0)
        ids = torch.randint(0, V, (2, 9))
        assert not torch.allclose(twin(ids).logits, model.eval()(ids).logits)


def test_a_failing_compile_trains_eagerly_with_one_line(eager, capsys):
    metrics, weights, _, learner = train("broken")
    out = capsys.readouterr().out
    assert out.count("compile_learner: the compiled training forward failed") == 1
    assert "RuntimeError: BackendCompilerFailed: no kernel for this op); training eagerly" in out  # the reason, its first line
    assert learner.compiled is None
    assert [m["grad_norm"] for m in metrics] == pytest.approx([m["grad_norm"] for m in eager[0]], rel=1e-6)
    for name, w in eager[1].items():
        torch.testing.assert_close(weights[name], w, rtol=1e-6, atol=1e-7, msg=name)


@pytest.mark.parametrize("stage", ["forward", "backward"])
def test_a_compile_failing_inside_the_step_retries_it_eagerly(eager, capsys, stage):
    """The compiler itself fails, in the forward graph's compile or in the backward's (compiled at
    the first backward, inside the autograd engine, mid checkpoint recompute): that step is taken
    again eagerly and gives the eager step. On an H200 a CUDA error in the first compiled step was
    followed by a CheckpointError in the eager retry (benchmarks/RESULTS.md, call 17); this is the
    CPU half of that path."""
    from torch._dynamo.backends.common import aot_autograd

    def compiler(which: str):
        def compile_graph(gm, example_inputs):
            if which == stage:
                raise RuntimeError(f"CUDA error: operation not permitted when stream is capturing ({which})")
            return gm
        return compile_graph

    metrics, weights, _, learner = train("yes", aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward")))
    assert capsys.readouterr().out.count("compile_learner: the compiled training forward failed") == 1
    assert learner.compiled is None
    assert [m["grad_norm"] for m in metrics] == pytest.approx([m["grad_norm"] for m in eager[0]], rel=1e-6)
    for name, w in eager[1].items():
        torch.testing.assert_close(weights[name], w, rtol=1e-6, atol=1e-7, msg=name)


@pytest.mark.parametrize("which", ["tile_stats", "tile_grad_"])
def test_a_head_tile_failing_to_compile_retries_the_step_eagerly(eager, capsys, monkeypatch, which):
    """The head's compiled tiles fail at the first step (in the forward's reduction or in the
    backward's gradient kernel): the step is taken again with the layers and the head eager."""
    real = head_tiles.compiled

    def compiled(name: str):  # type: ignore[no-untyped-def]
        if name != which:
            return real(name)

        def fail(*a, **k):
            raise RuntimeError("InductorError: no kernel for this tile\nmore detail")
        return fail

    monkeypatch.setattr(head_tiles, "compiled", compiled)
    metrics, weights, _, learner = train("yes")
    assert capsys.readouterr().out.count("compile_learner: the compiled training forward failed") == 1
    assert learner.compiled is None
    assert [m["grad_norm"] for m in metrics] == pytest.approx([m["grad_norm"] for m in eager[0]], rel=1e-6)
    for name, w in eager[1].items():
        torch.testing.assert_close(weights[name], w, rtol=1e-6, atol=1e-7, msg=name)


def test_a_forward_set_on_the_instance_is_put_back():
    """accelerate's offload hooks replace ``forward`` on the instance: active() must not drop them."""
    model = tiny()
    layer = model.model.layers[1]
    plain = layer.forward
    calls = []

    def hooked(*a, **k):
        calls.append(1)
        return plain(*a, **k)

    layer.forward = hooked
    compiled, _ = compile_layers(model, True, cuda=False, full_finetune=True)
    with compiled.active():
        assert layer.forward is compiled.forwards[1]
    assert layer.forward is hooked and "forward" not in model.model.layers[0].__dict__
    model.model(torch.randint(0, V, (1, 5)))
    assert calls == [1]


def test_when_the_layers_are_compiled():
    model = tiny()
    assert compile_layers(model, None, cuda=False, full_finetune=True) == (None, "")
    assert compile_layers(model, False, cuda=True, full_finetune=True) == (None, "")
    on, why = compile_layers(model, None, cuda=True, full_finetune=True)
    assert isinstance(on, CompiledLayers) and len(on.layers) == 3 and "3 decoder layers" in why
    off, why = compile_layers(model, None, cuda=True, full_finetune=False)
    assert off is None and "PEFT adapter" in why and "compile_learner=true" in why
    off, why = compile_layers(model, None, Sharded(2), cuda=True, full_finetune=True)
    assert off is None and "FSDP2" in why
    off, why = compile_layers(torch.nn.Linear(2, 2), True, cuda=False, full_finetune=True)
    assert off is None and "Linear exposes no get_decoder().layers" in why


def test_a_step_whose_rows_leave_one_over_compiles_the_layers_once():
    """8 rows in micro-batches of 7 would leave a micro-batch of one row, which the compiled layers
    specialise (a second compile, mid-run on a GPU); the learner splits 6 + 2 instead. Three graphs
    in all: the layers', and the head's two tile functions (each once, whatever its tiles' sizes)."""
    import torch._dynamo as dynamo

    dynamo.reset()  # compile afresh: one graph for the layers, whatever earlier tests compiled
    before = dynamo.utils.counters["stats"]["unique_graphs"]
    model = tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    settings = LearnerConfig(
        micro_batch_size=7, num_iterations=1, steps_per_generation=1, temperature=1.0, logprob_chunk_size=16,
        max_grad_norm=None, mask_truncated_completions=False, ref_mix_alpha=None, ref_mix_every=1,
    )
    layers, _ = compile_layers(model, True, cuda=False, full_finetune=True)
    learner = Learner(Accelerator(cpu=True), model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0),
                      Reference(model, "full", 0.0), LossConfig(loss_type="dapo"), settings, layers)
    batch = build_batch(groups(), pad_id=0)
    assert len(batch) == 8
    list(learner.learn(batch, 0))
    assert dynamo.utils.counters["stats"]["unique_graphs"] - before == 3


def test_compiled_layers_see_lengths_padded_to_a_multiple_of_eight():
    """On CUDA inductor guards on whether a sequence length is a multiple of 8, so the first
    micro-batch of the other kind compiled the layers again (every GPU run's recompile log). The
    compiled layers get right-padded lengths; the eager path keeps its own (the step's numbers are
    the same: test_compiled_layers_give_the_eager_step)."""
    seen: dict[str, list[int]] = {"no": [], "yes": []}
    for compiled in seen:
        model = tiny()
        model.model.layers[0].register_forward_pre_hook(lambda _m, args, kw, c=compiled: seen[c].append((args[0] if args else kw["hidden_states"]).shape[1]), with_kwargs=True)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        settings = LearnerConfig(
            micro_batch_size=3, num_iterations=1, steps_per_generation=1, temperature=1.0, logprob_chunk_size=16,
            max_grad_norm=None, mask_truncated_completions=False, ref_mix_alpha=None, ref_mix_every=1,
        )
        layers = None
        if compiled == "yes":
            layers, _ = compile_layers(model, True, cuda=False, full_finetune=True)
            layers.forwards = [torch.compile(layer.forward, dynamic=True, backend="eager") for layer in layers.layers]
        learner = Learner(Accelerator(cpu=True), model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0),
                          Reference(model, "full", 0.0), LossConfig(loss_type="dapo"), settings, layers)
        list(learner.learn(build_batch(groups(), pad_id=0), 0))
    assert any(n % 8 for n in seen["no"])  # the batch has lengths that are not
    assert seen["yes"] and all(n % 8 == 0 for n in seen["yes"])
    assert sorted(set(seen["yes"])) == sorted({-(-n // 8) * 8 for n in seen["no"]})


def test_a_first_micro_batch_as_long_as_the_head_dimension_does_not_fix_the_length():
    """Sequences of 32 tokens at the first trace, with 32-wide heads: under duck sizing their length
    shared a symbol with the rotary tables' head dimension and was fixed to 32, so every later
    length compiled the layers again (~7 s each on an H200). Forward and backward, one compile."""
    import torch._dynamo as dynamo

    dynamo.reset()
    before = dynamo.utils.counters["stats"]["unique_graphs"]
    model = tiny()
    assert model.config.head_dim == 32
    layers, _ = compile_layers(model, True, cuda=False, full_finetune=True)
    for rows, length in [(2, 32), (2, 40), (3, 17), (5, 33)]:
        with layers.active():
            model(input_ids=torch.randint(1, V, (rows, length))).logits.sum().backward()
    assert dynamo.utils.counters["stats"]["unique_graphs"] - before == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compiled_layers_on_cuda_bf16_autocast():
    """The GPU setting: float32 weights under bf16 autocast. Compiled and eager layers round
    differently in bf16, so each is held against the float32 log-probs: the compiled path must be
    within 1e-3 on average and no further from float32 than twice the eager path's worst error
    (H100, first run: compiled vs eager differed by up to 2.4e-3 at log-probs of ~-5.2)."""
    from agentrl.compute.logprobs import completion_logprobs

    model = tiny().cuda()
    layers, _ = compile_layers(model, None, cuda=True, full_finetune=True)
    torch.manual_seed(1)
    ids = torch.randint(0, V, (6, 40), device="cuda")
    starts = torch.tensor([5, 9, 12, 5, 20, 7])

    def run(compiled: bool, bf16: bool) -> tuple[torch.Tensor, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        with layers.active() if compiled else contextlib.nullcontext(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            lp = completion_logprobs(model, ids, starts, 40 - 5, compiled_head=compiled)
            lp.sum().backward()
        return lp.float().detach(), torch.cat([p.grad.flatten() for p in model.parameters()])

    exact, g32 = run(False, False)
    eager, g_eager = run(False, True)
    compiled, g_comp = run(True, True)
    err_eager, err_comp = (eager - exact).abs(), (compiled - exact).abs()
    print(f"vs float32: eager bf16 max {err_eager.max():.2e} mean {err_eager.mean():.2e}; compiled max {err_comp.max():.2e} mean {err_comp.mean():.2e}")
    assert err_comp.mean().item() < 1e-3
    assert err_comp.max().item() <= 2 * err_eager.max().item()
    rel = lambda g: ((g - g32).norm() / g32.norm()).item()  # noqa: E731
    assert rel(g_comp) <= 2 * rel(g_eager) + 1e-3
    compiled32, _ = run(True, False)
    assert (compiled32 - exact).abs().max().item() < 1e-5  # float32: the same numbers


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_learner_on_cuda_keeps_training_forwards_off_cudnn_attention():
    """cuDNN's attention builds a plan on the host for every new micro-batch length (2.6 ms per
    forward call in a multi-turn step, H200): the learner turns it off before its first forward."""
    from torch.profiler import ProfilerActivity, profile

    from agentrl.compute.logprobs import completion_logprobs

    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(vocab_size=V, hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   head_dim=64, intermediate_size=512, tie_word_embeddings=True)
    model = transformers.Qwen3ForCausalLM(cfg).cuda().train()
    ids = torch.randint(0, V, (4, 96), device="cuda")

    def attention_kernels() -> set[str]:
        with profile(activities=[ProfilerActivity.CPU]) as prof, torch.autocast("cuda", dtype=torch.bfloat16):
            completion_logprobs(model, ids, torch.tensor([5, 9, 12, 5]), 80).sum().backward()
        return {e.key for e in prof.key_averages() if "attention" in e.key and e.key.startswith("aten::_")}

    torch.backends.cuda.enable_cudnn_sdp(True)
    before = attention_kernels()
    if not any("cudnn" in k for k in before):
        pytest.skip(f"this card and torch do not pick cuDNN attention here: {sorted(before)}")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    settings = LearnerConfig(micro_batch_size=2, num_iterations=1, steps_per_generation=1, temperature=1.0, logprob_chunk_size=64,
                             max_grad_norm=None, mask_truncated_completions=False, ref_mix_alpha=None, ref_mix_every=1)
    Learner(Accelerator(), model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0), Reference(model, "full", 0.0),
            LossConfig(loss_type="dapo"), settings)
    after = attention_kernels()
    assert after and not any("cudnn" in k for k in after), sorted(after)
