"""benchmarks/profile_memory.py's replay of an allocator trace: the peak, what is alive at it, by
call site, and the stack of a site that an early allocation left alive (how the per-stream cuBLAS
workspaces were found on an H200, benchmarks/RESULTS.md 2026-11-29)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from profile_memory import summarise

MiB = 2**20


def frames(*where: tuple[str, int, str]) -> list[dict]:
    """Innermost first, as torch records them."""
    return [{"filename": f, "line": line, "name": name} for f, line, name in where]


LEARNER = frames(("/v/torch/nn/linear.py", 134, "forward"), ("/v/agentrl/learn/learner.py", 196, "_step"))
DECODE = frames(("/v/torch/_inductor/out.py", 9, "call"), ("/v/transformers/models/qwen2/modeling_qwen2.py", 206, "forward"),
                ("/v/agentrl/generators/hf/static_decode.py", 325, "forward"))


def trace() -> list[dict]:
    """Two steps: each decodes (a 32 MiB block that is never freed, like a workspace, and a 64 MiB
    one that is) and then learns (a 100 MiB activation); a free waiting on another stream is
    requested before it completes."""
    ev, addr = [], 0
    for _ in range(2):
        ev.append({"action": "alloc", "addr": (addr := addr + 1), "size": 32 * MiB, "frames": DECODE, "stream": 7})
        ev.append({"action": "alloc", "addr": (addr := addr + 1), "size": 64 * MiB, "frames": DECODE, "stream": 7})
        ev.append({"action": "free_requested", "addr": addr, "size": 64 * MiB})
        ev.append({"action": "alloc", "addr": (addr := addr + 1), "size": 100 * MiB, "frames": LEARNER, "stream": 0})
        ev.append({"action": "free_requested", "addr": addr, "size": 100 * MiB})
        ev.append({"action": "free_completed", "addr": addr, "size": 100 * MiB})
    return ev


def test_the_peak_and_what_is_alive_at_it_by_site():
    out = summarise({"device_traces": [trace()]}, stacks=1, watch=("modeling_qwen2.py:206",))
    assert out["peak_gib"] == round((32 * 2 + 100) / 1024, 3) and out["peak_event"] == 9  # the second step's activation
    assert out["phase_peaks"]["training"]["event"] == 9 and out["phase_peaks"]["rollout"]["event"] == 7
    sites = {s["site"]: (s["gib"], s["n"]) for s in out["sites"]}
    leak = "call @ qwen2/modeling_qwen2.py:206 forward < hf/static_decode.py:325 forward"
    assert sites[leak] == (round(64 / 1024, 3), 2)  # both steps' never-freed blocks, the freed ones gone
    assert sites["forward @ learn/learner.py:196 _step"] == (round(100 / 1024, 3), 1)
    assert out["peak_made_by"] == "forward @ learn/learner.py:196 _step"
    watched = next(s for s in out["stacks"] if s["site"] == leak)
    assert watched["event"] == 0 and watched["stream"] == 7 and watched["sizes_mib"] == [32.0]  # made in the first step
    assert watched["frames"][0] == "_inductor/out.py:9 call"
