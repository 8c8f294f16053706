"""Server settings: one typed object built from the command line and the environment."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


def _env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


@dataclass
class EngineSettings:
    """What the engine needs to know; no web concepts here."""

    device: str = "cpu"
    dtype: str = "float32"
    max_batch_size: int = 16
    max_packed_tokens: int = 24576
    attention: str = "auto"  # auto | torch | flashinfer


@dataclass
class ServerConfig:
    model: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    voices_dir: Path = field(default_factory=lambda: Path("voices"))
    voices_db: str | None = None  # postgresql://... : a voice library shared by replicas
    asr_model: str | None = None
    max_queue: int = 256
    max_text_chars: int = 5000
    max_inflight_per_connection: int = 16
    engine: EngineSettings = field(default_factory=EngineSettings)
    # set at boot: True when serving the auto-made random demo checkpoint
    demo_model: bool = False
    model_name: str = ""

    @classmethod
    def from_env(cls) -> "ServerConfig":
        cfg = cls()
        cfg.model = _env("CHORUS_MODEL")
        cfg.api_key = _env("CHORUS_API_KEY")
        if voices := _env("CHORUS_VOICES_DIR"):
            cfg.voices_dir = Path(voices)
        cfg.voices_db = _env("CHORUS_VOICES_DB")
        return cfg
