"""The vLLM generation backends: in-process (colocated) and server (client + the agentrl vllm-serve app)."""
