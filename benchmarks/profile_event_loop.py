"""The event loop's own work per episode-turn of a multi-turn rollout, with the GPU taken away.

Between two turns each episode parses its answer, runs its tool and renders the next prompt on
the rollout's event loop; in a multi-turn rollout on a GPU the device waits meanwhile (the turn
boundary). This runs the multi-turn rows' calculator episodes (``multiturn_bench.make_env``)
against a scripted generator that answers at once (two calculator calls, then the answer), so
what is timed is that work alone, and prints milliseconds per episode-turn and the top of a
cProfile of it.

    python benchmarks/profile_event_loop.py --tokenizer .assets/qwen3 [--episodes 64] [--top 25]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    import multiturn_bench
    from transformers import AutoTokenizer

    from agentrl.chat import get_chat_format
    from agentrl.generators.protocol import Generation, SamplingParams
    from agentrl.rollout import RolloutConfig, RolloutEngine

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default=".assets/qwen3")
    ap.add_argument("--episodes", type=int, default=64, help="8 episodes per task")
    ap.add_argument("--top", type=int, default=25, help="cProfile rows to print (0: none)")
    args = ap.parse_args()

    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    fmt = get_chat_format(tok)
    env = multiturn_bench.make_env()
    end = list(fmt.stop_token_ids)[:1]
    call = tok.encode('<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 7"}}\n</tool_call>', add_special_tokens=False) + end
    answer = tok.encode("The answer is 84.", add_special_tokens=False) + end

    class Scripted:
        """Two tool calls, then the answer; instantly."""

        async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
            out = call if tok.decode(prompt_ids[-400:]).count("<tool_response>") < 2 else answer
            return Generation(out, [-0.1] * len(out), "stop")

        def track_episodes(self, delta: int) -> None:
            pass

    config = RolloutConfig(max_turns=6, max_tokens_per_turn=256, max_completion_tokens=256, max_context=1536)
    engine = RolloutEngine(Scripted(), fmt, config, SamplingParams(temperature=1.0))
    k = max(1, args.episodes // 8)
    train = env.dataset("train")
    warm, timed, profiled = ([dict(t) for t in train.select(range(i * k, (i + 1) * k))] for i in range(3))
    anyio.run(lambda: engine.run(env, warm, n=8))  # warm-up (template compile); other tasks, as a new step has
    start = time.perf_counter()
    groups = anyio.run(lambda: engine.run(env, timed, n=8))
    plain = time.perf_counter() - start
    turns = sum(len(t.turns) for g in groups for t in g.trajectories)
    prof = cProfile.Profile()
    prof.enable()
    anyio.run(lambda: engine.run(env, profiled, n=8))
    prof.disable()
    print(f"{k * 8} episodes, {turns} turns: {plain * 1000:.0f} ms, {plain / turns * 1000:.2f} ms per episode-turn (without the profiler)")
    if args.top:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
