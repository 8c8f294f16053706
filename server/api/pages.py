"""The demo page: `GET /` renders `web/templates/index.html`; `/static` serves `web/static/`.

The app factory mounts this with::

    Litestar(route_handlers=[..., *web_route_handlers(cfg)], template_config=template_config(), ...)

Nothing here imports torch: the page only needs a few facts from the server's config and the
options table, read when the page is requested (the model is resolved before the app starts).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from litestar import MediaType, Request, get
from litestar.contrib.jinja import JinjaTemplateEngine
from litestar.response import Template
from litestar.static_files import create_static_files_router
from litestar.template.config import TemplateConfig

from server import options


def _web_dir() -> Path:
    """The page's files: `server/web/` in an installed wheel (package data), else the
    checkout's `web/` beside `server/` (a checkout, an editable install). Found by path,
    never imported, so no `web` package anywhere on `sys.path` can stand in for them."""
    server_dir = Path(__file__).resolve().parent.parent
    for candidate in (server_dir / "web", server_dir.parent / "web"):
        if (candidate / "templates" / "index.html").is_file():
            return candidate
    raise RuntimeError(f"the demo page's files are missing (looked in {server_dir / 'web'} and "
                       f"{server_dir.parent / 'web'})")


WEB_DIR = _web_dir()
TEMPLATES_DIR = WEB_DIR / "templates"
STATIC_DIR = WEB_DIR / "static"

# OmniVoice's codec runs at 24 kHz: the page's footer until the server's engine or the
# WebSocket's `ready` says otherwise.
DEFAULT_SAMPLE_RATE = 24000
# What the demo page sends where the wire's default is meant for other clients: fast start
# (`first_chunk_seconds`) makes the first sound of a long text come after one short chunk.
PAGE_DEFAULTS: dict[str, Any] = {"first_chunk_seconds": 2.0}


def page_context(config: Any, sample_rate: int | None = None) -> dict[str, Any]:
    """What `index.html` needs to know before the WebSocket says `ready`.

    `config` is the server's `ServerConfig`; `sample_rate` the served model's (None: the
    codec's usual 24 kHz). The options' defaults and ranges come from the one options table.
    `page_api_key` is the API key only when the server runs with `--page-embeds-key` (a
    trusted, private deployment); otherwise the page asks for the key.
    """
    model_name = config.model_name or str(config.model or "") or "OmniVoice"
    boot = {
        "model": model_name,
        "demo_model": bool(config.demo_model),
        "sample_rate": int(sample_rate or DEFAULT_SAMPLE_RATE),
        "limits": {
            "max_text_chars": int(config.max_text_chars),
            "max_inflight": int(config.max_inflight_per_connection),
            "max_num_step": options.MAX_NUM_STEP,
            "max_dialogue_lines": int(config.max_dialogue_lines),
            "max_dialogue_chars": int(config.max_dialogue_chars),
            "max_job_items": int(config.max_job_items),
            "max_job_chars": int(config.max_job_chars),
        },
        "options": options.table_json(),
        "page_defaults": dict(PAGE_DEFAULTS),
        "api_key_required": bool(config.api_keys),
        "api_key": config.page_api_key or None,
        "asr": bool(config.asr_model),  # a clip may come without its transcript
    }
    return {
        "model_name": model_name,
        "demo_model": boot["demo_model"],
        "max_text_chars": boot["limits"]["max_text_chars"],
        "max_num_step": options.MAX_NUM_STEP,
        "sample_rate": boot["sample_rate"],
        "api_key_required": boot["api_key_required"],
        # `<`, `>` and `&` as JSON escapes: the JSON can never end or alter the <script> holding it.
        "boot_json": json.dumps(boot).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"),
    }


def web_route_handlers(config: Any) -> list:
    """Route handlers for the page and its static files."""

    @get("/", media_type=MediaType.HTML, include_in_schema=False, name="web:index")
    async def index(request: Request) -> Template:
        service = request.app.state.get("service")  # absent when the page is served alone
        sample_rate = service.sample_rate if service is not None else None
        return Template(template_name="index.html", context=page_context(config, sample_rate))

    static = create_static_files_router(
        path="/static", directories=[STATIC_DIR], name="web:static", include_in_schema=False
    )
    return [index, static]


def template_config() -> TemplateConfig:
    return TemplateConfig(directory=TEMPLATES_DIR, engine=JinjaTemplateEngine)
