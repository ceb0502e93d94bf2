"""The loopback HTTP/1.1 server behind harness episodes: stdlib asyncio, on the rollout's own loop.

Why not a web framework: none is a dependency (FastAPI/uvicorn come only with vLLM), and the server
has one job — hand each ``POST /ep/<key>/v1/chat/completions`` body to the episode that owns
``<key>`` and write back its answer — on the same event loop as the episodes, so a request costs no
thread hop. Access as in ``agentrl vllm-serve``'s guard: it binds 127.0.0.1 only; every request
needs the run's bearer token (compared in constant time) before a body byte is read; a body over
the limit, or one without ``Content-Length``, is refused from its headers alone; headers are
bounded in size and in time. Connections are kept alive (the OpenAI client pools them).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

# (status, JSON body, seconds it waited for the episode) for a request: what the handler returns.
Handler = Callable[[str, str, bytes], Awaitable[tuple[int, dict[str, Any], float]]]

MAX_HEADER_BYTES = 32 * 1024
HEADER_TIMEOUT_S = 30.0
IDLE_TIMEOUT_S = 300.0
REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    409: "Conflict",
    411: "Length Required",
    413: "Payload Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def error_body(message: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}


class LoopbackServer:
    """One listening socket serving many episodes' endpoints, routed by the key in the path.

    ``handler(key, route, body)`` answers a request to ``/ep/<key>/v1/<route>``; unknown keys get 404.
    """

    def __init__(self, token: str, handler: Handler, max_body_bytes: int, own_s: deque[float] | None = None) -> None:
        self._expected = f"Bearer {token}".encode()
        self._handler = handler
        self.max_body_bytes = max_body_bytes
        self.own_s = own_s  # the server's own time per answered request (read to written, less the wait)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[Any]] = set()
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, limit=MAX_HEADER_BYTES)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for task in list(self._connections):  # idle keep-alive connections wait in readuntil
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(BaseException):
                await task
        with contextlib.suppress(Exception):
            await self._server.wait_closed()
        self._server = None

    def abandon(self) -> None:
        """Stop listening without the event loop, which has ended (its connections ended with it)."""
        if self._server is not None:
            for sock in getattr(self._server, "_sockets", None) or ():
                with contextlib.suppress(Exception):
                    sock.close()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        try:
            while True:
                keep = await self._one(reader, writer)
                if not keep:
                    break
        except (
            asyncio.IncompleteReadError,
            ConnectionError,
            asyncio.LimitOverrunError,
            ValueError,
            asyncio.TimeoutError,
        ):
            pass  # the client went away, stalled, or sent something that is not HTTP: drop the connection
        except asyncio.CancelledError:
            pass  # the server is closing: a connection task ends quietly (asyncio logs a cancelled one as an error)
        finally:
            if task is not None:
                self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Serve one request; False when the connection should close."""
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IDLE_TIMEOUT_S)
        except asyncio.TimeoutError:
            return False
        except asyncio.LimitOverrunError:
            await self._write(writer, 413, error_body(f"request headers over {MAX_HEADER_BYTES} bytes"), close=True)
            return False
        lines = head.decode("latin-1").split("\r\n")
        try:
            method, target, version = lines[0].split(" ")
        except ValueError:
            await self._write(writer, 400, error_body("malformed request line"), close=True)
            return False
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if ":" in line:
                name, value = line.split(":", 1)
                headers[name.strip().lower()] = value.strip()
        close = headers.get("connection", "").lower() == "close" or version == "HTTP/1.0"
        if not hmac.compare_digest(headers.get("authorization", "").encode(), self._expected):
            await self._write(
                writer,
                401,
                error_body("a valid bearer token is required (the episode's api_key)", "invalid_api_key"),
                close=True,
            )
            return False
        if "transfer-encoding" in headers:
            await self._write(
                writer,
                411,
                error_body("send the body with Content-Length (chunked bodies are not accepted)"),
                close=True,
            )
            return False
        try:
            size = int(headers.get("content-length", "0"))
        except ValueError:
            await self._write(writer, 400, error_body("Content-Length is not a number"), close=True)
            return False
        if size < 0 or size > self.max_body_bytes:
            await self._write(
                writer,
                413,
                error_body(f"request body of {size} bytes over the limit of {self.max_body_bytes}"),
                close=True,
            )
            return False
        body = await asyncio.wait_for(reader.readexactly(size), HEADER_TIMEOUT_S) if size else b""
        start = time.perf_counter()
        path = target.split("?", 1)[0]
        parts = path.strip("/").split("/")
        if len(parts) < 4 or parts[0] != "ep" or parts[2] != "v1":
            await self._write(
                writer, 404, error_body(f"no such endpoint {path!r}: use /ep/<episode key>/v1/chat/completions"), close
            )
            return not close
        route = "/".join(parts[3:])
        if (route, method) not in {("chat/completions", "POST"), ("models", "GET")}:
            await self._write(
                writer,
                405 if route in ("chat/completions", "models") else 404,
                error_body(f"{method} {path} is not served"),
                close,
            )
            return not close
        try:
            status, payload, waited = await self._handler(parts[1], route, body)
        except Exception as exc:  # an endpoint bug must not take the connection's other requests with it
            status, payload, waited = 500, error_body(f"{type(exc).__name__}: {exc}"), 0.0
        await self._write(writer, status, payload, close)
        if self.own_s is not None:
            self.own_s.append(time.perf_counter() - start - waited)
        return not close

    async def _write(self, writer: asyncio.StreamWriter, status: int, payload: dict[str, Any], close: bool) -> None:
        body = json.dumps(payload, ensure_ascii=False).encode()
        head = (
            f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: {'close' if close else 'keep-alive'}\r\n\r\n"
        )
        writer.write(head.encode() + body)
        await writer.drain()
