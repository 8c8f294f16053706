"""Built-in voices under OpenAI's names (alloy, ash, ... cedar): one name, one speaker.

Each name has a fixed voice-design instruct, seed and sentence. The first time a name is
used, the engine speaks the sentence in that design (a fixed length, the seed fixed) and
encodes the result as a voice prompt, exactly as an uploaded clip would be; from then on
every request that names it is a clone of that prompt. The prompt is kept in the voice
store under the model's name (`save_builtin`: the first writer wins), so restarts and
replicas sharing a store reuse the very same tokens, and concurrent first requests in one
process wait on one making.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from server.audio.files import DecodedAudio
from server.engine.types import ChunkAudio, Finished, GenerationOptions, SynthesisRequest, VoicePrompt
from server.errors import ServiceError
from server.voices.store import VoiceInfo, VoiceLibrary

log = logging.getLogger("chorus.voices")

DESIGN_VERSION = 1  # bump when a design, seed or sentence changes: stored prompts are then remade
SENTENCE = "The quick brown fox jumps over the lazy dog, while the morning light fills the quiet room."
SECONDS = 5.0


@dataclass(frozen=True)
class Design:
    instruct: str
    seed: int


DESIGNS: dict[str, Design] = {
    "alloy": Design("female, young adult, moderate pitch, american accent", 1101),
    "ash": Design("male, young adult, low pitch, american accent", 1102),
    "ballad": Design("male, young adult, high pitch, british accent", 1103),
    "coral": Design("female, young adult, high pitch, american accent", 1104),
    "echo": Design("male, young adult, moderate pitch, american accent", 1105),
    "fable": Design("male, middle-aged, moderate pitch, british accent", 1106),
    "nova": Design("female, young adult, moderate pitch, british accent", 1107),
    "onyx": Design("male, middle-aged, very low pitch, american accent", 1108),
    "sage": Design("female, middle-aged, low pitch, american accent", 1109),
    "shimmer": Design("female, teenager, very high pitch, american accent", 1110),
    "verse": Design("male, young adult, moderate pitch, canadian accent", 1111),
    "marin": Design("female, young adult, moderate pitch, australian accent", 1112),
    "cedar": Design("male, elderly, low pitch, american accent", 1113),
}
BUILTIN_NAMES = frozenset(DESIGNS)


def store_key(model_key: str, name: str) -> str:
    return f"{model_key}/{name}/v{DESIGN_VERSION}"


def model_key(model: str | None, model_name: str) -> str:
    """What built-in voices are kept under: the model's name, plus for a local folder a hash
    of its config and the first MiB of each weights file (random demo checkpoints share a
    name, not weights). A hub id is its own key."""
    folder = Path(model) if model else None
    if folder is None or not folder.is_dir():
        return model or model_name
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.json")) + sorted(folder.glob("*.safetensors")):
        digest.update(path.name.encode())
        with open(path, "rb") as f:
            digest.update(f.read(1 << 20))
    return f"{model_name}-{digest.hexdigest()[:16]}"


def builtin_info(name: str, seconds: float = SECONDS) -> VoiceInfo:
    """How `/v1/voices` lists a built-in voice (its id is its name)."""
    return VoiceInfo(id=name, name=name.capitalize(), text=SENTENCE, seconds=round(seconds, 3), created_at=0,
                     builtin=True)


class Speaker(Protocol):
    """What the built-in voices need of the service (`server.turns.service.SynthesisService`)."""

    model_name: str
    frame_rate: float
    library: VoiceLibrary

    async def submit(self, request: SynthesisRequest, deliver, endpoint: str) -> object: ...

    async def encode_voice(self, audio: DecodedAudio, text: str | None) -> VoicePrompt: ...


class BuiltinVoices:
    """The built-in voices of one service: made on first use, then held in memory."""

    def __init__(self, service: Speaker):
        self._service = service
        self.model_key = service.model_name  # the app sets `model_key(...)` once it knows the folder
        self._made: dict[str, VoicePrompt] = {}
        self._making: dict[str, asyncio.Task] = {}

    def infos(self) -> list[VoiceInfo]:
        frame_rate = self._service.frame_rate
        out = []
        for name in DESIGNS:
            prompt = self._made.get(name)
            out.append(builtin_info(name, prompt.num_frames / frame_rate) if prompt and frame_rate else
                       builtin_info(name))
        return out

    async def get(self, name: str) -> VoicePrompt:
        """The prompt of a built-in name, made (or loaded from the store) once."""
        if (prompt := self._made.get(name)) is not None:
            return prompt
        task = self._making.get(name)
        if task is None:
            task = self._making[name] = asyncio.ensure_future(self._load_or_make(name))
        try:
            prompt = await asyncio.shield(task)
        finally:
            if task.done():
                self._making.pop(name, None)
        self._made[name] = prompt
        return prompt

    async def _load_or_make(self, name: str) -> VoicePrompt:
        from server.engine.model.voice_codec import voice_from_bytes, voice_to_bytes  # lazy: no torch in the web layer

        service, key = self._service, store_key(self.model_key, name)
        blob = await asyncio.to_thread(service.library.load_builtin, key)
        if blob is None:
            prompt = await self._make(name)
            blob = await asyncio.to_thread(service.library.save_builtin, key, voice_to_bytes(prompt))
            log.info("built-in voice made", extra={"voice": name, "frames": prompt.num_frames})
        return await asyncio.to_thread(voice_from_bytes, blob)

    async def _make(self, name: str) -> VoicePrompt:
        """Speak the sentence in the name's design, then encode it as a clone reference."""
        design, service = DESIGNS[name], self._service
        done = asyncio.get_running_loop().create_future()
        parts: list[ChunkAudio] = []

        def deliver(event) -> None:
            if isinstance(event, ChunkAudio):
                parts.append(event)
            elif isinstance(event, Finished) and not done.done():
                done.set_result(event)

        request = SynthesisRequest(
            request_id=f"builtin-{name}-{id(done):x}", text=SENTENCE, language="en", instruct=design.instruct,
            stream="whole", options=GenerationOptions(seed=design.seed, duration=SECONDS), progress=False)
        await service.submit(request, deliver, "builtin")
        finished: Finished = await done
        if finished.outcome != "done" or len(parts) != 1:
            raise ServiceError("internal", f"voice: the built-in voice {name!r} could not be made "
                               f"({finished.outcome}: {finished.message})")
        audio = DecodedAudio(parts[0].audio, parts[0].sample_rate)
        return await service.encode_voice(audio, SENTENCE)
