"""Escape and abuse attempts against the python tool, each as an attacker would write it (issue 43).

Every attempt runs real code through the real tool and ``dispatch`` and looks at the host afterwards:
``attack(tool, scratch) -> (contained, message)``. ``EXPECTED`` says, per isolation backend, whether
it is contained there; tests/test_sandbox.py holds every backend to exactly that, and docs/
environments.md's table is printed from it (``python tests/test_sandbox.py``). ``scratch`` is a host
folder outside ``/tmp`` that anyone may read and write, so only isolation can protect it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import anyio

from agentrl.env.dispatch import dispatch
from agentrl.tools.python import PythonTool

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 3.0
DISK_MB = 32
ROOT_USER = os.geteuid() == 0

# x86-64 system call numbers (the attacks call them raw, as exploit code does; libc may have no wrapper).
NR = {"ptrace": 101, "mount": 165, "keyctl": 250, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
      "unshare": 272, "clone": 56, "clone3": 435, "syslog": 103, "setns": 308}  # fmt: skip


def make_tool(backend: str) -> PythonTool:
    return PythonTool(isolation=backend, timeout_s=TIMEOUT, memory_mb=256, max_processes=32, max_output_bytes=4000, disk_mb=DISK_MB, max_files=2000)


def call(tool: PythonTool, code: str) -> tuple[str, str, float]:
    """(tool message, record kind, seconds) of one call through dispatch."""

    async def go() -> tuple[str, str, float]:
        start = time.perf_counter()
        [res] = await dispatch([{"function": {"name": "python", "arguments": {"code": code}}}], {"python": tool})
        return res.message["content"], res.record.kind, time.perf_counter() - start

    return anyio.run(go)


def still_works(tool: PythonTool) -> None:
    text, kind, _ = call(tool, "print(sum(range(10)))")
    assert (text.strip(), kind) == ("45", "ok"), text


def processes_with(mark: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if mark.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


# -- what the issue's first paragraph lists --------------------------------------------------------


def parent_environment(tool: PythonTool, scratch: Path) -> tuple[bool, str]:
    """A host process with a secret in its environment; the code reads every /proc/*/environ."""
    secret = "AGENTRL-ENV-SECRET-" + uuid.uuid4().hex
    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env={**os.environ, "DECOY_SECRET": secret})
    try:
        time.sleep(0.2)
        code = (
            "import os\nfound = []\nfor pid in os.listdir('/proc'):\n    if pid.isdigit():\n        try:\n"
            "            data = open(f'/proc/{pid}/environ', 'rb').read()\n        except OSError:\n            continue\n"
            f"        if b{secret[:19]!r} in data:\n            found.append(data[data.find(b'AGENTRL'):][:60].decode())\n"
            "print('seen', len(found), found[:1], sorted(os.environ))"
        )
        text, _, _ = call(tool, code)
    finally:
        decoy.kill()
        decoy.wait()
    return secret not in text and "seen 0" in text, text


def host_files(tool: PythonTool, scratch: Path) -> tuple[bool, str]:
    """Read a world-readable secret and the project's own files."""
    secret = scratch / "secret.txt"
    secret.write_text("TOP-SECRET-" + uuid.uuid4().hex)
    secret.chmod(0o644)
    code = f"for p in [{str(secret)!r}, {str(ROOT / 'pyproject.toml')!r}]:\n    try:\n        print(open(p).read()[:200])\n    except OSError as e:\n        print('refused', type(e).__name__)"
    text, _, _ = call(tool, code)
    return "TOP-SECRET" not in text and 'name = "agentrl"' not in text, text


def write_outside(tool: PythonTool, scratch: Path) -> tuple[bool, str]:
    """Write into a world-writable host folder, the project and /usr."""
    target = scratch / "pwned.txt"
    project = ROOT / f"pwned-{uuid.uuid4().hex}.txt"
    code = f"for p in [{str(target)!r}, {str(project)!r}, '/usr/pwned.txt']:\n    try:\n        open(p, 'w').write('x'); print('wrote', p)\n    except OSError as e:\n        print('refused', type(e).__name__)"
    text, _, _ = call(tool, code)
    escaped = target.exists() or project.exists() or Path("/usr/pwned.txt").exists()
    for p in (target, project, Path("/usr/pwned.txt")):
        p.unlink(missing_ok=True)
    return not escaped, text


def inherited_descriptors(tool: PythonTool, scratch: Path) -> tuple[bool, str]:
    """An inheritable descriptor of a secret file is open in the caller; the code reads every fd it has."""
    secret = scratch / "fd-secret.txt"
    secret.write_text("FD-SECRET-" + uuid.uuid4().hex)
    fd = os.open(secret, os.O_RDONLY)
    os.set_inheritable(fd, True)
    try:
        code = (
            "import os\nopen_fds = []\nfor fd in range(3, 1024):\n    try:\n        os.fstat(fd)\n    except OSError:\n        continue\n"
            "    open_fds.append(fd)\n    try:\n        print(fd, os.pread(fd, 100, 0))\n    except OSError as e:\n        print(fd, type(e).__name__)\n"
            "print('extra descriptors', open_fds)"
        )
        text, _, _ = call(tool, code)
    finally:
        os.close(fd)
    return "FD-SECRET" not in text and "extra descriptors []" in text, text


def unix_sockets(tool: PythonTool, scratch: Path, abstract: bool) -> tuple[bool, str]:
    """A host service on a unix socket (abstract name, or a file in a world-writable folder)."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    address: str | bytes
    if abstract:
        address = b"\0agentrl-test-" + uuid.uuid4().hex.encode()
    else:
        address = str(scratch / "service.sock")
    server.bind(address)
    if not abstract:
        os.chmod(address, 0o777)
    server.listen(1)
    server.settimeout(0.3)
    code = f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.settimeout(2)\ns.connect({address!r})\ns.sendall(b'escaped')\nprint('connected')"
    try:
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


def dev_shm(tool: PythonTool, scratch: Path) -> tuple[bool, str]:
    """Leave a file in the host's /dev/shm (memory that nothing frees)."""
    name = f"agentrl-shm-{uuid.uuid4().hex}"
    code = f"try:\n    open('/dev/shm/{name}', 'w').write('x' * 1000); print('wrote')\nexcept OSError as e:\n    print('refused', type(e).__name__)"
    text, _, _ = call(tool, code)
    host = Path("/dev/shm") / name
    escaped = host.exists()
    host.unlink(missing_ok=True)
    return not escaped, text


def ptrace(tool: PythonTool, scratch: Path) -> tuple[bool, str]:
    """PTRACE_ATTACH to its own child and to its parent, PTRACE_TRACEME, process_vm_readv."""
    code = (
        "import ctypes, os, time\nlibc = ctypes.CDLL(None, use_errno=True)\nsys_ = libc.syscall\nsys_.restype = ctypes.c_long\n"
        "child = os.fork()\nif child == 0:\n    time.sleep(5)\n    os._exit(0)\n"
        f"print('attach child', sys_({NR['ptrace']}, 16, child, 0, 0), 'attach parent', sys_({NR['ptrace']}, 16, os.getppid(), 0, 0),"
        f" 'traceme', sys_({NR['ptrace']}, 0, 0, 0, 0))\nos.kill(child, 9)"
    )
    text, _, _ = call(tool, code)
    return "attach child -1 attach parent -1 traceme -1" in text, text


def host_pids(tool: PythonTool, scratch: Path) -> tuple[bool, str]:
    """See the host's processes: the test's own pid and a decoy's in /proc."""
    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        code = f"import os\npids = {{int(p) for p in os.listdir('/proc') if p.isdigit()}}\nprint('host pids seen', sorted(pids & {{{os.getpid()}, {decoy.pid}}}), len(pids))"
        text, _, _ = call(tool, code)
    finally:
        decoy.kill()
        decoy.wait()
    return "host pids seen []" in text, text


def kernel_log(tool: PythonTool, scratch: Path) -> tuple[bool, str]:
    """Read /proc/kmsg and the kernel ring buffer (syslog(SYSLOG_ACTION_READ_ALL))."""
    code = (
        "import ctypes\ntry:\n    print('kmsg', open('/proc/kmsg', 'rb').read(100))\nexcept OSError as e:\n    print('kmsg refused', type(e).__name__)\n"
        "buf = ctypes.create_string_buffer(4096)\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        f"print('syslog', libc.syscall({NR['syslog']}, 3, buf, 4096))"
    )
    text, _, _ = call(tool, code)
    return "kmsg refused" in text and "syslog -1" in text, text


def tmp_cap(tool: PythonTool, scratch: Path) -> tuple[bool, str]:
    """Write twice the disk limit into /tmp, catching every error (a program that does not give up)."""
    mark = f"agentrl-tmpfill-{uuid.uuid4().hex}"
    code = (
        f"import os\nos.makedirs('/tmp/{mark}', exist_ok=True)\nfor i in range({2 * DISK_MB // 8}):\n    try:\n"
        f"        open(f'/tmp/{mark}/{{i}}', 'wb').write(b'x' * 8 * 2**20)\n    except OSError as e:\n        pass\nprint('wrote on')"
    )
    text, _, _ = call(tool, code)
    host = Path("/tmp") / mark
    on_host = sum(p.stat().st_size for p in host.glob("*")) if host.exists() else 0
    if host.exists():
        for p in host.glob("*"):
            p.unlink()
        host.rmdir()
    return on_host == 0 and "disk limit" in text, text


def orphans(tool: PythonTool, scratch: Path) -> tuple[bool, str]:
    """setsid + double fork: a grandchild in its own session, reparented away from the run."""
    mark = "agentrl-orphan-" + uuid.uuid4().hex
    code = (
        "import os, subprocess, sys\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        f"        os.execv(sys.executable, [sys.executable, '-c', 'import time\\ntime.sleep(60)  # {mark}'])\n    os._exit(0)\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time\\ntime.sleep(60)  # {mark}'], start_new_session=True,"
        " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\nimport time\ntime.sleep(0.3)\nprint('spawned')"
    )
    text, _, _ = call(tool, code)
    time.sleep(0.5)
    survivors = processes_with(mark)
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    return not survivors and "spawned" in text, text


def symlinks_left_behind(tool: PythonTool, scratch: Path) -> tuple[bool, str]:
    """Symlinks in the working dir to a host file, a host folder and /; the host must not follow them."""
    import tempfile

    canary_dir = scratch / "canary"
    canary_dir.mkdir()
    canary = canary_dir / "keep.txt"
    canary.write_text("keep")
    canary_dir.chmod(0o777)
    link = f"link-{uuid.uuid4().hex}"
    code = (
        f"import os\nos.symlink({str(canary)!r}, '{link}')\nos.symlink({str(canary_dir)!r}, 'dir-link')\nos.symlink('/', 'root-link')\n"
        "os.makedirs('deep/er', exist_ok=True)\nos.symlink('../../dir-link', 'deep/er/up')\nprint(sorted(os.listdir('.')))"
    )
    text, _, _ = call(tool, code)
    left = [d for d in Path(tempfile.gettempdir()).glob("agentrl-sandbox-*") if (d / link).is_symlink()]
    intact = canary.read_text() == "keep" and sorted(p.name for p in canary_dir.iterdir()) == ["keep.txt"]
    return intact and not left and link in text, text


# -- the rest of the issue's list ------------------------------------------------------------------


def write_around_the_limit(tool: PythonTool, scratch: Path) -> tuple[bool, str]:
    """Twice the disk limit into each place outside the working dir a sandbox might leave writable
    (its own /, /etc, /dev, /dev/shm, /run): in all, no more than the limit may land anywhere."""
    mark = f"agentrl-around-{uuid.uuid4().hex[:8]}"
    code = (
        "import os\nwritten = {}\nfor d in ['/', '/etc', '/dev', '/dev/shm', '/run']:\n    n = 0\n"
        f"    for i in range({2 * DISK_MB // 8}):\n        try:\n            with open(os.path.join(d, f'{mark}-{{i}}'), 'wb') as f:\n"
        "                f.write(b'x' * 8 * 2**20)\n            n += 8\n        except OSError:\n            break\n    written[d] = n\n"
        f"    for i in range({2 * DISK_MB // 8}):\n        try:\n            os.unlink(os.path.join(d, f'{mark}-{{i}}'))\n"
        "        except OSError:\n            pass\nprint('MB written', written, 'total', sum(written.values()))"
    )
    text, _, _ = call(tool, code)
    for d in ("/dev/shm", "/run", "/tmp"):
        for p in Path(d).glob(f"{mark}-*"):
            p.unlink()
    total = int(text.split("total")[-1].split()[0]) if "total" in text else -1
    return 0 <= total <= DISK_MB, text


def disk_fill(tool: PythonTool, scratch: Path) -> tuple[bool, str]:
    """The issue's attack: 160 files of 15 MB in the working directory (2.4 GB before the fix)."""
    text, _, took = call(tool, "for i in range(160):\n    open(f'f{i}', 'wb').write(b'x' * 15 * 2**20)\nprint('wrote 2.4 GB')")
    return "wrote 2.4 GB" not in text and _last_line(text).startswith("Error:") and f"{DISK_MB} MB" in _last_line(text), text


def disk_fill_ignoring_errors(tool: PythonTool, scratch: Path) -> tuple[bool, str]:
    """The same, catching every error and going on: the watcher has to see it, not the traceback."""
    code = "for i in range(160):\n    try:\n        open(f'f{i}', 'wb').write(b'x' * 15 * 2**20)\n    except OSError:\n        pass\nimport time\ntime.sleep(1)\nprint('done')"
    text, _, _ = call(tool, code)
    return "disk limit" in _last_line(text), text


def many_small_files(tool: PythonTool, scratch: Path) -> tuple[bool, str]:
    """Empty files until something stops it (inodes cost memory that a byte limit does not count)."""
    code = "import os\ni = 0\nwhile True:\n    try:\n        open(f'f{i}', 'w').close()\n    except OSError:\n        pass\n    i += 1"
    text, _, took = call(tool, code)
    return "2000 files" in _last_line(text) and took < TIMEOUT + 3, text


def long_file_names(tool: PythonTool, scratch: Path) -> tuple[bool, str]:
    """A 300-character name, then folders of 255-character names as deep as they go."""
    code = (
        "import os\ntry:\n    open('x' * 300, 'w')\nexcept OSError as e:\n    print('long name:', e.strerror)\n"
        "depth = 0\ntry:\n    while depth < 100:\n        os.mkdir('d' * 255)\n        os.chdir('d' * 255)\n        depth += 1\n"
        "except OSError as e:\n    print('deep path:', e.strerror)\nprint('depth', depth)"
    )
    text, _, _ = call(tool, code)
    return "long name: File name too long" in text and "depth" in text, text


def read_sys(tool: PythonTool, scratch: Path) -> tuple[bool, str]:
    """Read the host's hardware and kernel details from /sys."""
    code = (
        "import os\nseen = []\nfor p in ['/sys/kernel', '/sys/class/net', '/sys/devices/system/cpu', '/sys/fs/cgroup']:\n"
        "    try:\n        seen.append((p, len(os.listdir(p))))\n    except OSError as e:\n        pass\nprint('sys entries', seen)"
    )
    text, _, _ = call(tool, code)
    return "sys entries []" in text, text


def nested_namespaces(tool: PythonTool, scratch: Path) -> tuple[bool, str]:
    """unshare(CLONE_NEWUSER | CLONE_NEWNS) (the issue's finding), clone with CLONE_NEWUSER, clone3, setns."""
    code = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nsys_ = libc.syscall\nsys_.restype = ctypes.c_long\n"
        f"r = sys_({NR['unshare']}, 0x10000000 | 0x00020000)\nprint('unshare', r, os.strerror(ctypes.get_errno()) if r else '')\n"
        f"pid = sys_({NR['clone']}, 0x10000000 | 17, 0, 0, 0, 0)\nif pid == 0:\n    os._exit(0)\nprint('clone', -1 if pid < 0 else 'made', os.strerror(ctypes.get_errno()))\n"
        f"args = (ctypes.c_uint64 * 11)(0x10000000)\nprint('clone3', sys_({NR['clone3']}, args, 88))\n"
        f"print('setns', sys_({NR['setns']}, os.open('/proc/self/ns/net', os.O_RDONLY), 0))"
    )
    text, _, _ = call(tool, code)
    return "unshare -1" in text and "clone -1" in text and "clone3 -1" in text and "setns -1" in text, text


def kernel_calls(tool: PythonTool, scratch: Path) -> tuple[bool, str]:
    """mount, keyctl, bpf, perf_event_open, userfaultfd: each must come back -1 (EPERM)."""
    code = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nsys_ = libc.syscall\nsys_.restype = ctypes.c_long\nout = []\n"
        f"for name, nr, args in [('mount', {NR['mount']}, (b'none', b'/tmp', b'tmpfs', 0, 0)), ('keyctl', {NR['keyctl']}, (0, -3, 0, 0, 0)),"
        f" ('bpf', {NR['bpf']}, (0, 0, 0)), ('perf_event_open', {NR['perf_event_open']}, (0, 0, -1, -1, 0)), ('userfaultfd', {NR['userfaultfd']}, (0,))]:\n"
        "    r = sys_(nr, *args)\n    out.append(f'{name} {r} {os.strerror(ctypes.get_errno()) if r < 0 else \"\"}')\nprint('; '.join(out))"
    )
    text, _, _ = call(tool, code)
    calls = [part.split() for part in text.strip().splitlines()[0].split("; ")] if text.strip() else []
    return len(calls) == 5 and all(c[1] == "-1" and "Operation not permitted" in " ".join(c) for c in calls), text


def fork_bomb(tool: PythonTool, scratch: Path) -> tuple[bool, str]:
    text, _, took = call(tool, "import os\nwhile True:\n    os.fork()")
    return took < TIMEOUT + 5 and "Error:" in text, text


def thread_bomb(tool: PythonTool, scratch: Path) -> tuple[bool, str]:
    code = "import threading, time\nwhile True:\n    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()"
    text, _, took = call(tool, code)
    return "more processes than the sandbox allows" in _last_line(text) and took < TIMEOUT + 5, text


def memory_bomb(tool: PythonTool, scratch: Path) -> tuple[bool, str]:
    text, _, took = call(tool, "chunks = []\nwhile True:\n    chunks.append(bytearray(50 * 2**20))")
    return "memory limit" in text and took < TIMEOUT + 5, text


def mmap_memory(tool: PythonTool, scratch: Path) -> tuple[bool, str]:
    """Anonymous mmaps touched page by page, past the memory limit."""
    code = "import mmap\nmaps = []\nwhile True:\n    m = mmap.mmap(-1, 64 * 2**20)\n    m.write(b'x' * (64 * 2**20))\n    maps.append(m)"
    text, _, took = call(tool, code)
    return "memory limit" in text and took < TIMEOUT + 5, text


def infinite_loop(tool: PythonTool, scratch: Path) -> tuple[bool, str]:
    text, _, took = call(tool, "while True:\n    pass")
    return "time limit" in text and took < TIMEOUT + 5, text


def cpu_threads(tool: PythonTool, scratch: Path) -> tuple[bool, str]:
    """CPU burn in eight threads that drop the GIL (hashing large buffers)."""
    code = "import hashlib, threading\ndata = b'x' * 2**24\ndef burn():\n    while True:\n        hashlib.sha256(data).digest()\nfor _ in range(8):\n    threading.Thread(target=burn).start()"
    text, _, took = call(tool, code)
    return "time limit" in text and took < TIMEOUT + 5, text


def huge_stdout(tool: PythonTool, scratch: Path) -> tuple[bool, str]:
    text, _, took = call(tool, "while True:\n    print('x' * 100000)")
    return len(text) < 5000 and "truncated" in text and took < TIMEOUT + 5, text[-200:]


def network(tool: PythonTool, scratch: Path) -> tuple[bool, str]:
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


def ctypes_calls(tool: PythonTool, scratch: Path) -> tuple[bool, str]:
    """setuid(0) (under unshare it succeeds: root of its own user namespace, nobody outside), then
    open the host's /etc/passwd for writing (never written), then a NULL read."""
    code = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nprint('setuid', libc.setuid(0), 'uid', os.getuid(), flush=True)\n"
        "try:\n    open('/etc/passwd', 'a').close()\n    print('opened /etc/passwd for writing', flush=True)\n"
        "except OSError as e:\n    print('refused', type(e).__name__, flush=True)\nctypes.string_at(0)"
    )
    text, _, _ = call(tool, code)
    return "refused" in text and "SIGSEGV" in text, text


def signal_parent(tool: PythonTool, scratch: Path) -> tuple[bool, str]:
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


Attack = Callable[[PythonTool, Path], "tuple[bool, str]"]
YES, NO = True, False
AS_ROOT = ROOT_USER  # contained only because, as root, the code runs as nobody

# attack name -> (function, contained under bwrap, unshare, none); docs/environments.md shows this table.
EXPECTED: dict[str, tuple[Attack, bool, bool, bool]] = {
    "the parent's environment via /proc/*/environ": (parent_environment, YES, YES, AS_ROOT),
    "read host files (a world-readable secret, the project)": (host_files, YES, NO, NO),
    "write outside the working dir (a world-writable folder, the project, /usr)": (write_outside, YES, NO, NO),
    "inherited file descriptors": (inherited_descriptors, YES, YES, YES),
    "abstract unix socket of a host service": (lambda t, s: unix_sockets(t, s, abstract=True), YES, YES, NO),
    "filesystem unix socket of a host service": (lambda t, s: unix_sockets(t, s, abstract=False), YES, NO, NO),
    "a file left in the host's /dev/shm": (dev_shm, YES, YES, NO),
    "ptrace (attach to child and parent, traceme)": (ptrace, YES, YES, YES),
    "host process ids in /proc": (host_pids, YES, YES, NO),
    "/proc/kmsg and syslog(2)": (kernel_log, YES, YES, YES),
    "/tmp past the disk limit": (tmp_cap, YES, YES, NO),
    "orphans (setsid + double fork)": (orphans, YES, YES, NO),
    "symlinks left behind in the working dir": (symlinks_left_behind, YES, YES, YES),
    "disk fill (160 files of 15 MB)": (disk_fill, YES, YES, YES),
    "writes outside the working dir's limit (/, /etc, /dev, /dev/shm, /run)": (write_around_the_limit, YES, YES, NO),
    "disk fill, errors ignored": (disk_fill_ignoring_errors, YES, YES, YES),
    "many small files": (many_small_files, YES, YES, YES),
    "very long file names and deep paths": (long_file_names, YES, YES, YES),
    "read /sys": (read_sys, YES, NO, NO),
    "nested namespaces (unshare, clone, clone3, setns)": (nested_namespaces, YES, YES, YES),
    "mount, keyctl, bpf, perf_event_open, userfaultfd": (kernel_calls, YES, YES, YES),
    "fork bomb": (fork_bomb, YES, YES, YES),
    "thread bomb": (thread_bomb, YES, YES, YES),
    "memory bomb": (memory_bomb, YES, YES, YES),
    "memory via mmap": (mmap_memory, YES, YES, YES),
    "infinite loop": (infinite_loop, YES, YES, YES),
    "CPU burn in threads": (cpu_threads, YES, YES, YES),
    "huge stdout": (huge_stdout, YES, YES, YES),
    "network to a loopback port": (network, YES, YES, NO),
    "ctypes calls (setuid(0), /etc/passwd for writing, a NULL read)": (ctypes_calls, YES, YES, YES),
    "signals to the parent and other host processes": (signal_parent, YES, YES, AS_ROOT),
}
BACKEND_COLUMN = {"bwrap": 1, "unshare": 2, "none": 3}


def expected(backend: str, attack: str) -> bool:
    return bool(EXPECTED[attack][BACKEND_COLUMN[backend]])
