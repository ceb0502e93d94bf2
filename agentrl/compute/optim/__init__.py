"""Optimizers beyond torch's: 8-bit AdamW moments and CPU-offloaded AdamW state."""
