"""One step's packed inputs: every admitted canvas end to end in a single ragged row.

A request is two documents (its conditional canvas and its CFG counterpart) or one at guidance
0, laid out `[cond_0, uncond_0, cond_1, ...]` and kept apart by `doc_lens`, not by a mask: no pad
positions. Positions restart at 0 in every document, so RoPE never reads one as the next's start.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from server.engine.work import CanvasItem


@dataclass
class PackedCanvas:
    """The packed row of one step, plus the index that gathers the logits it reads.

    `tgt_index` lists, in order, every item's conditional target positions and then the
    unconditional target positions of the items doing CFG. Only those rows go through
    `audio_heads` and the float32 upcast: prefix logits are never read.
    """

    packed_ids: torch.Tensor  # [C, S] long
    audio_mask: torch.Tensor  # [S] bool
    position_ids: torch.Tensor  # [S] long
    doc_lens: list[int]
    tgt_index: torch.Tensor  # [S_t] long
    items: list[CanvasItem]
    cond_offsets: list[int]  # per item: start of its cond target block within tgt rows
    uncond_offsets: list[int | None]  # per item: start of its uncond block, None without CFG

    @property
    def total_len(self) -> int:
        return int(self.packed_ids.shape[1])

    def slice_logits(self, logits: torch.Tensor, index: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Conditional and unconditional target logits ([T, C, V]) of item `index`."""
        item = self.items[index]
        start = self.cond_offsets[index]
        cond = logits[start : start + item.target_len]
        u_start = self.uncond_offsets[index]
        uncond = None if u_start is None else logits[u_start : u_start + item.target_len]
        return cond, uncond


def host_to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """Host index arrays -> device, through pinned memory without blocking the host."""
    tensor = torch.from_numpy(array)
    if device.type == "cpu":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)


def same_items(a: list[CanvasItem], b: list[CanvasItem]) -> bool:
    """The very same items in the same order: a steady batch, whose index arrays still hold."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def _token_rows(items: list[CanvasItem]) -> list[torch.Tensor]:
    """The packed row's token parts in order: prefix, target, then the CFG copy of the target."""
    return [part for item in items for part in
            ((item.prefix_ids, item.tokens, item.tokens) if item.does_cfg else (item.prefix_ids, item.tokens))]


def build_packed_canvas(items: list[CanvasItem], device: torch.device | str,
                        previous: PackedCanvas | None = None) -> PackedCanvas:
    """Pack a step's items into one ragged row (no padding).

    Index arrays (positions, audio mask, target gather index) are built on the host with
    numpy and copied once; only the token rows are concatenated on the device. When
    `previous` packed the very same items (a steady batch), its index arrays are reused.
    """
    device = torch.device(device)
    if previous is not None and same_items(items, previous.items):
        return replace(previous, packed_ids=torch.cat(_token_rows(items), dim=1), items=list(items))
    mask_parts: list[np.ndarray] = []
    doc_lens: list[int] = []
    cond_tgt: list[np.ndarray] = []
    uncond_tgt: list[np.ndarray] = []
    offset = 0
    for item in items:
        t_len, p_len = item.target_len, item.prefix_len
        mask_parts.append(item.prefix_audio_mask_host)
        mask_parts.append(np.ones(t_len, dtype=np.bool_))
        doc_lens.append(item.cond_len)
        cond_tgt.append(np.arange(offset + p_len, offset + p_len + t_len, dtype=np.int64))
        offset += item.cond_len
        if item.does_cfg:
            mask_parts.append(np.ones(t_len, dtype=np.bool_))
            doc_lens.append(t_len)
            uncond_tgt.append(np.arange(offset, offset + t_len, dtype=np.int64))
            offset += t_len

    cond_offsets: list[int] = []
    uncond_offsets: list[int | None] = []
    row = 0
    for item in items:
        cond_offsets.append(row)
        row += item.target_len
    for item in items:
        if item.does_cfg:
            uncond_offsets.append(row)
            row += item.target_len
        else:
            uncond_offsets.append(None)

    positions = np.concatenate([np.arange(n, dtype=np.int64) for n in doc_lens])
    return PackedCanvas(
        packed_ids=torch.cat(_token_rows(items), dim=1),
        audio_mask=host_to_device(np.concatenate(mask_parts), device),
        position_ids=host_to_device(positions, device),
        doc_lens=doc_lens,
        tgt_index=host_to_device(np.concatenate(cond_tgt + uncond_tgt), device),
        items=items,
        cond_offsets=cond_offsets,
        uncond_offsets=uncond_offsets,
    )
