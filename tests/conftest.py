"""Fixtures shared by test modules; a module's own fixture of the same name takes precedence."""

from __future__ import annotations

import pytest
import torch

from agentrl.chat import get_chat_format
from agentrl.compute.models import load_model, load_tokenizer


@pytest.fixture(scope="module")
def model():
    """The bundled model (offline, 3.3M parameters), float32 on the CPU."""
    torch.manual_seed(0)
    return load_model("default", dtype=torch.float32, device="cpu")


@pytest.fixture(scope="module")
def fmt():
    """The bundled model's chat format."""
    return get_chat_format(load_tokenizer("default"))
