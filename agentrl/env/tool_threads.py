"""Sync tools on their own daemon threads, within a per-tool thread budget.

Why not a shared pool (``anyio.to_thread``): a tool that hangs keeps its thread forever, so hung
calls of one tool would use up the threads every other tool needs. Here each tool has its own
budget (``Tool.max_concurrency`` threads alive at once, hung ones included): a stuck tool only
blocks further calls of itself, and those wait for a slot inside their own timeout. The threads are
daemon threads, so a hung tool never keeps the interpreter from exiting.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections import deque
from collections.abc import Callable
from typing import Any


class ThreadBudget:
    """At most ``limit`` threads of one tool alive at once, across event loops.

    ``acquire`` waits on the running event loop; ``release`` may come from any thread (a worker
    thread gives its slot back when it really ends, not when its caller stops waiting).
    """

    def __init__(self, limit: int) -> None:
        self.limit = max(1, int(limit))
        self._lock = threading.Lock()
        self._live = 0
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()

    @property
    def live(self) -> int:
        """Threads of this tool still running (hung ones included)."""
        return self._live

    async def acquire(self) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._live < self.limit and not self._waiters:
                self._live += 1
                return
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters.append((loop, fut))
        try:
            await fut
        except BaseException:
            with self._lock:
                if (loop, fut) in self._waiters:  # still queued: just leave the queue
                    self._waiters.remove((loop, fut))
                    raise
            # The slot was already handed to us (the grant is set or on its way): pass it on.
            if fut.done() and not fut.cancelled():
                self.release()
            raise

    def release(self) -> None:
        """Give a slot back: to the oldest waiter whose loop still runs, else to the pool."""
        with self._lock:
            while self._waiters:
                loop, fut = self._waiters.popleft()
                try:
                    loop.call_soon_threadsafe(self._grant, fut)
                    return  # the slot moves to that waiter; _live is unchanged
                except RuntimeError:  # its loop is closed: nobody waits there any more
                    continue
            self._live -= 1

    def _grant(self, fut: asyncio.Future[None]) -> None:
        if fut.done():  # the waiter gave up (timeout or cancellation) before the grant arrived
            self.release()
        else:
            fut.set_result(None)


class Outcome:
    """What a worker thread produced: a value, or the exception (any BaseException) it raised."""

    __slots__ = ("value", "error")

    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value, self.error = value, error


async def run_in_thread(fn: Callable[[], Any], budget: ThreadBudget, name: str = "tool") -> Outcome:
    """Run ``fn()`` on a new daemon thread once ``budget`` has a slot; never raises ``fn``'s errors.

    Cancelling the caller (a timeout) abandons the thread: it keeps its slot until it really ends.
    """
    await budget.acquire()
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Outcome] = loop.create_future()
    context = contextvars.copy_context()

    def settle(outcome: Outcome) -> None:
        if not done.done():
            done.set_result(outcome)

    def work() -> None:
        try:
            outcome = Outcome(value=context.run(fn))
        except BaseException as exc:  # SystemExit, KeyboardInterrupt... in a tool are the tool's failure
            outcome = Outcome(error=exc)
        finally:
            budget.release()
        try:
            loop.call_soon_threadsafe(settle, outcome)
        except RuntimeError:  # the loop is gone: nobody waits for this result
            pass

    try:
        threading.Thread(target=work, name=f"agentrl-tool-{name}"[:60], daemon=True).start()
    except BaseException:
        budget.release()
        raise
    return await done
