"""`/v1/pronunciations`: the lexicon. A word or phrase and what to say instead (other words,
or a CMU form in brackets), for every voice or for one (`server.text.lexicon`); stored with
the voice library, applied to every request's text before synthesis."""

from __future__ import annotations

import asyncio

import msgspec
from litestar import Request, delete, get, post

from server.api.errors import ApiError
from server.api.schema_parts import documented, json_body, link
from server.config import ServerConfig
from server.text.lexicon import Pronunciation, entry_problem, normal_say, normal_text
from server.turns.service import SynthesisService
from server.voices import LibraryFull, PronunciationTaken
from server.voices.builtin import BUILTIN_NAMES
from server.wire import messages as p


class NewPronunciation(msgspec.Struct, forbid_unknown_fields=True):
    text: str
    say: str
    voice: str | None = None


class PronunciationList(msgspec.Struct):
    pronunciations: list[Pronunciation]


@get("/pronunciations", operation_id="listPronunciations", tags=["pronunciations"], **documented())
async def list_pronunciations(service: SynthesisService) -> PronunciationList:
    """Every entry, oldest first."""
    return PronunciationList(await asyncio.to_thread(service.library.list_pronunciations))


@post("/pronunciations", status_code=201, operation_id="addPronunciation", tags=["pronunciations"],
      **documented(404, 409, 413, 422, body=json_body("NewPronunciation", "a word or phrase and what to say instead"),
                   links={"deletePronunciation": link("deletePronunciation", "entry_id")}))
async def add_pronunciation(request: Request, service: SynthesisService, config: ServerConfig) -> Pronunciation:
    """A new entry: JSON `{"text": WORD_OR_PHRASE, "say": REPLACEMENT_OR_[CMU FORM], "voice":
    null or a voice id}`; 409 when the text already has one for that voice."""
    try:
        new = msgspec.convert(p.decode_json(await request.body()), NewPronunciation)
    except p.ProtocolError as exc:
        raise ApiError(exc.code, exc.message) from None
    except msgspec.ValidationError as exc:
        field, message = p.describe_validation_error(exc, {}, target=NewPronunciation)
        raise ApiError("invalid_request", message, field=field) from None
    text, say = normal_text(new.text), normal_say(new.say)
    if (problem := entry_problem(text, say)) is not None:
        raise ApiError("invalid_request", problem[1], field=problem[0])
    voice = new.voice
    if voice is not None and voice.strip().lower() in BUILTIN_NAMES:
        voice = voice.strip().lower()  # as requests name it: `ALLOY` is `alloy`
    elif voice is not None and await asyncio.to_thread(service.library.get, voice) is None:
        raise ApiError("voice_not_found", f"voice: no voice {voice!r} (give a voice's id, or null for every "
                       "voice)", field="voice")
    try:
        entry = await asyncio.to_thread(service.library.add_pronunciation, text, say, voice, config.max_pronunciations)
    except PronunciationTaken as exc:
        raise ApiError("name_taken", str(exc), field="text") from None
    except LibraryFull as exc:
        raise ApiError("invalid_request", str(exc), field="text") from None
    service.text.changed()
    return entry


@delete("/pronunciations/{entry_id:str}", status_code=204, operation_id="deletePronunciation",
        tags=["pronunciations"], **documented(404))
async def delete_pronunciation(entry_id: str, service: SynthesisService) -> None:
    """Delete an entry."""
    if not await asyncio.to_thread(service.library.delete_pronunciation, entry_id):
        raise ApiError("invalid_request", f"no pronunciation {entry_id!r}", status=404)
    service.text.changed()
