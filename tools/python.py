"""The ``python`` tool: run model-written Python in ``agentrl.env.sandbox`` and show what it printed.

Each call is a fresh interpreter (standard library only) in a fresh private working directory, so
calls do not share state: the model prints what it wants to see. Program errors come back as the
traceback; a limit (time, memory, processes, disk, output) comes back as one plain sentence naming it.
"""

from __future__ import annotations

from typing import Any

from agentrl.env.sandbox import Sandbox, SandboxConfig
from agentrl.env.tool import Tool


class PythonTool(Tool):
    """Runs Python code in the sandbox; ``sandbox`` or ``SandboxConfig`` keyword arguments configure it."""

    name = "python"
    shared = ("sandbox",)  # one pool of sandbox slots for every episode (its limit is the point)

    def __init__(self, sandbox: Sandbox | None = None, **config: Any) -> None:
        if sandbox is not None and config:
            raise ValueError("pass either a Sandbox or SandboxConfig options, not both")
        self.sandbox = sandbox or Sandbox(SandboxConfig(**config))
        c = self.sandbox.config
        # The sandbox enforces its own limits; dispatch's timeout is only a backstop above them, and
        # it starts when the call gets one of the sandbox's slots: with 64 episodes calling at once
        # and 4 slots, the queue is not the program's time (it once turned into "timed out" messages).
        self.timeout = c.timeout_s + 10.0
        self.timeout_includes_queue = False
        self.max_output_chars = c.max_output_bytes + 400
        self.max_concurrency = c.max_concurrency
        if c.require_isolation:
            self.sandbox.check()  # refuse at construction, not at the first call

    async def run(self, code: str) -> str:
        """Run a Python program and return what it prints (stdout, then stderr).

        Args:
            code: A complete Python program. Use print() to show results.
        """
        result = await self.sandbox.run_python(code)
        c = self.sandbox.config
        return result.message(c.timeout_s, c.memory_mb, disk_mb=c.disk_mb, max_files=c.max_files, max_file_mb=c.max_file_mb)
