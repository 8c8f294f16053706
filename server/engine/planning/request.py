"""Request planning: a `SynthesisRequest` into text chunks with target lengths.

`plan_request` follows the reference's own rules (`_preprocess_all`, `_estimate_target_tokens`,
`get_indices`, `_generate_chunked`) and refuses a bad request before anything is queued.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace

import numpy as np
import torch

from server.engine.planning.fast_start import split_first_chunk
from server.engine.planning.text_chunks import chunk_text_punctuation
from server.engine.reference import ReferenceModel
from server.engine.types import GenerationOptions, RequestRejected, SynthesisRequest, VoicePrompt
from server.engine.upstream_names import (
    ZH_RE,
    resolve_instruct,
    resolve_language,
)
from server.engine.work import ChunkPlan, RequestPlan
from server.options import first_problem
from server.visible_text import has_visible_text


def validate_options(opts: GenerationOptions) -> None:
    """The options table's ranges; the engine re-checks so every entry point is safe."""
    if (problem := first_problem(opts)) is not None:
        name, rule = problem
        raise RequestRejected(f"options.{name}: {rule}", field=f"options.{name}")


def as_torch_voice(voice: VoicePrompt | None) -> VoicePrompt | None:
    """A voice whose tokens came as numpy (a finished chunk's `ChunkTokens`) as a LongTensor."""
    if voice is None or not isinstance(voice.tokens, np.ndarray):
        return voice
    if not np.issubdtype(voice.tokens.dtype, np.integer):
        raise RequestRejected("voice: codes must be a non-empty integer array", field="voice")
    return replace(voice, tokens=torch.from_numpy(voice.tokens.astype(np.int64)))


def validate_voice(voice: VoicePrompt, num_codebooks: int, codebook_size: int) -> None:
    """A voice's codes index the audio embedding table: out-of-range ids would crash the
    shared step on a GPU (device-side assert), so they are refused here."""
    tokens = voice.tokens
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.shape[0] != num_codebooks:
        raise RequestRejected(f"voice: codes must have shape ({num_codebooks}, T)", field="voice")
    if tokens.shape[1] == 0 or tokens.dtype != torch.long:
        raise RequestRejected("voice: codes must be a non-empty integer array", field="voice")
    if int(tokens.min()) < 0 or int(tokens.max()) >= codebook_size:
        raise RequestRejected(f"voice: codes must be in 0..{codebook_size - 1}", field="voice")


def prepare_request(model: ReferenceModel, request: SynthesisRequest, frame_rate: int,
                    max_audio_seconds: float | None = None) -> tuple[SynthesisRequest, RequestPlan, int]:
    """The request with its voice's tokens as torch, its plan, and its 64-bit seed (drawn when
    the request names none)."""
    if request.voice is not None:
        request = replace(request, voice=as_torch_voice(request.voice))
    plan = plan_request(model, request, frame_rate, max_audio_seconds)
    seed = request.options.seed
    if seed is None:
        seed = int.from_bytes(os.urandom(8), "little")
    return request, plan, seed & ((1 << 64) - 1)


def plan_request(model: ReferenceModel, request: SynthesisRequest, frame_rate: int,
                 max_audio_seconds: float | None = None) -> RequestPlan:
    """Chunk the text and size every canvas exactly as `OmniVoice.generate()` would; refuse
    a plan of more than `max_audio_seconds` of audio before anything is queued."""
    plan = _plan(model, request, frame_rate)
    seconds = sum(chunk.target_len for chunk in plan.chunks) / frame_rate
    if max_audio_seconds is not None and seconds > max_audio_seconds:
        opts = request.options
        field = "options.duration" if opts.duration is not None else (
            "options.speed" if opts.speed is not None and opts.speed < 1 else "text")
        raise RequestRejected(f"{field}: the request would make {seconds:.0f} s of audio, over this server's "
                              f"limit of {max_audio_seconds:g} s (shorten the text, or raise speed or lower "
                              "duration)", field=field)
    return plan


def _plan(model: ReferenceModel, request: SynthesisRequest, frame_rate: int) -> RequestPlan:
    opts = request.options
    validate_options(opts)
    text = request.text
    if not has_visible_text(text):
        raise RequestRejected("text: must not be empty (nothing but spaces or invisible characters)",
                              field="text")
    language = resolve_language(request.language)
    instruct = None
    if request.instruct is not None:
        try:
            instruct = resolve_instruct(request.instruct, use_zh=bool(ZH_RE.search(text)))
        except ValueError as exc:
            raise RequestRejected(f"instruct: {exc}", field="instruct") from exc

    voice = request.voice
    if voice is not None:
        validate_voice(voice, model.config.num_audio_codebook, model.config.audio_mask_id)
    paced = voice is not None and voice.sets_pace  # else: its text sized on its own, as with no reference
    ref_text = voice.text if paced else None
    ref_len = voice.num_frames if paced else None
    # duration overrides speed: estimate at speed 1, then fix the length (see _preprocess_all)
    has_duration = opts.duration is not None
    est_speed = 1.0 if has_duration else (opts.speed or 1.0)
    target = model._estimate_target_tokens(text, ref_text, ref_len, speed=est_speed)
    chunk_speed: float | None = None
    if has_duration:
        fixed = max(1, int(opts.duration * frame_rate))
        chunk_speed = target / fixed
        target = fixed
    elif opts.speed is not None:
        chunk_speed = opts.speed

    texts = chunk_texts(text, target, opts, frame_rate)
    if texts is None:
        return RequestPlan(language, instruct, [ChunkPlan(text, target)], chunk_speed, chained=False)
    speed = chunk_speed if chunk_speed is not None else 1.0
    chunks: list[ChunkPlan] = []
    if voice is not None:
        for chunk in texts:
            chunks.append(ChunkPlan(chunk, model._estimate_target_tokens(chunk, ref_text, ref_len, speed=speed)))
        return RequestPlan(language, instruct, chunks, chunk_speed, chained=False)
    # Later chunks take chunk 0 as their reference, sized from chunk 0's length, which the
    # speed already stretched, and then divided by the speed again: the reference's
    # `_generate_chunked` does the same (kept for parity; see docs/protocol.md).
    first_len = model._estimate_target_tokens(texts[0], None, None, speed=speed)
    chunks.append(ChunkPlan(texts[0], first_len))
    for chunk in texts[1:]:
        chunks.append(ChunkPlan(chunk, model._estimate_target_tokens(chunk, texts[0], first_len, speed=speed)))
    return RequestPlan(language, instruct, chunks, chunk_speed, chained=len(chunks) > 1)


def chunk_texts(text: str, target: int, opts: GenerationOptions, frame_rate: int) -> list[str] | None:
    """The text's chunks: the reference's rule (split into pieces of about `chunk_seconds`
    when the estimate exceeds `chunk_threshold`), after a short first chunk with fast start.
    None: not chunked (one canvas of the whole estimate, as `generate()` without chunking)."""
    tokens_per_char = target / len(text)
    first: list[str] = []
    if opts.first_chunk_seconds is not None:
        split = split_first_chunk(text, math.ceil(opts.first_chunk_seconds * frame_rate / tokens_per_char))
        if split is not None:
            first, text = [split[0]], split[1]
            target = round(tokens_per_char * len(text))
    if target <= int(opts.chunk_threshold * frame_rate):
        return first + [text] if first else None
    chunk_chars = int(opts.chunk_seconds * frame_rate / tokens_per_char)
    return first + chunk_text_punctuation(text=text, chunk_len=chunk_chars, min_chunk_len=3)
