"""Multi-turn rows of gpu_vs_trl.py: calculator episodes with 2-3 tool calls, agentrl vs TRL's tool loop.

A random model never calls a tool, so ``sft`` first teaches the 0.5B-shaped model the episode
shape on the device (ideal calculator transcripts from the calculator environment, rendered with
the chat format agentrl uses for this tokenizer, loss on the assistant spans). Both frameworks
then train that model on the same calculator tasks: agentrl with ``env=calculator``, TRL's
GRPOTrainer with ``tools=[calculator]`` (the same tool function and schema) and the same
correctness reward. TRL only recognises chat templates byte for byte, so the model folder carries
TRL's copy of the Qwen3 template; agentrl detects it by its behaviour like any other.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
DIFFICULTY = [2, 3]  # two or three calculator calls, then the answer: 3-4 assistant turns
MAX_COMPLETION = 256


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: The expression, e.g. "12 * 7".
    """
    from agentrl.tools.calculator import evaluate, format_number

    return format_number(evaluate(expression, max_ops=1))


def make_env() -> Any:
    from agentrl.environments.calculator import CalculatorEnv

    return CalculatorEnv(difficulty=DIFFICULTY)


def _examples(fmt: Any, env: Any, n: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """(ids, loss mask) of ideal episodes; the mask covers every assistant turn's tokens."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from train_default_model import conversation

    rng = random.Random(seed)
    tools = env.tool_schemas()
    out = []
    for task in env.dataset("train").select(range(n)):
        messages = conversation(dict(task), rng)
        full = fmt.render(messages, tools=tools)
        mask = [0] * len(full)
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            start = len(fmt.render(messages[:i], tools=tools, add_generation_prompt=True))
            end = len(fmt.render(messages[: i + 1], tools=tools))
            mask[start:end] = [1] * (end - start)
        out.append((full, mask))
    return out


def sft(model_dir: str, out_dir: str, seconds: float, batch: int = 32 if torch.cuda.is_available() else 4, lr: float = 3e-4) -> dict[str, Any]:
    """Supervised training for ``seconds`` of wall time; saves the result to ``out_dir``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.chat_template_utils import qwen3_chat_template

    from agentrl.chat import get_chat_format
    from agentrl.logprobs import token_logprobs

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.chat_template = qwen3_chat_template
    fmt = get_chat_format(tok)
    env = make_env()
    data = _examples(fmt, env, 2048, seed=0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), fused=dev == "cuda" or None)
    rng = random.Random(1)
    start, step, losses = time.perf_counter(), 0, []
    while time.perf_counter() - start < seconds:
        rows = rng.sample(data, batch)
        width = max(len(ids) for ids, _ in rows)
        ids = torch.full((batch, width), tok.pad_token_id or 0, dtype=torch.long)
        attn = torch.zeros((batch, width), dtype=torch.long)
        weight = torch.zeros((batch, width - 1))
        for i, (x, m) in enumerate(rows):
            ids[i, : len(x)] = torch.tensor(x)
            attn[i, : len(x)] = 1
            weight[i, : len(x) - 1] = torch.tensor(m[1:], dtype=torch.float32)  # position p predicts p + 1
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / 20)
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
            lp = token_logprobs(model, ids.to(dev), attn.to(dev), chunk_size=1024)  # never B x T x V at once
        weight = weight.to(dev)
        loss = -(lp * weight).sum() / weight.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
        step += 1
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return {"sft_steps": step, "sft_s": time.perf_counter() - start, "sft_loss_last10": statistics.mean(losses[-10:])}


def run_agentrl(model: str, P: int, G: int, steps: int) -> dict[str, Any]:
    from agentrl.config import build, parse_overrides
    from agentrl.train_config import TrainConfig
    from agentrl.trainer import Trainer

    args = [
        f"model.path={model}", "env=calculator", f"env_args={{\"difficulty\": {DIFFICULTY}}}", f"max_steps={steps}",
        f"prompts_per_step={P}", f"num_generations={G}", "micro_batch_size=16", "learning_rate=1e-6",
        "adam_betas=[0.9,0.99]", "weight_decay=0", "max_grad_norm=1.0", "loss.loss_type=dapo", "loss.beta=0",
        "sampling.temperature=1.0", f"rollout.max_tokens_per_turn={MAX_COMPLETION}",
        f"rollout.max_completion_tokens={MAX_COMPLETION}", "rollout.max_context=1536", "rollout.max_turns=6",
        f"output_dir={tempfile.mkdtemp(prefix='agentrl-mt-')}", f"samples_per_log={8 if os.environ.get('AGENTRL_MT_SAMPLES') else 0}", "save_final=false",
        "logprob_chunk_size=256",
        *(["precision=bf16", "gradient_checkpointing=true"] if torch.cuda.is_available() else ["precision=fp32"]),  # decoder: defaults
    ]
    args += os.environ.get("AGENTRL_BENCH_EXTRA", "").split()  # e.g. optimizer_offload=true
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    trainer = Trainer(build(TrainConfig, parse_overrides(args)))
    trainer.train()
    rows = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        print("STEP", r["step"], "well_formed", r.get("rollout/tools/well_formed_rate"), "calls", r.get("rollout/tools/calls"),
              "sampled", r.get("rollout/tokens/sampled"), "reward", r.get("reward/mean"), "grad_norm", r.get("grad_norm"),
              "skipped", r.get("train/skipped_nonfinite"), file=sys.stderr, flush=True)
    later = rows[1:] or rows
    step = statistics.median(r["perf/step_s"] for r in later)
    gen = statistics.median(r["rollout/elapsed_s"] for r in later)
    return {
        "step_s": step, "gen_s": gen, "train_s": step - gen, "episodes": P * G,
        "sampled_tokens": statistics.median(r["rollout/tokens/sampled"] for r in later),
        "turns_mean": statistics.mean(r["rollout/turns/mean"] for r in later),
        "tool_calls_per_episode": statistics.mean(r["rollout/tools/calls"] for r in later) / (P * G),
        "well_formed": statistics.mean(r["rollout/tools/well_formed_rate"] for r in later),
        "reward": statistics.mean(r["reward/mean"] for r in later),
        "peak_gib": max(max(r.get("perf/peak_gib_train", 0), r.get("perf/peak_gib_rollout", 0)) for r in rows),
        "skipped_steps": sum(int(r.get("train/skipped_nonfinite", 0)) for r in rows),
        "calls_per_step": [r.get("rollout/tools/calls") for r in rows],
    }


def run_trl(model: str, P: int, G: int, steps: int) -> dict[str, Any]:
    import anyio
    from datasets import Dataset
    from gpu_vs_trl import train_trl_timed
    from trl import GRPOConfig

    from agentrl.environments.calculator import correct

    env = make_env()
    rows = []
    for task in env.dataset("train").select(range(P * steps)):
        messages, _ = anyio.run(env.reset, dict(task), 0)
        rows.append({"prompt": messages, "answer": task["answer"]})
    calls: list[float] = []

    def reward(completions: list, answer: list, **_: Any) -> list[float]:
        out = []
        for messages, target in zip(completions, answer):
            calls.append(sum(len(m.get("tool_calls") or []) for m in messages if m.get("role") == "assistant"))
            final = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "assistant"), "")
            out.append(correct(final, target))
        return out

    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-mt-"), per_device_train_batch_size=16,
        gradient_accumulation_steps=P * G // 16, num_generations=G, max_completion_length=MAX_COMPLETION,
        max_tool_calling_iterations=6, temperature=1.0, learning_rate=1e-6, loss_type="dapo", beta=0.0,
        num_iterations=1, bf16=torch.cuda.is_available(), use_cpu=not torch.cuda.is_available(),
        gradient_checkpointing=torch.cuda.is_available(), max_steps=steps, logging_steps=1, report_to="none",
        save_strategy="no", seed=0, lr_scheduler_type="constant", max_grad_norm=1.0, adam_beta2=0.99, weight_decay=0.0,
        optim="adamw_torch_fused" if torch.cuda.is_available() else "adamw_torch", dataloader_num_workers=0, shuffle_dataset=False,
    )
    trainer, step, gen, _total = train_trl_timed(
        lambda cls, callbacks: cls(
            model=model, reward_funcs=[reward], args=config, train_dataset=Dataset.from_list(rows), tools=[calculator], callbacks=callbacks
        )
    )
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    return {
        "step_s": step, "gen_s": gen, "train_s": step - gen, "episodes": P * G,
        "sampled_tokens": (statistics.mean(lengths) if lengths else float("nan")) * P * G,
        "tool_calls_per_episode": statistics.mean(calls) if calls else 0.0,
        "reward": statistics.mean(rewards) if rewards else float("nan"),
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else float("nan"),
    }
