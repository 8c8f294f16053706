"""Every environment variable Chorus reads, in one registry: typed, defaulted, described.

Read a switch as `envs.CHORUS_MODEL`: the value is parsed from the environment at each access, so
a test's `monkeypatch.setenv` takes effect without a reload. `python -m server.envs` prints the
table `docs/deploy.md` lists.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def _text(value: str) -> str | None:
    return value or None


def _on_unless_zero(value: str) -> bool:
    return value.strip() != "0"


def _yes(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def _rows(value: str) -> int | None:
    return int(value) if value.strip() else None


@dataclass(frozen=True)
class Switch:
    """One environment variable: how its text is read, its value when unset, and what it does."""

    name: str
    parse: Callable[[str], Any]
    default: Any
    doc: str

    def read(self) -> Any:
        value = os.environ.get(self.name)
        return self.default if value is None else self.parse(value)


SWITCHES: tuple[Switch, ...] = (
    # serving: the defaults of `chorus serve`'s options
    Switch("CHORUS_MODEL", _text, None, "checkpoint folder or hub id (`--model`); unset: the tiny random demo"),
    Switch("CHORUS_DEVICE", _text, None, "`cpu`, `cuda`, `cuda:N` or `cuda:0,1` (`--device`; default cpu)"),
    Switch("CHORUS_HOST", _text, None, "address to listen on (`--host`; default 127.0.0.1)"),
    Switch("CHORUS_PORT", _text, None, "port to listen on (`--port`; default 8000)"),
    Switch("CHORUS_LOG_LEVEL", _text, None, "log detail (`--log-level`; default info)"),
    Switch("CHORUS_API_KEY", _text, None, "require this key on every request (`--api-key`)"),
    Switch("CHORUS_API_KEYS_FILE", _text, None, "a file of API keys, one a line (`--api-keys-file`)"),
    Switch("CHORUS_VOICES_DIR", _text, None, "voice library folder (`--voices-dir`; default ./voices)"),
    Switch("CHORUS_VOICES_DB", _text, None, "postgresql://... voice library shared by replicas (`--voices-db`)"),
    Switch("CHORUS_ALLOWED_ORIGINS", _text, None, "other browser origins allowed, comma-separated (`*`: any)"),
    Switch("CHORUS_ALLOWED_HOSTS", _text, None, "Host names answered, comma-separated (DNS rebinding guard)"),
    Switch("CHORUS_PAGE_EMBEDS_KEY", _yes, False, "`1`: the demo page carries the API key"),
    Switch("CHORUS_CACHE_DIR", _text, None, "where the demo checkpoint is cached (default ./.cache)"),
    Switch("CHORUS_COMMIT", _text, None, "the commit a copy of the tree without git history was made from"),
    # engine: optimisations that can be turned off, and one tuning knob
    Switch("CHORUS_DECODE_GRAPHS", _on_unless_zero, True, "`0`: every decode eager at its own length (no CUDA graphs)"),
    Switch("CHORUS_DECODE_LAUNCH", _on_unless_zero, True, "`0`: decodes launched by their finisher lane only"),
    Switch("CHORUS_DECODE_PRIORITY", _on_unless_zero, True, "`0`: decode streams at ordinary CUDA priority"),
    Switch("CHORUS_EAGER_WARMUP", _on_unless_zero, True, "`0`: no eager step of `--max-packed-tokens` at start"),
    Switch("CHORUS_FUSED_SNAKE", _on_unless_zero, True, "`0`: the codec's Snake activations in torch, not Triton"),
    Switch("CHORUS_SMALL_ATTENTION_ROWS", _rows, None,
           "steps of at most this many packed rows attend with the Triton kernel (`0`: FlashInfer always)"),
    # third-party
    Switch("TRITON_INTERPRET", _yes, False, "Triton's CPU interpreter (tests of the kernels without a GPU)"),
    Switch("PYTHONWARNINGS", _text, None, "Python's warning filters; `chorus` adds one for pydub's ffmpeg warning"),
)
_BY_NAME = {switch.name: switch for switch in SWITCHES}


def __getattr__(name: str) -> Any:
    switch = _BY_NAME.get(name)
    if switch is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return switch.read()


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_BY_NAME))


def markdown_table() -> str:
    """The registry as a Markdown table (the one in `docs/deploy.md`)."""
    rows = ["| Variable | Default | What it does |", "|---|---|---|"]
    for s in SWITCHES:
        default = "unset" if s.default is None else ("on" if s.default is True else "off" if s.default is False
                                                      else str(s.default))
        rows.append(f"| `{s.name}` | {default} | {s.doc} |")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.stdout.write(markdown_table() + "\n")
