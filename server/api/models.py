"""`/v1/models`: OpenAI's model list and `models.retrieve`, for clients that ask first.

One model is served, under the stable id `omnivoice` whatever the checkpoint (`checkpoint`
names it: `k2-fsa/OmniVoice`, a local folder, `omnivoice-random-demo`). `retrieve` answers the
same card for the names a client may hold for it: `omnivoice`, the checkpoint's own name, and
OpenAI's speech model names (`tts-1`, `tts-1-hd`, `gpt-4o-mini-tts`, with or without a dated
snapshot suffix such as `-2025-03-20`). Any other id is 404 in OpenAI's error shape. (The speech
endpoint takes any `model` at all: a client that never asks must not be refused.)
"""

from __future__ import annotations

import re
import time
from typing import Literal

import msgspec
from litestar import Response, get
from litestar.openapi.datastructures import ResponseSpec

from server.api.schema_parts import documented
from server.turns.service import SynthesisService

STARTED_AT = int(time.time())
MODEL_ID = "omnivoice"
OPENAI_SPEECH_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
_SNAPSHOT = re.compile(r"-\d{4}-\d{2}-\d{2}\Z")


class ModelCard(msgspec.Struct, kw_only=True):
    id: str
    checkpoint: str  # the served checkpoint: a hub id, a local folder, or the random demo's name
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "chorus"


class ModelList(msgspec.Struct):
    data: list[ModelCard]
    object: Literal["list"] = "list"


def names_the_model(model_id: str, checkpoint: str) -> bool:
    """Whether `retrieve(model_id)` answers the served model (see the module's docstring)."""
    if model_id in (MODEL_ID, checkpoint.lstrip("/"), checkpoint):
        return True
    return _SNAPSHOT.sub("", model_id) in OPENAI_SPEECH_MODELS


def _card(service: SynthesisService) -> ModelCard:
    return ModelCard(id=MODEL_ID, checkpoint=service.model_name, created=STARTED_AT)


@get("/models", operation_id="listModels", tags=["models"], **documented())
async def list_models(service: SynthesisService) -> ModelList:
    """OpenAI's model list: the served model, as `omnivoice` (its `checkpoint` beside). Any
    `model` name is accepted by the speech endpoint (clients send `tts-1`, `gpt-4o-mini-tts`...);
    all of them mean this one."""
    return ModelList([_card(service)])


@get("/models/{model_id:path}", operation_id="retrieveModel", tags=["models"], **documented(
    404, model_404=True, specs={200: ResponseSpec(ModelCard, description="the served model", generate_examples=False)}))
async def retrieve_model(model_id: str, service: SynthesisService) -> ModelCard | Response:
    """OpenAI's `models.retrieve`: the served model's card (id `omnivoice`) for `omnivoice`, the
    checkpoint's name (it may hold slashes, as `k2-fsa/OmniVoice`), or OpenAI's speech model
    names (`tts-1`, `tts-1-hd`, `gpt-4o-mini-tts`, also with a dated suffix); any other id is 404
    in OpenAI's error shape (`model_not_found`, with OpenAI's `type` and `param` beside Chorus's
    `field`)."""
    model_id = model_id.lstrip("/")
    if not names_the_model(model_id, service.model_name):
        message = (f"model: no model {model_id!r}; this server serves {MODEL_ID!r} (checkpoint "
                   f"{service.model_name!r}), also known as {', '.join(OPENAI_SPEECH_MODELS)}")
        return Response({"error": {"code": "model_not_found", "message": message, "field": "model",
                                   "type": "invalid_request_error", "param": "model"}}, status_code=404)
    return _card(service)
