"""benchmarks/profile_train.py's kernel total counts kernels once: a labelled range that the
profiler mirrors on the device's timeline (a user annotation) is not a kernel (it once nearly doubled
the printed total on an H200)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.autograd.profiler_util import EventList, FunctionEvent

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import profile_train


def _events(*specs: tuple[str, int, int, bool]) -> EventList:
    cuda = torch.autograd.DeviceType.CUDA
    events = [FunctionEvent(i, name, 0, start, end, device_type=cuda, use_device="cuda", stack=[],
                            is_user_annotation=annotation)
              for i, (name, start, end, annotation) in enumerate(specs)]
    listed = EventList(events, use_device="cuda")
    listed._build_tree()
    return listed


def test_kernel_seconds_leaves_out_the_labelled_ranges_on_the_device():
    events = _events(("agentrl:forward", 0, 1000, True), ("gemm", 10, 410, False),
                     ("gemm", 500, 700, False), ("silu", 700, 900, False))
    averages = events.key_averages()
    assert profile_train.kernel_seconds(averages) == 800 / 1e6
    assert profile_train.kernel_seconds(events) == 800 / 1e6


def test_kernel_seconds_counts_no_host_event():
    host = FunctionEvent(0, "aten::mm", 0, 0, 5000, stack=[])
    assert profile_train.kernel_seconds([host]) == 0
