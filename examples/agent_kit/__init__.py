"""What the agent examples share and a real agent replaces: a scripted LLM (an answer in
pieces of 1-4 characters, as an LLM's stream delivers text), their command line and the WAV
file they save. Each example imports it from this folder (`python examples/<name>.py` puts
`examples/` on the path)."""

from __future__ import annotations

import argparse
import asyncio
import wave
from collections.abc import AsyncIterator, Iterator


def llm_tokens(text: str) -> Iterator[str]:
    """Stand-in for an LLM's stream: pieces of 1-4 characters."""
    i = 0
    while i < len(text):
        n = 1 + i % 4
        yield text[i:i + n]
        i += n


async def scripted_llm(text: str, words_per_second: float = 40) -> AsyncIterator[str]:
    """`llm_tokens` at an LLM's pace (a word taken as five characters)."""
    for piece in llm_tokens(text):
        yield piece
        await asyncio.sleep(len(piece) / 5 / words_per_second)


def agent_arguments(description: str) -> argparse.Namespace:
    """The examples' command line: the server, where to save the audio, the voice, the steps."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("url", help="the Chorus server, e.g. http://127.0.0.1:8000")
    parser.add_argument("--out", default=None, help="save every turn's audio to this WAV file")
    parser.add_argument("--voice", default=None, help="a library voice id or name (the same for every turn)")
    parser.add_argument("--num-step", type=int, default=16)
    return parser.parse_args()


def save_wav(path: str, sample_rate: int, pcm: bytes) -> None:
    """16-bit mono PCM as a WAV file."""
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(pcm)
