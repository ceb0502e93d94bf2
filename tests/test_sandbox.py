"""The sandbox holds against escapes and abuse, answers with a clear message, and the run goes on.

Every attack runs through the real ``python`` tool and ``dispatch`` (as an episode would). Each is
tried under every isolation backend that works on this machine; rows that a backend does not claim
to contain (network and file reads without namespaces) are asserted as *not* contained there, so
the table in docs/environments.md stays true. ``python tests/test_sandbox.py`` prints that table.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import anyio
import pytest

from agentrl.env.dispatch import dispatch
from agentrl.env.sandbox import Sandbox, SandboxConfig, SandboxUnavailable, _probe, _pythons
from agentrl.tools.python import PythonTool

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 3.0


def available(backend: str) -> bool:
    c = SandboxConfig(isolation=backend)  # type: ignore[arg-type]
    return any(_probe(backend, c, p) for p in _pythons(c))


BACKENDS = [b for b in ("bwrap", "unshare", "none") if available(b)]
ISOLATED = {"bwrap", "unshare"}  # network and processes are namespaced
FILES_HIDDEN = {"bwrap"}  # only bubblewrap hides the host's files


def call(tool: PythonTool, code: str) -> tuple[str, str, float]:
    """(tool message, record kind, seconds) of one call through dispatch."""

    async def go() -> tuple[str, str, float]:
        start = time.perf_counter()
        [res] = await dispatch([{"function": {"name": "python", "arguments": {"code": code}}}], {"python": tool})
        return res.message["content"], res.record.kind, time.perf_counter() - start

    return anyio.run(go)


def still_works(tool: PythonTool) -> None:
    text, kind, _ = call(tool, "print(sum(range(10)))")
    assert (text.strip(), kind) == ("45", "ok")


@pytest.fixture(params=BACKENDS)
def tool(request: pytest.FixtureRequest) -> PythonTool:
    return PythonTool(isolation=request.param, timeout_s=TIMEOUT, memory_mb=256, max_processes=32, max_output_bytes=4000)


# -- the attacks: each returns (contained, message) ---------------------------------------------


def attack_network(tool: PythonTool, tmp: Path) -> tuple[bool, str]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    code = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\ns.sendall(b'escaped')\nprint('connected')"
    text, _, _ = call(tool, code)
    try:
        conn, _ = server.accept()
        conn.close()
        reached = True
    except TimeoutError:
        reached = False
    finally:
        server.close()
    return not reached and "connected" not in text, text


def attack_write_outside(tool: PythonTool, tmp: Path) -> tuple[bool, str]:
    target_dir = tmp / "open"
    target_dir.mkdir()
    target_dir.chmod(0o777)  # writable by anyone: only isolation can stop the write
    target = target_dir / "pwned.txt"
    project = ROOT / f"pwned-{uuid.uuid4().hex}.txt"
    code = f"for p in [{str(target)!r}, {str(project)!r}, '/usr/pwned.txt']:\n    try:\n        open(p, 'w').write('x'); print('wrote', p)\n    except OSError as e:\n        print('refused', type(e).__name__)"
    text, _, _ = call(tool, code)
    escaped = target.exists() or project.exists() or Path("/usr/pwned.txt").exists()
    for p in (target, project, Path("/usr/pwned.txt")):
        p.unlink(missing_ok=True)
    return not escaped, text


def attack_read_project(tool: PythonTool, tmp: Path) -> tuple[bool, str]:
    secret = tmp / "secret.txt"
    secret.write_text("TOP-SECRET-" + uuid.uuid4().hex)
    secret.chmod(0o644)
    tmp.chmod(0o755)
    code = f"for p in [{str(secret)!r}, {str(ROOT / 'pyproject.toml')!r}, '/etc/hostname']:\n    try:\n        print(open(p).read()[:200])\n    except OSError as e:\n        print('refused', type(e).__name__)"
    text, _, _ = call(tool, code)
    leaked = "TOP-SECRET" in text or 'name = "agentrl"' in text
    return not leaked, text


def attack_fork_bomb(tool: PythonTool, tmp: Path) -> tuple[bool, str]:
    text, _, took = call(tool, "import os\nwhile True:\n    os.fork()")
    still_works(tool)
    return took < TIMEOUT + 5 and "Error:" in text, text


def attack_memory_bomb(tool: PythonTool, tmp: Path) -> tuple[bool, str]:
    text, _, took = call(tool, "chunks = []\nwhile True:\n    chunks.append(bytearray(50 * 2**20))")
    return "memory limit" in text and took < TIMEOUT + 5, text


def attack_infinite_loop(tool: PythonTool, tmp: Path) -> tuple[bool, str]:
    text, _, took = call(tool, "while True:\n    pass")
    return "time limit" in text and took < TIMEOUT + 5, text


def attack_huge_stdout(tool: PythonTool, tmp: Path) -> tuple[bool, str]:
    text, _, took = call(tool, "while True:\n    print('x' * 100000)")
    return len(text) < 5000 and "truncated" in text and took < TIMEOUT + 5, text[-200:]


def attack_outlive_parent(tool: PythonTool, tmp: Path) -> tuple[bool, str]:
    mark = "agentrl-escape-" + uuid.uuid4().hex
    code = (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time\\ntime.sleep(60)  # {mark}'], start_new_session=True,"
        " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\nprint('spawned')"
    )
    text, _, _ = call(tool, code)
    time.sleep(0.5)
    survivors = _processes_with(mark)
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    return not survivors and "spawned" in text, text


def attack_ctypes(tool: PythonTool, tmp: Path) -> tuple[bool, str]:
    code = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print('setuid', libc.setuid(0), 'unshare', libc.unshare(0x10000000), 'uid', os.getuid(), flush=True)\n"
        "ctypes.string_at(0)"
    )
    text, _, _ = call(tool, code)
    still_works(tool)
    return "setuid -1" in text and "SIGSEGV" in text, text


def attack_signal_parent(tool: PythonTool, tmp: Path) -> tuple[bool, str]:
    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        code = (
            "import os, signal\n"
            f"for pid in ({os.getpid()}, {decoy.pid}, os.getppid(), -1):\n"
            "    try:\n        os.kill(pid, signal.SIGKILL); print('killed', pid)\n"
            "    except OSError as e:\n        print('refused', pid, type(e).__name__)"
        )
        text, _, _ = call(tool, code)
        time.sleep(0.2)
        alive = decoy.poll() is None
    finally:
        decoy.kill()
        decoy.wait()
    return alive, text


ATTACKS = {
    "network to a loopback port": attack_network,
    "write outside the working dir": attack_write_outside,
    "read the project's files": attack_read_project,
    "fork bomb": attack_fork_bomb,
    "memory bomb": attack_memory_bomb,
    "infinite loop": attack_infinite_loop,
    "huge stdout": attack_huge_stdout,
    "subprocess outliving its parent": attack_outlive_parent,
    "ctypes calls": attack_ctypes,
    "signals to the parent": attack_signal_parent,
}


def expected_contained(backend: str, attack: str) -> bool:
    """What each backend claims (docs/environments.md); the tests hold it to exactly that."""
    if attack in ("network to a loopback port", "subprocess outliving its parent"):
        return backend in ISOLATED
    if attack in ("read the project's files", "write outside the working dir"):
        return backend in FILES_HIDDEN
    if attack == "signals to the parent":
        return backend in ISOLATED or os.geteuid() == 0  # as root the code runs as nobody
    return True


def _processes_with(mark: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if mark.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_attack_is_contained_and_the_run_goes_on(tool: PythonTool, attack: str) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:  # reachable by anyone, so only isolation can protect it
        Path(d).chmod(0o755)
        contained, text = ATTACKS[attack](tool, Path(d))
    assert text.strip(), "the model must get a message"
    assert contained == expected_contained(tool.sandbox.backend, attack), f"{attack} under {tool.sandbox.backend}: {text[:500]}"
    still_works(tool)


# -- behaviour ------------------------------------------------------------------------------------


def test_output_and_errors_are_readable(tool: PythonTool) -> None:
    text, kind, _ = call(tool, "print(2**100)")
    assert (text, kind) == (str(2**100), "ok")
    text, _, _ = call(tool, "x = 1\nprint(x / 0)")
    assert "ZeroDivisionError" in text and "/sandbox/main.py" in text
    text, _, _ = call(tool, "import sys\nsys.exit(3)")
    assert "exited with status 3" in text


def test_timeouts_leave_nothing_behind_and_runs_overlap(tool: PythonTool) -> None:
    """Four sleepers at concurrency 4 finish in about one timeout; no process and no thread stays."""
    import threading

    threads = threading.active_count()

    async def go() -> list[str]:
        async def one() -> str:
            [res] = await dispatch([{"function": {"name": "python", "arguments": {"code": "import time\ntime.sleep(30)"}}}], {"python": tool})
            return res.message["content"]

        results: list[str] = []
        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(lambda: _append(results, one))
        return results

    start = time.perf_counter()
    out = anyio.run(go)
    took = time.perf_counter() - start
    assert len(out) == 4 and all("time limit" in t for t in out)
    assert took < 2 * TIMEOUT + 3
    assert threading.active_count() == threads
    assert not _processes_with("time.sleep(30)")


async def _append(results: list[str], fn) -> None:  # type: ignore[no-untyped-def]
    results.append(await fn())


def test_concurrency_is_capped_per_event_loop() -> None:
    """max_concurrency=2: four 1-second runs take two rounds, in every new event loop alike."""
    sandbox = Sandbox(timeout_s=10, max_concurrency=2)

    async def go() -> float:
        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(sandbox.run_python, "import time\ntime.sleep(1)")
        return time.perf_counter() - start

    for _ in range(2):
        assert anyio.run(go) >= 2.0


def test_a_queue_for_sandbox_slots_is_not_a_timeout() -> None:
    """Six calls at one slot queue for ~3 s; the backstop (1.5 s here) counts each run, not the queue.

    Before the fix the wait for a slot counted toward dispatch's timeout, so a training step whose
    episodes called the tool at once got "timed out" messages for programs that never ran."""
    tool = PythonTool(timeout_s=1, max_concurrency=1)
    tool.timeout = 1.5  # the backstop, shorter than the queue below (it is timeout_s + 10 by default)
    code = "import time\ntime.sleep(0.4)\nprint('done')"

    async def go() -> list[tuple[str, str]]:
        calls = [{"function": {"name": "python", "arguments": {"code": code}}} for _ in range(6)]
        return [(r.record.kind, r.message["content"].strip()) for r in await dispatch(calls, {"python": tool})]

    start = time.perf_counter()
    out = anyio.run(go)
    assert out == [("ok", "done")] * 6
    assert time.perf_counter() - start >= 6 * 0.4  # one at a time: the later calls did wait


def test_cancelling_a_run_kills_it() -> None:
    """A caller that gives up (dispatch's own timeout) leaves no process behind."""
    sandbox = Sandbox(timeout_s=60)
    mark = uuid.uuid4().hex

    async def go() -> None:
        with anyio.move_on_after(1.0):
            await sandbox.run_python(f"import time\ntime.sleep(50)  # {mark}")

    start = time.perf_counter()
    anyio.run(go)
    assert time.perf_counter() - start < 5
    time.sleep(0.3)
    assert not _processes_with(mark)


def test_fallback_warns_once_and_limits_still_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no isolation available, auto mode warns loudly once and keeps the rlimits."""
    import agentrl.env.sandbox as sb

    monkeypatch.setattr(sb, "_PROBED", {k: v for k, v in sb._PROBED.items() if k[0] == "none"})
    real = sb._probe
    monkeypatch.setattr(sb, "_probe", lambda backend, c, p: backend == "none" and real(backend, c, p))
    monkeypatch.setattr(sb, "_WARNED", set())
    with pytest.warns(RuntimeWarning, match="no isolation is available"):
        tool = PythonTool(timeout_s=2, memory_mb=128)
        assert call(tool, "print('hi')")[0] == "hi"
    assert tool.sandbox.backend == "none"
    text, _, _ = call(tool, "x = bytearray(400 * 2**20)")
    assert "memory limit" in text
    text, _, _ = call(tool, "while True: pass")
    assert "time limit" in text
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PythonTool(timeout_s=2).sandbox.check()  # second sandbox: no second warning


def test_require_isolation_refuses_without_isolation(monkeypatch: pytest.MonkeyPatch) -> None:
    import agentrl.env.sandbox as sb

    monkeypatch.setattr(sb, "_probe", lambda backend, c, p: backend == "none")
    with pytest.raises(SandboxUnavailable, match="require_isolation=True"):
        PythonTool(require_isolation=True)
    with pytest.raises(ValueError, match="contradicts"):
        SandboxConfig(isolation="none", require_isolation=True)
    with pytest.raises(ValueError, match="isolation must be"):
        SandboxConfig(isolation="docker")  # type: ignore[arg-type]


def test_no_secrets_in_the_environment(tool: PythonTool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRL_TEST_SECRET", "hunter2")
    text, _, _ = call(tool, "import os\nprint(sorted(os.environ))\nprint(os.environ.get('AGENTRL_TEST_SECRET'))")
    assert "hunter2" not in text and "None" in text


if __name__ == "__main__":  # the escape table for docs and reports
    import tempfile

    print("| attack | " + " | ".join(BACKENDS) + " |")
    print("|---|" + "---|" * len(BACKENDS))
    tools = {b: PythonTool(isolation=b, timeout_s=TIMEOUT, memory_mb=256, max_output_bytes=4000) for b in BACKENDS}
    for name, fn in ATTACKS.items():
        cells = []
        for b in BACKENDS:
            with tempfile.TemporaryDirectory() as d:
                Path(d).chmod(0o755)
                contained, text = fn(tools[b], Path(d))
            last = [line for line in text.strip().splitlines() if line.strip()][-1][:60]
            cells.append(("contained" if contained else "NOT contained") + f" ({last})")
        print(f"| {name} | " + " | ".join(cells) + " |")
