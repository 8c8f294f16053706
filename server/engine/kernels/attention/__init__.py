"""Attention within each document of a packed row: one selector, torch, FlashInfer and Triton
backends."""
