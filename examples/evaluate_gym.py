"""Evaluate a model on an environment's test split with a plain gym-style reset/step loop.

    python examples/evaluate_gym.py --env calculator --model default --n 200

Each episode is ``reset`` → (render → generate → parse → ``step``)* until terminated or
truncated. Episodes advance in lockstep batches only so that ``model.generate`` can batch them;
the environment sees exactly one reset/step sequence per episode. Prints the well-formed
tool-call rate and accuracy (mean of the episode's "correct" reward, else its total reward).
"""

from __future__ import annotations

import argparse
import time

import torch

import agentrl
from agentrl.chat import get_chat_format
from agentrl.compute.models import load_model, load_tokenizer, pad_token_id
from agentrl.core.records import MALFORMED


def generate(model, fmt, prompts: list[list[int]], max_new_tokens: int, pad_id: int) -> list[list[int]]:
    """Greedy continuations of several prompts in one left-padded batch."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, p in enumerate(prompts):
        ids[r, width - len(p) :] = torch.tensor(p)
        mask[r, width - len(p) :] = 1
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids.to(model.device),
            attention_mask=mask.to(model.device),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=fmt.stop_token_ids,
            pad_token_id=pad_id,
        )
    results = []
    for row in out[:, width:].tolist():
        cut = next((i for i, t in enumerate(row) if t in fmt.stop_token_ids), None)
        results.append(row if cut is None else row[: cut + 1])
    return results


def run(env_name: str, model_spec: str, split: str, n: int, batch_size: int = 64, max_new_tokens: int = 64, seed: int = 0) -> dict:
    """The gym loop over the first ``n`` tasks of ``split``; returns rates and per-episode scores."""
    torch.manual_seed(seed)
    tokenizer = load_tokenizer(model_spec)
    model = load_model(model_spec)
    fmt = get_chat_format(tokenizer)
    pad_id = pad_token_id(tokenizer, fmt.stop_token_ids)
    base = agentrl.make(env_name)
    tasks = list(base.dataset(split))[:n]

    calls = malformed = episodes_with_call = 0
    scores: list[float] = []
    for b in range(0, len(tasks), batch_size):
        envs = [base.spawn().sync() for _ in tasks[b : b + batch_size]]
        convos, done, score = [], [], []
        for i, env in enumerate(envs):
            messages, info = env.reset(task=tasks[b + i], seed=seed + b + i)
            convos.append(messages)
            done.append(False)
            score.append(0.0)
        used_call = [False] * len(envs)
        while not all(done):
            live = [i for i, d in enumerate(done) if not d]
            prompts = [fmt.render(convos[i], tools=envs[i].tool_schemas()) for i in live]
            for i, out in zip(live, generate(model, fmt, prompts, max_new_tokens, pad_id)):
                parsed = fmt.parse(out)
                message = parsed.to_message()
                new, reward, terminated, truncated, info = envs[i].step(message)
                if "<tool_call>" in fmt.decode(out):  # the turn tried to call a tool
                    kinds = {r.kind for r in info["tool_records"]}
                    bad = bool(parsed.issues) or not parsed.tool_calls or bool(kinds & MALFORMED)
                    calls += 1
                    malformed += int(bad)
                    used_call[i] = True
                convos[i] = convos[i] + [message] + new
                if terminated or truncated:
                    done[i] = True
                    score[i] = info["rewards"].get("correct", reward)
        for env in envs:
            env.close()
        scores.extend(score)
        episodes_with_call += sum(used_call)
    n_done = len(scores)
    return {
        "episodes": n_done,
        "episodes_with_call": episodes_with_call / n_done,
        "well_formed": (calls - malformed) / max(1, calls),
        "tool_call_turns": calls,
        "accuracy": sum(scores) / n_done,
        "scores": scores,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description="gym-style evaluation")
    ap.add_argument("--env", default="calculator")
    ap.add_argument("--model", default="default")
    ap.add_argument("--split", default="test")
    ap.add_argument("--n", type=int, default=200, help="number of test tasks")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    start = time.time()
    r = run(args.env, args.model, args.split, args.n, args.batch_size, args.max_new_tokens, args.seed)
    print(f"env={args.env} model={args.model} split={args.split} episodes={r['episodes']} ({time.time() - start:.0f}s)")
    print(f"episodes with a tool call: {r['episodes_with_call']:.1%}")
    print(f"well-formed tool calls:    {r['well_formed']:.1%} of {r['tool_call_turns']}")
    print(f"accuracy:                  {r['accuracy']:.1%}")


if __name__ == "__main__":
    main()
