"""One unmasking step for every item of a packed step: the reference's scoring, batched.

Per item `_predict_tokens_with_scoring` and the selection loop of `_generate_iterative`, run once
for every row of the step: per-item knobs become per-row values, top-k runs over a padded score
table, random draws stay per item (each item's own generator). Selection ranks on a mask-aware
key, so no score can touch a neighbour; a non-finite one fails its own item. On CUDA the scoring
and the keys may be one Triton kernel each (`cfg_scores`, `position_keys`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from types import ModuleType

import numpy as np
import torch
import torch.nn.functional as F

from server.engine.kernels import cfg_scores, position_keys
from server.engine.kernels.sampling_ops import best_unmasked, cfg_mix, gumbel, gumbel_, selection_key, uniform
from server.engine.model.canvas import PackedCanvas, host_to_device, same_items
from server.engine.upstream_names import filter_top_k
from server.engine.work import Utterance

log = logging.getLogger(__name__)


@dataclass
class _StepLayout:
    """Host-built index arrays of one batch composition (copied to the device once; a
    steady batch, the same items step after step, reuses them) and what is constant over it."""

    items: list  # the CanvasItems these were built for, compared by identity
    n_cond: int  # conditional target rows
    t_max: int
    row_penalty: torch.Tensor  # (rows, C) layer penalty of each row and codebook
    row_temp: torch.Tensor  # (rows, 1) position temperature (1 where none: x / 1 == x)
    cfg_rows: torch.Tensor | None  # conditional rows of the items doing CFG
    cfg_scale: torch.Tensor | None  # (cfg rows, 1, 1) their guidance scales
    all_cfg: bool  # every item does CFG: cfg_rows are all conditional rows, in order
    all_noise: bool  # every item draws position noise
    any_class_sampling: bool  # some item samples classes (class_temperature > 0)
    table_index: torch.Tensor  # (rows x C,) each score's slot in the (items, C x t_max) table
    row_slot: torch.Tensor  # (rows,) each row's slot in an (items x t_max) table


class Sampler:
    def __init__(self, mask_id: int, num_codebooks: int, device: torch.device, fused_scores: bool | None = None,
                 fused_keys: bool | None = None):
        self.mask_id = mask_id
        self.device = device
        self.num_codebooks = num_codebooks
        self.layer_ids = torch.arange(num_codebooks, device=device, dtype=torch.float32)
        self._last: _StepLayout | None = None
        self.fused_scores = self._pick_kernel(fused_scores, cfg_scores, "CFG scoring")
        self.fused_keys = self._pick_kernel(fused_keys, position_keys, "selection keys")

    def _pick_kernel(self, wanted: bool | None, module: ModuleType, what: str) -> bool:
        """Whether a Triton kernel module of the sampler (`cfg_scores`: an all-CFG step's
        scoring in one pass over half-precision logits; `position_keys`: the selection keys in
        one launch) replaces its torch ops: by default on CUDA, and only if the module's start-up
        check against those ops `passes` (confidences to float32 rounding with the same ids; keys
        bit for bit)."""
        if wanted is None:
            wanted = self.device.type == "cuda"
        if not wanted:
            return False
        try:
            result = module.check(self.device, num_codebooks=self.num_codebooks, vocab=self.mask_id + 1,
                                  mask_id=self.mask_id)
        except Exception as exc:  # noqa: BLE001 - fall back, loudly
            log.warning("%s kernel unavailable (%s); using torch", what, exc)
            return False
        if not module.passes(result):
            log.warning("%s kernel failed its check (%s); using torch", what, result)
            return False
        log.info("%s: one Triton kernel (check: %s)", what, result)
        return True

    def _layout(self, canvas: PackedCanvas, utts: list[Utterance]) -> _StepLayout:
        if self._last is not None and same_items(canvas.items, self._last.items):
            return self._last
        items, c = canvas.items, self.num_codebooks
        lengths = np.array([item.target_len for item in items], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        rows = int(lengths.sum())
        t_max = int(lengths.max()) if len(lengths) else 0
        with np.errstate(over="ignore"):  # knobs beyond float32 become inf: the finite guard fails them
            penalty = np.array([u.options.layer_penalty_factor for u in utts], dtype=np.float32)
            temps = np.array([u.options.position_temperature for u in utts], dtype=np.float32)
            scales = np.array([item.guidance_scale for item in items], dtype=np.float32)
        all_noise = bool((temps > 0).all())
        temps = np.where(temps > 0, temps, 1.0).astype(np.float32)
        cfg = np.array([item.does_cfg for item in items], dtype=np.bool_)
        cfg_rows = cfg_scale = None
        if cfg.any():
            keep = np.repeat(cfg, lengths)
            cond_rows = np.concatenate([np.arange(o, o + n) for o, n in zip(canvas.cond_offsets, lengths)])
            cfg_rows = host_to_device(cond_rows[keep], self.device)
            cfg_scale = host_to_device(np.repeat(scales, lengths)[keep].reshape(-1, 1, 1), self.device)
        row_item = np.repeat(np.arange(len(lengths)), lengths)
        row_pos = np.arange(rows) - np.repeat(starts, lengths)
        # slot of (row, codebook) in a row-major (items, C, t_max) table
        slots = (row_item[:, None] * c + np.arange(c)[None, :]) * t_max + row_pos[:, None]
        row_penalty = host_to_device(np.repeat(penalty, lengths)[:, None], self.device)
        self._last = _StepLayout(
            items=list(items),
            n_cond=rows,
            t_max=t_max,
            row_penalty=self.layer_ids * row_penalty,  # the same product the step used to form
            row_temp=host_to_device(np.repeat(temps, lengths)[:, None], self.device),
            cfg_rows=cfg_rows,
            cfg_scale=cfg_scale,
            all_cfg=bool(cfg.all()),
            all_noise=all_noise,
            any_class_sampling=any(u.options.class_temperature > 0 for u in utts),
            table_index=host_to_device(slots.reshape(-1), self.device),
            row_slot=host_to_device(row_item * t_max + row_pos, self.device),
        )
        return self._last

    @torch.inference_mode()
    def step(self, logits: torch.Tensor, canvas: PackedCanvas, utts: list[Utterance]) -> torch.Tensor:
        """Reveal this step's tokens in every item's canvas, in place.

        `logits` may be half precision (the fused scoring reads them so); the torch path
        upcasts them first, as the reference does.
        Returns a device bool tensor: per item, whether its logits were finite (an item
        with non-finite logits must fail). It is not read here, so the step never waits
        for the GPU; the loop reads it once the step has finished. Every operation is
        launched from Python, so the step uses as few as give the reference's numbers (on
        CUDA the scores and the keys are one kernel each: `cfg_scores`, `position_keys`).
        """
        items = canvas.items
        layout = self._layout(canvas, utts)
        k_host = [u.schedule[u.step] for u in utts]  # this step's picks per item

        if self.fused_scores and layout.all_cfg and not layout.any_class_sampling and logits.is_contiguous():
            confidence, predicted = cfg_scores.cfg_scores(logits, layout.n_cond, layout.cfg_scale, self.mask_id)
            log_probs = None  # only class sampling reads it
        else:
            log_probs = self._log_probs(logits.float(), layout)
            confidence, predicted = best_unmasked(log_probs, self.mask_id)  # (rows, C)
        tokens = items[0].tokens.t() if len(items) == 1 else torch.cat([item.tokens for item in items], dim=1).t()
        lone = len(items) == 1 and items[0].tokens.is_contiguous()
        vocab = logits.shape[-1]

        if self.fused_keys and layout.all_noise and not layout.any_class_sampling:
            # the draws `_noise` makes; keys and ids come back codebook-major for a lone item
            key, predicted, finite_rows = position_keys.position_keys(
                confidence, predicted, self._position_uniforms(canvas, utts), layout.row_penalty, layout.row_temp,
                tokens, self.mask_id, vocab, codebook_major=lone)
            if lone:
                return self._select_one(items[0], key.t(), predicted.t(), k_host[0], finite_rows)
            return self._select(items, key, predicted, tokens, k_host, finite_rows, layout)

        noise = self._noise(log_probs, predicted, canvas, utts, layout)
        key, finite_rows = selection_key(confidence, noise, layout.row_penalty, layout.row_temp, predicted, tokens,
                                         self.mask_id, vocab)
        if lone:
            return self._select_one(items[0], key, predicted, k_host[0], finite_rows)
        return self._select(items, key, predicted, tokens, k_host, finite_rows, layout)

    def _log_probs(self, logits: torch.Tensor, layout: _StepLayout) -> torch.Tensor:
        """(rows, C, V) log-probabilities: the conditional, or the CFG mix where an item does CFG."""
        n_cond = layout.n_cond
        log_probs = F.log_softmax(logits[:n_cond], dim=-1)
        if layout.cfg_rows is None:
            return log_probs
        uncond = F.log_softmax(logits[n_cond:], dim=-1)
        if layout.all_cfg:  # every conditional row mixes: no gather and scatter
            return cfg_mix(log_probs, uncond, layout.cfg_scale)
        cond = log_probs.index_select(0, layout.cfg_rows)
        log_probs.index_copy_(0, layout.cfg_rows, cfg_mix(cond, uncond, layout.cfg_scale))
        return log_probs

    def _position_uniforms(self, canvas: PackedCanvas, utts: list[Utterance]) -> torch.Tensor:
        """(rows, C) uniform draws of a step where every item draws position noise (no class
        sampling): from each item's own generator, (C, T) as the reference draws them, laid
        out by rows; the same draws `_noise` makes."""
        c = self.num_codebooks
        parts = [uniform((c, item.target_len), utt.generator, self.device).t()
                 for item, utt in zip(canvas.items, utts)]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _noise(self, log_probs: torch.Tensor | None, predicted: torch.Tensor, canvas: PackedCanvas,
               utts: list[Utterance], layout: _StepLayout) -> torch.Tensor:
        """Per-item random parts, each from the item's own generator: class sampling (rare,
        rewrites `predicted`) and the (rows, C) Gumbel position noise (0 where an item has none)."""
        c = self.num_codebooks
        parts: list[torch.Tensor] = []
        for i, (item, utt) in enumerate(zip(canvas.items, utts)):
            start, t_len = canvas.cond_offsets[i], item.target_len
            opts = utt.options
            if opts.class_temperature > 0:
                filtered = filter_top_k(log_probs[start : start + t_len], ratio=0.1)
                noise = gumbel(uniform(filtered.shape, utt.generator, self.device))
                noisy = filtered / opts.class_temperature + noise
                predicted[start : start + t_len] = noisy.argmax(dim=-1)
            if opts.position_temperature > 0:
                # drawn as the reference does, (C, T), then laid out by rows
                parts.append(uniform((c, t_len), utt.generator, self.device).t())
            else:
                parts.append(torch.full((t_len, c), -1.0, device=self.device))  # marks "no noise"
        if layout.all_noise:
            return gumbel_(parts[0] if len(parts) == 1 else torch.cat(parts))
        draws = torch.cat(parts)
        return torch.where(draws >= 0, gumbel(draws.clamp(min=0)), 0.0)

    @staticmethod
    def _select_one(item, key: torch.Tensor, predicted: torch.Tensor, k: int,
                    finite_rows: torch.Tensor) -> torch.Tensor:
        """One item: top-k over its own (C x T) scores, picks written straight into its canvas.

        The picks are a set (distinct positions, each written once), so on CUDA the top-k
        skips its sort: CUDA's top-k gathers the same elements either way and only then sorts
        them. The CPU's unsorted top-k may break ties differently, so the CPU sorts, as the
        reference does."""
        flat = key.t().reshape(1, -1)  # (1, C x T): codebook-major, as the reference flattens
        chosen = torch.topk(flat, k, dim=1, sorted=not flat.is_cuda).indices
        values = predicted.t().reshape(1, -1).gather(1, chosen)
        item.tokens.view(1, -1).scatter_(1, chosen, values)  # the only write, after every read
        return finite_rows.all().view(1)

    def _select(self, items, key: torch.Tensor, predicted: torch.Tensor, tokens: torch.Tensor, k_host: list[int],
                finite_rows: torch.Tensor, layout: _StepLayout) -> torch.Tensor:
        """One top-k for every item over a padded (items, C x t_max) table.

        Every write after every read: a failure here leaves all canvases untouched. Picks are
        written into a padded token table (never out of range), an item's picks past its own
        k rewrite what is there (top-k picks in a row are distinct, so they never collide
        with a real pick), and each item's region is copied back to its canvas.
        """
        n_items, width = len(items), self.num_codebooks * layout.t_max
        k_max = max(k_host, default=0)
        take = host_to_device(np.arange(k_max)[None, :] < np.array(k_host, dtype=np.int64)[:, None], self.device)
        index = layout.table_index
        size = n_items * width
        flat = key.new_full((size,), -float("inf")).index_copy_(0, index, key.reshape(-1)).view(n_items, width)
        chosen = torch.topk(flat, k_max, dim=1).indices  # (items, k_max), best first, distinct
        table = predicted.new_zeros(size).index_copy_(0, index, predicted.reshape(-1)).view(n_items, width)
        values = table.gather(1, chosen)
        board = tokens.new_full((size,), self.mask_id).index_copy_(0, index, tokens.reshape(-1)).view(n_items, width)
        board.scatter_(1, chosen, torch.where(take, values, board.gather(1, chosen)))
        finite = finite_rows.new_ones(n_items * layout.t_max).index_copy_(0, layout.row_slot, finite_rows)
        for i, item in enumerate(items):
            if k_host[i] > 0:
                item.tokens.copy_(board[i].view(-1, layout.t_max)[:, : item.target_len])
        return finite.view(n_items, layout.t_max).all(dim=1)
