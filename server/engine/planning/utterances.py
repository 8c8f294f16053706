"""Each chunk of a planned request as an `Utterance`: its canvas in the reference's layout, its
unmask schedule and its own random stream, so its tokens never depend on what shares its steps;
and the chunk's packed length, exactly or as a bound, for the budget check at submission.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch

from server.engine.planning.prefix_tokens import prefix_tokenizer
from server.engine.reference import ReferenceModel
from server.engine.types import VoicePrompt
from server.engine.upstream_names import combine_text, get_time_steps
from server.engine.work import CanvasItem, ChunkDue, ChunkSpec, RequestState, Utterance

_U64 = (1 << 64) - 1


@lru_cache(maxsize=1024)
def unmask_schedule(target_len: int, num_codebooks: int, num_step: int, t_shift: float) -> tuple[int, ...]:
    """Tokens revealed at each step: the reference's `_generate_iterative` schedule. Cached: a
    chunk's canvas is built on the path to its first sound, and the schedule's float math
    (torch ops on the host) costs more there than the lookup."""
    timesteps = get_time_steps(t_start=0.0, t_end=1.0, num_step=num_step, t_shift=t_shift).tolist()
    total = target_len * num_codebooks
    remaining = total
    schedule = []
    for step in range(num_step):
        if step == num_step - 1:
            num = remaining
        else:
            num = min(math.ceil(total * (timesteps[step + 1] - timesteps[step])), remaining)
        schedule.append(int(num))
        remaining -= int(num)
    return tuple(schedule)


def chunk_seed(seed: int, chunk_index: int) -> int:
    """A distinct, reproducible stream per chunk (chunks may run in any order)."""
    x = (seed + 0x9E3779B97F4A7C15 * (chunk_index + 1)) & _U64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _U64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _U64
    return x ^ (x >> 31)


def _prefix_strings(text: str, ref_text: str | None, has_ref: bool, language: str | None, instruct: str | None,
                    denoise: bool) -> tuple[str, str]:
    """The style string and the wrapped text string `_prepare_inference_inputs` tokenises."""
    style = "<|denoise|>" if (denoise and has_ref) else ""
    style += f"<|lang_start|>{language or 'None'}<|lang_end|>"
    style += f"<|instruct_start|>{instruct or 'None'}<|instruct_end|>"
    return style, f"<|text_start|>{combine_text(ref_text=ref_text, text=text)}<|text_end|>"


def text_prefix_ids(model: ReferenceModel, text: str, ref_text: str | None, has_ref: bool, language: str | None,
                    instruct: str | None, denoise: bool) -> torch.Tensor:
    """Style and text token ids (1-D, CPU), exactly as `_prepare_inference_inputs` makes them.

    Built on the host so admitting a request never copies through a synchronising
    pageable transfer on the GPU stream; tests check equality with the reference's canvas.
    """
    style, wrapped = _prefix_strings(text, ref_text, has_ref, language, instruct, denoise)
    tokens = prefix_tokenizer(model.text_tokenizer)
    return torch.cat([tokens.style_ids(style), tokens.text_ids(wrapped)]).long()


def _to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type == "cpu":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)


def chunk_spec(state: RequestState, chunk_index: int, num_codebooks: int) -> ChunkSpec:
    """The frozen spec of one planned chunk: its knobs, its unmask schedule, its deadline's terms."""
    opts = state.request.options
    plan = state.plan
    due = ChunkDue(whole=state.request.stream == "whole", arrived_at=state.submitted_at, hint=state.request.due_at,
                   chunk_index=chunk_index, frames_before=plan.frames_before(chunk_index),
                   frames_total=plan.frames_before(len(plan.chunks)), num_step=opts.num_step)
    schedule = unmask_schedule(plan.chunks[chunk_index].target_len, num_codebooks, opts.num_step, opts.t_shift)
    return ChunkSpec(state.request_id, chunk_index, state.seq, opts, schedule, due)


def build_utterance(model: ReferenceModel, state: RequestState, chunk_index: int, ref: VoicePrompt | None,
                    device: torch.device) -> Utterance:
    """One chunk's canvas: the reference's layout (style, text, reference audio, MASK target)."""
    chunk = state.plan.chunks[chunk_index]
    opts = state.request.options
    num_codebooks = model.config.num_audio_codebook
    text_ids = state.text_ids.get(chunk_index)
    if text_ids is None:
        text_ids = text_prefix_ids(model, chunk.text, ref.text if ref else None, ref is not None,
                                   state.plan.language, state.plan.instruct, opts.denoise)
    n_text = int(text_ids.shape[0])
    ref_len = ref.num_frames if ref else 0
    prefix_parts = [_to_device(text_ids.unsqueeze(0).expand(num_codebooks, -1).contiguous(), device)]
    if ref is not None:
        ref_tokens = ref.tokens if ref.tokens.device == device else _to_device(ref.tokens.long(), device)
        prefix_parts.append(ref_tokens)
    mask_host = np.zeros(n_text + ref_len, dtype=np.bool_)
    mask_host[n_text:] = True  # audio_mask: true from the reference audio on
    item = CanvasItem(
        item_id=f"{state.request_id}#{chunk_index}",
        prefix_ids=torch.cat(prefix_parts, dim=1) if len(prefix_parts) > 1 else prefix_parts[0],
        prefix_audio_mask=_to_device(torch.from_numpy(mask_host), device),
        tokens=torch.full((num_codebooks, chunk.target_len), model.config.audio_mask_id, dtype=torch.long,
                          device=device),
        guidance_scale=opts.guidance_scale,
        prefix_audio_mask_host=mask_host,
    )
    generator = torch.Generator(device=device)
    generator.manual_seed(chunk_seed(state.seed, chunk_index))
    return Utterance(state=state, spec=chunk_spec(state, chunk_index, num_codebooks), item=item, generator=generator)


def _chunk_reference(state: RequestState, chunk_index: int) -> tuple[str | None, int, bool]:
    """(reference transcript, reference frames, has a reference) of a chunk's canvas."""
    voice = state.request.voice
    if state.plan.chained and chunk_index > 0:
        return state.plan.chunks[0].text, state.plan.chunks[0].target_len, True
    return (voice.text, voice.num_frames, True) if voice else (None, 0, False)


def _packed_len(state: RequestState, chunk_index: int, n_text: int, ref_len: int) -> int:
    """A chunk's packed length: its prefix (text, reference audio) and target, and the target
    again for CFG."""
    chunk = state.plan.chunks[chunk_index]
    cond = n_text + ref_len + chunk.target_len
    return cond + (chunk.target_len if state.request.options.guidance_scale != 0 else 0)


def packed_len_of(model: ReferenceModel, state: RequestState, chunk_index: int) -> int:
    """Exact packed length of a chunk before its canvas exists (budget check at submission)."""
    chunk = state.plan.chunks[chunk_index]
    ref_text, ref_len, has_ref = _chunk_reference(state, chunk_index)
    text_ids = text_prefix_ids(model, chunk.text, ref_text, has_ref, state.plan.language, state.plan.instruct,
                               state.request.options.denoise)
    state.text_ids[chunk_index] = text_ids  # the canvas reuses them
    return _packed_len(state, chunk_index, int(text_ids.shape[0]), ref_len)


def packed_len_bound(state: RequestState, chunk_index: int) -> int:
    """An upper bound of `packed_len_of` without tokenising, for the budget check of chunks
    built later. A byte-level BPE token covers at least one UTF-8 byte, and Unicode
    normalisation (NFC) at most triples a string's bytes; four tokens a byte and a margin for
    special tokens bound any tokenizer that keeps to either. The text is counted before the
    reference's clean-up, which never lengthens it (and costs more than the count)."""
    chunk = state.plan.chunks[chunk_index]
    ref_text, ref_len, has_ref = _chunk_reference(state, chunk_index)
    style, wrapped = _prefix_strings("", None, has_ref, state.plan.language, state.plan.instruct,
                                     state.request.options.denoise)
    # `combine_text` only strips, drops and narrows characters, and adds one space
    text_bytes = len(chunk.text.encode("utf-8")) + (len(ref_text.encode("utf-8")) + 1 if ref_text else 0)
    return _packed_len(state, chunk_index, 4 * (len((style + wrapped).encode("utf-8")) + text_bytes) + 64, ref_len)
