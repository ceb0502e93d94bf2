"""The ``vllm-server`` backend: a ``Generator`` that talks to ``agentrl vllm-serve`` over HTTP.

Why a server: the inference engine can live on other GPUs or another machine than the trainer,
and survive trainer restarts. The trainer keeps calling the same protocol as for the in-process
backends: ``generate`` (one request per episode turn, many in flight at once; the server's
engine batches them), ``update_weights`` after each optimizer step, ``close``.

Transport is the standard library's ``http.client`` on worker threads (one keep-alive connection
per thread, at most ``max_connections`` requests in flight), so the client adds no dependency and
runs in the trainer's environment whatever HTTP packages it has. What it guarantees:

* Connection errors (server not up yet, killed, restarting) are retried with exponential backoff
  for up to ``timeout_s``; then one ``VLLMServerError`` names the URL and the last error.
* A request that gets no answer within ``request_timeout_s`` fails with an error naming the URL.
* A cancelled ``generate`` closes its socket, so the server aborts the request; idle keep-alive
  connections are not reused past the server's keep-alive timeout.
* A restarted server is picked up on the next request. If this client had pushed weights to the
  old server instance, the new one would silently serve its startup weights, so the server
  refuses such a request (it carries the instance id the weights went to) and the client raises
  ``ServerRestartedError``; the next ``update_weights`` pushes to the new instance and clears it.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import queue
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import anyio

from agentrl.core.errors import AgentrlError
from agentrl.generators.protocol import Generation, SamplingParams, T
from agentrl.generators.vllm.http_guard import TOKEN_ENV

if TYPE_CHECKING:
    from agentrl.generators.weights import WeightUpdate

__all__ = ["ServerRestartedError", "VLLMServerError", "VLLMServerGenerator"]

log = logging.getLogger(__name__)

INSTANCE_HEADER = "X-Agentrl-Instance"  # the server's per-start id, on every response
EXPECT_HEADER = "X-Agentrl-Expect-Instance"  # the instance this client's weights live on
IDLE_S = 4.0  # reuse a keep-alive connection only if used this recently (uvicorn closes idle ones after 5 s)


class VLLMServerError(AgentrlError, RuntimeError):
    """The server could not be reached, timed out, or answered with an error."""


class ServerRestartedError(VLLMServerError):
    """The server restarted since this client pushed weights, so it lost them; push them again."""


class _Response:
    def __init__(self, status: int, body: bytes, instance: str | None) -> None:
        self.status, self.body, self.instance = status, body, instance

    def json(self) -> Any:
        return json.loads(self.body or b"null")

    def detail(self) -> str:
        """The server's error message (FastAPI puts it under ``detail``), else the raw body."""
        try:
            data = self.json()
        except ValueError:
            return self.body[:500].decode("utf-8", "replace")
        return str(data.get("detail", data)) if isinstance(data, dict) else str(data)


class _Call:
    """The connection one request is using, so the event loop can cut it when the caller cancels."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None
        self.cancelled = False

    def attach(self, conn: http.client.HTTPConnection) -> bool:
        with self._lock:
            self._conn = conn
            return not self.cancelled

    def detach(self) -> None:
        with self._lock:
            self._conn = None

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            sock = self._conn.sock if self._conn is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class VLLMServerGenerator:
    """Generator backed by an ``agentrl vllm-serve`` server at ``url`` (``http://host:port``).

    ``timeout_s``: how long connection failures are retried before giving up.
    ``request_timeout_s``: how long one request may wait for its answer (a long generation under
    load can take minutes on CPU). ``max_connections``: requests in flight at once; keep it at
    least the rollout's concurrent episodes so the server's engine sees them all and batches them.
    ``token``: the server's bearer token (default: the ``AGENTRL_VLLM_TOKEN`` environment variable).
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 60.0,
        request_timeout_s: float = 600.0,
        max_connections: int = 256,
        backoff_s: float = 0.1,
        max_backoff_s: float = 2.0,
        token: str | None = None,
    ) -> None:
        parsed = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
        if parsed.scheme != "http" or not parsed.hostname:
            raise ValueError(f"vLLM server url must look like http://host:port, got {url!r}")
        if timeout_s <= 0 or request_timeout_s <= 0 or max_connections < 1:
            raise ValueError("timeout_s and request_timeout_s must be > 0 and max_connections >= 1")
        self.url = f"http://{parsed.hostname}:{parsed.port or 80}"
        self._host, self._port = parsed.hostname, parsed.port or 80
        self.timeout_s = timeout_s
        self.request_timeout_s = request_timeout_s
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self._token = token or os.environ.get(TOKEN_ENV) or None
        self._limiter = anyio.CapacityLimiter(max_connections)
        self._pool: queue.SimpleQueue[tuple[http.client.HTTPConnection, float]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._weights_instance: str | None = None  # the server instance holding our pushed weights
        self._closed = False
        self.server_info: dict[str, Any] = {}
        self.stats: dict[str, Any] = {"requests": 0, "retries": 0, "weight_updates": 0, "instances_seen": []}

    # ----------------------------------------------------------------- Generator protocol

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        """One request; the server's engine batches it with every other request in flight."""
        if self._closed:
            raise VLLMServerError(f"VLLMServerGenerator for {self.url} is closed")
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("prompt_ids is empty")
        body = json.dumps({"prompt_ids": prompt, "sampling": sampling.model_dump()}).encode()
        call = _Call()
        try:
            resp = await anyio.to_thread.run_sync(
                lambda: self._request("POST", "/generate", body, call=call), limiter=self._limiter, abandon_on_cancel=True
            )
        except anyio.get_cancelled_exc_class():
            call.cancel()  # closing the socket makes the server abort the request instead of finishing it
            raise
        data = resp.json()
        return Generation(token_ids=list(data["token_ids"]), logprobs=list(data["logprobs"]), finish_reason=data["finish_reason"])

    def update_weights(self, named_tensors: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> None:
        """Send the full model's weights (checkpoint names) as safetensors; blocks until applied.

        Tensors are cast to the server's dtype first (half the bytes for a bf16 server). Tied
        weights may be passed once or under both names. The server applies them between engine
        steps, re-packs a tied output layer and resets its prefix cache.
        """
        from safetensors.torch import save

        from agentrl.generators.vllm.common import normalize_named_tensors

        items = normalize_named_tensors(named_tensors)  # PEFT names unwrapped, LoRA factors dropped
        dtype = self._server_dtype()
        tensors: dict[str, Any] = {}
        seen: dict[tuple[int, tuple[int, ...]], str] = {}
        for name, tensor in items:
            t = tensor.detach()
            key = (t.data_ptr(), tuple(t.shape))
            if key in seen:  # a tied weight under its second name: the server re-ties it
                continue
            seen[key] = name
            tensors[name] = t.to(device="cpu", dtype=dtype or t.dtype).contiguous()  # a copy only where needed
        payload = save(tensors)
        limit = self.server_info.get("max_push_bytes")  # from the /health call that gave the dtype
        if isinstance(limit, int) and len(payload) > limit:
            raise ValueError(
                f"weight push of {len(payload)} bytes is over the limit of {limit} bytes of the vLLM server at "
                f"{self.url}; start it with a larger max_push_mb"
            )
        resp = self._request("POST", "/update_weights?transport=safetensors", payload, content_type="application/octet-stream", expect=False)
        data = resp.json()
        with self._lock:
            self._weights_instance = resp.instance
        self.stats["weight_updates"] += 1
        log.info("pushed %d tensors (%.1f MB) to %s: weights version %s", len(tensors), len(payload) / 1e6, self.url, data.get("weights_version"))

    def begin_rollout(self) -> None:
        """Nothing to prepare: the server keeps its engine and memory between rollouts."""

    def end_rollout(self) -> None:
        """Nothing to free here: the server's memory is on its own machine or process."""

    def load_weights(self, update: WeightUpdate) -> None:
        """New policy weights: full weights (LoRA merged) pushed to the server (``update_weights``)."""
        with update.full() as named:
            self.update_weights(named)

    def track_episodes(self, delta: int) -> None:
        """Nothing to do: the server's scheduler takes requests into its running batch as they come."""

    def run_rollouts(self, rollouts: Callable[[], T]) -> T:
        """Just ``rollouts()``: the compute is the server's, in another process."""
        return rollouts()

    async def close(self) -> None:
        """Close pooled connections; the server keeps running (it belongs to whoever started it)."""
        self._closed = True
        self._drop_pool()

    # ----------------------------------------------------------------- other endpoints

    def health(self) -> dict[str, Any]:
        """The server's ``/health``: instance id, model, dtype, weights version. Retries like any call."""
        info = self._request("GET", "/health", expect=False).json()
        self.server_info = info
        return info

    def wait_until_ready(self, timeout_s: float | None = None) -> dict[str, Any]:
        """Block until the server answers ``/health`` (an engine takes ~20-30 s to start on CPU)."""
        saved = self.timeout_s
        self.timeout_s = timeout_s or saved
        try:
            return self.health()
        finally:
            self.timeout_s = saved

    def reset_prefix_cache(self) -> None:
        self._request("POST", "/reset_prefix_cache", expect=False)

    # ----------------------------------------------------------------- transport

    def _server_dtype(self) -> Any:
        import torch

        name = self.health().get("dtype")  # asked each push: a restarted server may serve another dtype
        return getattr(torch, name, None) if isinstance(name, str) else None

    def _request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        content_type: str = "application/json",
        expect: bool = True,
        call: _Call | None = None,
    ) -> _Response:
        """Send one request, retrying connection failures with backoff until ``timeout_s``."""
        deadline = time.monotonic() + self.timeout_s
        delay = self.backoff_s
        attempt = 0
        while True:
            headers = {"Content-Type": content_type}
            if self._token:
                headers["Authorization"] = f"Bearer {self._token}"
            with self._lock:
                if expect and self._weights_instance is not None:
                    headers[EXPECT_HEADER] = self._weights_instance
            conn = self._connection()
            if call is not None and not call.attach(conn):
                raise VLLMServerError(f"request to {self.url} was cancelled")
            sent = False
            try:
                if conn.sock is None:  # connect with a short timeout, then wait up to request_timeout_s per answer
                    conn.timeout = min(self.timeout_s, 10.0)
                    conn.connect()
                    conn.sock.settimeout(self.request_timeout_s)
                    conn.timeout = self.request_timeout_s
                conn.request(method, path, body=body, headers=headers)
                sent = True
                raw = conn.getresponse()
                resp = _Response(raw.status, raw.read(), raw.getheader(INSTANCE_HEADER))
            except OSError as exc:  # includes ConnectionError, TimeoutError, http.client's RemoteDisconnected
                conn.close()
                self._drop_pool()  # one failed socket: the others were likely cut by the same event
                if call is not None and call.cancelled:
                    raise VLLMServerError(f"request to {self.url} was cancelled") from exc
                if isinstance(exc, TimeoutError) and sent:
                    raise VLLMServerError(
                        f"vLLM server at {self.url} did not answer {method} {path} within {self.request_timeout_s:g} s "
                        "(request_timeout_s); is it overloaded or stuck?"
                    ) from exc
                attempt += 1
                self.stats["retries"] += 1
                now = time.monotonic()
                if now >= deadline:
                    raise VLLMServerError(
                        f"cannot reach the vLLM server at {self.url} ({method} {path}): {type(exc).__name__}: {exc}; "
                        f"gave up after {attempt} attempt(s) in {self.timeout_s:g} s. Is `agentrl vllm-serve` running "
                        "there, and is the url right?"
                    ) from exc
                if attempt > 1 or not isinstance(exc, (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)):
                    time.sleep(min(delay, max(0.0, deadline - now)))  # a stale keep-alive socket retries at once
                    delay = min(delay * 2, self.max_backoff_s)
                continue
            except http.client.HTTPException as exc:  # garbled answer: not a server we can talk to
                conn.close()
                raise VLLMServerError(f"bad HTTP answer from {self.url} to {method} {path}: {type(exc).__name__}: {exc}") from exc
            if call is not None:
                call.detach()
            self._pool.put((conn, time.monotonic()))
            self.stats["requests"] += 1
            if resp.instance and resp.instance not in self.stats["instances_seen"]:
                self.stats["instances_seen"].append(resp.instance)
            return self._check(resp, method, path)

    def _check(self, resp: _Response, method: str, path: str) -> _Response:
        if resp.status == 200:
            return resp
        if resp.status == 409:
            raise ServerRestartedError(
                f"the vLLM server at {self.url} restarted (now instance {resp.instance}) and lost the weights this "
                "client pushed to its previous instance; it would generate with its startup weights. Call "
                "update_weights again before generating."
            )
        if resp.status == 401:
            raise VLLMServerError(
                f"the vLLM server at {self.url} refused {method} {path}: {resp.detail()}. Give the server's token "
                f"as token= or in the {TOKEN_ENV} environment variable"
            )
        if resp.status in (400, 404, 413, 422):
            raise ValueError(f"vLLM server at {self.url} rejected {method} {path}: {resp.detail()}")
        raise VLLMServerError(f"vLLM server at {self.url} failed {method} {path} (HTTP {resp.status}): {resp.detail()}")

    def _connection(self) -> http.client.HTTPConnection:
        """A pooled keep-alive connection used within ``IDLE_S``, else a new one (connected lazily)."""
        while True:
            try:
                conn, last_used = self._pool.get_nowait()
            except queue.Empty:
                return http.client.HTTPConnection(self._host, self._port, timeout=self.request_timeout_s)
            if time.monotonic() - last_used < IDLE_S:
                return conn
            conn.close()  # the server has probably dropped it: reusing it would fail, and cost a retry

    def _drop_pool(self) -> None:
        while True:
            try:
                self._pool.get_nowait()[0].close()
            except queue.Empty:
                return
