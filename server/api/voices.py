"""`/v1/voices`: upload a reference clip once (encoded with the codec, stored), list, delete."""

from __future__ import annotations

import asyncio

import msgspec
from litestar import Request, delete, get, post
from litestar.datastructures import UploadFile
from litestar.openapi.spec import Encoding, OpenAPIMediaType, RequestBody, Schema

from server.api.auth import owner_of
from server.api.errors import ApiError
from server.api.schema_parts import documented, link
from server.audio.files import AudioError, decode_audio, decode_in_thread
from server.config import ServerConfig
from server.turns.service import SHUTTING_DOWN, ServiceError, SynthesisService
from server.voices import VoiceInfo
from server.voices.builtin import BUILTIN_NAMES
from server.voices.store import name_problem

MAX_NAME_CHARS = 100


class VoiceList(msgspec.Struct):
    voices: list[VoiceInfo]


def _form_text(form, name: str) -> str | None:
    values = form.getall(name) if name in form else []
    if len(values) > 1:
        raise ApiError("invalid_request", f"{name}: given {len(values)} times; send it once", field=name)
    value = values[0] if values else None
    if value is None:
        return None
    if not isinstance(value, str):
        raise ApiError("invalid_request", f"{name}: must be a text field, not a file")
    return value


_UPLOAD = RequestBody(required=True, content={"multipart/form-data": OpenAPIMediaType(
    schema=Schema(type="object", required=["audio"], properties={
        "audio": Schema(type="string", format="binary", description="the clip: a wav, flac, ogg or mp3 file"),
        "text": Schema(type="string", description="its transcript"),
        "name": Schema(type="string", min_length=1, max_length=MAX_NAME_CHARS,
                       description="a display name, unique without case (no control or formatting characters)"),
    }),
    encoding={"audio": Encoding(content_type="audio/wav, audio/flac, audio/ogg, audio/mpeg, application/octet-stream")},
)})
_VOICE_LINKS = {"getVoice": link("getVoice", "voice_id"), "deleteVoice": link("deleteVoice", "voice_id")}


@post("/voices", status_code=201, operation_id="createVoice", tags=["voices"],
      **documented(409, 413, 415, 422, body=_UPLOAD, links=_VOICE_LINKS))
async def create_voice(request: Request, service: SynthesisService, config: ServerConfig) -> VoiceInfo:
    """Upload a voice: multipart `audio` (wav, flac, ogg or mp3), its `text` transcript, an
    optional `name` (unique: a name already taken is refused with 409)."""
    if service.draining:
        raise ApiError("busy", SHUTTING_DOWN)
    if request.content_type[0] != "multipart/form-data":
        raise ApiError("invalid_request", "send multipart/form-data: an `audio` file (wav, flac, ogg or mp3), "
                       "its `text` transcript, and optionally a `name`", status=415)
    form = await request.form()
    upload = form.get("audio")
    if not isinstance(upload, UploadFile):
        raise ApiError("invalid_request", "audio: required, a wav, flac, ogg or mp3 file")
    text, name = _form_text(form, "text"), _form_text(form, "name")
    if text is not None and len(text) > config.max_text_chars:
        raise ApiError("text_too_long", f"text: over the limit of {config.max_text_chars} characters")
    if name is not None and (problem := name_problem(name, MAX_NAME_CHARS)):
        raise ApiError("invalid_request", problem, field="name")
    if name is not None and name.strip().casefold() in BUILTIN_NAMES:
        raise ApiError("name_taken", f"name: {name.strip()!r} is the name of a built-in voice; choose another "
                       "name", field="name")
    data = await upload.read()
    limits = service.voices.audio_limits
    try:
        audio = await decode_in_thread(decode_audio, data, "audio", limits, what="audio", limits=limits)
    except AudioError as exc:
        raise ApiError("invalid_request", str(exc), status=415 if exc.unsupported else 422) from None
    try:
        return await service.voices.add(audio, text, name.strip() if name else None)
    except ServiceError as exc:
        raise ApiError(exc.code, exc.message, field=exc.field) from None


@get("/voices", operation_id="listVoices", tags=["voices"], **documented())
async def list_voices(request: Request, service: SynthesisService, config: ServerConfig) -> VoiceList:
    """The built-in voices (OpenAI's names, `"builtin": true`) first, then the uploaded ones,
    then those this caller's API key kept (`keep_voice`: `"kept": true` and their `expires_at`;
    without API keys, kept voices are listed to nobody: their ids are their owners' secret)."""
    library = await asyncio.to_thread(service.library.list, owner_of(request, config.api_keys))
    uploaded = [voice for voice in library if not voice.kept]
    return VoiceList(service.builtins.infos() + uploaded + [voice for voice in library if voice.kept])


@get("/voices/{voice_id:str}", operation_id="getVoice", tags=["voices"], **documented(404))
async def get_voice(request: Request, voice_id: str, service: SynthesisService, config: ServerConfig) -> VoiceInfo:
    """One voice by its id (a built-in name too; a kept voice only to its owner)."""
    if voice_id in BUILTIN_NAMES:
        return next(info for info in service.builtins.infos() if info.id == voice_id)
    info = await asyncio.to_thread(service.library.get, voice_id, owner_of(request, config.api_keys))
    if info is None:
        raise ApiError("voice_not_found", f"voice: no voice {voice_id!r} in the library")
    return info


@delete("/voices/{voice_id:str}", status_code=204, operation_id="deleteVoice", tags=["voices"], **documented(404))
async def delete_voice(request: Request, voice_id: str, service: SynthesisService, config: ServerConfig) -> None:
    """Delete a library voice (built-in voices cannot be deleted: 403; a kept voice only by its
    owner). It stops working on every replica within `--voice-cache-seconds`."""
    if voice_id in BUILTIN_NAMES:
        raise ApiError("invalid_request", f"voice: {voice_id!r} is a built-in voice; built-in voices "
                       "cannot be deleted", status=403)
    if not await service.voices.delete(voice_id, owner_of(request, config.api_keys)):
        raise ApiError("voice_not_found", f"voice: no voice {voice_id!r} in the library")
