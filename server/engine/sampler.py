"""One unmasking step for every item of a packed step: the reference's scoring, batched.

Per item this is `_predict_tokens_with_scoring` + the selection loop of
`_generate_iterative`: CFG log-softmax mix (or the conditional alone at guidance 0),
MASK excluded, greedy or top-10% Gumbel class sampling, confidence minus the codebook
layer penalty, Gumbel position noise, top-k over still-masked positions with k from the
item's own schedule.

All of it runs once for every row of the step: the per-item parts (guidance, penalty,
temperature, k) become per-row values, and the top-k runs over a padded (items, C x Tmax)
score table. Only random draws stay per item, from each item's own generator, so a
seeded request's tokens do not depend on its neighbours.

No score can make the shared step index out of range or touch a neighbour: selection ranks
on a mask-aware key (a still-masked position above every revealed or padding one, NaN and
infinities mapped to the float32 extremes), picks are written through a padded table, and
token ids are clamped to the vocabulary. A masked position with a non-finite score (e.g.
knobs beyond float32: a layer penalty that overflows, a denormal position temperature)
fails its own item through the finiteness flags; the other items step on unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from server.engine.canvas import PackedCanvas, host_to_device, same_items
from server.engine.request import Utterance
from server.engine.upstream_names import filter_top_k


def _gumbel(u: torch.Tensor) -> torch.Tensor:
    """The reference's `_gumbel_sample` noise from uniform draws `u`."""
    return -torch.log(-torch.log(u + 1e-10) + 1e-10)


def _uniform(shape, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    return torch.rand(shape, generator=generator, device=device, dtype=torch.float32)


@dataclass
class _StepLayout:
    """Host-built index arrays of one batch composition (copied to the device once; a
    steady batch, the same items step after step, reuses them)."""

    items: list  # the CanvasItems these were built for, compared by identity
    row_item: torch.Tensor  # (rows,) item of each conditional target row
    row_pos: torch.Tensor  # (rows,) position of the row within its item's target
    row_penalty: torch.Tensor  # (rows, 1) layer penalty factor
    row_temp: torch.Tensor  # (rows, 1) position temperature (1 where none: x / 1 == x)
    t_max: int
    cfg_rows: torch.Tensor | None  # conditional rows of the items doing CFG
    cfg_scale: torch.Tensor | None  # (cfg rows, 1, 1) their guidance scales


class Sampler:
    def __init__(self, mask_id: int, num_codebooks: int, device: torch.device):
        self.mask_id = mask_id
        self.device = device
        self.num_codebooks = num_codebooks
        self.layer_ids = torch.arange(num_codebooks, device=device, dtype=torch.float32)
        self._last: _StepLayout | None = None

    def _layout(self, canvas: PackedCanvas, utts: list[Utterance]) -> _StepLayout:
        if self._last is not None and same_items(canvas.items, self._last.items):
            return self._last
        items = canvas.items
        lengths = np.array([item.target_len for item in items], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        rows = int(lengths.sum())
        row_item = np.repeat(np.arange(len(lengths)), lengths)
        row_pos = np.arange(rows) - np.repeat(starts, lengths)
        with np.errstate(over="ignore"):  # knobs beyond float32 become inf: the finite guard fails them
            penalty = np.array([u.options.layer_penalty_factor for u in utts], dtype=np.float32)
            temps = np.array([u.options.position_temperature for u in utts], dtype=np.float32)
            scales = np.array([item.guidance_scale for item in items], dtype=np.float32)
        temps = np.where(temps > 0, temps, 1.0).astype(np.float32)
        cfg = np.array([item.does_cfg for item in items], dtype=np.bool_)
        cfg_rows = cfg_scale = None
        if cfg.any():
            keep = np.repeat(cfg, lengths)
            cond_rows = np.concatenate([np.arange(o, o + n) for o, n in zip(canvas.cond_offsets, lengths)])
            cfg_rows = host_to_device(cond_rows[keep], self.device)
            cfg_scale = host_to_device(np.repeat(scales, lengths)[keep].reshape(-1, 1, 1), self.device)
        self._last = _StepLayout(
            items=list(items),
            row_item=host_to_device(row_item, self.device),
            row_pos=host_to_device(row_pos, self.device),
            row_penalty=host_to_device(np.repeat(penalty, lengths)[:, None], self.device),
            row_temp=host_to_device(np.repeat(temps, lengths)[:, None], self.device),
            t_max=int(lengths.max()) if len(lengths) else 0,
            cfg_rows=cfg_rows,
            cfg_scale=cfg_scale,
        )
        return self._last

    @torch.inference_mode()
    def step(self, logits: torch.Tensor, canvas: PackedCanvas, utts: list[Utterance]) -> torch.Tensor:
        """Reveal this step's tokens in every item's canvas, in place.

        Returns a device bool tensor: per item, whether its logits were finite (an item
        with non-finite logits must fail). It is not read here, so the step never waits
        for the GPU; the loop reads it once the step has finished.
        """
        items = canvas.items
        layout = self._layout(canvas, utts)
        n_items, c = len(items), self.num_codebooks
        n_cond = sum(item.target_len for item in items)
        k_host = [u.schedule[u.step] for u in utts]  # this step's picks per item
        k_max = max(k_host, default=0)
        take = host_to_device(np.arange(k_max)[None, :] < np.array(k_host, dtype=np.int64)[:, None], self.device)

        log_probs = F.log_softmax(logits[:n_cond], dim=-1)
        if layout.cfg_rows is not None:
            uncond = F.log_softmax(logits[n_cond:], dim=-1)
            cond = log_probs.index_select(0, layout.cfg_rows)
            log_probs.index_copy_(0, layout.cfg_rows,
                                  F.log_softmax(cond + layout.cfg_scale * (cond - uncond), dim=-1))
        log_probs[..., self.mask_id] = -float("inf")
        confidence = log_probs.max(dim=-1).values  # (rows, C)
        predicted = log_probs.argmax(dim=-1)
        finite_rows = torch.isfinite(confidence).all(dim=-1)

        # per-item random parts: class sampling (rare) and position noise (default on)
        noise_parts: list[torch.Tensor] = []
        for i, (item, utt) in enumerate(zip(items, utts)):
            start, t_len = canvas.cond_offsets[i], item.target_len
            opts = utt.options
            if opts.class_temperature > 0:
                filtered = filter_top_k(log_probs[start : start + t_len], ratio=0.1)
                noise = _gumbel(_uniform(filtered.shape, utt.generator, self.device))
                noisy = filtered / opts.class_temperature + noise
                predicted[start : start + t_len] = noisy.argmax(dim=-1)
            if opts.position_temperature > 0:
                # drawn as the reference does, (C, T), then laid out by rows
                noise_parts.append(_uniform((c, t_len), utt.generator, self.device).t())
            else:
                noise_parts.append(torch.full((t_len, c), -1.0, device=self.device))  # marks "no noise"
        uniform = torch.cat(noise_parts)
        noise = torch.where(uniform >= 0, _gumbel(uniform.clamp(min=0)), 0.0)
        scores = (confidence - self.layer_ids * layout.row_penalty) / layout.row_temp + noise

        # One top-k for every item over a padded (items, C, Tmax) table. The key is
        # mask-aware: a still-masked position ranks above every revealed or padding one
        # whatever its score (NaN and infinities become the float32 extremes), so no score,
        # however poisoned, can pick a position that is not masked.
        tokens = torch.cat([item.tokens for item in items], dim=1).t()  # (rows, C)
        masked = tokens == self.mask_id
        # a masked position whose score is not finite fails its item (knobs beyond float32)
        finite_rows &= (torch.isfinite(scores) | ~masked).all(dim=-1)
        big = torch.finfo(scores.dtype).max
        key = torch.where(masked, scores.nan_to_num(nan=-big, posinf=big, neginf=-big), -float("inf"))
        table = torch.full((n_items, layout.t_max, c), -float("inf"), device=self.device)
        table[layout.row_item, layout.row_pos] = key
        flat = table.transpose(1, 2).reshape(n_items, c * layout.t_max)
        chosen = torch.topk(flat, k_max, dim=1).indices  # (items, k_max), best first, distinct
        codebook, position = chosen // layout.t_max, chosen % layout.t_max  # inside the table by construction
        table_pred = torch.zeros((n_items, layout.t_max, c), dtype=predicted.dtype, device=self.device)
        table_pred[layout.row_item, layout.row_pos] = predicted.clamp(0, logits.shape[-1] - 1)
        item_index = torch.arange(n_items, device=self.device).unsqueeze(1)
        values = table_pred[item_index, position, codebook]

        finite = torch.ones((n_items, layout.t_max), dtype=torch.bool, device=self.device)
        finite[layout.row_item, layout.row_pos] = finite_rows
        # Every write after every read: a failure above leaves all canvases untouched. Picks
        # are written into a padded token table (never out of range), an item's picks past
        # its own k rewrite what is there (top-k picks in a row are distinct, so they never
        # collide with a real pick), and each item's region is copied back to its canvas.
        board = torch.full((n_items, layout.t_max, c), self.mask_id, dtype=tokens.dtype, device=self.device)
        board[layout.row_item, layout.row_pos] = tokens
        current = board[item_index, position, codebook]
        board[item_index, position, codebook] = torch.where(take, values, current)
        for i, item in enumerate(items):
            if k_host[i] > 0:
                item.tokens.copy_(board[i, : item.target_len].t())
        return finite.all(dim=1)
