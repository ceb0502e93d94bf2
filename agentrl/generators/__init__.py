"""Generation backends behind one async protocol, and the factory that picks one from the config."""
from __future__ import annotations

from typing import Any

from agentrl.generators.config import SamplingConfig
from agentrl.generators.protocol import FinishReason, Generation, Generator, SamplingParams
from agentrl.generators.weights import WeightUpdate

__all__ = ["FinishReason", "Generation", "Generator", "SamplingConfig", "SamplingParams", "WeightUpdate", "build_generator", "run_with"]


def run_with(generator: Generator, fn: Any, *args: Any) -> Any:
    """``anyio.run(fn, *args)`` started through ``generator.run_rollouts``, which picks the thread
    that does the generator's compute meanwhile (the transformers backend on CPU: this one, with
    the event loop on a helper; ``TransformersGenerator.run_hosted``). Train and eval both start
    rollouts through here."""
    import anyio

    return generator.run_rollouts(lambda: anyio.run(fn, *args))


def build_generator(
    settings: Any,
    *,
    model_path: str,
    pad_token_id: int,
    max_context: int | None,
    model: Any = None,
    seed: int = 0,
    train_dtype: Any = None,
    training_alongside: bool = False,
    host_rollouts: bool | None = None,
) -> Generator:
    """The generator ``settings`` (a ``config.GeneratorConfig``) asks for; training and eval share it.

    ``model``: the loaded policy module, used in place by the transformers backend (so it sees
    every optimizer step without a copy); the vLLM backends load ``model_path`` themselves and get
    weights pushed through ``update_weights``. Backends are imported only when chosen, so vLLM
    stays optional. ``max_context``: the longest prompt plus completion the caller will send
    (None: the model's own limit). ``train_dtype``: the dtype the trainer computes in under
    autocast (e.g. ``torch.bfloat16``); the transformers backend on CUDA then decodes a full
    model from a copy in that dtype (``TransformersGenerator(weights_dtype=...)``).
    ``training_alongside``: a learner trains on another thread while this generator decodes
    (rollouts ahead; see ``TransformersGenerator``).
    ``host_rollouts``: serve the transformers backend's batches on the thread that runs the
    rollouts (None: on CPU only); the vLLM backends compute in their own engine and ignore it.
    """
    backend = settings.backend
    if backend == "transformers":
        from agentrl.generators.hf.generator import TransformersGenerator

        if model is None:
            raise ValueError("the transformers backend generates with a loaded model; pass model=")
        cuda = next(model.parameters()).device.type == "cuda"
        cuda_graphs = _use_cuda_graphs(settings.cuda_graphs, cuda, model)
        compile_decode = cuda_graphs and (settings.compile_decode is not False)
        copy = cuda and train_dtype is not None and not hasattr(model, "peft_config")
        return TransformersGenerator(
            model, pad_token_id=pad_token_id, max_batch_size=settings.max_batch_size,
            gather_window_s=settings.gather_window_s, static_cache=cuda_graphs,
            compile_decode=compile_decode, weights_dtype=train_dtype if copy else None, host_rollouts=host_rollouts,
            training_alongside=training_alongside, continuous=settings.continuous_batching,
            sample_in_step=settings.sample_in_step,
        )
    if backend == "vllm":
        import torch

        from agentrl.compute.models import resolve_model
        from agentrl.generators.vllm.colocated import VLLMGenerator

        dtype = settings.dtype
        if dtype == "auto":  # what the trainer computes logprobs in on this device
            dtype = "bfloat16" if torch.cuda.is_available() else "float32"
        path = resolve_model(model_path)
        max_model_len = settings.max_model_len
        if max_model_len is None and max_context is not None:  # no longer than the model allows
            from transformers import AutoConfig

            limit = getattr(AutoConfig.from_pretrained(path), "max_position_embeddings", None)
            max_model_len = min(max_context, limit) if limit else max_context
        return VLLMGenerator.from_pretrained(
            path,
            dtype=dtype,
            max_model_len=max_model_len,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            enable_sleep_mode=settings.enable_sleep_mode,
            enforce_eager=settings.enforce_eager,
            seed=seed,
            max_context=max_context,
        )
    if backend == "vllm-server":
        from agentrl.generators.vllm.client import VLLMServerGenerator

        return VLLMServerGenerator(settings.url, timeout_s=settings.timeout_s, request_timeout_s=settings.request_timeout_s)
    raise ValueError(f"unknown generator backend {backend!r}; known: transformers, vllm, vllm-server")


def _use_cuda_graphs(asked: bool | None, cuda: bool, model: Any) -> bool:
    """CUDA-graph decoding: on by default on CUDA, off on CPU; an unsupported model falls back to
    eager decoding with one line naming why (an explicit ``cuda_graphs=true`` fails instead). An
    explicit ``true`` without CUDA decodes eagerly too, and says so (a config shared by a GPU and a
    CPU machine stays valid on both; before, the setting was dropped without a word)."""
    if not cuda or asked is False:
        if asked and not cuda:
            print("generator: cuda_graphs=true has no effect without CUDA; decoding eagerly", flush=True)
        return False
    from agentrl.generators.hf.static_decode import StaticDecoder

    reason = StaticDecoder.unsupported_reason(model)
    if reason is None:
        return True
    if asked:
        raise ValueError(f"generator.cuda_graphs=true: {reason}")
    print(f"generator: decoding without CUDA graphs: {reason}", flush=True)
    return False
