"""The transformers generation backend: one request per call, batched by its own decode loops (static, dynamic, continuous)."""
