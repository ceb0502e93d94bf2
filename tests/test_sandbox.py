"""The sandbox holds against escapes and abuse, answers with a clear message, and the run goes on.

Every attack (tests/sandbox_attacks.py, issue 43) runs through the real ``python`` tool and
``dispatch`` (as an episode would) under every isolation backend that works on this machine, and is
held to exactly what ``EXPECTED`` says for that backend: an attack a backend does not claim to
contain is asserted as *not* contained there, so the table in docs/environments.md stays true.
``python tests/test_sandbox.py`` prints that table.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from pathlib import Path

import anyio
import pytest
from sandbox_attacks import EXPECTED, TIMEOUT, call, expected, make_tool, processes_with, still_works

from agentrl.env.dispatch import dispatch
from agentrl.env.sandbox import Sandbox, SandboxConfig, SandboxUnavailable, _probe, _pythons
from agentrl.tools.python import PythonTool

ROOT = Path(__file__).resolve().parents[1]


def available(backend: str) -> bool:
    c = SandboxConfig(isolation=backend)  # type: ignore[arg-type]
    return any(_probe(backend, c, p) for p in _pythons(c))


BACKENDS = [b for b in ("bwrap", "unshare", "none") if available(b)]


def scratch_dir() -> tempfile.TemporaryDirectory[str]:
    """A host folder anyone may read and write, outside /tmp (which bwrap and unshare replace)."""
    base = "/var/tmp" if os.access("/var/tmp", os.W_OK) else str(ROOT)
    return tempfile.TemporaryDirectory(prefix="agentrl-attack-", dir=base)


@pytest.fixture(params=BACKENDS)
def tool(request: pytest.FixtureRequest) -> PythonTool:
    return make_tool(request.param)


def test_installed_bubblewrap_works() -> None:
    """.ci/run installs bubblewrap (scripts/setup_test_machine.sh): where it is installed the escape
    suite must run under it, not silently fall back to the weaker backends."""
    import shutil

    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed here")
    assert "bwrap" in BACKENDS, "bwrap is installed but its probe failed: are unprivileged user namespaces allowed (sysctl user.max_user_namespaces)?"


@pytest.mark.parametrize("attack", list(EXPECTED))
def test_attack_is_contained_and_the_run_goes_on(tool: PythonTool, attack: str) -> None:
    with scratch_dir() as d:
        Path(d).chmod(0o777)  # reachable by anyone, so only isolation can protect it
        contained, text = EXPECTED[attack][0](tool, Path(d))
    backend = tool.sandbox.backend
    assert text.strip(), "the model must get a message"
    assert contained == expected(backend, attack), f"{attack} under {backend}: {text[:800]}"
    still_works(tool)


def test_threads_fit_in_the_memory_limit_whatever_the_hosts_stack_limit(tool: PythonTool) -> None:
    """Eight live threads that each allocate: thread stacks are sized from RLIMIT_STACK (a CI host
    with a 64 MB stack) and glibc gives each allocating thread a 64 MB arena; both made "can't start
    new thread" under the memory limit, depending on load, until the sandbox fixed its stack and arenas."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
    if hard != resource.RLIM_INFINITY and hard < 64 * 2**20:
        pytest.skip("the hard stack limit here is below 64 MB")
    code = (
        "import threading\nready = threading.Barrier(9)\ndef work():\n    junk = [bytes(100) for _ in range(1000)]\n"
        "    ready.wait()\nts = [threading.Thread(target=work) for _ in range(8)]\nfor t in ts:\n    t.start()\n"
        "    t.join(0.05)\nready.wait()\nprint('ran', len(ts))"
    )  # each thread allocates before the next starts: the order a loaded machine gives
    resource.setrlimit(resource.RLIMIT_STACK, (64 * 2**20, hard))
    try:
        text, kind, _ = call(tool, code)
    finally:
        resource.setrlimit(resource.RLIMIT_STACK, (soft, hard))
    assert (text, kind) == ("ran 8", "ok"), text


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
    assert threading.active_count() <= threads  # an earlier test's thread may end meanwhile; none may be added
    assert not processes_with("time.sleep(30)")


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
    assert not processes_with(mark)


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


def _fresh_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    import agentrl.env.sandbox as sb

    monkeypatch.setattr(sb, "_PROBED", {})
    monkeypatch.setattr(sb, "_NESTED_USERNS", {})
    monkeypatch.setattr(sb, "_WARNED", set())


def _no_seccomp() -> bytes:
    from agentrl.env.sandbox_seccomp import SeccompUnavailable

    raise SeccompUnavailable("the seccomp filter needs libseccomp (Debian/Ubuntu: apt-get install libseccomp2)")


@pytest.mark.skipif("bwrap" not in BACKENDS, reason="bubblewrap does not work here")
def test_start_up_check_without_seccomp_or_disable_userns(monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's finding, reproduced: with neither layer, the probe itself makes a nested user
    namespace inside bwrap, and the start-up check says so (or refuses under require_isolation)."""
    import agentrl.env.sandbox as sb

    _fresh_probes(monkeypatch)
    monkeypatch.setattr(sb, "seccomp_filter", _no_seccomp)
    with pytest.warns(RuntimeWarning, match="no seccomp filter.*apt-get install libseccomp2"):
        Sandbox(isolation="bwrap").check()  # --disable-userns alone still closes user namespaces
    assert not sb._NESTED_USERNS[("bwrap", Sandbox(isolation="bwrap").python, True)]
    real = sb.bwrap_supports
    monkeypatch.setattr(sb, "bwrap_supports", lambda flag: flag != "--disable-userns" and real(flag))
    _fresh_probes(monkeypatch)
    with pytest.raises(SandboxUnavailable, match="no --disable-userns.*created a nested user namespace"):
        Sandbox(isolation="bwrap", require_isolation=True).check()
    text, _, _ = call(PythonTool(isolation="bwrap", timeout_s=TIMEOUT), "import ctypes\nprint('unshare', ctypes.CDLL(None).unshare(0x10000000 | 0x20000))")
    assert "unshare 0" in text  # what bwrap did before the fix: the check above is not a false alarm


def test_seccomp_off_is_said_at_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """seccomp=False where user namespaces stay open (unshare, none) is warned about, naming the problem."""
    _fresh_probes(monkeypatch)
    backend = next((b for b in BACKENDS if b != "bwrap"), None)
    if backend is None:
        pytest.skip("only bwrap works here")
    if backend == "none" and os.geteuid() != 0:
        pytest.skip("unprivileged none: whether the kernel lets nobody make user namespaces varies")
    with pytest.warns(RuntimeWarning, match="nested user namespace"):
        Sandbox(isolation=backend, seccomp=False).check()


def test_no_secrets_in_the_environment(tool: PythonTool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRL_TEST_SECRET", "hunter2")
    text, _, _ = call(tool, "import os\nprint(sorted(os.environ))\nprint(os.environ.get('AGENTRL_TEST_SECRET'))")
    assert "hunter2" not in text and "None" in text


if __name__ == "__main__":  # the escape table for docs and reports
    print("| attack | " + " | ".join(BACKENDS) + " |")
    print("|---|" + "---|" * len(BACKENDS))
    tools = {b: make_tool(b) for b in BACKENDS}
    for name, (fn, *_) in EXPECTED.items():
        cells = []
        for b in BACKENDS:
            with scratch_dir() as d:
                Path(d).chmod(0o777)
                contained, text = fn(tools[b], Path(d))
            last = [line for line in text.strip().splitlines() if line.strip()][-1][:70]
            mark = "" if contained == expected(b, name) else " **(differs from EXPECTED)**"
            cells.append(("contained" if contained else "NOT contained") + f" ({last}){mark}")
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


def test_the_docs_table_states_what_the_tests_assert() -> None:
    """docs/environments.md's attack table, row by row in EXPECTED's order: "contained" exactly where
    the escape suite asserts containment, per backend ("contained as root" where that depends on it)."""
    from sandbox_attacks import ROOT_USER

    text = (Path(__file__).resolve().parents[1] / "docs" / "environments.md").read_text()
    start = text.index("| attack (tests/sandbox_attacks.py) | bwrap | unshare | none |")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    assert len(rows) == len(EXPECTED)
    for (attack, (_, *columns)), cells in zip(EXPECTED.items(), rows):
        stated = [not c.lstrip("*").startswith("not contained") for c in cells[1:4]]
        if cells[3].startswith("contained as root"):
            stated[2] = ROOT_USER
        assert stated == columns, (attack, cells[0])
