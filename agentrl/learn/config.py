"""The learner's config: micro-batching, log-prob computation, gradient clipping and the reference mix."""

from __future__ import annotations

from agentrl.core.strict import Strict


class LearnerConfig(Strict):
    """The knobs of the learning side; ``agentrl train`` fills them from its top-level keys (agentrl/train/build.py)."""

    micro_batch_size: int
    num_iterations: int
    steps_per_generation: int
    temperature: float
    logprob_chunk_size: int
    max_grad_norm: float | None
    mask_truncated_completions: bool
    ref_mix_alpha: float | None
    ref_mix_every: int
    max_completion_tokens: int | None = None  # the constant of dr_grpo's constant-length sum
    # the training-phase fast path (docs/performance.md, "Training phase"); off = the earlier path,
    # kept so benchmarks/learner_phase.py can time both and the tests can compare them
    logprob_head: str = "fused"  # "fused" linear + log-softmax autograd function, or "checkpoint" (chunked head module)
    sort_by_length: bool = True  # micro-batches of rows of similar length: less padding in each
    score_sampled_only: bool = True  # the output head only at sampled tokens (not tool results or padding)
    autocast_cache: bool = False  # keep autocast's bf16 weight copies for the whole forward (torch's default)
    # packed micro-batches (agentrl/learn/packing.py): no padding between sequences, each shared prompt
    # computed once; models that cannot be packed exactly fall back to micro_batch_size rows (one line says why)
    pack_sequences: bool = True
    share_prompt: bool = True  # with pack_sequences: the rows that share a prompt run it once
    micro_batch_tokens: int = 4096  # with pack_sequences: the most tokens one forward computes (a longer sequence runs alone)
