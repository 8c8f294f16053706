"""The reference `generate()`'s token canvases, captured just before it decodes them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def captured_tokens(model) -> Iterator[list]:
    """Within the block, every `_decode_and_post_process` call's tokens (a (C, T) tensor,
    or a list of chunk tensors for long text) are appended to the yielded list."""
    captured: list = []
    original = model._decode_and_post_process

    def capture(tokens, rms, gen_config):
        captured.append(tokens)
        return original(tokens, rms, gen_config)

    model._decode_and_post_process = capture
    try:
        yield captured
    finally:
        del model._decode_and_post_process
