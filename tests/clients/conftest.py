"""Fixtures of the client tests: a tiny checkpoint and one real `chorus serve` for the
session (a child process, see `chorus_process`), a speech-like reference clip as WAV
bytes (standard library only), and the client package importable from the checkout.

The Pipecat and LiveKit tests skip where those frameworks are not installed, unless
`CHORUS_REQUIRE_CLIENT_FRAMEWORKS=1` (CI sets it: there a missing framework fails).
"""

from __future__ import annotations

import io
import math
import os
import struct
import sys
import wave
from pathlib import Path

import pytest

from tests.clients.chorus_process import ROOT, ChorusProcess, make_checkpoint

if str(ROOT / "client") not in sys.path:
    sys.path.insert(0, str(ROOT / "client"))


def require_framework(module: str):
    """`pytest.importorskip`, or a hard import when CI requires the frameworks."""
    if os.environ.get("CHORUS_REQUIRE_CLIENT_FRAMEWORKS") == "1":
        return __import__(module)
    return pytest.importorskip(module)


@pytest.fixture(scope="session")
def client_checkpoint(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("client-ckpt") / "tiny")


@pytest.fixture(scope="session")
def chorus(client_checkpoint, tmp_path_factory):
    """One real `chorus serve` on the tiny checkpoint, shared by the client tests."""
    server = ChorusProcess(client_checkpoint, tmp_path_factory.mktemp("client-server")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def chorus_url(chorus) -> str:
    return chorus.url


def speech_like_wav(seconds: float = 2.0, sample_rate: int = 16000) -> bytes:
    """A gliding harmonic tone with syllable-rate bursts, as 16-bit WAV bytes."""
    frames = bytearray()
    phase = 0.0
    for i in range(int(seconds * sample_rate)):
        t = i / sample_rate
        phase += 2 * math.pi * (140 + 30 * math.sin(2 * math.pi * 0.7 * t)) / sample_rate
        envelope = max(math.sin(2 * math.pi * 3.0 * t), 0.0) ** 0.5
        value = 0.3 * envelope * sum(math.sin(k * phase) / k for k in range(1, 6))
        frames += struct.pack("<h", int(max(-1.0, min(1.0, value)) * 32767))
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(bytes(frames))
    return buf.getvalue()


@pytest.fixture(scope="session")
def reference_wav() -> bytes:
    return speech_like_wav()
