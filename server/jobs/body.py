"""The body of `POST /v1/jobs`, in its three forms, as the items of a job.

- JSON `{"items": [SPEECH_BODY, ...], "response_format"?}`: each item is a `/v1/audio/speech`
  body (its own `response_format` over the job's), checked by the speech body's own rules.
- JSON `{"input": LONG_TEXT, ...the rest of a speech body}`: one long text, cut into items
  (`server.jobs.split`) that share the body's voice and knobs; with no voice named, the later
  items speak in the voice the first one makes (`chained`).
- JSONL (`Content-Type: application/jsonl` or `application/x-ndjson`): one speech body a line,
  or an OpenAI batch request line (`{"custom_id", "method", "url": "/v1/audio/speech", "body"}`,
  whose `body` is taken); `?response_format=` sets the job's format.

Every refusal names its field as `items[K].FIELD` (K counts items from 0; a JSONL line's number
is in the message), so a client can point at the line at fault.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import msgspec

from server.engine.types import GenerationOptions
from server.jobs.split import estimate_seconds, split_text
from server.jobs.store import ItemWork
from server.visible_text import has_visible_text
from server.voices.instructions import map_instructions
from server.wire import messages as p
from server.wire.speech_body import SpeechFormat, SpeechRequest, check_sizes
from server.wire.validation import describe_validation_error

JSONL_TYPES = ("application/jsonl", "application/x-ndjson", "application/jsonlines", "application/x-jsonlines")
FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
_RULES = {"response_format": "must be mp3, opus, aac, flac, wav or pcm", "stream_format": "must be audio or sse",
          "timestamps": "must be word, char or null"}
_DEFAULTS = asdict(GenerationOptions())


class ItemsBody(msgspec.Struct, forbid_unknown_fields=True):
    items: list[Any]
    response_format: SpeechFormat | None = None
    model: Any = None


@dataclass(frozen=True)
class JobLimits:
    """`--max-text-chars` (an item), `--max-instructions-chars`, and the job's own caps: items,
    characters and estimated audio in all, and the size of a long text's items."""

    max_text_chars: int | None = 5000
    max_instructions_chars: int | None = 4096
    max_items: int = 10_000
    max_chars: int = 500_000
    max_audio_seconds: float = 36_000.0
    item_chars: int = 600
    first_item_chars: int = 160  # a chained long text's first item: its voice, carried by the rest


@dataclass(frozen=True)
class ParsedJob:
    items: tuple[ItemWork, ...]
    chained: bool
    voices: dict[str, str]  # each voice named -> the field that first names it (checked at submission)


def _refuse(code: str, message: str, field: str | None) -> p.ProtocolError:
    return p.ProtocolError(code, message, field=field)


def _speech(raw: Any, at: str) -> SpeechRequest:
    """A speech body by its own rules (its knobs' ranges too), its fields named after `at`."""
    if not isinstance(raw, dict):
        raise _refuse("invalid_request", f"{at}: must be a JSON object (a speech body)", at or None)
    dot = f"{at}." if at else ""
    try:
        req = msgspec.convert(raw, SpeechRequest)
    except msgspec.ValidationError as exc:
        field, message = describe_validation_error(exc, _RULES, target=SpeechRequest)
        raise _refuse("invalid_request", f"{dot}{message}", f"{dot}{field}" if field else at or None) from None
    for name, problem in (("stream_format", req.stream_format == "sse"), ("timestamps", req.timestamps is not None),
                          ("keep_voice", req.keep_voice)):
        if problem:
            raise _refuse("invalid_request", f"{dot}{name}: not available in a job (its items are files; a long "
                          "text with no voice keeps its first item's voice on its own)", f"{dot}{name}")
    if req.normalize_text is None:
        req.normalize_text = True
    p.check_options(req, prefix=dot)
    return req


def _work(req: SpeechRequest, raw: dict, text: str, job_format: str | None) -> ItemWork:
    options = asdict(p.generation_options(req))
    return ItemWork(text=text, format=raw.get("response_format") or job_format or "mp3",
                    seconds=round(estimate_seconds(text, req.speed, req.duration), 3), voice=req.voice_name,
                    instruct=map_instructions(req.instructions).instruct, language=req.language,
                    normalize=req.normalize_text if req.normalize_text is not None else True,
                    options={k: v for k, v in options.items() if v != _DEFAULTS[k]})


def _item(raw: Any, k: int, job_format: str | None, limits: JobLimits, line: int | None = None) -> ItemWork:
    at = f"items[{k}]"
    try:
        req = _speech(raw, at)
        try:
            check_sizes(req, limits.max_text_chars, limits.max_instructions_chars)
        except p.ProtocolError as exc:
            raise _refuse(exc.code, f"{at}.{exc.message}", f"{at}.{exc.field}") from None
        if not has_visible_text(req.input):
            raise _refuse("invalid_request", f"{at}.input: must not be empty (nothing but spaces or invisible "
                          "characters)", f"{at}.input")
    except p.ProtocolError as exc:
        if line is not None:
            exc = _refuse(exc.code, f"line {line}: {exc.message}", exc.field)
        raise exc from None
    return _work(req, raw, req.input, job_format)


def _totals(items: list[ItemWork], limits: JobLimits, field: str) -> ParsedJob:
    """The job's caps over all its items; the voices it names."""
    if not 1 <= len(items) <= limits.max_items:
        raise _refuse("invalid_request", f"{field}: {len(items)} items; a job has 1..{limits.max_items} "
                      "(--max-job-items)", field)
    chars = sum(len(item.text) for item in items)
    if chars > limits.max_chars:
        raise _refuse("text_too_long", f"{field}: {chars} characters in all, over the limit of {limits.max_chars} "
                      "(--max-job-chars)", field)
    seconds = sum(item.seconds for item in items)
    if seconds > limits.max_audio_seconds:
        raise _refuse("invalid_request", f"{field}: about {seconds:.0f} s of audio in all, over the limit of "
                      f"{limits.max_audio_seconds:g} s (--max-job-audio-seconds)", field)
    voices: dict[str, str] = {}
    for k, item in enumerate(items):
        if item.voice is not None:
            voices.setdefault(item.voice, f"items[{k}].voice" if field == "items" else "voice")
    return ParsedJob(tuple(items), False, voices)


def parse_json(body: bytes, limits: JobLimits) -> ParsedJob:
    """`{"items": [...]}` or `{"input": LONG_TEXT, ...}`; `ProtocolError` otherwise."""
    raw = p.decode_json(body)
    if not isinstance(raw, dict):
        raise _refuse("bad_message", "the body must be a JSON object", None)
    if "items" in raw and "input" in raw:
        raise _refuse("invalid_request", "items: give items, or one long text as input, not both", "items")
    if "input" in raw:
        return _long_text(raw, limits)
    try:
        job = msgspec.convert(raw, ItemsBody)
    except msgspec.ValidationError as exc:
        field, message = describe_validation_error(exc, _RULES, target=ItemsBody)
        if field == "items" and message.endswith("required"):
            message = "items: required (a list of speech bodies), or one long text as input"
        raise _refuse("invalid_request", message, field) from None
    if len(job.items) > limits.max_items:  # before any item is read
        raise _refuse("invalid_request", f"items: {len(job.items)} items; a job has 1..{limits.max_items} "
                      "(--max-job-items)", "items")
    return _totals([_item(raw_item, k, job.response_format, limits) for k, raw_item in enumerate(job.items)],
                   limits, "items")


def _long_text(raw: dict, limits: JobLimits) -> ParsedJob:
    req = _speech(raw, "")
    if len(req.input) > limits.max_chars:
        raise _refuse("text_too_long", f"input: {len(req.input)} characters, over the limit of {limits.max_chars} "
                      "(--max-job-chars)", "input")
    try:
        check_sizes(req, None, limits.max_instructions_chars)
    except p.ProtocolError as exc:
        raise _refuse(exc.code, exc.message, exc.field) from None
    if not has_visible_text(req.input):
        raise _refuse("invalid_request", "input: must not be empty (nothing but spaces or invisible characters)",
                      "input")
    chained = req.voice_name is None
    size = min(limits.item_chars, limits.max_text_chars or limits.item_chars)
    texts = split_text(req.input, size, limits.first_item_chars if chained else None)
    parsed = _totals([_work(req, raw, text, None) for text in texts], limits, "input")
    return ParsedJob(parsed.items, chained, parsed.voices)


def parse_jsonl(body: bytes, job_format: str | None, limits: JobLimits) -> ParsedJob:
    """One speech body (or OpenAI batch request) a line; blank lines are skipped."""
    if job_format is not None and job_format not in FORMATS:
        raise _refuse("invalid_request", f"response_format: {_RULES['response_format']}", "response_format")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _refuse("bad_message", f"the body is not UTF-8 (byte {exc.start})", None) from None
    items: list[ItemWork] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if len(items) >= limits.max_items:
            raise _refuse("invalid_request", f"line {number}: a job has 1..{limits.max_items} items "
                          "(--max-job-items)", "items")
        try:
            raw = p.decode_json(line)
        except p.ProtocolError as exc:
            raise _refuse(exc.code, f"line {number}: {exc.message}", f"items[{len(items)}]") from None
        items.append(_item(_batch_body(raw, len(items), number), len(items), job_format, limits, number))
    return _totals(items, limits, "items")


def _batch_body(raw: Any, k: int, number: int) -> Any:
    """An OpenAI batch request line's `body` (its `url` must be the speech endpoint); else the line."""
    if not (isinstance(raw, dict) and "body" in raw and ("custom_id" in raw or "url" in raw)):
        return raw
    url = raw.get("url", "/v1/audio/speech")
    if url != "/v1/audio/speech" or raw.get("method", "POST") != "POST":
        raise _refuse("invalid_request", f"line {number}: a batch line must be POST /v1/audio/speech, not "
                      f"{raw.get('method', 'POST')} {url}", f"items[{k}].url")
    return raw["body"]
