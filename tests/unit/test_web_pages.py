"""The demo page's routes without a browser or a model: context, notice, static files, no torch."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from litestar import Litestar
from litestar.testing import TestClient

from server.api.pages import template_config, web_route_handlers
from server.config import ServerConfig


def page_app(**settings) -> Litestar:
    cfg = ServerConfig()
    for name, value in settings.items():
        setattr(cfg, name, value)
    return Litestar(route_handlers=web_route_handlers(cfg), template_config=template_config())


def boot(html: str) -> dict:
    found = re.search(r'<script type="application/json" id="chorus-boot">(.*?)</script>', html, re.S)
    assert found
    return json.loads(found.group(1))


def test_demo_checkpoint_page_says_so():
    app = page_app(demo_model=True, model_name="omnivoice-random-demo", max_text_chars=1234)
    with TestClient(app, base_url="http://test.localhost") as client:
        res = client.get("/")
    assert res.status_code == 200
    assert res.headers["content-type"].startswith("text/html")
    assert 'id="demo-notice"' in res.text and "its audio is noise" in res.text
    data = boot(res.text)
    assert data["demo_model"] is True
    assert data["model"] == "omnivoice-random-demo"
    assert data["limits"]["max_text_chars"] == 1234
    assert data["api_key_required"] is False and data["api_key"] is None
    assert "0 / 1234" in res.text


def test_real_model_page_has_no_notice_and_asks_for_a_key():
    app = page_app(demo_model=False, model_name="OmniVoice", api_key="k")
    with TestClient(app, base_url="http://test.localhost") as client:
        res = client.get("/")
    assert 'id="demo-notice"' not in res.text
    data = boot(res.text)
    assert data["api_key_required"] is True
    assert data["api_key"] is None  # the key itself is never put in the page unless configured to
    assert "data-required" in res.text


def test_model_name_cannot_break_out_of_the_page():
    name = "</script><script>alert(1)</script>"
    with TestClient(page_app(model_name=name), base_url="http://test.localhost") as client:
        res = client.get("/")
    assert "<script>alert(1)" not in res.text
    assert boot(res.text)["model"] == name


def test_static_files_are_served_with_their_types():
    with TestClient(page_app(), base_url="http://test.localhost") as client:
        for path, kind in [("/static/app.js", "javascript"), ("/static/chorus.css", "text/css"),
                           ("/static/recorder-worklet.js", "javascript"), ("/static/favicon.svg", "image/svg")]:
            res = client.get(path)
            assert res.status_code == 200, path
            assert kind in res.headers["content-type"], (path, res.headers["content-type"])
        assert client.get("/static/nope.js").status_code == 404


def test_page_references_only_local_assets():
    with TestClient(page_app(), base_url="http://test.localhost") as client:
        html = client.get("/").text
    assert not re.search(r'(src|href)="(https?:)?//', html)


def test_web_layer_does_not_import_torch():
    code = "import sys, server.api.pages; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
