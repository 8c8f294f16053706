"""A LiveKit Agents TTS on Chorus: an agent's answers, written token by token by an LLM,
spoken through `chorus_client.livekit.TTS`'s streaming API, turn after turn, with a
barge-in (the stream closed mid-answer).

    pip install "./client[livekit]"       # from a Chorus checkout
    python examples/livekit_agent.py http://127.0.0.1:8000 --out agent.wav

Here a scripted LLM writes the answers and the audio frames are collected. In a real
agent, hand the TTS to the session and let LiveKit drive it:

    from chorus_client import livekit as chorus
    from livekit.agents import AgentSession
    from livekit.plugins import openai

    session = AgentSession(stt=..., llm=openai.LLM(model="gpt-4o-mini"), tts=chorus.TTS(url=URL, voice=VOICE))

`AgentSession` then calls `tts.stream()` per reply, pushes the LLM's tokens and closes the
stream when the user interrupts, exactly as `speak()` below does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

from agent_kit import agent_arguments, llm_tokens, save_wav
from chorus_client import livekit as chorus
from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT

ANSWERS = [
    "Hello! This is the front desk. How can I help you today?",
    "Your room is ready. It is on the fourth floor, next to the lift. Breakfast is from seven.",
    "You are welcome. Have a pleasant stay!",
]


@dataclass
class Spoken:
    audio: bytes
    frames: int
    interrupted: bool
    transcript: list[tuple[str, float, float]]  # aligned words, when the server sends timings


async def speak(tts: chorus.TTS, answer: str, *, barge_in: bool = False) -> Spoken:
    """One reply through `tts.stream()`; with `barge_in`, the stream is closed as soon as its
    first audio frame arrives (what `AgentSession` does when the user starts talking)."""
    stream = tts.stream()
    for token in llm_tokens(answer):
        stream.push_text(token)
        await asyncio.sleep(0)
    stream.end_input()
    audio, frames, words = bytearray(), 0, []
    async for event in stream:
        audio += bytes(event.frame.data)
        frames += 1
        for piece in event.frame.userdata.get(USERDATA_TIMED_TRANSCRIPT) or []:
            words.append((str(piece).strip(), piece.start_time, piece.end_time))
        if barge_in:
            break
    await stream.aclose()
    return Spoken(bytes(audio), frames, barge_in, words)


async def run_agent(url: str, answers: list[str], *, barge_in: Iterable[int] = (), sample_rate: int = 16000,
                    **tts_options) -> list[Spoken]:
    barge_in = set(barge_in)
    tts = chorus.TTS(url=url, sample_rate=sample_rate, **tts_options)
    try:
        return [await speak(tts, answer, barge_in=i in barge_in) for i, answer in enumerate(answers)]
    finally:
        await tts.aclose()


def main() -> None:
    args = agent_arguments(__doc__.splitlines()[0])
    rate = 16000
    turns = asyncio.run(run_agent(args.url, ANSWERS, barge_in=[1], sample_rate=rate, voice=args.voice,
                                  options={"num_step": args.num_step}))
    for turn, answer in zip(turns, ANSWERS):
        state = "interrupted" if turn.interrupted else "complete"
        print(f"{len(turn.audio) // 2 / rate:.2f} s of audio in {turn.frames} frames, {state}: {answer}")
    if args.out:
        save_wav(args.out, rate, b"".join(t.audio for t in turns))


if __name__ == "__main__":
    main()
