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
MAX_TURNS = 6  # assistant turns per episode, both sides
SEED = 0  # agentrl's task order; TRL's side is given the same tasks in the same order


def calculator(expression: str):  # type: ignore[no-untyped-def]
    # No return annotation on purpose: transformers' get_json_schema adds it to the schema as
    # "return": {"type": "string"}, which the environment's schema (the one sft() trains on) lacks,
    # so TRL's model saw a system prompt 9 tokens different from every SFT transcript
    # (`python benchmarks/multiturn_bench.py --trl-oracle` compares the tokens).
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
    from agentrl.compute.logprobs import token_logprobs

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


def agentrl_args(model: str, P: int, G: int, steps: int, lr: float = 1e-6) -> list[str]:
    """agentrl's settings for the multi-turn rows (and learning_race.py), as CLI keys."""
    return [
        # TRL's reward is `correct` alone (trl_setup), so agentrl's is too: the calculator's format and per-turn
        # progress terms off and the episode advantage, the same objective on both sides
        # The calculator's recommended training settings (CalculatorEnv.train_defaults) are the
        # defaults under these keys; TRL's side has neither, so both are pinned here: the train
        # split's levels (its default adds one-call tasks the SFT never showed) and no
        # demonstrations (guidance replaces each group's worst episode and leaves it out of the
        # reported reward). The task order is the trainer's (seed 0), which trl_setup copies.
        f"model.path={model}", "env=calculator",
        f"env_args={{\"difficulty\": {DIFFICULTY}, \"train_difficulty\": {DIFFICULTY}, \"format_weight\": 0, \"progress_weight\": 0}}",
        "guidance.enabled=false", f"seed={SEED}", "advantage=episode", f"max_steps={steps}",
        f"prompts_per_step={P}", f"num_generations={G}", "micro_batch_size=16", f"learning_rate={lr}",
        "adam_betas=[0.9,0.99]", "weight_decay=0", "max_grad_norm=1.0", "loss.loss_type=dapo", "loss.beta=0",
        "sampling.temperature=1.0", f"rollout.max_tokens_per_turn={MAX_COMPLETION}",
        f"rollout.max_completion_tokens={MAX_COMPLETION}", "rollout.max_context=1536", f"rollout.max_turns={MAX_TURNS}",
        f"output_dir={tempfile.mkdtemp(prefix='agentrl-mt-')}", f"samples_per_log={8 if os.environ.get('AGENTRL_MT_SAMPLES') else 0}", "save_final=false",
        *(["precision=bf16", "gradient_checkpointing=true"] if torch.cuda.is_available() else ["precision=fp32"]),  # decoder: defaults
    ]


def run_agentrl(model: str, P: int, G: int, steps: int) -> dict[str, Any]:
    from agentrl.core.overrides import build, parse_overrides
    from agentrl.train.config import TrainConfig
    from agentrl.train.trainer import Trainer

    args = agentrl_args(model, P, G, steps)
    args += os.environ.get("AGENTRL_BENCH_EXTRA", "").split()  # e.g. optimizer_offload=true
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    trainer = Trainer(build(TrainConfig, parse_overrides(args)))
    from gpu_vs_trl import T0, experiment_kernels, time_first_step

    experiment_kernels(trainer.learner.model, os.environ.get("AGENTRL_BENCH_KERNELS", ""))
    first_end = time_first_step(trainer)
    trainer.train()
    rows = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        print("STEP", r["step"], "well_formed", r.get("rollout/tools/well_formed_rate"), "calls", r.get("rollout/tools/calls"),
              "sampled", r.get("rollout/tokens/sampled"), "reward", r.get("reward/mean"), "grad_norm", r.get("grad_norm"),
              "skipped", r.get("train/skipped_nonfinite"), file=sys.stderr, flush=True)
    trace = list(trainer.generator.stats.get("trace", []))
    t0 = trace[0]["start"] if trace else 0.0
    for b in trace:  # the generator's batches: when, how long, how many requests and forward passes
        print(f"BATCH at {b['start'] - t0:8.3f} s  {1000 * (b['end'] - b['start']):7.1f} ms  requests {b['requests']:3d}"
              f"  admitted {b['admitted']:3d}  passes {b['forward_passes']:4d}  longest prompt {b['longest_prompt']}", file=sys.stderr)
    later = rows[1:] or rows
    step = statistics.median(r["perf/step_s"] for r in later)
    gen = statistics.median(r["rollout/elapsed_s"] for r in later)
    return {
        "step_s": step, "gen_s": gen, "train_s": step - gen, "episodes": P * G,
        "learn_s": statistics.median(r["perf/train_s"] for r in later),  # the learner: forward, backward, optimizer
        "first_step_s": rows[0]["perf/step_s"], "first_step_end_s": first_end[0] - T0,
        # what the episodes did, over every step as TRL's side reports it (times: after the first step)
        "sampled_tokens": statistics.mean(r["rollout/tokens/sampled"] for r in rows),
        "turns_mean": statistics.mean(r["rollout/turns/mean"] for r in rows),
        "tool_calls_per_episode": statistics.mean(r["rollout/tools/calls"] for r in rows) / (P * G),
        "well_formed": statistics.mean(r["rollout/tools/well_formed_rate"] for r in rows),
        "final_answer_rate": 1 - statistics.mean(r["rollout/truncated_rate"] for r in rows),  # not cut by a limit: it answered
        "reward": statistics.mean(r["reward/mean"] for r in rows),
        "peak_gib": max(max(r.get("perf/peak_gib_train", 0), r.get("perf/peak_gib_rollout", 0)) for r in rows),
        "skipped_steps": sum(int(r.get("train/skipped_nonfinite", 0)) for r in rows),
        "calls_per_step": [r.get("rollout/tools/calls") for r in rows],
        "gen_s_steps": [round(r["rollout/elapsed_s"], 2) for r in rows], "learn_s_steps": [round(r["perf/train_s"], 2) for r in rows],
        "generator": {k: trainer.generator.stats.get(k) for k in ("batches", "admitted", "admissions", "forward_passes", "sampled_in_step")},
        # seconds per rollout inside the generator's batches (the rest of gen_s: between batches)
        "batch_s_per_step": sum(b["end"] - b["start"] for b in trace) / len(rows) if trace else None,
    }


def trl_setup(model: str, P: int, G: int, steps: int, lr: float = 1e-6, cb: bool = False) -> tuple[Any, Any, Any, dict[str, list[float]]]:
    """TRL's side of the multi-turn rows: (GRPOConfig, dataset, reward function, per-episode stats it fills).

    ``cb``: TRL's continuous-batching generation (``use_transformers_continuous_batching``).
    """
    import anyio
    from datasets import Dataset
    from trl import GRPOConfig

    from agentrl.environments.calculator import correct
    from agentrl.train.state import TrainState

    env = make_env()
    train = env.dataset("train")
    rows = []
    # the tasks agentrl's trainer draws for these steps, in its order (TRL does not shuffle them)
    for task in TrainState.start(len(train), SEED).next_tasks(train, min(P * steps, len(train))):
        messages, _ = anyio.run(env.reset, dict(task), 0)
        rows.append({"prompt": messages, "answer": task["answer"]})
    stats: dict[str, list[float]] = {"calls": [], "turns": [], "answered": []}

    def reward(completions: list, answer: list, **_: Any) -> list[float]:
        out = []
        for messages, target in zip(completions, answer):
            stats["calls"].append(sum(len(m.get("tool_calls") or []) for m in messages if m.get("role") == "assistant"))
            stats["turns"].append(sum(m.get("role") == "assistant" for m in messages))
            last = messages[-1] if messages else {}
            # an episode that ended on an assistant message without a tool call: it gave its answer
            stats["answered"].append(float(last.get("role") == "assistant" and not last.get("tool_calls")))
            final = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "assistant"), "")
            out.append(correct(final, target))
        return out

    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-mt-"), per_device_train_batch_size=16,
        gradient_accumulation_steps=P * G // 16, num_generations=G, max_completion_length=MAX_COMPLETION,
        # TRL's first generation plus one per tool round: MAX_TURNS assistant turns, as agentrl's max_turns
        max_tool_calling_iterations=MAX_TURNS - 1, temperature=1.0, learning_rate=lr, loss_type="dapo", beta=0.0,
        num_iterations=1, bf16=torch.cuda.is_available(), use_cpu=not torch.cuda.is_available(),
        gradient_checkpointing=torch.cuda.is_available(), max_steps=steps, logging_steps=1, report_to="none",
        save_strategy="no", seed=0, lr_scheduler_type="constant", max_grad_norm=1.0, adam_beta2=0.99, weight_decay=0.0,
        optim="adamw_torch_fused" if torch.cuda.is_available() else "adamw_torch", dataloader_num_workers=0, shuffle_dataset=False,
        use_transformers_continuous_batching=cb,
    )
    return config, Dataset.from_list(rows), reward, stats


def trl_trainer(model: str, P: int, G: int, steps: int, lr: float = 1e-6, callbacks: list[Any] | None = None, cls: Any = None) -> Any:
    """A GRPOTrainer with the multi-turn rows' settings and the calculator tool."""
    from trl import GRPOTrainer

    config, data, reward, _ = trl_setup(model, P, G, steps, lr)
    return (cls or GRPOTrainer)(model=model, reward_funcs=[reward], args=config, train_dataset=data, tools=[calculator], callbacks=callbacks)


def run_trl(model: str, P: int, G: int, steps: int, cb: bool = False) -> dict[str, Any]:
    from gpu_vs_trl import T0, train_trl_timed

    config, data, reward, stats = trl_setup(model, P, G, steps, cb=cb)
    trainer, step, gen, _total = train_trl_timed(
        lambda cls, callbacks: cls(model=model, reward_funcs=[reward], args=config, train_dataset=data, tools=[calculator], callbacks=callbacks)
    )
    calls, turns, answered = stats["calls"], stats["turns"], stats["answered"]
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    return {
        "step_s": step, "gen_s": gen, "train_s": step - gen, "episodes": P * G,
        "learn_s": statistics.median(trainer.learn_times[1:] or trainer.learn_times),
        "sampled_tokens": (statistics.mean(lengths) if lengths else float("nan")) * P * G,
        "tool_calls_per_episode": statistics.mean(calls) if calls else 0.0,
        "turns_mean": statistics.mean(turns) if turns else float("nan"),
        "final_answer_rate": statistics.mean(answered) if answered else float("nan"),
        "reward": statistics.mean(rewards) if rewards else float("nan"),
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else float("nan"),
        "first_step_s": trainer.first_step_s, "first_step_end_s": trainer.first_step_end - T0,
    }


# -- checking TRL's side of the comparison with a perfect scripted policy (CPU, no training) ----------


def _oracle_text(tok: Any, ids: list[int], tasks: dict[str, dict[str, Any]]) -> str:
    """What a perfect calculator policy says next in this conversation, in the SFT transcripts' form."""
    text = tok.decode(ids)
    question = text.rsplit("<|im_start|>user\n", 1)[0] if "<tool_response>" in text.rsplit("<|im_start|>user\n", 1)[-1] else text
    task = next(t for q, t in tasks.items() if q in question)
    done = text.count("<tool_response>")
    if done < len(task["steps"]):
        call = json.dumps({"name": "calculator", "arguments": {"expression": task["steps"][done]}})
        return f"<think>\n\n</think>\n\n<tool_call>\n{call}\n</tool_call><|im_end|>"
    return f"<think>\n\n</think>\n\nThe answer is {task['answer']}.<|im_end|>"


def trl_oracle(tokenizer_dir: str, P: int = 4, G: int = 2) -> dict[str, Any]:
    """Run TRL's tool loop and reward (``run_trl``'s settings) with a perfect scripted policy.

    The model is a tiny random one; TRL's token generation is replaced by the oracle, so every
    other part of TRL's multi-turn path runs as in the benchmark: the chat template it picks, the
    tool-call parser, the tool execution, the tool-result suffix, ``max_completion_length``, and the
    reward reading the final message. A perfect policy must score 1.0; anything less is the
    benchmark's (or TRL's) doing, not the model's.
    """
    import anyio
    from datasets import Dataset
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_chat_template

    from agentrl.environments.calculator import correct

    folder = tempfile.mkdtemp(prefix="trl-oracle-")
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    tok.chat_template = qwen3_chat_template  # what sft() saves with the model
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=1,
                      num_key_value_heads=1, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"), pad_token_id=tok.pad_token_id)
    Qwen2ForCausalLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)

    env = make_env()
    rows, tasks = [], {}
    for task in env.dataset("train").select(range(P)):
        messages, _ = anyio.run(env.reset, dict(task), 0)
        rows.append({"prompt": messages, "answer": task["answer"]})
        tasks[task["question"]] = dict(task)
    seen: list[dict[str, Any]] = []

    def reward(completions: list, answer: list, **_: Any) -> list[float]:
        out = []
        for messages, target in zip(completions, answer):
            final = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "assistant"), "")
            out.append(correct(final, target))
            seen.append({"messages": messages, "answer": target, "final": final, "reward": out[-1]})
        return out

    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-oracle-out-"), per_device_train_batch_size=P * G, num_generations=G,
        max_completion_length=MAX_COMPLETION, max_tool_calling_iterations=6, use_cpu=True, max_steps=1, report_to="none",
        save_strategy="no", logging_steps=1, beta=0.0, loss_type="dapo", shuffle_dataset=False, dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(model=folder, reward_funcs=[reward], args=config, train_dataset=Dataset.from_list(rows), tools=[calculator])

    prompts_seen: list[list[int]] = []

    def generate(self: Any, prompt_ids: list[list[int]], *args: Any, **kwargs: Any) -> tuple[list[list[int]], None]:
        prompts_seen.extend(prompt_ids)
        return [tok.encode(_oracle_text(tok, ids, tasks), add_special_tokens=False) for ids in prompt_ids], None

    trainer._generate_single_turn = generate.__get__(trainer)
    trainer.train()
    first = seen[0]["messages"] if seen else []
    # the tokens TRL fed the model before its last turn, against agentrl's rendering of the same
    # conversation with the environment's tool schemas (what sft() trained the model on)
    from agentrl.chat import get_chat_format

    fmt = get_chat_format(AutoTokenizer.from_pretrained(folder))
    ours = fmt.render(rows[0]["prompt"] + [dict(m) for m in first[:-1]], tools=env.tool_schemas(), add_generation_prompt=True)
    question = rows[0]["prompt"][-1]["content"]
    theirs = max((ids for ids in prompts_seen if question in tok.decode(ids)), key=len)
    at = next((i for i, (x, y) in enumerate(zip(ours, theirs)) if x != y), None)
    if at is None and len(ours) != len(theirs):
        at = min(len(ours), len(theirs))
    return {
        "same_tokens_as_sft": at is None,
        "first_difference": None if at is None else {"agentrl": tok.decode(ours[at : at + 40]), "trl": tok.decode(theirs[at : at + 40])},
        "template": "TRL training template" if trainer.chat_template else "tokenizer's own",
        "episodes": len(seen), "reward_mean": statistics.mean(s["reward"] for s in seen) if seen else float("nan"),
        "tool_calls_per_episode": statistics.mean(sum(len(m.get("tool_calls") or []) for m in s["messages"]) for s in seen) if seen else 0.0,
        "first_episode": first, "first_final": seen[0]["final"] if seen else None,
    }


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="checks of the multi-turn benchmark")
    ap.add_argument("--trl-oracle", action="store_true", help="TRL's tool loop and reward with a perfect scripted policy")
    ap.add_argument("--tokenizer", default=str(Path.home() / ".cache/agentrl/test-assets/qwen3"))
    a = ap.parse_args()
    if a.trl_oracle:
        print(json.dumps(trl_oracle(a.tokenizer), indent=1, default=str))
