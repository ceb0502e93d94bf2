"""The seccomp filter refuses what it lists and nothing that ordinary Python needs (issue 43).

The filter is loaded for real into a child interpreter (the same snippet the sandbox's launcher
uses), which then calls every refused system call raw and does the things a math program does.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agentrl.env.sandbox_seccomp import DENIED, LOAD_SNIPPET, SeccompUnavailable, seccomp_filter

pyseccomp = pytest.importorskip("pyseccomp", reason="the filter is built with pyseccomp (agentrl[dev])")


def run_filtered(body: str) -> subprocess.CompletedProcess[str]:
    """Run ``body`` in a fresh interpreter after it installed the filter (read from a pipe)."""
    data = seccomp_filter()
    read, write = os.pipe()
    os.write(write, data)
    os.close(write)
    code = "import ctypes, os, sys\n" + LOAD_SNIPPET + "\nctypes.CDLL(None).prctl(38, 1, 0, 0, 0)\n" + f"load_seccomp({read})\n" + body
    try:
        return subprocess.run([sys.executable, "-I", "-S", "-c", code], pass_fds=[read], capture_output=True, text=True, timeout=60)
    finally:
        os.close(read)


def test_the_filter_is_a_bpf_program() -> None:
    data = seccomp_filter()
    assert data and len(data) % 8 == 0  # struct sock_filter is 8 bytes
    assert seccomp_filter() is data  # built once per process


def test_every_listed_call_is_refused_with_eperm() -> None:
    arch = pyseccomp.system_arch()
    numbers = {}
    for name in DENIED:
        try:
            numbers[name] = pyseccomp.resolve_syscall(arch, name)
        except ValueError:
            pass
    assert {"ptrace", "mount", "keyctl", "bpf", "perf_event_open", "userfaultfd", "unshare", "setns"} <= set(numbers)
    body = (
        "libc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
        f"for name, nr in {sorted(numbers.items())!r}:\n"
        "    r = libc.syscall(nr, 0, 0, 0, 0, 0, 0)\n    print(name, r, ctypes.get_errno())\n"
        # clone with CLONE_NEWUSER | SIGCHLD: refused; clone3: ENOSYS so that glibc falls back to clone
        "print('clone', libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0), ctypes.get_errno())\n"
        "print('clone3', libc.syscall(435, 0, 0), ctypes.get_errno())\n"
    )
    done = run_filtered(body)
    assert done.returncode == 0, done.stderr
    results = {line.split()[0]: (int(line.split()[1]), int(line.split()[2])) for line in done.stdout.splitlines()}
    for name in numbers:
        assert results[name] == (-1, 1), f"{name}: {results[name]}"  # EPERM
    assert results["clone"] == (-1, 1)
    assert results["clone3"] == (-1, 38)  # ENOSYS


def test_ordinary_python_still_works_under_the_filter() -> None:
    body = (
        "import threading, subprocess, socket, tempfile, multiprocessing.pool\n"
        "t = threading.Thread(target=lambda: None); t.start(); t.join()\n"
        "pid = os.fork()\nif pid == 0:\n    os._exit(7)\nprint('fork', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
        "print('subprocess', subprocess.run([sys.executable, '-c', 'print(6 * 7)'], capture_output=True, text=True).stdout.strip())\n"
        "with multiprocessing.pool.ThreadPool(4) as p:\n    print('threads', sum(p.map(lambda x: x * x, range(10))))\n"
        "a, b = socket.socketpair(); a.sendall(b'hi'); print('socketpair', b.recv(2))\n"
        "with tempfile.TemporaryDirectory() as d:\n    open(os.path.join(d, 'f'), 'w').write('x'); print('files ok')\n"
    )
    done = run_filtered(body)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:5] == ["fork 7", "subprocess 42", "threads 285", "socketpair b'hi'", "files ok"]


def test_a_missing_library_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without pyseccomp the error names the package and how to get it."""
    seccomp_filter.cache_clear()
    monkeypatch.setitem(sys.modules, "pyseccomp", None)  # import fails as if it were not installed
    try:
        with pytest.raises(SeccompUnavailable, match="pip install pyseccomp"):
            seccomp_filter()
    finally:
        monkeypatch.delitem(sys.modules, "pyseccomp")
        seccomp_filter.cache_clear()
    assert seccomp_filter()
