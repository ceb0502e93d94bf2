"""The bundled default model: weights, tokenizer and chat template shipped in the package."""
