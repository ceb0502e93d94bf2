"""``agentrl vllm-serve``: a vLLM engine behind a small HTTP API made for RL training.

Why not vLLM's OpenAI server: the trainer speaks token ids, not text. It needs the sampled ids
exactly as sampled, each one's logprob under the distribution it was drawn from (after
temperature; importance-sampling correction compares it with the trainer's), the finish reason,
and a way to load new weights after every optimizer step. One request per episode turn; vLLM's
continuous batching batches whatever is in flight.

Endpoints (JSON unless noted; every response carries ``X-Agentrl-Instance``, an id fresh at each
start, so a client can tell a restarted server from the one it pushed weights to):

* ``GET /health``: ``status``, ``instance``, ``model``, ``dtype``, ``max_model_len``,
  ``vocab_size``, ``weights_version``, ``weight_transports``, ``running`` (requests in flight),
  ``aborted`` (requests stopped because their client went away, since the start),
  ``max_push_bytes``. The only endpoint that needs no token.
* ``POST /generate`` ``{"prompt_ids": [...], "sampling": {temperature, top_p, top_k, min_p,
  max_tokens, stop_token_ids, seed}}`` → ``{"token_ids", "logprobs", "finish_reason",
  "weights_version"}``. A request carrying ``X-Agentrl-Expect-Instance`` that names another
  instance gets 409 (its weights were pushed to a server that has since restarted).
* ``POST /update_weights?transport=safetensors``, body = a safetensors file of the full model
  under its checkpoint (HF) names. Waits for running requests to finish and holds new ones,
  loads the tensors in place (vLLM's layer-wise ``reload_weights`` in the worker), re-packs a
  tied output layer, resets the prefix cache, bumps ``weights_version``.
* ``POST /reset_prefix_cache``.

Access (``http_guard.RequestGuard``, in front of everything): with a token (``token=`` or the
``AGENTRL_VLLM_TOKEN`` environment variable) every other endpoint needs ``Authorization: Bearer
<token>`` (401 otherwise); binding anything but a loopback address without a token is refused at
start. Bodies over ``max_body_mb`` (``max_push_mb`` for ``/update_weights``) get 413 before they
are read, and a push streams to a scratch file rather than into memory.

On GPU the weights should not go through HTTP: ``transport`` is the extension point for an NCCL
path (vLLM's weight-transfer engine: an NCCL group between trainer and workers, the trainer
broadcasting each tensor). It is not implemented here (no vLLM on our GPU machines to test it);
see docs/vllm_server.md.

Run: ``agentrl vllm-serve model=<folder|default> port=8000 dtype=float32``.
"""

# No `from __future__ import annotations`: FastAPI reads the endpoint annotations at runtime, and
# the request types are defined inside create_app (fastapi exists only where vLLM is installed).
import asyncio
import contextlib
import math
import os
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from agentrl.core.overrides import build, parse_overrides
from agentrl.core.strict import Strict
from agentrl.generators.vllm.http_guard import TOKEN_ENV, RequestGuard, is_loopback

__all__ = ["ServeConfig", "WeightReloadExtension", "create_app", "main"]

INSTANCE_HEADER = "X-Agentrl-Instance"
EXPECT_HEADER = "X-Agentrl-Expect-Instance"
TRANSPORTS = ("safetensors",)

USAGE = f"""usage: agentrl vllm-serve model=<folder|default> [host=127.0.0.1] [port=8000] [dtype=auto]
       [max_model_len=N] [max_num_seqs=256] [gpu_memory_utilization=0.9] [enforce_eager=auto]
       [seed=0] [log_level=warning] [token=SECRET] [max_body_mb=16] [max_push_mb=auto]
A token (token= or {TOKEN_ENV}, which keeps it out of the process list) is required for any host
other than a loopback address."""


class ServeConfig(Strict):
    model: str = Field("default", description="'default' (bundled), or a local model folder")
    host: str = Field("127.0.0.1", description="0.0.0.0 to accept trainers on other machines")
    port: int = Field(8000, ge=1, le=65535, description="TCP port to listen on")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field("auto", description="auto: float32 on CPU, bfloat16 on CUDA")
    max_model_len: int | None = Field(None, ge=16, description="longest prompt + completion in tokens (None: the model's own limit)")
    max_num_seqs: int = Field(256, ge=1, description="sequences the engine batches at once")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="GPU only")
    enforce_eager: bool | None = Field(None, description="None: eager on CPU (compiling costs ~30 s, gains little), CUDA graphs on GPU")
    seed: int = Field(0, description="the engine's random seed")
    log_level: Literal["debug", "info", "warning", "error"] = Field("warning", description="the HTTP server's log level")
    token: str | None = Field(None, min_length=1, description=f"bearer token clients must send (default: ${TOKEN_ENV}); required off loopback")
    max_body_mb: float = Field(16.0, gt=0, description="largest request body of the JSON endpoints")
    max_push_mb: float | None = Field(None, gt=0, description="largest /update_weights body; None: 4 bytes per model parameter + 64 MB")

    def resolved_token(self) -> str | None:
        return self.token or os.environ.get(TOKEN_ENV) or None


class WeightReloadExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``); runs in the engine's worker process.

    Tensors cannot travel as rpc arguments to the engine process, so the server writes them to a
    file and the worker reads it back (on tmpfs where available: no disk round-trip). With tied
    embeddings the CPU backend's packed copy of the output layer must be re-derived, or the logits
    keep coming from the old embedding (measured: logprobs off by up to 0.7 without it).
    """

    def agentrl_reload_file(self, path: str) -> int:
        from safetensors.torch import load_file

        tensors = load_file(path)
        self.reload_weights(weights_iterator=iter(tensors.items()), is_checkpoint_format=True)  # type: ignore[attr-defined]
        from agentrl.generators.vllm.common import repack_tied_head

        repack_tied_head(self)
        return len(tensors)


class _InstanceStamp:
    """ASGI middleware: put this server's instance id on every response, and answer 409 to a request
    whose weights were pushed to another instance (this server restarted since).

    Plain ASGI rather than ``@app.middleware``: Starlette's BaseHTTPMiddleware hides the client's
    disconnect from the endpoint, and the server must notice it to abort the request.
    """

    def __init__(self, app: Any, instance: str) -> None:
        self.app, self.instance = app, instance
        self._stamp = (INSTANCE_HEADER.lower().encode(), instance.encode())

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        expected = dict(scope["headers"]).get(EXPECT_HEADER.lower().encode())
        if expected is not None and expected.decode() != self.instance:
            from starlette.responses import JSONResponse

            detail = f"weights were pushed to server instance {expected.decode()}; this is instance {self.instance} (restarted)"
            await JSONResponse({"detail": detail}, status_code=409, headers={INSTANCE_HEADER: self.instance})(scope, receive, send)
            return

        async def stamped(message: dict) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), self._stamp]
            await send(message)

        await self.app(scope, receive, stamped)


class _Gate:
    """Many generate requests at once, or one weight update alone (which waits for them to end)."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._active = 0
        self._writing = False

    @property
    def running(self) -> int:
        return self._active

    @contextlib.asynccontextmanager
    async def read(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._writing)
            self._active += 1
        try:
            yield
        finally:
            async with self._cond:
                self._active -= 1
                self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def write(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._writing)
            self._writing = True
            await self._cond.wait_for(lambda: self._active == 0)
        try:
            yield
        finally:
            async with self._cond:
                self._writing = False
                self._cond.notify_all()


def _safetensors_file_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Names and shapes from a safetensors file's header, checking that the data it declares is there.

    Reads only the 8-byte length and the JSON header (a push can be gigabytes); ValueError if malformed.
    """
    import json
    import struct

    total = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise ValueError(f"{total} bytes")
        (size,) = struct.unpack("<Q", prefix)
        if size > total - 8:
            raise ValueError(f"header of {size} bytes in a body of {total}")
        raw = f.read(size)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"unreadable header ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    header.pop("__metadata__", None)
    shapes, end = {}, 0
    for name, entry in header.items():
        try:
            shapes[name] = tuple(int(d) for d in entry["shape"])
            end = max(end, int(entry["data_offsets"][1]))
        except (KeyError, TypeError, ValueError, IndexError):
            raise ValueError(f"bad header entry for {name!r}") from None
    if 8 + size + end != total:
        raise ValueError(f"header declares {end} data bytes, body holds {total - 8 - size}")
    return shapes


def push_limit(cfg: ServeConfig, expected: dict[str, tuple[int, ...]]) -> int:
    """Most bytes a weight push may carry: ``max_push_mb``, else room for the model in float32."""
    if cfg.max_push_mb is not None:
        return int(cfg.max_push_mb * 2**20)
    if not expected:  # not a local folder: the size is unknown until the engine loads it
        return 64 * 2**30
    params = sum(math.prod(shape) for shape in expected.values())
    return 4 * params + 64 * 2**20 + 1000 * len(expected)  # float32 data + header room


def create_app(cfg: ServeConfig) -> Any:
    """The FastAPI app; the engine starts in its lifespan, before the port accepts connections."""
    from fastapi import FastAPI, HTTPException, Request
    from pydantic import BaseModel
    from starlette.requests import ClientDisconnect

    from agentrl.compute.models import resolve_model
    from agentrl.generators.protocol import SamplingParams

    model_path = resolve_model(cfg.model)
    from agentrl.generators.vllm.common import checkpoint_shapes, shape_problems

    expected_shapes = checkpoint_shapes(model_path) or {}
    max_push = push_limit(cfg, expected_shapes)
    max_body = int(cfg.max_body_mb * 2**20)
    instance = uuid.uuid4().hex[:12]
    state: dict[str, Any] = {"weights_version": 0, "engine": None, "aborted": 0}
    gate = _Gate()
    scratch = Path(tempfile.mkdtemp(prefix="agentrl-weights-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))

    class GenerateBody(BaseModel):
        prompt_ids: list[int]
        sampling: dict[str, Any] = {}  # SamplingParams fields: the server follows the protocol's dataclass

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        import torch
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from agentrl.generators.vllm.common import engine_kwargs

        cuda = torch.cuda.is_available()
        dtype = cfg.dtype if cfg.dtype != "auto" else ("bfloat16" if cuda else "float32")  # what a trainer computes in
        args = AsyncEngineArgs(
            model=model_path,
            worker_extension_cls=f"{__name__}.WeightReloadExtension",
            **engine_kwargs(
                dtype=dtype, max_model_len=cfg.max_model_len, gpu_memory_utilization=cfg.gpu_memory_utilization,
                seed=cfg.seed, max_num_seqs=cfg.max_num_seqs,
                enforce_eager=(not cuda) if cfg.enforce_eager is None else cfg.enforce_eager,
            ),
        )
        engine = AsyncLLM.from_engine_args(args)
        mc = engine.model_config
        state.update(
            engine=engine,
            max_model_len=mc.max_model_len,
            vocab_size=mc.get_vocab_size(),
            dtype=str(mc.dtype).removeprefix("torch."),
            tied=bool(getattr(mc.hf_config, "tie_word_embeddings", False)),
            expected=expected_shapes,
        )
        print(f"agentrl vllm-serve: {model_path} ready on http://{cfg.host}:{cfg.port} (instance {instance})", flush=True)
        try:
            yield
        finally:
            engine.shutdown()
            for f in scratch.glob("*"):
                f.unlink(missing_ok=True)
            scratch.rmdir()

    app = FastAPI(title="agentrl vllm-serve", lifespan=lifespan)

    app.add_middleware(_InstanceStamp, instance=instance)
    # added last, so outermost: nothing runs and no body byte is read before the token and size checks
    app.add_middleware(RequestGuard, token=cfg.resolved_token(), limit_for=lambda path: max_push if path == "/update_weights" else max_body)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        engine = state["engine"]
        if engine is None or engine.errored:
            raise HTTPException(503, "engine is not running")
        return {
            "status": "ok", "instance": instance, "model": model_path, "dtype": state["dtype"],
            "max_model_len": state["max_model_len"], "vocab_size": state["vocab_size"],
            "weights_version": state["weights_version"], "weight_transports": list(TRANSPORTS), "running": gate.running,
            "aborted": state["aborted"],
            "max_push_bytes": max_push,
        }

    @app.post("/generate")
    async def generate(body: GenerateBody, request: Request) -> dict[str, Any]:
        try:
            sampling = SamplingParams(**body.sampling)
        except (TypeError, ValueError) as exc:
            raise HTTPException(400, f"bad sampling settings: {exc}") from None
        prompt = body.prompt_ids
        if not prompt:
            raise HTTPException(400, "prompt_ids is empty")
        bad = [t for t in prompt if not 0 <= t < state["vocab_size"]]
        if bad:
            raise HTTPException(400, f"prompt token ids out of range [0, {state['vocab_size']}): {bad[:10]}")
        room = state["max_model_len"] - len(prompt)
        if room < 1:
            raise HTTPException(400, f"prompt has {len(prompt)} tokens; max_model_len={state['max_model_len']} leaves no room")
        from vllm.inputs import TokensPrompt

        from agentrl.generators.vllm.common import to_generation, to_vllm_sampling

        params = to_vllm_sampling(sampling, max_tokens=min(sampling.max_tokens, room))
        async with gate.read():
            version = state["weights_version"]
            final = await _until_disconnected(
                request, _last(state["engine"].generate(TokensPrompt(prompt_token_ids=prompt), params, uuid.uuid4().hex))
            )
            if final is None:  # counted before the gate lets go, so /health never shows it neither running nor aborted
                state["aborted"] += 1
        if final is None:
            raise HTTPException(499, "client disconnected")
        gen = to_generation(final)
        return {"token_ids": gen.token_ids, "logprobs": gen.logprobs, "finish_reason": gen.finish_reason, "weights_version": version}

    @app.post("/update_weights")
    async def update_weights(request: Request, transport: str = "safetensors") -> dict[str, Any]:
        if transport not in TRANSPORTS:
            raise HTTPException(
                400, f"weight transport {transport!r} is not available; this server implements {list(TRANSPORTS)} "
                "(NCCL is not implemented yet, see docs/vllm_server.md)",
            )
        path = scratch / f"push-{uuid.uuid4().hex}.safetensors"
        try:
            try:
                with open(path, "wb") as f:  # straight to the scratch file: a push can be gigabytes
                    async for chunk in request.stream():
                        f.write(chunk)
            except ClientDisconnect:  # gone, or cut off by the size limit (which has answered 413)
                raise HTTPException(499, "client disconnected during the push") from None
            try:
                shapes = _safetensors_file_shapes(path)
            except ValueError as exc:
                raise HTTPException(400, f"body is not a safetensors file: {exc}") from None
            problem = shape_problems(shapes, expected_shapes, state.get("tied", False), full=True)
            if problem:
                raise HTTPException(400, f"weights do not match the served model {model_path}: {problem}")
            start = time.perf_counter()
            async with gate.write():
                await state["engine"].collective_rpc("agentrl_reload_file", args=(str(path),))
                await state["engine"].reset_prefix_cache()
                state["weights_version"] += 1
        finally:
            path.unlink(missing_ok=True)
        return {"weights_version": state["weights_version"], "tensors": len(shapes), "seconds": time.perf_counter() - start}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> dict[str, Any]:
        return {"reset": bool(await state["engine"].reset_prefix_cache())}

    return app


async def _last(outputs: AsyncIterator[Any]) -> Any:
    final = None
    async for out in outputs:
        final = out
    return final


async def _until_disconnected(request: Any, work: Any) -> Any:
    """Run ``work``; if the client goes away first, cancel it (vLLM aborts the request) and return None."""
    task = asyncio.ensure_future(work)
    while True:
        done, _ = await asyncio.wait({task}, timeout=0.25)
        if done:
            return task.result()
        if await request.is_disconnected():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return None


def main(args: list[str]) -> int:
    if any(a in ("-h", "--help", "help") for a in args):
        print(USAGE)
        return 0
    cfg = build(ServeConfig, parse_overrides(args, shortcuts={}))
    from agentrl.compute.models import resolve_model

    path = resolve_model(cfg.model)
    if not os.path.isdir(path) and (path.startswith((".", "/", "~")) or path.count("/") != 1):  # not a hub id either
        raise FileNotFoundError(f"model folder {path} does not exist")
    if not is_loopback(cfg.host) and not cfg.resolved_token():
        print(
            f"agentrl vllm-serve: host={cfg.host} accepts connections from other machines, and anyone who reaches "
            f"the port could replace the model's weights; set a token (token=... or {TOKEN_ENV}; clients send it "
            "from the same variable) or bind host=127.0.0.1",
            file=sys.stderr,
        )
        return 2
    from agentrl.generators.vllm.common import VLLMNotInstalledError, cpu_env_defaults, require_vllm

    try:
        require_vllm()
    except VLLMNotInstalledError as exc:
        print(f"agentrl vllm-serve: {exc}", file=sys.stderr)
        return 2
    import uvicorn

    cpu_env_defaults()
    uvicorn.run(create_app(cfg), host=cfg.host, port=cfg.port, log_level=cfg.log_level)
    return 0
