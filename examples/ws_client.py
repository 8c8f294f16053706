"""Speak one text over Chorus's WebSocket with `chorus-client` and save it as a WAV file.

    pip install ./client                  # from a Chorus checkout
    python examples/ws_client.py http://127.0.0.1:8000 "Hello there. How are you?" --out hello.wav

Prints each event as it arrives (accepted, progress, audio chunks, done).
"""

from __future__ import annotations

import argparse
import asyncio
import wave

from chorus_client import Accepted, AudioChunk, ChorusClient, Done, Progress, SynthesisOptions


async def speak(url: str, text: str, out: str | None, voice: str | None, num_step: int) -> None:
    async with ChorusClient(url) as client:  # api_key=... (or $CHORUS_API_KEY) if the server has one
        audio = bytearray()
        rate = 24000
        async for event in client.synthesize(text, voice=voice, progress=True,
                                             options=SynthesisOptions(num_step=num_step, seed=7)):
            if isinstance(event, Accepted):
                print(f"accepted: {event.chunks} chunk(s), about {sum(event.target_seconds):.1f} s")
            elif isinstance(event, Progress):
                print(f"\r{event.fraction:.0%}", end="", flush=True)
            elif isinstance(event, AudioChunk):
                audio += event.data
                rate = event.sample_rate
                print(f"\naudio chunk {event.chunk}: {event.seconds:.2f} s")
            elif isinstance(event, Done):
                print(f"done: {event.audio_seconds:.2f} s of audio, first audio after "
                      f"{event.timings.get('first_audio_ms', 0):.0f} ms")
    if out:
        with wave.open(out, "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)  # pcm_s16le, the default encoding
            w.setframerate(rate)
            w.writeframes(bytes(audio))
        print(f"saved {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the Chorus server, e.g. http://127.0.0.1:8000")
    parser.add_argument("text", nargs="?", default="Hello there. How are you?")
    parser.add_argument("--out", default="out.wav")
    parser.add_argument("--voice", default=None, help="a library voice id or name, or an OpenAI name (alloy, ...)")
    parser.add_argument("--num-step", type=int, default=32)
    args = parser.parse_args()
    asyncio.run(speak(args.url, args.text, args.out, args.voice, args.num_step))


if __name__ == "__main__":
    main()
