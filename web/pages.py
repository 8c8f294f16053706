"""The demo page: `GET /` renders `index.html`; `/static` serves the page's JS and CSS.

The app factory mounts this with::

    Litestar(route_handlers=[..., *web_route_handlers(cfg)], template_config=template_config(), ...)

Nothing here imports torch: the page only needs a few facts from the server's config,
read when the page is requested (the model is resolved before the app starts).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from litestar import MediaType, get
from litestar.contrib.jinja import JinjaTemplateEngine
from litestar.response import Template
from litestar.static_files import create_static_files_router
from litestar.template.config import TemplateConfig

WEB_DIR = Path(__file__).resolve().parent
TEMPLATES_DIR = WEB_DIR / "templates"
STATIC_DIR = WEB_DIR / "static"

# OmniVoice's codec runs at 24 kHz; the page learns the real value from the `ready` message.
DEFAULT_SAMPLE_RATE = 24000
# docs/protocol.md: options.num_step is 1..64.
DEFAULT_MAX_NUM_STEP = 64


def page_context(config: Any) -> dict[str, Any]:
    """What `index.html` needs to know before the WebSocket says `ready`.

    `config` is the server's `ServerConfig`; attributes it may not have yet are read with
    defaults so the page keeps working while the config grows. `page_api_key` is the API
    key only when the server runs with `--page-embeds-key` (a trusted, private deployment);
    otherwise the page asks for the key.
    """
    api_key = getattr(config, "api_key", None)
    page_api_key = getattr(config, "page_api_key", None) or None
    demo = bool(getattr(config, "demo_model", False))
    model_name = getattr(config, "model_name", "") or str(getattr(config, "model", "") or "") or "OmniVoice"
    boot = {
        "model": model_name,
        "demo_model": demo,
        "sample_rate": int(getattr(config, "sample_rate", DEFAULT_SAMPLE_RATE)),
        "limits": {
            "max_text_chars": int(getattr(config, "max_text_chars", 5000)),
            "max_inflight": int(getattr(config, "max_inflight_per_connection", 16)),
            "max_num_step": DEFAULT_MAX_NUM_STEP,
        },
        "api_key_required": bool(api_key),
        "api_key": page_api_key,
    }
    return {
        "model_name": model_name,
        "demo_model": demo,
        "max_text_chars": boot["limits"]["max_text_chars"],
        "max_num_step": DEFAULT_MAX_NUM_STEP,
        "sample_rate": boot["sample_rate"],
        "api_key_required": boot["api_key_required"],
        # `<`, `>` and `&` as JSON escapes: the JSON can never end or alter the <script> holding it.
        "boot_json": json.dumps(boot).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"),
    }


def web_route_handlers(config: Any) -> list:
    """Route handlers for the page and its static files."""

    @get("/", media_type=MediaType.HTML, include_in_schema=False, name="web:index")
    async def index() -> Template:
        return Template(template_name="index.html", context=page_context(config))

    static = create_static_files_router(
        path="/static", directories=[STATIC_DIR], name="web:static", include_in_schema=False
    )
    return [index, static]


def template_config() -> TemplateConfig:
    return TemplateConfig(directory=TEMPLATES_DIR, engine=JinjaTemplateEngine)
