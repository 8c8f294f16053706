"""Clients made from what the server says of itself: the real `openai` client reads `/v1/models`,
and a real generator (`openapi-python-client`, from the dev extra) makes a Python client from
`/schema/openapi.json` that then speaks through `/v1/audio/speech` against a real server."""

from __future__ import annotations

import importlib
import io
import json
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
import soundfile as sf

KEY = "generated-client-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
TEXT = "A client generated from the schema."
KNOBS = {"num_step": 8, "seed": 31, "normalize_text": False}  # the client is tested here, not the normaliser
AUDIO_TYPES = ("audio/mpeg", "audio/ogg", "audio/aac", "audio/flac", "audio/wav", "audio/pcm")
GENERATOR_CONFIG = """\
project_name_override: chorus-generated
package_name_override: chorus_generated
post_hooks: []
content_type_overrides:
"""


@pytest.fixture(scope="module")
def keyed_server(start_inproc, tmp_path_factory):
    server = start_inproc(tmp_path_factory.mktemp("openapi-client"), "--api-key", KEY)
    yield server
    server.stop()


def test_models_as_the_openai_client_reads_them(chorus_server):
    client = openai.OpenAI(base_url=chorus_server.url + "/v1", api_key="unused", max_retries=0)
    listed = client.models.list().data
    checkpoint = chorus_server.engine.model_name
    assert [(m.id, m.object, m.owned_by, m.checkpoint) for m in listed] == [("omnivoice", "model", "chorus",
                                                                              checkpoint)]
    for name in ("omnivoice", checkpoint, "tts-1", "tts-1-hd", "gpt-4o-mini-tts", "gpt-4o-mini-tts-2025-03-20"):
        card = client.models.retrieve(name)
        assert (card.id, card.checkpoint, card.created) == ("omnivoice", checkpoint, listed[0].created), name
    for name in ("whisper-1", "gpt-4o", "Omnivoice", "tts-1-2025"):
        with pytest.raises(openai.NotFoundError) as failed:
            client.models.retrieve(name)
        error = failed.value.body
        assert (error["code"], error["type"], error["param"], error["field"]) == (
            "model_not_found", "invalid_request_error", "model", "model"), name
        assert repr(name) in error["message"] and "'omnivoice'" in error["message"]


def test_schema_declares_bodies_errors_and_media_types(keyed_server):
    schema = httpx.get(keyed_server.url + "/schema/openapi.json", headers=AUTH).json()
    paths, components = schema["paths"], schema["components"]["schemas"]
    assert not any(path.startswith("/schema") for path in paths)  # the framework's own routes are hidden
    speech = paths["/v1/audio/speech"]["post"]
    assert speech["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/SpeechRequest"}
    body = components["SpeechRequest"]
    assert body["required"] == ["input"] and body["additionalProperties"] is False
    assert (body["properties"]["num_step"]["minimum"], body["properties"]["num_step"]["maximum"]) == (1, 64)
    assert set(speech["responses"]["200"]["content"]) == {*AUDIO_TYPES, "text/event-stream"}
    for status in ("400", "401", "404", "413", "422", "500", "503"):
        assert speech["responses"][status]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/ErrorBody"}, status
    assert speech["responses"]["503"]["headers"]["Retry-After"]["required"] is True
    assert components["ErrorDetail"]["required"] == ["code", "message"]
    upload = paths["/v1/voices"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert upload["required"] == ["audio"] and upload["properties"]["audio"]["format"] == "binary"
    assert paths["/v1/voices"]["post"]["responses"]["201"]["links"]["getVoice"]["operationId"] == "getVoice"
    assert paths["/v1/pronunciations"]["post"]["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/NewPronunciation"}
    metrics = paths["/metrics"]["get"]
    (declared,) = metrics["responses"]["200"]["content"]
    sent = httpx.get(keyed_server.url + "/metrics").headers["content-type"]
    assert declared.startswith("text/plain; version=") and sent.startswith(declared) and metrics["security"] == []
    assert paths["/v1/voices"]["get"]["security"] == [{"bearer": []}]
    for name in ("WebSocketClientMessage", "WebSocketServerMessage", "Synthesize", "StreamOpen", "Ready", "Done",
                 "ErrorMsg", "WordsMsg", "SegmentMsg", "SpeechEvent"):
        assert name in components, name
    assert components["Synthesize"]["properties"]["type"] == {"enum": ["synthesize"]}


def _as_bytes(schema: dict) -> set[str]:
    """The media types a generated client passes as plain bytes (the generator reads JSON, text
    and forms itself; anything else, audio and the rest, it is told is octets)."""
    found = set()
    for item in schema["paths"].values():
        for operation in item.values():
            contents = [operation.get("requestBody", {}).get("content", {}),
                        *(response.get("content") or {} for response in operation.get("responses", {}).values())]
            for media in (media for content in contents for media in content):
                base = media.split(";")[0].strip()
                if not (base == "application/json" or base.endswith("+json") or base.startswith("text/")
                        or base == "multipart/form-data"):
                    found.add(media)
    return found


def _generate(schema_text: str, folder: Path) -> Path:
    (folder / "openapi.json").write_text(schema_text)
    binary = _as_bytes(json.loads(schema_text))
    assert binary >= set(AUDIO_TYPES)
    (folder / "config.yaml").write_text(GENERATOR_CONFIG + "".join(f"  {media}: application/octet-stream\n"
                                                                   for media in sorted(binary)))
    generator = Path(sys.executable).parent / "openapi-python-client"
    done = subprocess.run([str(generator), "generate", "--path", "openapi.json", "--config", "config.yaml",
                           "--meta", "none", "--output-path", "chorus_generated", "--fail-on-warning"],
                          cwd=folder, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return folder


def test_a_generated_client_speaks(keyed_server, tmp_path):
    schema_text = httpx.get(keyed_server.url + "/schema/openapi.json", headers=AUTH).text
    sys.path.insert(0, str(_generate(schema_text, tmp_path)))
    try:
        generated = importlib.import_module("chorus_generated")
        speech = importlib.import_module("chorus_generated.api.audio.create_speech")
        models = importlib.import_module("chorus_generated.models")
        voices = importlib.import_module("chorus_generated.api.voices.get_voice")
        with generated.AuthenticatedClient(base_url=keyed_server.url, token=KEY, timeout=120) as client:
            answer = speech.sync_detailed(client=client, body=models.SpeechRequest(
                input_=TEXT, voice="alloy", response_format=models.SpeechRequestResponseFormat.WAV, **KNOBS))
            refused = speech.sync_detailed(client=client, body=models.SpeechRequest(input_=TEXT, num_step=0))
            missing = voices.sync_detailed("no-such-voice", client=client)
    finally:
        sys.path.remove(str(tmp_path))
        for name in [name for name in sys.modules if name.split(".")[0] == "chorus_generated"]:
            del sys.modules[name]
    assert answer.status_code == 200 and answer.headers["content-type"] == "audio/wav"
    samples, rate = sf.read(answer.parsed.payload, dtype="int16")
    assert rate == 24000 and len(samples) > rate // 4
    direct = httpx.post(keyed_server.url + "/v1/audio/speech", headers=AUTH, timeout=120, json={
        "input": TEXT, "voice": "alloy", "response_format": "wav", **KNOBS})
    assert sf.read(io.BytesIO(direct.content), dtype="int16")[0].tobytes() == samples.tobytes()
    # errors arrive parsed as the schema's envelope
    assert refused.status_code == 422 and refused.parsed.error.field == "num_step"
    assert refused.parsed.error.code.value == "invalid_request"
    assert missing.status_code == 404 and missing.parsed.error.code.value == "voice_not_found"
