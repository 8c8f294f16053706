"""The HTTP API's own description: Litestar's OpenAPI schema at `/schema/openapi.json` and a
browsable page at `/schema`, both behind the API key like the rest of `/v1`.

The page is rendered here, on the server, from the schema itself: plain HTML and CSS with no
script and nothing fetched from elsewhere, so it works where the browser reaches no CDN (the
renderers Litestar ships, Swagger UI, ReDoc and the rest, load their code from one). Swagger
UI is still offered at `/schema/swagger` for browsers that are online. With `?api_key=KEY`
in the page's address, its links carry the key on.
"""

from __future__ import annotations

import html
import json
from typing import Any
from urllib.parse import quote

from litestar import Request, Router
from litestar.openapi.config import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin, OpenAPIRenderPlugin, SwaggerRenderPlugin
from litestar.openapi.spec import SecurityScheme

from server.api.auth import require_api_key
from server.api.pronunciations import NewPronunciation
from server.api.schema_parts import WireComponents, wire_schemas

_METHODS = ("get", "post", "put", "patch", "delete")
_STYLE = """
body{font:15px/1.5 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}
h1{margin-bottom:.2rem} .op{border:1px solid #ddd;border-radius:6px;margin:1rem 0;padding:.6rem 1rem}
.method{display:inline-block;min-width:4.5rem;font-weight:700;text-transform:uppercase}
.get{color:#1a7f37}.post{color:#0969da}.delete{color:#cf222e} code,pre{font-family:ui-monospace,monospace}
pre{background:#f6f8fa;padding:.6rem;overflow:auto;font-size:13px} .desc{white-space:pre-wrap}
table{border-collapse:collapse} td,th{border:1px solid #ddd;padding:.2rem .5rem;text-align:left}
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _parameters(operation: dict[str, Any]) -> str:
    rows = [f"<tr><td><code>{_e(p.get('name'))}</code></td><td>{_e(p.get('in'))}</td>"
            f"<td>{'yes' if p.get('required') else 'no'}</td><td>{_e(p.get('description', ''))}</td></tr>"
            for p in operation.get("parameters", [])]
    if not rows:
        return ""
    return "<table><tr><th>parameter</th><th>in</th><th>required</th><th>about</th></tr>" + "".join(rows) + "</table>"


def _responses(operation: dict[str, Any]) -> str:
    items = []
    for status, response in sorted(operation.get("responses", {}).items()):
        content = response.get("content") or {}
        media = ", ".join(content) or "no body"
        schema = next((body.get("schema") for body in content.values() if body.get("schema")), None)
        shown = f"<pre>{_e(json.dumps(schema, indent=2))}</pre>" if schema else ""
        items.append(f"<li><b>{_e(status)}</b> {_e(response.get('description', ''))} ({_e(media)}){shown}</li>")
    return "<ul>" + "".join(items) + "</ul>" if items else ""


def render_page(schema: dict[str, Any], key_query: str = "") -> str:
    """The whole page: each operation with its summary, description, parameters and
    responses; the component schemas at the end."""
    info = schema.get("info", {})
    parts = [f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{_e(info.get('title'))}</title>"
             f"<style>{_STYLE}</style></head><body><h1>{_e(info.get('title'))}</h1>"
             f"<p>version {_e(info.get('version'))} &middot; <a href=\"schema/openapi.json{key_query}\">"
             f"openapi.json</a> &middot; <a href=\"schema/swagger{key_query}\">Swagger UI</a> (loads its code "
             "from a CDN)</p>"]
    if info.get("description"):
        parts.append(f"<p class=desc>{_e(info['description'])}</p>")
    for path, item in sorted(schema.get("paths", {}).items()):
        for method in _METHODS:
            operation = item.get(method)
            if operation is None:
                continue
            parts.append(f"<div class=op id=\"{_e(method + path)}\"><span class=\"method {method}\">{method}</span>"
                         f"<code>{_e(path)}</code> &mdash; {_e(operation.get('summary', ''))}"
                         f"<p class=desc>{_e(operation.get('description', ''))}</p>"
                         f"{_parameters(operation)}{_responses(operation)}</div>")
    components = schema.get("components", {}).get("schemas", {})
    if components:
        parts.append("<h2>Schemas</h2>")
        for name, body in sorted(components.items()):
            parts.append(f"<h3 id=\"{_e(name)}\">{_e(name)}</h3><pre>{_e(json.dumps(body, indent=2))}</pre>")
    parts.append("</body></html>")
    return "".join(parts)


class OfflinePagePlugin(OpenAPIRenderPlugin):
    """`/schema`: the page above (no script, nothing from elsewhere)."""

    def __init__(self) -> None:
        super().__init__(path="/")

    def render(self, request: Request, openapi_schema: dict[str, Any]) -> bytes:
        key = request.query_params.get("api_key")
        key_query = f"?api_key={quote(key, safe='')}" if key else ""
        # the page lives at /schema (no trailing slash): links are relative to the root
        return render_page(openapi_schema, key_query).replace('href="schema/', 'href="/schema/').encode()


def openapi_config(title: str, version: str, max_input_chars: int | None = None,
                   max_instructions_chars: int | None = None) -> OpenAPIConfig:
    """Litestar's OpenAPI config for the app: `/schema` (the page), `/schema/openapi.json`
    and `/schema/swagger`, guarded by the API key and left out of the schema they serve;
    handler docstrings become descriptions; the wire's Structs (the bodies, the sse events,
    the WebSocket's messages) are components (`server.api.schema_parts`). The `/v1` router
    asks for the key (`bearer`); the operations routes do not."""
    return OpenAPIConfig(
        title=title,
        version=version,
        description="Chorus: streaming OmniVoice text-to-speech. OpenAI's speech and model routes, a voice "
                    "library, a pronunciation lexicon, and operations. Errors are `ErrorBody`: "
                    '`{"error": {"code", "message", "field"?}}`. The WebSocket protocol (`/v1/stream`) is '
                    "described in docs/protocol.md; its messages are the `WebSocket*` schemas here.",
        path="/schema",
        use_handler_docstrings=True,
        create_examples=False,
        render_plugins=[OfflinePagePlugin(), JsonRenderPlugin(), SwaggerRenderPlugin(path="/swagger")],
        openapi_router=Router("/schema", guards=[require_api_key], route_handlers=[], include_in_schema=False),
        components=WireComponents(security_schemes={"bearer": SecurityScheme(type="http", scheme="bearer")},
                                  wire=wire_schemas(NewPronunciation, max_input_chars, max_instructions_chars)),
    )
