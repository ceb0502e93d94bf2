"""The seccomp filter for sandboxed code: the kernel calls that container escapes go through, refused.

The filter is compiled by libseccomp (the maintained library that systemd, Docker and Flatpak use),
through ``pyseccomp``'s ctypes binding of it, into the classic BPF program that bubblewrap's
``--seccomp FD`` and ``prctl(PR_SET_SECCOMP)`` both take. Everything not listed is allowed: the
sandbox's other layers (namespaces, rlimits, read-only mounts) bound the rest, and a short deny list
keeps ordinary Python (threads, subprocess, sockets to nowhere) working.

Refused with EPERM: new namespaces (``unshare`` always, ``clone`` with any ``CLONE_NEW*`` flag,
``setns``), ``ptrace`` and cross-process memory access, every mount call, the kernel keyring,
``bpf``, ``perf_event_open``, ``userfaultfd``, ``io_uring``, kernel modules, ``kexec``, the kernel
log (``syslog``) and file handles (``open_by_handle_at``, the "shocker" escape). ``clone3`` gets
ENOSYS: its flags live in memory a filter cannot read, and ENOSYS makes glibc fall back to ``clone``,
whose flags it can. System calls of a foreign architecture (32-bit ``int 0x80``) kill the process
(libseccomp's default for a filter built for the native architecture only).
"""

from __future__ import annotations

import errno
import functools
import tempfile

from agentrl.core.errors import AgentrlError

# Linux's CLONE_NEW* flags (include/uapi/linux/sched.h): any one of them makes a new namespace.
CLONE_NEW_FLAGS = {
    "CLONE_NEWTIME": 0x00000080,
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}

DENIED = (
    # namespaces (clone is handled by its flags below)
    "unshare", "setns",
    # tracing and other processes' memory
    "ptrace", "process_vm_readv", "process_vm_writev",
    # mounts, old and new API
    "mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount", "fspick", "move_mount",
    "open_tree", "mount_setattr",
    # kernel keyring
    "keyctl", "add_key", "request_key",
    # kernel interfaces with a history of privilege escalations
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    # the machine itself
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot", "swapon",
    "swapoff", "acct", "quotactl", "syslog", "iopl", "ioperm", "open_by_handle_at", "name_to_handle_at",
    "lookup_dcookie",
)  # fmt: skip


class SeccompUnavailable(AgentrlError, RuntimeError):
    """libseccomp (or its Python binding) is missing, so the filter cannot be built here."""


@functools.lru_cache(maxsize=1)
def seccomp_filter() -> bytes:
    """The compiled filter (an array of ``struct sock_filter``), built once per process."""
    try:
        import pyseccomp as sc
    except ImportError as exc:
        raise SeccompUnavailable(
            "the seccomp filter needs the pyseccomp package (pip install pyseccomp, part of agentrl's "
            f"[sandbox] and [dev] extras): {exc}"
        ) from exc
    except (OSError, RuntimeError) as exc:  # pyseccomp raises RuntimeError when libseccomp.so is absent
        raise SeccompUnavailable(
            f"the seccomp filter needs libseccomp (Debian/Ubuntu: apt-get install libseccomp2): {exc}"
        ) from exc
    try:
        f = sc.SyscallFilter(defaction=sc.ALLOW)
        refuse = sc.ERRNO(errno.EPERM)
        for name in DENIED:
            try:
                f.add_rule(refuse, name)
            except ValueError:  # a call this architecture does not have (e.g. iopl on arm64)
                continue
        for flag in CLONE_NEW_FLAGS.values():
            f.add_rule(refuse, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))  # x86-64 and arm64: flags are arg 0
        f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
        with tempfile.TemporaryFile() as out:  # pyseccomp exports through a real file descriptor
            f.export_bpf(out)
            out.seek(0)
            return out.read()
    except OSError as exc:
        raise SeccompUnavailable(f"libseccomp could not build the sandbox's filter: {exc}") from exc


# Runs in the sandbox's launcher (plain ``python -I -S``, no agentrl there) for the backends that
# have no bubblewrap to load the filter: reads it from a descriptor and installs it with prctl.
LOAD_SNIPPET = """
def load_seccomp(fd):
    data = b''
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    os.close(fd)
    class Prog(ctypes.Structure):
        _fields_ = [('len', ctypes.c_ushort), ('filter', ctypes.c_char_p)]
    prog = Prog(len(data) // 8, data)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), 'agentrl sandbox: installing the seccomp filter failed')
"""
