"""A voice agent's speaking half with `chorus-client`: each answer is streamed to Chorus
while the LLM writes it (`client.stream()`: append, close), turn after turn in one voice,
and the user can barge in (`cancel()`); captions come from the `Segment` events.

    pip install ./client                  # from a Chorus checkout
    python examples/voice_agent.py http://127.0.0.1:8000 --out agent.wav

One voice: the first turn's stream sets `keep_voice`, so the speaker the model picks for it
is kept as a voice (`Done.voice_id`, `kept-...`), and every later turn names that id as its
`voice`. With `--voice` (a built-in voice such as `alloy`, or a library voice's id or name)
every turn speaks with that voice instead, and nothing is kept.

The LLM here is scripted (`scripted_llm`, from `examples/agent_kit`). To plug a real one in,
put an async generator of its stream's text deltas where `speak_turn` calls `scripted_llm`,
for example with the `openai` package:

    stream = await openai_client.chat.completions.create(model="gpt-4o-mini", messages=history, stream=True)
    async for part in stream:
        yield part.choices[0].delta.content or ""
"""

from __future__ import annotations

import asyncio

from agent_kit import agent_arguments, save_wav, scripted_llm
from chorus_client import AudioChunk, ChorusClient, Done, Segment, SynthesisOptions

ANSWERS = [
    "Good morning! You have three meetings today. The first one is at ten.",
    "The ten o'clock is with the design team. It is about the new onboarding flow, and they asked for an hour.",
    "Sure, I moved it to eleven and told everyone. Anything else?",
]


async def speak_turn(client: ChorusClient, answer: str, *, voice: str | None, barge_in: bool,
                     options: SynthesisOptions) -> tuple[bytes, str | None]:
    """Stream one answer in, with `voice`, or keeping the speaker it gets when there is none;
    with `barge_in`, cancel it once its first audio arrives. Returns its audio and the voice
    the next turns speak with."""
    audio = bytearray()
    async with client.stream(voice=voice, keep_voice=True if voice is None else None, options=options) as stream:

        async def write() -> None:
            async for piece in scripted_llm(answer):
                await stream.append(piece)
            await stream.close()

        writer = asyncio.create_task(write())
        async for event in stream:
            if isinstance(event, AudioChunk):
                audio += event.data  # hand it to the player here
                if barge_in:
                    print("  (the user starts talking: cancel)")
                    await stream.cancel()
            elif isinstance(event, Segment):
                print(f"  {event.offset_samples / client.ready.sample_rate:6.2f} s  {event.text}")
            elif isinstance(event, Done):
                kept = f", voice kept as {event.voice_id}" if voice is None and event.voice_id else ""
                print(f"  done: {event.audio_seconds:.2f} s{kept}")
                voice = voice or event.voice_id
            else:
                print(f"  {type(event).__name__.lower()}")
        writer.cancel()
    return bytes(audio), voice


async def run(url: str, out: str | None, voice: str | None, num_step: int) -> None:
    async with ChorusClient(url) as client:
        ready = await client.connect()
        options = SynthesisOptions(num_step=num_step, seed=7)
        audio = bytearray()
        for turn, answer in enumerate(ANSWERS):
            print(f"turn {turn} ({f'voice {voice}' if voice else 'keep_voice'}):")
            spoken, voice = await speak_turn(client, answer, voice=voice, barge_in=turn == 1, options=options)
            audio += spoken
            if voice is None:
                raise SystemExit("the server kept no voice (no voice_id in done): pass --voice")
    if out:
        save_wav(out, ready.sample_rate, bytes(audio))
        print(f"saved {out}")


def main() -> None:
    args = agent_arguments(__doc__.splitlines()[0])
    asyncio.run(run(args.url, args.out, args.voice, args.num_step))


if __name__ == "__main__":
    main()
