"""L2 prefetch for small steps: how requests cover a buffer, and where it turns itself off."""

from __future__ import annotations

import pytest
import torch

from server.engine.l2_prefetch import CHUNK_BYTES, L2Prefetcher, chunks_of


@pytest.mark.parametrize("nbytes", [1, 15, 16, 17, CHUNK_BYTES - 1, CHUNK_BYTES, CHUNK_BYTES + 1,
                                    8 * 1024 * 1024, 4096 * 1024 * 2 + 48])
def test_requests_cover_the_buffer_in_multiples_of_16(nbytes):
    count, tail = chunks_of(nbytes)
    assert count >= 1 and 0 < tail <= CHUNK_BYTES and tail % 16 == 0
    covered = (count - 1) * CHUNK_BYTES + tail
    assert nbytes <= covered < nbytes + 16  # the whole buffer, and at most its 16-byte rounding
    assert (count - 1) * CHUNK_BYTES < nbytes  # no request wholly past the end


def test_nothing_to_request_for_an_empty_buffer():
    assert chunks_of(0) == (0, 0)


def test_prefetch_turns_itself_off_without_a_hopper_gpu_and_refuses_unknown_modes():
    for mode in ("off", "same", "side"):
        prefetcher = L2Prefetcher(torch.device("cpu"), mode, 4096)
        assert prefetcher.mode == "off" and not prefetcher.active(128)
    with pytest.raises(ValueError, match="off, same or side"):
        L2Prefetcher(torch.device("cpu"), "sideways", 4096)
