"""Request planning and per-chunk state.

`plan_request` turns a `SynthesisRequest` into text chunks with target lengths, by the
reference's own rules (`_preprocess_all`, `_estimate_target_tokens`, `get_indices`,
`_generate_chunked`). An `Utterance` is one chunk = one canvas, with its own knobs,
unmask schedule and random generator, so its tokens never depend on what shares its steps.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np
import torch

from server.engine.model.canvas import CanvasItem
from server.engine.planning.fast_start import split_first_chunk
from server.engine.planning.prefix_tokens import prefix_tokenizer
from server.engine.planning.text_chunks import chunk_text_punctuation
from server.engine.types import EventSink, Finished, GenerationOptions, RequestRejected, SynthesisRequest, VoicePrompt
from server.engine.upstream_names import (
    ZH_RE,
    combine_text,
    get_time_steps,
    resolve_instruct,
    resolve_language,
)
from server.options import first_problem
from server.visible_text import has_visible_text

_U64 = (1 << 64) - 1


@dataclass(frozen=True)
class ChunkPlan:
    text: str
    target_len: int


@dataclass(frozen=True)
class RequestPlan:
    language: str | None
    instruct: str | None
    chunks: list[ChunkPlan]
    # speed used to estimate chunk lengths (the reference's `task.speed` entry, or None)
    chunk_speed: float | None
    chained: bool  # no voice and several chunks: chunk 0 becomes the others' reference


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


def plan_request(model, request: SynthesisRequest, frame_rate: int,
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


def _plan(model, request: SynthesisRequest, frame_rate: int) -> RequestPlan:
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
    ref_text = voice.text if voice else None
    ref_len = voice.num_frames if voice else None
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


@dataclass
class RequestState:
    """Engine-side bookkeeping of one request across its chunks."""

    request: SynthesisRequest
    plan: RequestPlan
    sink: EventSink
    seq: int
    seed: int
    submitted_at: float = field(default_factory=time.perf_counter)
    started_at: float | None = None
    first_audio_at: float | None = None
    steps_done: int = 0
    finished: bool = False
    raw_audio: dict[int, object] = field(default_factory=dict)
    # style + text token ids per chunk, tokenized once at submission (budget check)
    text_ids: dict[int, torch.Tensor] = field(default_factory=dict)
    audio_samples: int = 0

    def __post_init__(self) -> None:
        if self.request.received_at is not None:  # the clock starts where the server got the frame
            self.submitted_at = min(self.submitted_at, self.request.received_at)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def num_chunks(self) -> int:
        return len(self.plan.chunks)

    @property
    def ref_rms(self) -> float | None:
        """The reference voice's loudness, which post-processing restores (None: no reference)."""
        return self.request.voice.rms if self.request.voice else None

    @property
    def total_steps(self) -> int:
        return self.num_chunks * self.request.options.num_step

    def ended(self, outcome: str, message: str | None, sample_rate: int) -> Finished:
        """The request's one terminal event, with its timings (ms since submission)."""
        now = time.perf_counter()
        ms = lambda t: round((t - self.submitted_at) * 1000.0, 3)
        return Finished(
            request_id=self.request_id,
            outcome=outcome,  # type: ignore[arg-type]
            message=message,
            audio_seconds=round(self.audio_samples / sample_rate, 4),
            queue_ms=ms(self.started_at) if self.started_at else ms(now),
            first_audio_ms=ms(self.first_audio_at) if self.first_audio_at else None,
            total_ms=ms(now),
        )


@dataclass
class Utterance:
    """One text chunk of a request: one canvas, stepping through its own schedule."""

    state: RequestState
    chunk_index: int
    item: CanvasItem
    schedule: tuple[int, ...]
    generator: torch.Generator
    step: int = 0

    @property
    def options(self) -> GenerationOptions:
        return self.state.request.options

    @property
    def num_step(self) -> int:
        return self.options.num_step

    @property
    def finished(self) -> bool:
        return self.step >= self.num_step

    @property
    def packed_len(self) -> int:
        return self.item.packed_len


def _prefix_strings(text: str, ref_text: str | None, has_ref: bool, language: str | None, instruct: str | None,
                    denoise: bool) -> tuple[str, str]:
    """The style string and the wrapped text string `_prepare_inference_inputs` tokenises."""
    style = "<|denoise|>" if (denoise and has_ref) else ""
    style += f"<|lang_start|>{language or 'None'}<|lang_end|>"
    style += f"<|instruct_start|>{instruct or 'None'}<|instruct_end|>"
    return style, f"<|text_start|>{combine_text(ref_text=ref_text, text=text)}<|text_end|>"


def text_prefix_ids(model, text: str, ref_text: str | None, has_ref: bool, language: str | None,
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


def build_utterance(model, state: RequestState, chunk_index: int, ref: VoicePrompt | None,
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
    schedule = unmask_schedule(chunk.target_len, num_codebooks, opts.num_step, opts.t_shift)
    return Utterance(state=state, chunk_index=chunk_index, item=item, schedule=schedule, generator=generator)


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


def packed_len_of(model, state: RequestState, chunk_index: int) -> int:
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
