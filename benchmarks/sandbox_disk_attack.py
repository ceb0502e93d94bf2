"""The issue-43 disk attack, one call: how much a sandbox module let reach the host disk.

One call with the default ``SandboxConfig()`` runs the issue's program (160 files of 15 MB in the
working directory) while a thread samples, every 50 ms, the bytes under the private temp folder the
sandbox uses. Prints the run time, the limit reported, the peak bytes on the host and the last line
the model reads. ``--module-path`` runs another version of ``agentrl/env/sandbox.py`` (e.g. the one
before the fix: ``git show df5b4f7:agentrl/env/sandbox.py > /tmp/old/old_sandbox.py``).

Usage: python benchmarks/sandbox_disk_attack.py [--module-path /tmp/old/old_sandbox.py]
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import shutil
import sys
import tempfile
import threading
import time

import anyio

PROGRAM = "for i in range(160):\n    open(f'f{i}', 'wb').write(b'x' * 15 * 2**20)\nprint('wrote 2.4 GB')"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--module-path", help="a sandbox.py to load instead of agentrl.env.sandbox")
    args = ap.parse_args()
    if args.module_path:
        spec = importlib.util.spec_from_file_location("sandbox_under_test", args.module_path)
        mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[spec.name] = mod  # type: ignore[union-attr]  # dataclasses look their module up there
        spec.loader.exec_module(mod)  # type: ignore[union-attr]
    else:
        mod = importlib.import_module("agentrl.env.sandbox")
    tmp = tempfile.mkdtemp(prefix="agentrl-disk-attack-")
    os.chmod(tmp, 0o755)
    tempfile.tempdir = tmp  # the sandbox's folders go here, so their bytes can be counted
    sandbox = mod.Sandbox(mod.SandboxConfig())
    print(f"module {args.module_path or 'agentrl.env.sandbox'}, backend {sandbox.backend}")
    peak, stop = [0], [False]

    def sample() -> None:
        while not stop[0]:
            total = 0
            for dirpath, _dirs, names in os.walk(tmp):
                for n in names:
                    try:
                        total += os.lstat(os.path.join(dirpath, n)).st_blocks * 512
                    except OSError:
                        pass
            peak[0] = max(peak[0], total)
            time.sleep(0.05)

    watcher = threading.Thread(target=sample)
    watcher.start()
    try:
        result = anyio.run(sandbox.run_python, PROGRAM)
    finally:
        stop[0] = True
        watcher.join()
        shutil.rmtree(tmp, ignore_errors=True)
    c = sandbox.config
    print(f"ran {result.elapsed_s:.1f} s, limit {result.limit}, peak on the host disk {peak[0] / 2**20:,.0f} MB")
    print("last line:", result.message(c.timeout_s, c.memory_mb).strip().splitlines()[-1])


if __name__ == "__main__":
    main()
