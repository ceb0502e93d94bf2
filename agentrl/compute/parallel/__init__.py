"""How the policy is spread over processes: one strategy object per layout (single process, DDP, FSDP2), asked to wrap, gather, reduce and give checkpoint views."""
