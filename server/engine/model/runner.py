"""The step runner: one scheduled batch in, one launched step out.

`StepRunner.run` packs the batch's canvases, runs the forward and the sampler and queues a
non-blocking copy of the finiteness flags; nothing waits for the device. A batch that raises is
retried in halves until the culprit is alone; out-of-memory lowers a cap on packed tokens per
forward. What the step did comes back as a `LaunchedStep` (`scheduling/output.py`).
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext

import torch

from server import envs
from server.engine.model.backbones import Backbone, make_backbone
from server.engine.model.canvas import PackedCanvas, build_packed_canvas
from server.engine.model.cuda_graphs import DEFAULT_GRAPH_MAX_TOKENS
from server.engine.model.sampler import Sampler
from server.engine.model.step_observer import StepObserver, StepPhase
from server.engine.reference import ReferenceModel
from server.engine.scheduling.output import FailedItem, LaunchedPart, LaunchedStep, ScheduledBatch, StepTimer
from server.engine.work import Utterance

log = logging.getLogger("chorus.engine")

CAP_RELAX_AFTER_STEPS = 200  # clean steps before the out-of-memory cap grows by a quarter


def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


def backbone_for(model: ReferenceModel, attention: str, quantize: str | None = None,
                 graph_max_tokens: int = DEFAULT_GRAPH_MAX_TOKENS) -> Backbone:
    """`make_backbone` on the model's own device: on CUDA its kernels are checked and its graphs
    captured on that GPU, whichever is current."""
    device = model.audio_heads.weight.device
    with torch.cuda.device(device) if device.type == "cuda" else nullcontext():
        return make_backbone(model, attention, quantize=quantize, graph_max_tokens=graph_max_tokens)


class StepRunner:
    def __init__(self, backbone: Backbone, sampler: Sampler, device: torch.device, max_packed_tokens: int,
                 observer: StepObserver | None = None):
        self.backbone = backbone
        self.sampler = sampler
        self.device = device
        self.max_packed_tokens = max_packed_tokens
        self.observer = observer  # told of each forward's phases; None: nothing is called
        self.oom_cap: int | None = None  # packed tokens per forward after an out-of-memory error
        self._clean_steps = 0
        self._last_canvas: PackedCanvas | None = None  # a steady batch reuses its index arrays

    @classmethod
    def for_model(cls, model: ReferenceModel, attention: str, max_packed_tokens: int, quantize: str | None = None,
                  graph_max_tokens: int = DEFAULT_GRAPH_MAX_TOKENS, *, backbone: Backbone | None = None,
                  observer: StepObserver | None = None) -> StepRunner:
        """The model's sampler over `backbone` (None: `backbone_for` the model with `attention`,
        `quantize` and `graph_max_tokens`), on the model's device, its largest step warmed."""
        device = model.audio_heads.weight.device
        if backbone is None:
            backbone = backbone_for(model, attention, quantize, graph_max_tokens)
        sampler = Sampler(model.config.audio_mask_id, model.config.num_audio_codebook, device)
        runner = cls(backbone, sampler, device, max_packed_tokens, observer)
        runner.warm_largest_step()
        return runner

    def warm_largest_step(self) -> None:
        """Run a step of `max_packed_tokens` eagerly before traffic (`FusedBackbone.warm_eager`:
        kernels built, memory reserved), unless `CHORUS_EAGER_WARMUP=0`; where it runs out of
        memory, steps start capped at half of it, as after an out-of-memory step."""
        warm = getattr(self.backbone, "warm_eager", None)
        if warm is None or not envs.CHORUS_EAGER_WARMUP:
            return
        t = time.perf_counter()
        try:
            if warm(self.max_packed_tokens):
                log.info("eager step of %d tokens warmed in %.2f s", self.max_packed_tokens, time.perf_counter() - t)
        except Exception as exc:
            if not is_oom(exc):  # anything else would fail the first large step too: say so now
                raise
            self._lower_cap(self.max_packed_tokens)

    def run(self, batch: ScheduledBatch[Utterance], index: int = 0) -> LaunchedStep:
        """Queue step `index` of every utterance in the batch (each advances exactly one step)."""
        utts = batch.utts
        timer = StepTimer(self.device)
        step = LaunchedStep(parts=[], timer=timer, items=len(utts), packed_tokens=sum(u.packed_len for u in utts),
                            admitted=batch.admitted, index=index)
        for group in self._split_for_memory(utts):
            step.parts += self._launch(group, step.failed)
        timer.stop()
        return step

    def _split_for_memory(self, utts: list[Utterance]) -> list[list[Utterance]]:
        """Groups whose packed length fits the memory cap learnt from out-of-memory errors.

        A capped step just runs as several forwards; the cap relaxes after clean steps.
        """
        if self.oom_cap is None:
            return [utts]
        self._clean_steps += 1
        if self._clean_steps >= CAP_RELAX_AFTER_STEPS:
            self._clean_steps = 0
            grown = self.oom_cap * 5 // 4
            self.oom_cap = None if grown >= self.max_packed_tokens else grown
            if self.oom_cap is None:
                return [utts]
        groups: list[list[Utterance]] = [[]]
        size = 0
        for utt in utts:
            if groups[-1] and size + utt.packed_len > self.oom_cap:
                groups.append([])
                size = 0
            groups[-1].append(utt)
            size += utt.packed_len
        return groups

    def _launch(self, utts: list[Utterance], failed: list[FailedItem]) -> list[LaunchedPart]:
        """Queue one forward for `utts`; on failure, split the batch to isolate the culprit."""
        try:
            if (observer := self.observer) is None:
                canvas = build_packed_canvas([u.item for u in utts], self.device, self._last_canvas)
                self._last_canvas = canvas
                logits = self._logits(canvas)
                finite = self.sampler.step(logits, canvas, utts)
            else:
                canvas, finite = self._observed(observer, utts)
        except Exception as exc:  # isolated to the item(s) at fault
            if is_oom(exc):
                self._lower_cap(sum(u.packed_len for u in utts))
            if len(utts) == 1:
                log.exception("request %s: step failed", utts[0].state.request_id)
                failed.append(FailedItem(utts[0], exc))
                return []
            log.warning("step of %d items failed (%s); retrying in halves", len(utts), exc)
            half = len(utts) // 2
            return self._launch(utts[:half], failed) + self._launch(utts[half:], failed)
        ready = None
        if finite.device.type != "cpu":
            host = torch.empty(finite.shape, dtype=finite.dtype, pin_memory=True)
            host.copy_(finite, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record()
            finite = host
        return [LaunchedPart(utts, finite, [u.step + 1 for u in utts], ready)]

    def _observed(self, observer: StepObserver, utts: list[Utterance]) -> tuple[PackedCanvas, torch.Tensor]:
        """`_launch`'s three phases, each reported to `observer` as it begins and ends."""
        observer.phase_begin(StepPhase.CANVAS)
        canvas = build_packed_canvas([u.item for u in utts], self.device, self._last_canvas)
        self._last_canvas = canvas
        observer.phase_end(StepPhase.CANVAS, canvas)
        observer.phase_begin(StepPhase.FORWARD)
        logits = self._logits(canvas)
        observer.phase_end(StepPhase.FORWARD, canvas)
        observer.phase_begin(StepPhase.SAMPLE)
        finite = self.sampler.step(logits, canvas, utts)
        observer.phase_end(StepPhase.SAMPLE, canvas)
        return canvas, finite

    def _logits(self, canvas: PackedCanvas) -> torch.Tensor:
        """The step's target logits: in the model's dtype where the sampler scores them in one
        fused pass and the backbone can give them so, else float32."""
        if self.sampler.fused_scores and hasattr(self.backbone, "head_logits"):
            return self.backbone.head_logits(canvas)
        return self.backbone(canvas)

    def _lower_cap(self, tokens: int) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        half = max(1, tokens // 2)
        self.oom_cap = half if self.oom_cap is None else min(self.oom_cap, half)
        self._clean_steps = 0
        log.warning("out of memory at %d packed tokens; capping steps at %d", tokens, self.oom_cap)
