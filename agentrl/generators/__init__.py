"""Generation backends behind one async protocol."""
from agentrl.generators.base import FinishReason, Generation, Generator, SamplingParams

__all__ = ["FinishReason", "Generation", "Generator", "SamplingParams"]
