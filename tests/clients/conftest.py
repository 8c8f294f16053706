"""Fixtures of the client tests: a tiny checkpoint and one real `chorus serve` for the
session (a child process, see `chorus_process`), a speech-like reference clip as WAV
bytes (standard library only), and the client package importable from the checkout.

The Pipecat and LiveKit tests skip where those frameworks are not installed, unless
`CHORUS_REQUIRE_CLIENT_FRAMEWORKS=1` (CI sets it: there a missing framework fails).
"""

from __future__ import annotations

import asyncio
import io
import math
import os
import re
import struct
import sys
import wave
from pathlib import Path

import httpx
import pytest

from tests.clients.chorus_process import ROOT, ChorusProcess, make_checkpoint

# the client from this checkout (installed or not), and the examples, which the tests run
for folder in (ROOT / "client", ROOT / "examples"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))


def pytest_configure(config):
    config.addinivalue_line("markers", "bench: a benchmark's logic, briefly on CPU")


def require_framework(module: str):
    """`pytest.importorskip`, or a hard import when CI requires the frameworks."""
    if os.environ.get("CHORUS_REQUIRE_CLIENT_FRAMEWORKS") == "1":
        return __import__(module)
    return pytest.importorskip(module)


@pytest.fixture(scope="session")
def client_checkpoint(tmp_path_factory, pytestconfig) -> Path:
    """The tiny checkpoint `--tiny-checkpoint` names (tests/conftest.py), or one made here."""
    given = pytestconfig.getoption("tiny_checkpoint")
    return Path(given) if given else make_checkpoint(tmp_path_factory.mktemp("client-ckpt") / "tiny")


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


@pytest.fixture(scope="session")
def library_voice(chorus_url, reference_wav) -> str:
    """A voice saved in the session server's library (its id)."""
    from chorus_client import ChorusClient  # importable once the path above is set

    async def upload() -> str:
        async with ChorusClient(chorus_url) as client:
            return (await client.upload_voice(reference_wav, "A short test clip.", name="agent-voice")).id

    return asyncio.run(upload())


def cancelled_requests(url: str) -> float:
    """The server's count of requests that ended cancelled (its Prometheus metrics)."""
    text = httpx.get(f"{url}/metrics").text
    return sum(float(m.group(1)) for m in re.finditer(r'chorus_requests_total\{[^}]*outcome="cancelled"[^}]*\} (\S+)',
                                                       text))


def stream_audio(url: str, answer: str, *, tokens, **options) -> bytes:
    """The audio of one answer streamed token by token with the plain client: what a
    framework plugin given the same text and options must deliver, byte for byte."""
    from chorus_client import ChorusClient  # importable once the path above is set

    async def speak() -> bytes:
        async with ChorusClient(url) as client, client.stream(**options) as stream:
            for token in tokens(answer):
                await stream.append(token)
            await stream.close()
            return (await stream.collect()).audio

    return asyncio.run(speak())
