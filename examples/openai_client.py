"""Chorus through the official `openai` package: its text-to-speech API, pointed at Chorus.

    pip install openai
    python examples/openai_client.py http://127.0.0.1:8000 --out speech.wav

Every option of OpenAI's speech API works (`voice`: alloy, ash, coral, ... are Chorus's
built-in voices; `instructions`; `response_format`); Chorus's own knobs (`num_step`,
`seed`, ...) go in `extra_body`. `instructions` is free text: Chorus uses what OmniVoice's
voice design knows (gender, age, pitch, whisper, an accent: "Speak in a whisper, with a
British accent." is `whisper, british accent`), says what it used in the
`X-Chorus-Instructions` response header, and names the rest, which it ignores (tone, mood:
"cheerful"), in `X-Chorus-Ignored-Instructions`.
"""

from __future__ import annotations

import argparse
import os

from openai import OpenAI


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the Chorus server, e.g. http://127.0.0.1:8000")
    parser.add_argument("text", nargs="?", default="Today is a wonderful day to build something people love!")
    parser.add_argument("--out", default="speech.wav")
    parser.add_argument("--voice", default="coral")
    parser.add_argument("--instructions", default="Speak in a whisper, with a British accent.")
    parser.add_argument("--num-step", type=int, default=32)
    args = parser.parse_args()
    client = OpenAI(base_url=f"{args.url.rstrip('/')}/v1", api_key=os.environ.get("CHORUS_API_KEY", "none"))
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice=args.voice, input=args.text, instructions=args.instructions,
        response_format="wav", extra_body={"num_step": args.num_step, "seed": 7},
    ) as response:
        response.stream_to_file(args.out)
        used = response.headers.get("X-Chorus-Instructions")
        ignored = response.headers.get("X-Chorus-Ignored-Instructions")
    print(f"saved {args.out} ({os.path.getsize(args.out)} bytes)")
    print(f"instructions used: {used or 'none'}")
    if ignored:
        print(f"instructions Chorus ignored: {ignored}")


if __name__ == "__main__":
    main()
