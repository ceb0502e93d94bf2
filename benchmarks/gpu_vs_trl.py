"""agentrl's trainer against TRL's GRPOTrainer, side by side, same model, prompts and settings.

    # lent GPU (no hub there): a Qwen2.5-0.5B-shaped random model and Qwen3's real tokenizer
    python benchmarks/gpu_vs_trl.py --tokenizer .assets/qwen3 --rows 8x8x256,8x8x1024,32x8x512
    # multi-turn calculator rows "mtPxG" (a short SFT on the device first, see multiturn_bench.py)
    python benchmarks/gpu_vs_trl.py --tokenizer .assets/qwen3 --rows mt8x8
    # TRL's continuous-batching path beside its plain generate; the sizes users train (issue 48)
    python benchmarks/gpu_vs_trl.py --tokenizer .assets/qwen3 --shape qwen3-1.7b --rows 8x8x256 --frameworks agentrl,trl,trl_cb
    python benchmarks/gpu_vs_trl.py --tokenizer .assets/qwen3 --shape qwen3-8b --lora 16 --rows 8x8x256 --frameworks agentrl,trl_cb,trl
    # on a lent machine, several rows inside one time budget (benchmarks/device_rows.sh says what it expects)
    bash benchmarks/device_rows.sh 555 qwen2.5-0.5b:8x8x256:4:agentrl,trl,trl_cb qwen3-4b:8x8x256:3:agentrl,trl_cb,trl
    # this CPU: the bundled model, both frameworks on CPU; a dry run of the GPU rows' code paths on a tiny Qwen3
    python benchmarks/gpu_vs_trl.py --cpu --rows 4x4x32
    python benchmarks/gpu_vs_trl.py --cpu --shape tiny-qwen3-untied --lora 16 --tokenizer <qwen3 tokenizer> --rows 4x4x16 --steps 2 --frameworks agentrl,trl,trl_cb

A row ``PxGxN`` is P prompts x G generations x N completion tokens per optimizer step. Both sides
get the same single-turn prompts (TRL's dataset is built from the agentrl environment's own reset
messages), completions forced to full length (TRL: ``min_new_tokens``; agentrl: ``min_tokens``),
temperature 1, loss dapo, beta 0, one iteration, AdamW (fused on CUDA) lr 1e-6 betas (0.9, 0.99),
no weight decay, grad-norm clip 1, bf16 autocast over fp32 master weights, gradient checkpointing,
micro-batches of 16 sequences; agentrl's own settings (generator, compiles, ``logprob_chunk_size``)
at their defaults (``AGENTRL_BENCH_CHUNK``/``AGENTRL_BENCH_EXTRA`` change them for experiments).
Each (framework, row) runs in its own process, so peak memory is
that run's alone. Step time is the median over the steps after the first (warm-up). Reward: the
share of digits in the completion (random weights: it only has to vary within groups).

Columns: "gen s" is generation alone; "train s" is the step minus generation (scoring, batch
building, weight sync and the learning itself); "learner s" is the learning alone, the same work on
both sides: the micro-batches' forward and backward, clipping and the optimizer step (agentrl:
``perf/train_s`` of its learner; TRL: ``training_step`` without ``_prepare_inputs``, where it
generates and scores, plus the optimizer step). "peak GiB" is the run's peak CUDA memory
allocated (on CPU the peak resident set); agentrl's rollout and training peaks are printed below
the table. "first step end s" counts from the worker's launch (imports, model load, compiles) to
the end of its first optimizer step; that step's own seconds follow in brackets.

Frameworks (``--frameworks``, run in the order given, each in its own process): ``agentrl``;
``trl``, GRPOTrainer on transformers' ``generate``; ``trl_cb``, the same with
``use_transformers_continuous_batching=True`` at TRL's defaults for it (vLLM, TRL's other fast
path, cannot run on the lent machines). Every ratio in the table is against each TRL path that ran.
``--lora R``: LoRA rank R (alpha 32, all linear layers) on both sides; the model is built in bf16
and TRL loads it so; agentrl loads its base as it always does (float32, bf16 autocast).
``--deadline S`` bounds the whole command: a run still going at S seconds is killed with its
process group and later runs are not started, so a lent machine's per-call limit returns results.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # multiturn_bench

HERE = Path(__file__).resolve()
MICRO = 16
LR = 1e-6
CHUNK = os.environ.get("AGENTRL_BENCH_CHUNK")  # agentrl logprob_chunk_size for experiments (unset: its default)
# when the driver launched this worker (wall clock): "first step end s" counts from here, imports and model load included
T0 = float(os.environ.get("AGENTRL_BENCH_T0") or time.time())
TRL_PATHS = {"trl": "TRL (generate)", "trl_cb": "TRL (continuous batching)"}


def digits(completion: str = "", completions: Any = None, **_: Any) -> Any:
    """Share of digits in the answer; works as an agentrl extra reward and as a TRL reward."""
    def one(text: Any) -> float:
        if isinstance(text, list):  # TRL conversational completions
            text = "".join(m.get("content") or "" for m in text)
        return sum(c.isdigit() for c in text) / max(1, len(text))

    if completions is not None:
        return [one(c) for c in completions]
    return one(completion)


def prompt_tasks(n: int) -> list[dict[str, str]]:
    topics = ["primes", "the year 1969", "a phone number", "a recipe", "a train timetable", "chess", "a tax form", "dice"]
    return [{"question": f"Task {i}: write a short text about {topics[i % len(topics)]} with numbers in it."} for i in range(n)]


def make_env(n: int = 64) -> Any:
    """Single-turn: no tools, the episode ends after one assistant turn."""
    from datasets import Dataset

    from agentrl import ToolEnvironment

    class SingleTurn(ToolEnvironment):
        max_turns = 1

        def load_dataset(self, split: str) -> Any:
            return Dataset.from_list(prompt_tasks(n))

    return SingleTurn(rewards=[digits])


SHAPES = {
    # the issue's three families at 0.5-1.5B, random weights, all on Qwen3's tokenizer (151,936 ids)
    "qwen2.5-0.5b": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, rope_theta=1_000_000.0)),
    "qwen3-0.6b": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, rope_theta=1_000_000.0)),
    "llama-1b": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, rope_theta=500_000.0)),
    # the sizes users train (issue 48): Qwen3's published dimensions
    "qwen3-1.7b": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, rope_theta=1_000_000.0)),
    "qwen3-4b": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, rope_theta=1_000_000.0)),
    "qwen3-8b": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, rope_theta=1_000_000.0, tie_word_embeddings=False)),
    # dry runs of this script on a CPU (the real tokenizer, a few layers): the tied and the untied head
    "tiny-qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, rope_theta=1_000_000.0)),
    "tiny-qwen3-untied": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, rope_theta=1_000_000.0, tie_word_embeddings=False)),
}
LORA_DTYPE = torch.bfloat16  # a LoRA row's base checkpoint (and TRL's base in memory): bf16, as users load an 8B model


def build_model(tokenizer_dir: str, out: Path, dtype: torch.dtype = torch.float32, shape: str = "qwen2.5-0.5b") -> None:
    """A model of one of ``SHAPES`` with random weights (fp32 on disk by default) plus the tokenizer."""
    import transformers
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    config_name, model_name, dims = SHAPES[shape]
    config = getattr(transformers, config_name)(
        vocab_size=151936, max_position_embeddings=32768, **{"tie_word_embeddings": True, **dims},
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"), pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    # initialised on the card when there is one: an 8B model's random init takes minutes on the host
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = getattr(transformers, model_name)(config).to(dtype)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    print(f"model ({shape}): {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters", flush=True)


def weights(model: Any) -> dict[str, Any]:
    """What a run trained: millions of trainable parameters and the dtypes of all (after training).

    TRL's continuous-batching path casts the model to bf16 in place before generating, so its
    "fp32 master weights" are bf16 from the first step on; this shows it.
    """
    params = list(model.parameters())
    return {
        "trainable_m": round(sum(p.numel() for p in params if p.requires_grad) / 1e6, 2),
        "dtypes": sorted({str(p.dtype).removeprefix("torch.") for p in params}),
        "trainable_dtypes": sorted({str(p.dtype).removeprefix("torch.") for p in params if p.requires_grad}),
    }


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _peak() -> float:
    """Peak CUDA memory allocated by this process; on CPU its peak resident set size."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


# -- workers (each in its own process) ---------------------------------------------------------------


def run_agentrl(model: str, P: int, G: int, N: int, steps: int, cpu: bool, lora: int | None = None) -> dict[str, Any]:
    from agentrl.core.overrides import build, parse_overrides
    from agentrl.train.config import TrainConfig
    from agentrl.train.trainer import Trainer

    out = tempfile.mkdtemp(prefix="agentrl-bench-")
    args = [
        f"model.path={model}", f"env={HERE}:make_env", f"env_args={{\"n\": {P * steps}}}", f"max_steps={steps}",
        f"prompts_per_step={P}", f"num_generations={G}", f"micro_batch_size={MICRO}", f"learning_rate={LR}",
        "adam_betas=[0.9,0.99]", "weight_decay=0", "max_grad_norm=1.0", "loss.loss_type=dapo", "loss.beta=0",
        "sampling.temperature=1.0", f"sampling.min_tokens={N}", f"rollout.max_tokens_per_turn={N}",
        f"rollout.max_completion_tokens={N}", f"rollout.max_context={N + 128}", "rollout.max_turns=1",
        f"output_dir={out}", "samples_per_log=0", "save_final=false", "eval_every=0",
        f"precision={'fp32' if cpu else 'bf16'}", f"gradient_checkpointing={'false' if cpu else 'true'}",
        # the environment already scores digits (an extra reward of the same name is refused)
    ]
    if CHUNK:
        args.append(f"logprob_chunk_size={int(CHUNK)}")
    if lora:  # alpha 32, all linear layers, no dropout: AdapterConfig' defaults, the same as TRL's side gets
        args.append(f"peft.r={lora}")
    args += os.environ.get("AGENTRL_BENCH_EXTRA", "").split()  # experiments: extra key=value overrides
    history = torch.cuda.is_available() and os.environ.get("AGENTRL_BENCH_MEMORY") == "1"
    if history:  # every allocation with its stack, from before the first (profile_memory.py; slows the run)
        import profile_memory

        profile_memory.record()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    trainer = Trainer(build(TrainConfig, parse_overrides(args)))
    experiment_kernels(trainer.learner.model, os.environ.get("AGENTRL_BENCH_KERNELS", ""))
    first_end = time_first_step(trainer)
    t0 = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - t0
    rows = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
    later = rows[1:] or rows
    step = statistics.median(r["perf/step_s"] for r in later)
    gen = statistics.median(r["rollout/elapsed_s"] for r in later)
    sampled = statistics.median(r["rollout/tokens/sampled"] for r in later)
    stats = getattr(trainer.generator, "static", None)
    phases = {k: max(r[k] for r in rows) for k in ("perf/peak_gib_rollout", "perf/peak_gib_train") if k in rows[0]}
    by_step = {k + "_by_step": [round(r[k], 3) for r in rows] for k in phases}  # does a phase's peak grow step by step?
    memory = None
    if history:
        memory = profile_memory.summarise(torch.cuda.memory._snapshot(), watch=tuple(os.environ.get("AGENTRL_BENCH_MEMORY_WATCH", "").split()))
        torch.cuda.memory._record_memory_history(enabled=None)
    return {
        **phases, **by_step, "memory_at_peak": memory,
        "step_s": step, "gen_s": gen, "train_s": step - gen, "sampled_tokens": sampled,
        "learn_s": statistics.median(r["perf/train_s"] for r in later),  # the learner: forward, backward, optimizer
        "first_step_s": rows[0]["perf/step_s"], "first_step_end_s": first_end[0] - T0, **weights(trainer.policy),
        "total_s": total, "steps": len(rows), "static_decode": None if stats is None else stats.stats,
        # batches whose captured steps drew their own tokens (generator.sample_in_step; the graph counts are the same either way)
        "sampled_in_step": getattr(trainer.generator, "stats", {}).get("sampled_in_step"),
        "peak_gib": max([_peak(), *phases.values()]),
        "skipped_steps": sum(int(r.get("train/skipped_nonfinite", 0)) for r in rows),
        "grad_norms": [r.get("grad_norm") for r in rows],
        # the generator's last batches: how much of a rollout's time is the decode loop itself
        "last_batches": [
            {"s": round(b["end"] - b["start"], 3), "requests": b["requests"], "forward_passes": b["forward_passes"],
             **{k: b[k] for k in ("captures", "capture_s", "wait_s") if k in b}}
            for b in list(getattr(trainer.generator, "stats", {}).get("trace", []))[-3:]
        ],
    }


def time_first_step(trainer: Any) -> list[float]:
    """A list that receives the wall-clock time at which ``trainer`` finished its first step."""
    when: list[float] = []
    finish = trainer._finish_step

    def timed(*a: Any, **kw: Any) -> Any:
        out = finish(*a, **kw)
        if not when:
            _sync()
            when.append(time.time())
        return out

    trainer._finish_step = timed
    return when


def experiment_kernels(model: Any, kind: str) -> None:
    """Experiments on agentrl's training forward, named in ``AGENTRL_BENCH_KERNELS`` (comma-separated):

    - ``liger``: liger-kernel's RMSNorm and SwiGLU on the training model's instance (needs
      ``pip install liger-kernel``), to judge it against ``compile_learner`` (benchmarks/RESULTS.md).
      The generation copy is built before this, so it decodes unpatched.
    - ``flash``: the learner's forward prefers flash attention to cuDNN's, whose per-shape
      execution plans took 0.54 s of host time in a multi-turn learner step (RESULTS.md, profile).
    """
    kinds = set(filter(None, kind.split(",")))
    if "liger" in kinds:
        from liger_kernel.transformers.monkey_patch import _patch_rms_norm_module, _patch_swiglu_module
        from liger_kernel.transformers.swiglu import LigerSwiGLUMLP

        base = model.get_decoder()
        for m in base.modules():
            if type(m).__name__.endswith("RMSNorm"):
                _patch_rms_norm_module(m)
        for layer in base.layers:
            _patch_swiglu_module(layer.mlp, LigerSwiGLUMLP)
    if "flash" in kinds:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        import agentrl.learn.learner as learner

        order = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH]
        plain = learner.Learner._step

        def step(self: Any, *a: Any, **kw: Any) -> Any:
            # around the whole step: the backward's checkpoint recompute must see the forward's kernel
            with sdpa_kernel(order, set_priority=True):
                return plain(self, *a, **kw)

        learner.Learner._step = step  # type: ignore[method-assign]
    if kinds:
        print(f"experiment kernels: {sorted(kinds)}", file=sys.stderr, flush=True)


def train_trl_timed(build: Callable[[type, list], Any]) -> tuple[Any, float, float, float]:
    """Train the GRPOTrainer ``build(trainer_class, callbacks)`` makes, timed from outside.

    Returns (trainer, step s, generation s, total s); step and generation times are medians over
    the steps after the first (warm-up). Generation is TRL's ``_generate`` alone, not scoring.
    The trainer also gets ``first_step_end`` (wall clock at the end of its first step) and
    ``first_step_s`` (that step's own seconds).
    The trainer also gets ``learn_times``: per optimizer step, the seconds of its micro-batches'
    ``training_step`` without ``_prepare_inputs`` (where TRL generates and scores) plus the
    optimizer step: the same work as agentrl's learner (``perf/train_s``).
    """
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    ends: list[float] = []
    first_end: list[float] = []
    gen_times: list[float] = []
    learn: dict[str, Any] = {"current": 0.0, "steps": [], "opt_start": 0.0}

    class Clock(TrainerCallback):
        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            _sync()
            learn["opt_start"] = time.perf_counter()

        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            _sync()
            learn["current"] += time.perf_counter() - learn["opt_start"]

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            _sync()
            ends.append(time.perf_counter())
            if len(ends) == 1:
                first_end.append(time.time())
            learn["steps"].append(learn["current"])
            learn["current"] = 0.0

    class Timed(GRPOTrainer):
        def _generate(self, *a: Any, **kw: Any) -> Any:
            _sync()
            t = time.perf_counter()
            out = super()._generate(*a, **kw)
            _sync()
            gen_times.append(time.perf_counter() - t)
            return out

        def _prepare_inputs(self, *a: Any, **kw: Any) -> Any:
            _sync()
            t = time.perf_counter()
            out = super()._prepare_inputs(*a, **kw)
            _sync()
            learn["current"] -= time.perf_counter() - t
            return out

        def training_step(self, *a: Any, **kw: Any) -> Any:
            _sync()
            t = time.perf_counter()
            out = super().training_step(*a, **kw)
            _sync()
            learn["current"] += time.perf_counter() - t
            return out

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    trainer = build(Timed, [Clock()])
    _sync()
    start = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - start
    marks = [start, *ends]
    durations = [b - a for a, b in zip(marks, marks[1:])]
    step = statistics.median(durations[1:] or durations)
    gen = statistics.median(gen_times[1:] or gen_times)
    trainer.learn_times = learn["steps"]
    trainer.first_step_end = first_end[0] if first_end else float("nan")
    trainer.first_step_s = durations[0] if durations else float("nan")
    return trainer, step, gen, total


def trl_path(cb: bool, lora: int | None) -> dict[str, Any]:
    """GRPOConfig keys for TRL's generation path and, for a LoRA row, its bf16 base.

    ``cb``: transformers' continuous batching (``generate_batch``), TRL's fastest path without
    vLLM; TRL's defaults for it (half the free memory for the paged cache; the model cast to bf16
    in place before each generation, so it trains in bf16 from the first step on).
    """
    keys: dict[str, Any] = {"use_transformers_continuous_batching": True} if cb else {}
    if lora:
        keys["model_init_kwargs"] = {"dtype": str(LORA_DTYPE).removeprefix("torch.")}
    return keys


def trl_peft(lora: int | None) -> Any:
    """The LoRA adapter of a LoRA row, as agentrl's ``peft.r`` with its defaults (alpha 32, all linear, no dropout)."""
    if not lora:
        return None
    from peft import LoraConfig

    return LoraConfig(r=lora, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")


def run_trl(model: str, P: int, G: int, N: int, steps: int, cpu: bool, cb: bool = False, lora: int | None = None) -> dict[str, Any]:
    import anyio
    from datasets import Dataset
    from trl import GRPOConfig

    env = make_env(P * steps)
    prompts = []
    for task in env.dataset("train"):
        messages, _ = anyio.run(env.reset, dict(task), 0)
        prompts.append({"prompt": messages})
    data = Dataset.from_list(prompts)
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-bench-"), per_device_train_batch_size=MICRO,
        gradient_accumulation_steps=P * G // MICRO, num_generations=G, max_completion_length=N,
        generation_kwargs={"min_new_tokens": N}, temperature=1.0, learning_rate=LR, loss_type="dapo", beta=0.0,
        num_iterations=1, bf16=not cpu, use_cpu=cpu, gradient_checkpointing=not cpu, max_steps=steps, logging_steps=1,
        report_to="none", save_strategy="no", seed=0, lr_scheduler_type="constant", max_grad_norm=1.0,
        adam_beta2=0.99, weight_decay=0.0, optim="adamw_torch" if cpu else "adamw_torch_fused",
        dataloader_num_workers=0, shuffle_dataset=False, **trl_path(cb, lora),
    )
    trainer, step, gen, total = train_trl_timed(
        lambda cls, callbacks: cls(model=model, reward_funcs=[digits], args=config, train_dataset=data, callbacks=callbacks, peft_config=trl_peft(lora))
    )
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    return {
        "step_s": step, "gen_s": gen, "train_s": step - gen, "sampled_tokens": (lengths[-1] if lengths else N) * P * G,
        "learn_s": statistics.median(trainer.learn_times[1:] or trainer.learn_times),
        "peak_gib": _peak(), "total_s": total, "steps": trainer.state.global_step,
        "first_step_s": trainer.first_step_s, "first_step_end_s": trainer.first_step_end - T0, **weights(trainer.model),
    }


# -- driver -------------------------------------------------------------------------------------------


def worker(args: argparse.Namespace) -> None:
    if args.worker == "sft":
        import multiturn_bench

        result = multiturn_bench.sft(args.model, args.row, args.sft_seconds)
    elif args.worker == "agentrl_offload":  # agentrl with AdamW's moments in host memory
        os.environ["AGENTRL_BENCH_EXTRA"] = (os.environ.get("AGENTRL_BENCH_EXTRA", "") + " optimizer_offload=true").strip()
        args.worker = "agentrl"
        worker(args)
        return
    elif args.row.startswith("mt"):  # multi-turn calculator row "mtPxG"
        import multiturn_bench

        P, G = (int(x) for x in args.row[2:].split("x"))
        if args.worker == "agentrl":
            result = multiturn_bench.run_agentrl(args.model, P, G, args.steps)
        else:
            result = multiturn_bench.run_trl(args.model, P, G, args.steps, cb=args.worker == "trl_cb")
    else:
        P, G, N = (int(x) for x in args.row.split("x"))
        if args.worker == "agentrl":
            result = run_agentrl(args.model, P, G, N, args.steps, args.cpu, lora=args.lora)
        else:
            result = run_trl(args.model, P, G, N, args.steps, args.cpu, cb=args.worker == "trl_cb", lora=args.lora)
    print("RESULT " + json.dumps(result), flush=True)


def _label(name: str, r: dict[str, Any]) -> str:
    """The framework cell: its name, plus any steps the trainer skipped for a non-finite gradient."""
    return name + (f" ({r['skipped_steps']} non-finite steps skipped)" if r.get("skipped_steps") else "")


def _times(other: dict[str, Any], r: dict[str, Any]) -> str:
    """TRL's step time over this framework's, worded so a ratio below 1 reads as slower."""
    v = other["step_s"] / r["step_s"]
    return f"{v:.2f}x " + ("faster" if v >= 1 else "(slower)")


def _against(pair: dict[str, dict[str, Any]], r: dict[str, Any], fmt: Callable[[dict[str, Any]], str]) -> str:
    """One cell per TRL path in this row that ran: ``fmt(TRL's result)``, joined with " / "."""
    cells = [fmt(pair[name]) if name in pair and "error" not in pair[name] else "-" for name in TRL_PATHS]
    return " / ".join(cells) if any(c != "-" for c in cells) else ""


def _first(r: dict[str, Any]) -> str:
    """Seconds from the worker's launch to the end of its first step (the first step's own seconds)."""
    if r.get("first_step_end_s") is None:
        return ""
    return f"{r['first_step_end_s']:.1f} ({r['first_step_s']:.1f})"


def table(results: list[dict[str, Any]]) -> str:
    """Markdown tables of ``results``; every ratio is against TRL's generate path / its continuous-batching path."""
    vs = " / ".join(TRL_PATHS.values())
    lines = [
        f"Ratios: against {vs} (\"-\": that path not run).",
        "",
        "| P x G x N | framework | step s | gen s | train s | learner s | generated tok/s (over the step) | trained tok/s (train phase) | peak GiB | first step end s (first step s) | agentrl/TRL speed | TRL/agentrl learner s | agentrl/TRL memory |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    by_row: dict[str, dict[str, dict[str, Any]]] = {}
    for r in results:
        by_row.setdefault(r["row"], {})[r["framework"]] = r
    mt = {row: pair for row, pair in by_row.items() if row.startswith("mt")}
    by_row = {row: pair for row, pair in by_row.items() if not row.startswith("mt")}
    for row, pair in by_row.items():
        for name, r in pair.items():
            label = _label(TRL_PATHS.get(name, name), r)
            if "error" in r:
                lines.append(f"| {row} | {label} | failed: {r['error'][:80]} | | | | | | | | | | |")
                continue
            tok = r["sampled_tokens"]
            speed = mem = learn = ""
            if name not in TRL_PATHS:
                speed = _against(pair, r, lambda o: _times(o, r))
                mem = _against(pair, r, lambda o: f"{r['peak_gib'] / o['peak_gib']:.2f}x")
                if r.get("learn_s"):
                    learn = _against(pair, r, lambda o: f"{o['learn_s'] / r['learn_s']:.2f}x" if o.get("learn_s") else "-")
            lines.append(
                f"| {row} | {label} | {r['step_s']:.2f} | {r['gen_s']:.2f} | {r['train_s']:.2f} | {r.get('learn_s', float('nan')):.2f} | "
                f"{tok / r['step_s']:,.0f} | {tok / max(r['train_s'], 1e-9):,.0f} | {r['peak_gib']:.2f} | {_first(r)} | {speed} | {learn} | {mem} |"
            )
    peaks = [
        f"{row} {name}: {r['perf/peak_gib_rollout']:.2f} / {r['perf/peak_gib_train']:.2f}"
        for row, pair in by_row.items() for name, r in pair.items() if "perf/peak_gib_train" in r
    ]
    if peaks:
        lines += ["", "agentrl peak GiB by phase (rollout / training): " + "; ".join(peaks)]
    if mt:
        lines += [
            "",
            "| multi-turn P x G | framework | step s | gen s | train s | learner s | episodes/s | tool calls/episode | turns/episode | final answer | reward | peak GiB | first step end s (first step s) | agentrl/TRL episodes/s in the rollout | agentrl/TRL step | agentrl/TRL memory |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
    for row, pair in mt.items():
        for name, r in pair.items():
            label = _label(TRL_PATHS.get(name, name), r)
            if "error" in r:
                lines.append(f"| {row[2:]} | {label} | failed: {r['error'][:80]} | | | | | | | | | | | | | |")
                continue
            eps = r["episodes"] / r["step_s"]
            gen_eps = r["episodes"] / r["gen_s"]
            ratio = step_ratio = mem = ""
            if name not in TRL_PATHS:
                ratio = _against(pair, r, lambda o: f"{gen_eps / (o['episodes'] / o['gen_s']):.2f}x")
                step_ratio = _against(pair, r, lambda o: _times(o, r))
                mem = _against(pair, r, lambda o: f"{r['peak_gib'] / o['peak_gib']:.2f}x")
            lines.append(
                f"| {row[2:]} | {label} | {r['step_s']:.2f} | {r['gen_s']:.2f} | {r['train_s']:.2f} | {r.get('learn_s', float('nan')):.2f} | "
                f"{eps:.1f} ({gen_eps:.1f} in rollout) | "
                f"{r['tool_calls_per_episode']:.2f} | {r.get('turns_mean', float('nan')):.2f} | {r.get('final_answer_rate', float('nan')):.0%} | "
                f"{r['reward']:.3f} | {r['peak_gib']:.2f} | {_first(r)} | {ratio} | {step_ratio} | {mem} |"
            )
    return "\n".join(lines)


FRAMEWORKS = ("agentrl", "agentrl_offload", "trl", "trl_cb")
SUMMARY = ("step_s", "gen_s", "learn_s", "peak_gib", "first_step_end_s", "first_step_s", "sampled_tokens", "steps", "skipped_steps", "trainable_m", "dtypes", "trainable_dtypes")


def check_args(args: argparse.Namespace) -> list[str]:
    """The run's frameworks, after every check that can fail before a model is built or loaded."""
    frameworks = args.frameworks.split(",")
    unknown = [f for f in frameworks if f not in FRAMEWORKS]
    if unknown:
        raise SystemExit(f"--frameworks: unknown {', '.join(unknown)}; known: {', '.join(FRAMEWORKS)}")
    rows = args.rows.split(",")
    for row in rows:
        parts = row[2:].split("x") if row.startswith("mt") else row.split("x")
        if len(parts) != (2 if row.startswith("mt") else 3) or not all(x.isdigit() and int(x) > 0 for x in parts):
            raise SystemExit(f"--rows: {row!r} is neither PxGxN nor mtPxG (positive integers)")
    if args.lora and any(r.startswith("mt") for r in rows):
        raise SystemExit("--lora: the multi-turn rows train the whole SFT model; run them without --lora")
    if args.lora and "agentrl_offload" in frameworks:
        raise SystemExit("--lora: agentrl_offload moves full fine-tuning's AdamW moments; LoRA has none worth moving")
    if args.model and not (Path(args.model) / "config.json").exists() and args.cpu and args.shape is None:
        raise SystemExit(f"--model {args.model}: no config.json there; give --shape to build one there")
    return frameworks


def run_worker(cmd: list[str], log: Path | None, timeout: float) -> tuple[str, str]:
    """Run one worker in its own process group; past ``timeout`` the whole group is killed. Returns (stdout, stderr)."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "AGENTRL_BENCH_T0": repr(time.time())}
    out = log.open("w") if log else subprocess.PIPE  # a file: a run killed by a time limit still leaves its log
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT if log else subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # its compile workers too
        stdout, stderr = proc.communicate()
        stderr = (stderr or "") + f"\nkilled after {timeout:.0f} s (--deadline)"
    if log:
        out.close()
        stdout = stderr = log.read_text() + (stderr or "")
    return stdout or "", stderr or ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default=".assets/qwen3", help="tokenizer folder for the GPU model")
    ap.add_argument("--rows", default="8x8x256,8x8x1024,32x8x512")
    ap.add_argument("--shape", choices=sorted(SHAPES), default=None, help="the model built when --model is not given or holds none yet (GPU default qwen2.5-0.5b; --cpu default: the bundled model)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--cpu", action="store_true", help="on CPU, both frameworks (the bundled model unless --shape)")
    ap.add_argument("--frameworks", default="trl,agentrl", help=f"comma-separated, in run order: {', '.join(FRAMEWORKS)} (trl_cb: TRL with use_transformers_continuous_batching=True)")
    ap.add_argument("--lora", type=int, default=None, help="LoRA rank for both sides (alpha 32, all linear layers); the built model and TRL's base are bf16")
    ap.add_argument("--model", default=None, help="model folder; one without config.json is built there from --shape (default: build one in a temp folder; --cpu: the bundled model)")
    ap.add_argument("--json", default=None, help="also write the results here (rewritten after every run)")
    ap.add_argument("--deadline", type=float, default=None, help="seconds for the whole command: a run is killed at it, later runs are not started")
    ap.add_argument("--sft-seconds", type=float, default=90, help="multi-turn rows: SFT time before the runs")
    ap.add_argument("--logs", default=None, help="write each run's stderr and stdout (as it runs) to <logs>/<row>-<framework>.log")
    ap.add_argument("--sft-model", default=None, help="multi-turn rows: where the SFT model goes (default: a temp folder); a folder that already holds one is reused")
    ap.add_argument("--worker", choices=[*FRAMEWORKS, "sft"], help=argparse.SUPPRESS)
    ap.add_argument("--row", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    started = time.perf_counter()
    frameworks = check_args(args)
    if not args.cpu:
        assert torch.cuda.is_available(), "GPU mode needs CUDA; use --cpu on this machine"
    if args.cpu and args.shape is None:
        from agentrl.compute.models import resolve_model

        model = args.model or str(resolve_model("default"))
    else:
        model = args.model or tempfile.mkdtemp(prefix="bench-model-")
        if not (Path(model) / "config.json").exists():
            shape = args.shape or "qwen2.5-0.5b"
            t = time.perf_counter()
            build_model(args.tokenizer, Path(model), dtype=LORA_DTYPE if args.lora else torch.float32, shape=shape)
            print(f"built {shape} in {model} in {time.perf_counter() - t:.1f} s", flush=True)
    device = "cpu" if args.cpu else torch.cuda.get_device_name()
    results: list[dict[str, Any]] = []
    rows = args.rows.split(",")
    sft_model = None
    if any(r.startswith("mt") for r in rows):  # teach the random model to call the tool first
        sft_model = args.sft_model or tempfile.mkdtemp(prefix="q05-sft-")
        if (Path(sft_model) / "config.json").exists():  # an earlier run's SFT model: compare runs on the same one
            print(f"sft: reusing {sft_model}", flush=True)
        else:
            cmd = [sys.executable, str(HERE), "--worker", "sft", "--row", sft_model, "--model", model, "--sft-seconds", str(args.sft_seconds)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            found = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
            print("sft: " + (found[-1][7:] if found else proc.stderr[-3000:]), flush=True)
    for row in rows:
        for fw in frameworks:
            result: dict[str, Any]
            left = None if args.deadline is None else args.deadline - (time.perf_counter() - started)
            t = time.perf_counter()
            if left is not None and left < 30:
                result = {"error": f"not run: {left:.0f} s left of --deadline"}
            else:
                target = sft_model if row.startswith("mt") else model
                cmd = [sys.executable, str(HERE), "--worker", fw, "--row", row, "--model", str(target), "--steps", str(args.steps)]
                cmd += (["--cpu"] if args.cpu else []) + ([f"--lora={args.lora}"] if args.lora else [])
                log = None
                if args.logs:
                    Path(args.logs).mkdir(parents=True, exist_ok=True)
                    log = Path(args.logs) / f"{row}-{fw}.log"
                stdout, stderr = run_worker(cmd, log, timeout=left if left is not None else 1e9)
                found = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
                if found:
                    result = json.loads(found[-1][7:])
                else:
                    result = {"error": (stderr.strip().splitlines() or ["no output"])[-1]}
                    print(stderr[-3000:], file=sys.stderr)
            result.update(row=row, framework=fw, wall_s=time.perf_counter() - t, lora=args.lora)
            results.append(result)
            brief = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in result.items() if k in (*SUMMARY, "row", "framework", "wall_s", "error")}
            print("RUN " + json.dumps(brief), flush=True)
            if args.json:  # after every run: a command cut short still leaves what it measured
                Path(args.json).write_text(json.dumps({"device": device, "results": results}, indent=1))
    name = args.model if args.model and not args.shape else (args.shape or ("bundled" if args.cpu else "qwen2.5-0.5b"))
    print(f"\ndevice: {device}; torch {torch.__version__}; {time.strftime('%Y-%m-%d')}; model {name}" + (f"; LoRA r={args.lora}" if args.lora else ""))
    print(table(results))


if __name__ == "__main__":
    main()
