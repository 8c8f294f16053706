"""The sampler's arithmetic in torch: the reference's CFG mix, Gumbel noise, confidences and the
mask-aware selection key. The sampler runs them, and the Triton kernels that replace them
(`cfg_scores`, `position_keys`) check themselves against them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gumbel(u: torch.Tensor) -> torch.Tensor:
    """The reference's `_gumbel_sample` noise from uniform draws `u`."""
    return -torch.log(-torch.log(u + 1e-10) + 1e-10)


def gumbel_(u: torch.Tensor) -> torch.Tensor:
    """`gumbel(u)` in place: the same operations in the same order (bit for bit), no temporaries."""
    return u.add_(1e-10).log_().neg_().add_(1e-10).log_().neg_()


def cfg_mix(cond: torch.Tensor, uncond: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The reference's CFG: log-softmax of `cond + scale * (cond - uncond)` (both log-probabilities)."""
    return F.log_softmax(cond + scale * (cond - uncond), dim=-1)


def best_unmasked(log_probs: torch.Tensor, mask_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Confidence and predicted id of each (row, codebook), MASK excluded (in place): the first
    maximum, as argmax picks it."""
    log_probs.select(-1, mask_id).fill_(-float("inf"))
    return log_probs.max(dim=-1)


def selection_key(confidence: torch.Tensor, noise: torch.Tensor, row_penalty: torch.Tensor, row_temp: torch.Tensor,
                  predicted: torch.Tensor, tokens: torch.Tensor, mask_id: int, vocab: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The (rows, C) key top-k ranks and each row's finiteness, in place on `confidence` and
    `predicted` (clamped into the vocabulary).

    The key is mask-aware: a still-masked position ranks above every revealed or padding one
    whatever its score (NaN and infinities become the float32 extremes), so no score, however
    poisoned, can pick a position that is not masked; a masked position whose score is not
    finite fails its row's item (knobs beyond float32).
    """
    finite_rows = torch.isfinite(confidence).all(dim=-1)
    scores = confidence.sub_(row_penalty).div_(row_temp).add_(noise)
    predicted.clamp_(0, vocab - 1)  # ids inside the vocabulary, whatever the scores
    revealed = tokens != mask_id  # (rows, C)
    finite_rows &= scores.masked_fill(revealed, 0.0).isfinite().all(dim=-1)
    big = torch.finfo(scores.dtype).max
    key = scores.nan_to_num_(nan=-big, posinf=big, neginf=-big).masked_fill_(revealed, -float("inf"))
    return key, finite_rows


def uniform(shape, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """float32 draws in [0, 1) from `generator`, as the reference makes them."""
    return torch.rand(shape, generator=generator, device=device, dtype=torch.float32)
