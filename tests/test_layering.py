"""The web layer never imports torch: it talks to the engine only through the engine API."""

from __future__ import annotations

import subprocess
import sys

WEB_MODULES = ["server.app", "server.protocol", "server.service", "server.voices", "server.voices.sqlite",
               "server.voices.postgres", "server.audio_io", "server.metrics", "server.api.stream",
               "server.api.speech", "server.api.voices", "server.api.ops", "server.encoders",
               "server.instructions", "server.builtin_voices", "server.speech_body", "server.kept_voices",
               "server.text.normalize", "server.text.prepare", "server.api.schema_page", "server.text.lexicon",
               "server.api.pronunciations", "server.timestamps.clock", "server.timestamps.model_words"]


def test_web_layer_imports_no_torch():
    code = ("import sys\n" + "".join(f"import {m}\n" for m in WEB_MODULES)
            + "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
              "assert not bad, bad[:5]\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
