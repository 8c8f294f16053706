"""A two-speaker script as one Chorus dialogue with `chorus-client`, saved as a WAV file.

    pip install ./client                  # from a Chorus checkout
    python examples/dialogue.py http://127.0.0.1:8000 --out dialogue.wav

Every line is sent at once (`client.dialogue()`, the WebSocket's `dialogue` message): the server
makes them all together, in the same steps, and sends the audio in script order, each line
announced by a `Line` event (who, what, where its audio starts), with a pause of silence between
lines. Prints each line as it starts and its words as they are timed; the WAV is the whole
dialogue. `--host` and `--guest` pick the two voices: built-in names (alloy, echo, ...), or a
library voice's id or name.
"""

from __future__ import annotations

import argparse
import asyncio
import wave

from chorus_client import AudioChunk, ChorusClient, DialogueLine, Done, Line, SynthesisOptions, Words

SCRIPT = [
    ("host", "Welcome back to the show. Today we are talking about how speech is made by machines."),
    ("guest", "Thanks for having me! It is a fun topic, and it moves fast."),
    ("host", "So where does a sentence start, when a computer says it?"),
    ("guest", "With text, of course. Then the model fills in sound, a little more at every step."),
]


async def perform(url: str, out: str, voices: dict[str, str], pause_ms: int, num_step: int) -> None:
    lines = [DialogueLine(text, voice=voices[who]) for who, text in SCRIPT]
    async with ChorusClient(url) as client:  # api_key=... (or $CHORUS_API_KEY) if the server has one
        audio = bytearray()
        rate = 24000
        async for event in client.dialogue(lines, pause_ms=pause_ms, timestamps="word",
                                           options=SynthesisOptions(num_step=num_step, seed=11)):
            if isinstance(event, Line):
                who = SCRIPT[event.line][0]
                print(f"line {event.line} at {event.offset_seconds:5.2f} s, {who} ({event.voice}): {event.text}")
            elif isinstance(event, Words):
                print("    " + " ".join(f"{w.text}@{w.start_seconds:.2f}" for w in event.words))
            elif isinstance(event, AudioChunk):
                audio += event.data  # lines and pauses back to back, in order
                rate = event.sample_rate
            elif isinstance(event, Done):
                print(f"done: {event.audio_seconds:.2f} s of dialogue, first audio after "
                      f"{event.timings.get('first_audio_ms', 0):.0f} ms")
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)  # pcm_s16le, the default encoding
        w.setframerate(rate)
        w.writeframes(bytes(audio))
    print(f"saved {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the Chorus server, e.g. http://127.0.0.1:8000")
    parser.add_argument("--out", default="dialogue.wav")
    parser.add_argument("--host", default="alloy", help="the host's voice")
    parser.add_argument("--guest", default="echo", help="the guest's voice")
    parser.add_argument("--pause-ms", type=int, default=300, help="silence between lines")
    parser.add_argument("--num-step", type=int, default=32)
    args = parser.parse_args()
    asyncio.run(perform(args.url, args.out, {"host": args.host, "guest": args.guest}, args.pause_ms, args.num_step))


if __name__ == "__main__":
    main()
