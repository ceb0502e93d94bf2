"""Who may call ``agentrl vllm-serve`` and how much they may send: a plain ASGI middleware.

Why its own layer, in front of everything: an unauthenticated ``/update_weights`` lets anyone who
can reach the port replace the model, and a body read into memory before its size is checked lets
anyone exhaust it. So the token is checked and the declared size refused before the application
(or any body byte) is touched, and a body without a declared size is counted as it streams in and
cut off at the limit. Plain ASGI, no web framework: it runs (and is tested) without vLLM or FastAPI.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from collections.abc import Callable
from typing import Any

TOKEN_ENV = "AGENTRL_VLLM_TOKEN"  # where both the server and the client look when no token is given
OPEN_PATHS = frozenset({"/health"})  # GET only: readiness probes need no token


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` accepts connections from this machine only."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to a public address
        return False


class RequestGuard:
    """ASGI middleware: a bearer token (when set) and a per-path limit on request body bytes.

    ``limit_for(path)`` gives the most bytes a request to ``path`` may carry. A request declaring
    more (``Content-Length``) gets 413 without a byte of its body read; one that streams more
    gets 413 once it passes the limit, and the application sees the client as gone.
    """

    def __init__(self, app: Any, token: str | None, limit_for: Callable[[str], int]) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode() if token else None
        self.limit_for = limit_for

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        path = scope.get("path", "")
        if self._expected is not None and not (scope.get("method") == "GET" and path in OPEN_PATHS):
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                why = "a bearer token is required" if not given else "the bearer token is wrong"
                await reply(send, 401, f"{why} (Authorization: Bearer <token>; the client reads {TOKEN_ENV})",
                            [(b"www-authenticate", b"Bearer")])
                return
        limit = self.limit_for(path)
        declared = headers.get(b"content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                await reply(send, 400, "Content-Length is not a number", [(b"connection", b"close")])
                return
            if size > limit:
                await reply(send, 413, too_large(path, size, limit), [(b"connection", b"close")])
                return

        received = 0
        refused = False

        async def counted() -> dict:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message.get("type") == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    refused = True
                    await reply(send, 413, too_large(path, None, limit), [(b"connection", b"close")])
                    return {"type": "http.disconnect"}
            return message

        async def unless_refused(message: dict) -> None:
            if not refused:  # after our 413, whatever the application answers is dropped
                await send(message)

        await self.app(scope, counted, unless_refused)


def too_large(path: str, size: int | None, limit: int) -> str:
    what = f"{size} bytes" if size is not None else "more bytes"
    return f"request body too large for {path}: {what} > the limit of {limit} bytes (vllm-serve max_body_mb / max_push_mb)"


async def reply(send: Any, status: int, detail: str, headers: list[tuple[bytes, bytes]] = ()) -> None:  # type: ignore[assignment]
    body = json.dumps({"detail": detail}).encode()
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers],
    })
    await send({"type": "http.response.body", "body": body})
