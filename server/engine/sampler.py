"""One unmasking step for every item of a packed step: the reference's scoring, batched.

Per item this is `_predict_tokens_with_scoring` + the selection loop of
`_generate_iterative`: CFG log-softmax mix (or the conditional alone at guidance 0),
MASK excluded, greedy or top-10% Gumbel class sampling, confidence minus the codebook
layer penalty, Gumbel position noise, top-k over still-masked positions with k from the
item's own schedule. Everything that has no per-item randomness is done once for all
rows; random draws come from each item's own generator so a seeded request's tokens do
not depend on its neighbours.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from server.engine.canvas import PackedCanvas
from server.engine.request import Utterance
from server.engine.upstream_names import filter_top_k


def _gumbel(scores: torch.Tensor, temperature: float, generator: torch.Generator) -> torch.Tensor:
    """The reference's `_gumbel_sample`, drawing from `generator`."""
    u = torch.rand(scores.shape, generator=generator, device=scores.device, dtype=scores.dtype)
    return scores / temperature + -torch.log(-torch.log(u + 1e-10) + 1e-10)


class Sampler:
    def __init__(self, mask_id: int, num_codebooks: int, device: torch.device):
        self.mask_id = mask_id
        self.device = device
        self.layer_ids = torch.arange(num_codebooks, device=device, dtype=torch.float32)

    @torch.inference_mode()
    def step(self, logits: torch.Tensor, canvas: PackedCanvas, utts: list[Utterance]) -> torch.Tensor:
        """Reveal this step's tokens in every item's canvas, in place.

        Returns a device bool tensor: per item, whether its logits were finite (an item
        with non-finite logits must fail). It is not read here, so the step never waits
        for the GPU; the loop reads it once the step has finished.
        """
        items = canvas.items
        n_cond = sum(item.target_len for item in items)
        log_probs = F.log_softmax(logits[:n_cond], dim=-1)
        cfg = [i for i, item in enumerate(items) if item.does_cfg]
        if cfg:
            uncond = F.log_softmax(logits[n_cond:], dim=-1)
            rows = torch.cat([
                torch.arange(canvas.cond_offsets[i], canvas.cond_offsets[i] + items[i].target_len,
                             device=self.device) for i in cfg
            ])
            scale = torch.cat([
                torch.full((items[i].target_len,), items[i].guidance_scale, device=self.device) for i in cfg
            ]).view(-1, 1, 1)
            cond = log_probs.index_select(0, rows)
            log_probs.index_copy_(0, rows, F.log_softmax(cond + scale * (cond - uncond), dim=-1))
        log_probs[..., self.mask_id] = -float("inf")
        confidence = log_probs.max(dim=-1).values  # (rows, C)
        predicted = log_probs.argmax(dim=-1)

        # Compute every item's picks first and write them last, so a failure part-way
        # leaves all canvases untouched and the step can be retried with fewer items.
        writes: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        finite_rows = torch.isfinite(confidence).all(dim=-1)
        finite_items: list[torch.Tensor] = []
        for i, (item, utt) in enumerate(zip(items, utts)):
            start, t_len = canvas.cond_offsets[i], item.target_len
            finite_items.append(finite_rows[start : start + t_len].all())
            k = utt.schedule[utt.step]
            if k <= 0:
                continue
            opts = utt.options
            pred = predicted[start : start + t_len]  # (T, C)
            if opts.class_temperature > 0:
                filtered = filter_top_k(log_probs[start : start + t_len], ratio=0.1)
                pred = _gumbel(filtered, opts.class_temperature, utt.generator).argmax(dim=-1)
            scores = (confidence[start : start + t_len] - self.layer_ids * opts.layer_penalty_factor).t()
            if opts.position_temperature > 0:
                scores = _gumbel(scores.contiguous(), opts.position_temperature, utt.generator)
            tokens = item.tokens  # (C, T)
            scores = scores.masked_fill(tokens != self.mask_id, -float("inf"))
            chosen = torch.topk(scores.flatten(), k).indices
            writes.append((tokens.view(-1), chosen, pred.t().flatten()[chosen]))
        for flat, chosen, values in writes:
            flat[chosen] = values
        return torch.stack(finite_items)
