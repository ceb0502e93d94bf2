"""Build agentrl's bundled default model from nothing: tokenizer, architecture, SFT.

The result is a ~4M-parameter Qwen2-architecture causal LM with its own byte-level BPE tokenizer
(single-digit number tokens) and our ChatML + tools template, supervised on synthetic calculator
conversations made with the real calculator environment and tool. Training stops on a fixed step
budget chosen so the model calls the tool well-formed nearly always but gets the final answer
right only part of the time — room for RL to show a rising reward.

Reproducible from ``--seed``; runs in about ten minutes on two CPU cores.

    python scripts/train_default_model.py --out agentrl/bundled/default_model

``--env sokoban`` builds a starting model for Sokoban the same way (same tokenizer recipe, with
every board character its own token, same architecture and SFT loop), from episodes played through
the environment's real ``reset``/``step`` loop by a deliberately imperfect scripted player: each
move is the BFS reference move with probability ``--reference-prob``, else a random direction. The
model learns to call ``move`` well-formed and solves part of the held-out levels, leaving RL room:

    python scripts/train_default_model.py --env sokoban --out runs/sokoban-start

``--env math_python`` does the same from ideal math_python episodes: one ``python`` call with the
scripted solver's short program (``solution_program``), the sandbox's real output through the
environment's ``reset``/``step`` loop, then "The answer is N.". The step budget is cut short so the
model writes well-formed calls but copies numbers imperfectly, leaving RL room:

    python scripts/train_default_model.py --env math_python --out runs/mathpy-start
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

import anyio
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from agentrl.environments.calculator import CalculatorEnv
from agentrl.environments.math_python import MathPythonEnv, solution_program
from agentrl.environments.sokoban import MOVES, SokobanEnv, scripted_move
from agentrl.tools.calculator import evaluate, format_number

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
]
TEMPLATE_PATH = Path(__file__).resolve().parents[1] / "agentrl" / "chat" / "templates" / "chatml_tools.jinja"


def conversation(task: dict[str, Any], rng: random.Random) -> list[dict[str, Any]]:
    """The ideal episode for ``task``: one calculator call per step, then the answer."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": task["question"]}]
    value = None
    for i, step in enumerate(task["steps"]):
        if value is not None:  # later steps start from the previous result, as the model must
            step = format_number(value) + step[step.index(" ") :]
        value = evaluate(step, max_ops=1)
        call_id = f"call_{i}"
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"type": "function", "id": call_id, "function": {"name": "calculator", "arguments": {"expression": step}}}],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "name": "calculator", "content": format_number(value)})
    messages.append({"role": "assistant", "content": f"The answer is {format_number(value)}."})
    return messages


# Sokoban's board characters (and the row break): one token each, so a cell's neighbours above and
# below are always the same number of tokens away and no BPE merge hides a position.
BOARD_CHARS = r"[#@$*+.\n]| (?=[#@$*+. ])"


def sokoban_conversations(env: SokobanEnv, tasks: list[dict[str, Any]], reference_prob: float, rng: random.Random) -> list[list[dict[str, Any]]]:
    """Episodes of an imperfect player, through the environment's real reset/step loop.

    Each move is the optimal (BFS) move with probability ``reference_prob``, else a uniformly random
    direction; the transcript holds exactly the messages the environment produced.
    """

    async def play(task: dict[str, Any]) -> list[dict[str, Any]]:
        episode = env.spawn()
        messages, _ = await episode.reset(task=dict(task))
        convo = [dict(m) for m in messages]
        for turn in range(episode.max_turns):
            move = scripted_move(task, episode.episode["state"]) if rng.random() < reference_prob else None
            call = {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"type": "function", "id": f"call_{turn}", "function": {"name": "move", "arguments": {"direction": move or rng.choice(list(MOVES))}}}],
            }
            convo.append(call)
            out, _, terminated, truncated, _ = await episode.step(call)
            convo.extend(dict(m) for m in out)
            if terminated or truncated:
                break
        return convo

    async def run() -> list[list[dict[str, Any]]]:
        return [await play(t) for t in tasks]

    return anyio.run(run)


def math_conversations(env: MathPythonEnv, tasks: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Ideal episodes through the environment's real reset/step loop: the scripted program, the
    sandbox's output, the answer statement. Raises when the sandbox's output is not the answer."""

    async def play(task: dict[str, Any]) -> list[dict[str, Any]]:
        episode = env.spawn()
        messages, _ = await episode.reset(task=dict(task))
        code = solution_program(task)
        call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "id": "call_0", "function": {"name": "python", "arguments": {"code": code}}}]}
        out, *_ = await episode.step(call)
        printed = str(out[0]["content"]).strip()
        if printed != task["answer"]:
            raise RuntimeError(f"scripted program for {task['question']!r} printed {printed!r}, not {task['answer']!r}")
        final = {"role": "assistant", "content": f"The answer is {printed}."}
        _, _, terminated, _, _ = await episode.step(final)
        assert terminated
        return [dict(m) for m in messages] + [call] + [dict(m) for m in out] + [final]

    async def run() -> list[list[dict[str, Any]]]:
        convos: list[list[dict[str, Any]] | None] = [None] * len(tasks)
        # A few episodes at a time: the tool's timeout counts the wait for a sandbox slot, so
        # thousands queued at once would time out before they run.
        limiter = anyio.CapacityLimiter(8)

        async def one(i: int) -> None:
            async with limiter:
                convos[i] = await play(tasks[i])

        async with anyio.create_task_group() as tg:
            for i in range(len(tasks)):
                tg.start_soon(one, i)
        return [c for c in convos if c is not None]

    return anyio.run(run)


def build_tokenizer(texts: list[str], vocab_size: int, template: str, isolate: str | None = None) -> PreTrainedTokenizerFast:
    """Byte-level BPE with single-digit tokens; ``isolate`` is a regex of characters kept one token each."""
    tok = Tokenizer(models.BPE())
    steps = [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    if isolate:
        steps.insert(0, pre_tokenizers.Split(Regex(isolate), behavior="isolated"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=SPECIAL_TOKENS[3:],
    )
    fast.chat_template = template
    fast.model_max_length = 1024
    return fast


def encode_example(tok: PreTrainedTokenizerFast, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """Token ids and a loss mask that is 1 exactly on assistant-produced tokens (incl. <|im_end|>)."""

    def render(msgs: list[dict[str, Any]], gen: bool) -> list[int]:
        text = tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=gen)
        return tok(text, add_special_tokens=False)["input_ids"]

    ids = render(messages, False)
    mask = [0] * len(ids)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start = len(render(messages[:i], True))
        end = len(render(messages[: i + 1], False))
        assert ids[:end] == render(messages[: i + 1], False), "template is not prefix-preserving"
        while end > start and ids[end - 1] != im_end:
            end -= 1
        for j in range(start, end):
            mask[j] = 1
    return ids, mask


def make_model(vocab_size: int, pad_id: int, eos_id: int, seed: int, hidden_size: int = 256, layers: int = 4) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    heads = max(1, hidden_size // 64)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=3 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        head_dim=hidden_size // heads,
        max_position_embeddings=1024,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=None,
    )
    return Qwen2ForCausalLM(config)


def batches(examples: list[tuple[list[int], list[int]]], batch_size: int, pad_id: int, rng: random.Random):
    while True:
        order = list(range(len(examples)))
        rng.shuffle(order)
        for s in range(0, len(order) - batch_size + 1, batch_size):
            chunk = [examples[i] for i in order[s : s + batch_size]]
            width = max(len(ids) for ids, _ in chunk)
            input_ids = torch.full((batch_size, width), pad_id)
            labels = torch.full((batch_size, width), -100)
            attention = torch.zeros((batch_size, width), dtype=torch.long)
            for r, (ids, mask) in enumerate(chunk):
                input_ids[r, : len(ids)] = torch.tensor(ids)
                attention[r, : len(ids)] = 1
                labels[r, : len(ids)] = torch.tensor([t if m else -100 for t, m in zip(ids, mask)])
            yield input_ids, attention, labels


ENV_DEFAULTS: dict[str, dict[str, Any]] = {
    "calculator": {"steps": 900, "batch_size": 32, "lr": 1e-3, "warmup": 50, "examples": 20000},
    "sokoban": {"steps": 80, "batch_size": 16, "lr": 2e-3, "warmup": 10, "examples": 2000},
    "math_python": {"steps": 300, "batch_size": 16, "lr": 1e-3, "warmup": 30, "examples": 2000},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", choices=["calculator", "sokoban", "math_python"], default="calculator", help="the environment whose transcripts the model learns")
    ap.add_argument("--out", default=None, help="default: agentrl/bundled/default_model (calculator); required otherwise")
    ap.add_argument("--reference-prob", type=float, default=0.5, help="sokoban: chance each scripted move is the optimal one (else random)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=None, help="default: 900 (calculator), 80 (sokoban), 300 (math_python)")
    ap.add_argument("--batch-size", type=int, default=None, help="default: 32 (calculator), 16 (sokoban, math_python)")
    ap.add_argument("--lr", type=float, default=None, help="default: 1e-3 (calculator, math_python), 2e-3 (sokoban)")
    ap.add_argument("--vocab-size", type=int, default=512)
    ap.add_argument("--examples", type=int, default=None, help="default: 20000 (calculator), 2000 (sokoban: the whole train split, math_python)")
    ap.add_argument("--save-every", type=int, default=0, help="also save snapshots to OUT/step-N")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=None, help="linear learning-rate warmup steps; default: 50 (calculator), 10 (sokoban), 30 (math_python)")
    ap.add_argument("--direction-weight", type=float, default=1.0, help="sokoban: loss weight of the direction tokens (1: plain SFT)")
    ap.add_argument("--max-turns", type=int, default=6, help="sokoban: turns per scripted episode (shorter transcripts, cheaper SFT)")
    ap.add_argument("--hidden-size", type=int, default=256, help="model width (heads of 64)")
    ap.add_argument("--layers", type=int, default=4, help="transformer layers")
    args = ap.parse_args()
    sokoban = args.env == "sokoban"
    if args.out is None:
        if args.env != "calculator":
            ap.error(f"--out is required with --env {args.env} (the bundled model is the calculator's)")
        args.out = "agentrl/bundled/default_model"
    # Unset options take the environment's defaults: the sokoban ones are the measured starting
    # model of docs/environments.md (about 6 minutes on two busy cores).
    defaults = ENV_DEFAULTS[args.env]
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if not 0.0 <= args.reference_prob <= 1.0:
        ap.error(f"--reference-prob must be in [0, 1], got {args.reference_prob}")

    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    env = SokobanEnv(max_turns=args.max_turns) if sokoban else MathPythonEnv() if args.env == "math_python" else CalculatorEnv()
    tools = env.tool_schemas()
    tasks = list(env.dataset("train"))[: args.examples]
    if sokoban:
        convos = sokoban_conversations(env, tasks, args.reference_prob, rng)
    elif args.env == "math_python":
        made = time.time()
        convos = math_conversations(env, tasks)
        print(f"{len(convos)} episodes through the sandbox in {time.time() - made:.0f}s", flush=True)
    else:
        convos = [conversation(t, rng) for t in tasks]
    template = TEMPLATE_PATH.read_text()

    # Tokenizer corpus: rendered conversations (so the tool schema itself compresses well).
    probe = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()))
    probe.chat_template = template
    texts = [probe.apply_chat_template(c, tools=tools, tokenize=False) for c in convos[:3000]]
    tok = build_tokenizer(texts, args.vocab_size, template, isolate=BOARD_CHARS if sokoban else None)
    examples = [encode_example(tok, c, tools) for c in convos]
    lengths = [len(ids) for ids, _ in examples]
    print(f"vocab {len(tok)}; {len(examples)} examples; tokens/example mean {sum(lengths) / len(lengths):.0f} max {max(lengths)}", flush=True)

    pad_id = tok.convert_tokens_to_ids("<|endoftext|>")
    eos_id = tok.convert_tokens_to_ids("<|im_end|>")
    model = make_model(len(tok), pad_id, eos_id, args.seed, args.hidden_size, args.layers)
    print(f"parameters: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.95))
    warmup = max(1, args.warmup)

    def lr_at(step: int) -> float:
        # Constant after warmup, so the model after k steps does not depend on --steps and a
        # snapshot from --save-every is exactly what `--steps k` reproduces.
        return args.lr * min(1.0, (step + 1) / warmup)

    direction_ids = torch.tensor(sorted({i for d in MOVES for i in tok(d, add_special_tokens=False)["input_ids"]}))
    model.train()
    start = time.time()
    tokens = 0
    data = batches(examples, args.batch_size, pad_id, random.Random(args.seed))
    for step in range(args.steps):
        input_ids, attention, labels = next(data)
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if args.direction_weight == 1.0:
                loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
            else:  # the one token per turn that depends on the board weighs more than the syntax around it
                logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1].float()
                target = labels[:, 1:]
                ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100, reduction="none").view(target.shape)
                weight = (target != -100).float() * (1 + (args.direction_weight - 1) * torch.isin(target, direction_ids).float())
                loss = (ce * weight).sum() / weight.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        tokens += int(attention.sum())
        if step % 25 == 0 or step == args.steps - 1:
            el = time.time() - start
            print(f"step {step + 1:4d} loss {loss.item():.4f} lr {lr_at(step):.2e} {tokens / el:.0f} tok/s {el:.0f}s", flush=True)

        if args.save_every and (step + 1) % args.save_every == 0 and step + 1 < args.steps:
            save(model, tok, Path(args.out) / f"step-{step + 1}", args, step + 1, time.time() - start)
    save(model, tok, Path(args.out), args, args.steps, time.time() - start)


def save(model: Qwen2ForCausalLM, tok: PreTrainedTokenizerFast, out: Path, args: argparse.Namespace, steps: int, seconds: float) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config.eos_token_id = tok.convert_tokens_to_ids("<|im_end|>")
    model.generation_config.pad_token_id = tok.convert_tokens_to_ids("<|endoftext|>")
    # Shipped in bfloat16 (half the bytes); load_model upcasts to float32 on CPU.
    copy = type(model)(model.config)
    copy.load_state_dict(model.state_dict())
    copy.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    meta = {"env": args.env, "seed": args.seed, "steps": steps, "warmup": args.warmup, "batch_size": args.batch_size, "lr": args.lr, "vocab_size": args.vocab_size, "train_seconds": round(seconds)}
    if args.env == "sokoban":
        meta.update(reference_prob=args.reference_prob, max_turns=args.max_turns, direction_weight=args.direction_weight)
    (out / "agentrl_build.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"saved {out}", flush=True)


if __name__ == "__main__":
    main()
