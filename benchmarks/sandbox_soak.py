"""Soak of the python tool under a hostile mix (issue 43): nothing leaks, every call is answered.

64 concurrent math_python episodes (one shared ``PythonTool``, as ``spawn`` gives the rollout
engine) play through the environment's real ``reset``/``step``: each assistant turn calls ``python``
with either the task's scripted solution or one of the hostile programs below, until 2,000 calls
were made. Before and after, it counts what could leak: processes (descendants of this process and
any process carrying the soak's mark), files (what is left in the private temp folder the sandbox
uses), threads, open descriptors; while it runs it samples host disk use of that folder's file
system and tmpfs memory (``Shmem`` in /proc/meminfo, where bwrap's and unshare's working
directories live). It prints latency percentiles (benign and hostile calls apart) and the limits the
model was told about.

Usage: nice -n 10 python benchmarks/sandbox_soak.py [--calls 2000] [--episodes 64] [--isolation auto]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

MARK = "agentrl-soak-" + uuid.uuid4().hex[:12]

# name -> program; each is an attempt of tests/sandbox_attacks.py reduced to its core.
HOSTILE = {
    "disk fill": "for i in range(160):\n    open(f'f{i}', 'wb').write(b'x' * 15 * 2**20)",
    "disk fill, errors ignored": "for i in range(160):\n    try:\n        open(f'f{i}', 'wb').write(b'x' * 15 * 2**20)\n    except OSError:\n        pass\nprint('done')",
    "/tmp fill": f"import os\nfor i in range(40):\n    try:\n        open(f'/tmp/{MARK}-{{i}}', 'wb').write(b'x' * 8 * 2**20)\n    except OSError:\n        pass",
    "many small files": "i = 0\nwhile True:\n    try:\n        open(f'f{i}', 'w').close()\n    except OSError:\n        pass\n    i += 1",
    "fork bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
    "thread bomb": "import threading, time\nwhile True:\n    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()",
    "mmap memory": "import mmap\nmaps = []\nwhile True:\n    m = mmap.mmap(-1, 64 * 2**20)\n    m.write(b'x' * (64 * 2**20))\n    maps.append(m)",
    "CPU in threads": "import hashlib, threading\nd = b'x' * 2**22\ndef burn():\n    while True:\n        hashlib.sha256(d).digest()\nfor _ in range(8):\n    threading.Thread(target=burn).start()",
    "orphans": "import os, sys\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
    f"        os.execv(sys.executable, [sys.executable, '-c', 'import time\\ntime.sleep(120)  # {MARK}'])\n    os._exit(0)\nprint('spawned')",
    "huge stdout": "while True:\n    print('x' * 100000)",
    "nested namespaces": "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nprint('unshare', libc.unshare(0x10000000 | 0x00020000))",
    "long names and symlinks": "import os\ntry:\n    open('x' * 300, 'w')\nexcept OSError as e:\n    print(e.strerror)\nos.symlink('/', 'root-link')\nos.symlink('/etc/passwd', 'pw')\nprint('ok')",
}


def descendants(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (through /proc/PID/task/TID/children)."""
    found: set[int] = set()
    stack = [pid]
    while stack:
        p = stack.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                kids = [int(k) for k in Path(f"/proc/{p}/task/{t}/children").read_text().split()]
            except (OSError, ValueError):
                continue
            for k in kids:
                if k not in found:
                    found.add(k)
                    stack.append(k)
    return found


def marked_processes() -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if MARK.encode() in (entry / "cmdline").read_bytes():
                    out.append(int(entry.name))
            except OSError:
                pass
    return out


def folder_bytes(root: Path) -> int:
    """Bytes on disk under ``root`` (what the sandbox put on the host disk)."""
    total = 0
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            try:
                total += os.lstat(os.path.join(dirpath, n)).st_blocks * 512
            except OSError:
                pass
    return total


def shmem_kb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Shmem:"):
            return int(line.split()[1])
    return 0


def host_marked_files() -> list[Path]:
    """Files the hostile programs left in the host's shared folders (only ``none`` lets them)."""
    return [p for d in ("/tmp", "/dev/shm") for p in Path(d).glob(f"{MARK}*")]


def snapshot(tmp: Path) -> dict[str, int]:
    return {
        "marked files in the host's /tmp and /dev/shm": len(host_marked_files()),
        "processes": len(descendants(os.getpid())),
        "marked processes": len(marked_processes()),
        "files in the sandbox temp folder": sum(1 for _ in tmp.rglob("*")),
        "threads (Python)": threading.active_count(),
        "threads (kernel tasks)": len(os.listdir("/proc/self/task")),
        "open descriptors": len(os.listdir("/proc/self/fd")),
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def soak(args: argparse.Namespace, tmp: Path) -> dict:
    import agentrl
    from agentrl.environments.math_python import solution_program

    base = agentrl.make("math_python", sandbox={"timeout_s": args.timeout_s, "isolation": args.isolation, "disk_mb": args.disk_mb})
    tool = base.tools[0]
    backend = tool.sandbox.check()
    tasks = base.dataset("train")
    runs: list[float] = []  # seconds inside the sandbox (no queue for a slot)
    real_run = tool.sandbox.run

    async def timed_run(*a, **kw):  # type: ignore[no-untyped-def]
        result = await real_run(*a, **kw)
        runs.append(result.elapsed_s)
        return result

    tool.sandbox.run = timed_run  # type: ignore[method-assign]
    await asyncio.sleep(0)
    before = snapshot(tmp)  # after imports, the dataset and the probe: their threads are not the sandbox's
    rng = random.Random(args.seed)
    kinds: Counter[str] = Counter()
    budget = {"left": args.calls}
    lat: dict[str, list[float]] = {"benign": [], "hostile": []}
    limits: Counter[str] = Counter()
    problems: list[str] = []
    answered = 0
    correct_outputs = 0
    peak = {"disk": 0, "shmem": 0, "folder": 0}
    disk0, shmem0 = shutil.disk_usage(tmp).used, shmem_kb()

    async def sample() -> None:
        while True:
            peak["disk"] = max(peak["disk"], shutil.disk_usage(tmp).used - disk0)
            peak["shmem"] = max(peak["shmem"], shmem_kb() - shmem0)
            peak["folder"] = max(peak["folder"], folder_bytes(tmp))
            await asyncio.sleep(0.2)

    async def episode_loop(k: int) -> None:
        nonlocal answered, correct_outputs
        env = base.spawn()
        while budget["left"] > 0:
            task = dict(tasks[rng.randrange(len(tasks))])
            await env.reset(task=task, seed=rng.randrange(2**31))
            for _turn in range(env.max_turns):
                if budget["left"] <= 0:
                    break
                budget["left"] -= 1
                hostile = rng.random() < args.hostile_share
                name = rng.choice(sorted(HOSTILE)) if hostile else "solution"
                code = HOSTILE[name] if hostile else solution_program(task)
                call = {"id": f"c{k}", "type": "function", "function": {"name": "python", "arguments": json.dumps({"code": code})}}
                start = time.perf_counter()
                msgs, _reward, terminated, truncated, info = await env.step({"role": "assistant", "content": "", "tool_calls": [call]})
                lat["hostile" if hostile else "benign"].append(time.perf_counter() - start)
                kinds.update(r.kind for r in info["tool_records"])
                tool_msgs = [m for m in msgs if m.get("role") == "tool"]
                if len(tool_msgs) != 1 or not str(tool_msgs[0].get("content", "")).strip():
                    problems.append(f"{name}: {len(tool_msgs)} tool messages")
                    continue
                answered += 1
                text = str(tool_msgs[0]["content"])
                last = text.strip().splitlines()[-1]
                if last.startswith("Error:"):
                    limits[last[:60]] += 1
                if not hostile and text.strip() == str(task["answer"]):
                    correct_outputs += 1
                if terminated or truncated:
                    break
            if not env._episode["done"]:  # end the episode with an answer, as a model would
                await env.step({"role": "assistant", "content": f"The answer is {task['answer']}."})

    sampler = asyncio.ensure_future(sample())
    start = time.perf_counter()
    await asyncio.gather(*(episode_loop(k) for k in range(args.episodes)))
    wall = time.perf_counter() - start
    sampler.cancel()
    await asyncio.sleep(1.0)  # let killed process trees finish dying before counting
    after = snapshot(tmp)
    return {
        "backend": backend, "python": tool.sandbox.python, "wall_s": wall, "answered": answered, "problems": problems,
        "benign_correct_output": correct_outputs, "lat": lat, "limits": limits, "peak_disk": peak["disk"], "peak_folder": peak["folder"],
        "peak_shmem_kb": peak["shmem"], "slots": tool.sandbox.config.max_concurrency, "runs": runs, "kinds": kinds,
        "before": before, "after": after,
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--hostile-share", type=float, default=0.25)
    ap.add_argument("--timeout-s", type=float, default=2.0)
    ap.add_argument("--disk-mb", type=int, default=64)
    ap.add_argument("--isolation", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="agentrl-soak-"))
    os.chmod(tmp, 0o755)
    tempfile.tempdir = str(tmp)  # the sandbox's working and io folders go here: leftovers are countable
    out = asyncio.run(soak(args, tmp))
    before, after = out["before"], out["after"]
    leftovers = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*"))[:10]
    for pid in marked_processes():  # do not leave them to the machine, whatever the count says
        os.kill(pid, 9)
    for p in host_marked_files():
        p.unlink(missing_ok=True)

    lat = out["lat"]
    everything = lat["benign"] + lat["hostile"]
    print(f"# {platform.node()} ({os.cpu_count()} cores, {platform.machine()}), python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"# backend {out['backend']} ({out['python']}), {args.episodes} episodes, {args.calls} calls, hostile share {args.hostile_share}, "
          f"timeout_s {args.timeout_s}, disk_mb {args.disk_mb}, {out['slots']} sandbox slots; wall {out['wall_s']:.1f} s")  # fmt: skip
    print(f"calls answered: {out['answered']} of {args.calls} ({len(out['problems'])} problems: {out['problems'][:3]})")
    print(f"benign calls: {len(lat['benign'])}, printed the right answer: {out['benign_correct_output']}; hostile calls: {len(lat['hostile'])}")
    print("| calls | n | p50 (s) | p90 (s) | p99 (s) | max (s) |")
    print("|---|---|---|---|---|---|")
    for name, values in (("benign", lat["benign"]), ("hostile", lat["hostile"]), ("all", everything)):
        print(f"| {name} | {len(values)} | {percentile(values, 0.5):.3f} | {percentile(values, 0.9):.3f} | {percentile(values, 0.99):.3f} | {max(values, default=float('nan')):.3f} |")
    runs = out["runs"]
    print(f"| inside the sandbox (no slot queue) | {len(runs)} | {percentile(runs, 0.5):.3f} | {percentile(runs, 0.9):.3f} | {percentile(runs, 0.99):.3f} | {max(runs, default=float('nan')):.3f} |")
    print(f"mean benign latency {statistics.mean(lat['benign']):.3f} s; dispatch record kinds: {dict(out['kinds'])}")
    print("| what | before | after | leaked |")
    print("|---|---|---|---|")
    for key in before:
        print(f"| {key} | {before[key]} | {after[key]} | {after[key] - before[key]} |")
    bound = out["slots"] * args.disk_mb * 2**20
    print(f"sandbox temp folder on the host disk, peak: {out['peak_folder'] / 2**20:.1f} MB; its file system's used space, peak growth "
          f"(shared with other jobs): {out['peak_disk'] / 2**20:.1f} MB")
    print(f"tmpfs memory (Shmem) peak growth "
          f"{out['peak_shmem_kb'] / 1024:.1f} MB (shared with other jobs); bound slots x disk_mb = {bound / 2**20:.0f} MB")  # fmt: skip
    print(f"leftover paths (first 10): {leftovers}")
    print("limits the model read:")
    for text, n in out["limits"].most_common():
        print(f"  {n:5d}  {text}")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
