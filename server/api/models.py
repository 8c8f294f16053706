"""`/v1/models`: OpenAI's model list and `models.retrieve`, for clients that ask first."""

from __future__ import annotations

import time

import msgspec
from litestar import Response, get

from server.turns.service import SynthesisService

STARTED_AT = int(time.time())


class ModelCard(msgspec.Struct):
    id: str
    object: str = "model"
    created: int = 0
    owned_by: str = "chorus"


class ModelList(msgspec.Struct):
    data: list[ModelCard]
    object: str = "list"


@get("/models")
async def list_models(service: SynthesisService) -> ModelList:
    """OpenAI's model list: the served model. Any `model` name is accepted by the speech
    endpoint (clients send `tts-1`, `gpt-4o-mini-tts`...); all of them mean this one."""
    return ModelList([ModelCard(service.model_name, created=STARTED_AT)])


@get("/models/{model_id:path}")
async def retrieve_model(model_id: str, service: SynthesisService) -> ModelCard | Response:
    """OpenAI's `models.retrieve`: the served model by its id (ids hold slashes, as
    `k2-fsa/OmniVoice`); any other id is 404 in OpenAI's error shape (`model_not_found`,
    with OpenAI's `type` and `param` beside Chorus's `field`)."""
    model_id = model_id.lstrip("/")
    if model_id != service.model_name:
        message = f"model: no model {model_id!r}; this server serves {service.model_name!r}"
        return Response({"error": {"code": "model_not_found", "message": message, "field": "model",
                                   "type": "invalid_request_error", "param": "model"}}, status_code=404)
    return ModelCard(service.model_name, created=STARTED_AT)
