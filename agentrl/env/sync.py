"""A blocking face for async environments, for scripts, notebooks and gym-style loops."""

from __future__ import annotations

from typing import Any

from anyio.from_thread import start_blocking_portal


class SyncEnvironment:
    """Runs an async ``Environment`` on a private event loop in a background thread.

    One loop serves every call, so tool limiters and other loop-bound state stay valid between
    ``reset`` and ``step``. Close it (or use it as a context manager) to stop the loop.
    """

    def __init__(self, env: Any) -> None:
        self.env = env
        self._cm = start_blocking_portal()
        self._portal = self._cm.__enter__()

    def reset(self, task: dict[str, Any] | None = None, seed: int | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        return self._portal.call(lambda: self.env.reset(task=task, seed=seed))

    def step(self, message: Any) -> tuple[list[dict[str, Any]], float, bool, bool, dict[str, Any]]:
        return self._portal.call(self.env.step, message)

    def call(self, fn: Any, *args: Any) -> Any:
        """Run any coroutine function on the environment's loop."""
        return self._portal.call(fn, *args)

    def close(self) -> None:
        if self._cm is not None:
            try:
                self._portal.call(self.env.close)
            finally:
                self._cm.__exit__(None, None, None)
                self._cm = None

    def __enter__(self) -> SyncEnvironment:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)
