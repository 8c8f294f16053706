"""`GET /v1/models/{id}` with the real `openai` client, and the HTTP API's own OpenAPI schema
and page at `/schema`, behind the API key like the rest of `/v1`."""

from __future__ import annotations

import httpx
import openai
import pytest

KEY = "schema-test-key"


@pytest.fixture(scope="module")
def keyed_server(start_inproc, tmp_path_factory):
    server = start_inproc(tmp_path_factory.mktemp("schema"), "--api-key", KEY)
    yield server
    server.stop()


def test_models_retrieve_names_the_served_model(chorus_server):
    client = openai.OpenAI(base_url=chorus_server.url + "/v1", api_key="unused", max_retries=0)
    served = client.models.list().data[0]
    model = client.models.retrieve(served.id)
    assert (model.id, model.object, model.owned_by, model.created) == (served.id, "model", "chorus", served.created)
    with pytest.raises(openai.NotFoundError) as failed:
        client.models.retrieve("whisper-1")  # OpenAI's, but no speech model
    error = failed.value.body
    assert error["code"] == "model_not_found" and "whisper-1" in error["message"]
    assert (error["type"], error["param"], error["field"]) == ("invalid_request_error", "model", "model")
    assert served.id in error["message"]


def test_schema_describes_the_http_api_behind_the_key(keyed_server):
    url = keyed_server.url
    for path in ("/schema", "/schema/openapi.json", "/schema/swagger"):
        refused = httpx.get(url + path)
        assert refused.status_code == 401, path
        assert refused.json()["error"]["code"] == "unauthorized"
    schema = httpx.get(url + "/schema/openapi.json", headers={"Authorization": f"Bearer {KEY}"}).json()
    paths = schema["paths"]
    for path in ("/v1/audio/speech", "/v1/voices", "/v1/voices/{voice_id}", "/v1/models", "/v1/models/{model_id}"):
        assert path in paths, (path, sorted(paths))
    assert "/" not in paths and not any(p.startswith("/static") for p in paths)  # the page is not API
    assert "OpenAI" in paths["/v1/audio/speech"]["post"]["description"]  # docstrings describe routes
    assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"


def test_schema_page_is_whole_without_the_network(keyed_server):
    page = httpx.get(keyed_server.url + "/schema", params={"api_key": KEY})
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    text = page.text
    assert "<script" not in text and "https://" not in text  # nothing to fetch from elsewhere
    assert "/v1/audio/speech" in text and "/v1/voices/{voice_id}" in text
    assert f'href="/schema/openapi.json?api_key={KEY}"' in text  # its links carry the key on
    linked = httpx.get(keyed_server.url + f"/schema/openapi.json?api_key={KEY}")
    assert linked.status_code == 200 and linked.json()["info"]["title"] == "Chorus"
