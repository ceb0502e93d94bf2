"""``agentrl vllm-serve`` access control without vLLM: the bearer token, body limits, the refusal
to bind off loopback without a token, and the client sending the token (issue 17, item 11).

The guard is plain ASGI and is driven here directly; the FastAPI app (``create_app``) is driven
the same way, without its lifespan (which starts vLLM), where FastAPI is installed.
"""

from __future__ import annotations

import asyncio
import glob
import http.server
import json
import shutil
import threading
from typing import Any

import pytest

from agentrl.generators.vllm.client import VLLMServerError, VLLMServerGenerator
from agentrl.generators.vllm.http_guard import TOKEN_ENV, RequestGuard, is_loopback
from agentrl.generators.vllm.serve import ServeConfig, main


class Echo:
    """An ASGI app that reads the whole body and answers with its size."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, scope, receive, send):
        self.calls += 1
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            size += len(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = json.dumps({"size": size}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})


def request(app: Any, method: str, path: str, *, token: str | None = None, chunks: tuple[bytes, ...] = (), declare: bool = True,
            query: str = "") -> tuple[int, Any, int]:
    """(status, JSON body, how many times the app's receive was called) of one request."""
    pending = list(chunks)
    reads = 0
    sent: list[dict] = []

    async def receive() -> dict:
        nonlocal reads
        reads += 1
        if pending:
            chunk = pending.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(pending)}
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    headers = [(b"host", b"127.0.0.1")]
    if token is not None:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    if declare:
        headers.append((b"content-length", str(sum(map(len, chunks))).encode()))
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": query.encode(), "root_path": "", "headers": headers,
             "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 50000)}
    asyncio.run(app(scope, receive, send))
    starts = [m for m in sent if m["type"] == "http.response.start"]
    assert len(starts) == 1, sent  # exactly one response, never the app's after the guard's
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return starts[0]["status"], json.loads(body or b"null"), reads


def guard(token: str | None = "s3cret", limit: int = 100) -> tuple[RequestGuard, Echo]:
    echo = Echo()
    return RequestGuard(echo, token, lambda path: limit), echo


def test_the_token_is_required_except_for_health():
    app, echo = guard()
    assert request(app, "POST", "/generate")[0] == 401
    status, body, _ = request(app, "POST", "/update_weights", token="wrong")
    assert status == 401 and "wrong" in body["detail"]
    assert request(app, "POST", "/reset_prefix_cache", token="s3cret\n")[0] == 401
    assert echo.calls == 0  # the application never saw them
    assert request(app, "POST", "/generate", token="s3cret", chunks=(b"{}",))[:2] == (200, {"size": 2})
    assert request(app, "GET", "/health")[0] == 200
    assert request(app, "POST", "/health")[0] == 401  # only GET is open
    open_app, _ = guard(token=None)
    assert request(open_app, "POST", "/update_weights", chunks=(b"x",))[0] == 200  # no token set: open (loopback only)


def test_a_declared_oversized_body_is_refused_unread():
    app, echo = guard(limit=100)
    status, body, reads = request(app, "POST", "/update_weights", token="s3cret", chunks=(b"x" * 101,))
    assert status == 413 and "101 bytes > the limit of 100" in body["detail"]
    assert reads == 0 and echo.calls == 0  # not a byte of the body was read
    assert request(app, "POST", "/update_weights", token="s3cret", chunks=(b"x" * 100,))[:2] == (200, {"size": 100})


def test_a_streamed_oversized_body_is_cut_at_the_limit():
    app, echo = guard(limit=100)
    chunks = tuple(b"y" * 40 for _ in range(1000))  # 40 kB, no Content-Length (chunked upload)
    status, body, reads = request(app, "POST", "/update_weights", token="s3cret", chunks=chunks, declare=False)
    assert status == 413 and "more bytes > the limit of 100" in body["detail"]
    assert reads == 3  # 120 bytes read, then cut off; the app's own answer was dropped


def test_loopback_hosts():
    assert all(map(is_loopback, ["127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.2"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "10.0.0.5", "example.com", ""]))


def test_binding_off_loopback_without_a_token_is_refused(monkeypatch, capsys):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert main(["model=default", "host=0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "host=0.0.0.0" in err and TOKEN_ENV in err and "Traceback" not in err
    assert ServeConfig(token="t").resolved_token() == "t"
    monkeypatch.setenv(TOKEN_ENV, "from-env")
    assert ServeConfig().resolved_token() == "from-env"
    try:
        import vllm  # noqa: F401
    except ImportError:  # past the token check, it stops at the missing vLLM (never starts a server here)
        assert main(["model=default", "host=0.0.0.0"]) == 2
        err = capsys.readouterr().err
        assert "host=0.0.0.0" not in err and "vllm" in err.lower()


# -- the FastAPI app itself --------------------------------------------------------------------


@pytest.fixture()
def served():
    pytest.importorskip("fastapi")
    from agentrl.generators.vllm.serve import create_app

    before = set(glob.glob("/dev/shm/agentrl-weights-*") + glob.glob("/tmp/agentrl-weights-*"))
    yield lambda **kw: create_app(ServeConfig(model="default", **kw))
    for d in set(glob.glob("/dev/shm/agentrl-weights-*") + glob.glob("/tmp/agentrl-weights-*")) - before:
        shutil.rmtree(d, ignore_errors=True)  # the scratch folder the (never started) lifespan would remove


def test_the_app_checks_token_and_size_before_its_endpoints(served):
    app = served(token="s3cret", max_body_mb=0.001)
    assert request(app, "POST", "/generate", chunks=(b"{}",))[0] == 401
    assert request(app, "POST", "/update_weights", token="nope", chunks=(b"x",))[0] == 401
    assert request(app, "GET", "/health")[0] == 503  # open, and past the guard: no engine runs here
    status, body, reads = request(app, "POST", "/generate", token="s3cret", chunks=(b"[" * 2000,))
    assert status == 413 and reads == 0
    status, body, _ = request(app, "POST", "/update_weights", token="s3cret", chunks=(b"garbage", b"more"), declare=False)
    assert status == 400 and "not a safetensors file" in body["detail"]  # streamed to the scratch file and checked


def test_the_push_limit_defaults_to_the_model_in_float32(served):
    app = served(token="s3cret")
    status, body, reads = request(app, "POST", "/update_weights", token="s3cret", chunks=(b"x" * 8 * 2**20,), declare=True)
    assert status == 400  # 8 MB of garbage is within the limit of the bundled model (4 bytes/param + 64 MB)
    app = served(token="s3cret", max_push_mb=1)
    status, body, reads = request(app, "POST", "/update_weights", token="s3cret", chunks=(b"x" * (2**20 + 1),))
    assert status == 413 and reads == 0


# -- the client --------------------------------------------------------------------------------


class Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[str | None] = []

    def do_GET(self):  # noqa: N802
        Recorder.seen.append(self.headers.get("Authorization"))
        ok = self.headers.get("Authorization") == "Bearer s3cret"
        body = json.dumps({"status": "ok"} if ok else {"detail": "a bearer token is required"}).encode()
        self.send_response(200 if ok else 401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_the_client_sends_the_token(monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        Recorder.seen.clear()
        monkeypatch.delenv(TOKEN_ENV, raising=False)
        assert VLLMServerGenerator(url, token="s3cret").health() == {"status": "ok"}
        monkeypatch.setenv(TOKEN_ENV, "s3cret")
        assert VLLMServerGenerator(url).health() == {"status": "ok"}
        monkeypatch.delenv(TOKEN_ENV)
        with pytest.raises(VLLMServerError, match=f"token is required.*{TOKEN_ENV}"):
            VLLMServerGenerator(url).health()
        assert Recorder.seen == ["Bearer s3cret", "Bearer s3cret", None]
    finally:
        server.shutdown()
        server.server_close()
