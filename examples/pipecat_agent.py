"""A voice agent in Pipecat with Chorus as its TTS: an LLM's answers, token by token, go
through `ChorusTTSService` and come out as audio frames, turn after turn, with a barge-in.

    pip install "./client[pipecat]"       # from a Chorus checkout
    python examples/pipecat_agent.py http://127.0.0.1:8000 --out agent.wav

Here a scripted LLM writes the answers and a sink collects the audio. For a real agent,
put an LLM service where `ScriptedLLM` is (for example Pipecat's `OpenAILLMService` after a
user-context aggregator: it emits the same LLMFullResponseStart/LLMText/LLMFullResponseEnd
frames) and a transport's output (Daily, SmallWebRTC, a phone serializer) where `AudioSink`
is; `ChorusTTSService` stays as it is.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field

from agent_kit import agent_arguments, llm_tokens, save_wav
from chorus_client.pipecat import ChorusTTSService
from loguru import logger
from pipecat.frames.frames import (
    ErrorFrame,
    Frame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
    TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.workers.runner import WorkerRunner

ANSWERS = [
    "Hi! I can help you book a table. Which evening suits you?",
    "Friday at eight works. I have a table by the window. Shall I book it?",
    "Done. You will get a confirmation by text message. Anything else?",
]


@dataclass
class Turn:
    context_id: str | None = None
    audio: bytearray = field(default_factory=bytearray)
    frames: int = 0
    words: list[tuple[str, int]] = field(default_factory=list)  # (word, pts) from word timestamps
    stopped: bool = False
    audio_after_interruption: int = 0


class AudioSink(FrameProcessor):
    """The end of the pipeline: each turn's audio, in arrival order."""

    def __init__(self):
        super().__init__()
        self.turns: list[Turn] = []
        self.interrupted: set[str] = set()
        self.changed = asyncio.Event()

    def turn_of(self, context_id: str) -> Turn:
        for turn in self.turns:
            if turn.context_id == context_id:
                return turn
        self.turns.append(Turn(context_id))
        return self.turns[-1]

    async def process_frame(self, frame: Frame, direction: FrameDirection):
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame) and frame.context_id:
            turn = self.turn_of(frame.context_id)
            turn.audio += frame.audio
            turn.frames += 1
            if frame.context_id in self.interrupted:
                turn.audio_after_interruption += 1
        elif isinstance(frame, TTSTextFrame) and frame.context_id:
            self.turn_of(frame.context_id).words.append((frame.text, frame.pts))
        elif isinstance(frame, TTSStoppedFrame) and frame.context_id:
            self.turn_of(frame.context_id).stopped = True
        elif isinstance(frame, InterruptionFrame):
            self.interrupted.update(t.context_id for t in self.turns if t.context_id)
        self.changed.set()
        await self.push_frame(frame, direction)

    async def wait_for(self, predicate, timeout: float = 120.0) -> None:
        async def loop():
            while not predicate():
                self.changed.clear()
                await self.changed.wait()
        await asyncio.wait_for(loop(), timeout)


class ErrorLog(FrameProcessor):
    """The start of the pipeline: errors pushed upstream by the services end here."""

    def __init__(self):
        super().__init__()
        self.errors: list[ErrorFrame] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection):
        await super().process_frame(frame, direction)
        if isinstance(frame, ErrorFrame):
            self.errors.append(frame)
        await self.push_frame(frame, direction)


@dataclass
class AgentRun:
    turns: list[Turn]
    errors: list[ErrorFrame]
    sample_rate: int


async def run_agent(url: str, answers: list[str], *, barge_in: Iterable[int] = (), sample_rate: int = 16000,
                    token_delay_s: float = 0.002, **tts_options) -> AgentRun:
    """Speak `answers` turn after turn; a turn whose index is in `barge_in` is interrupted
    as soon as its first audio reaches the sink (the user started talking)."""
    barge_in = set(barge_in)
    errors, sink = ErrorLog(), AudioSink()
    tts = ChorusTTSService(url=url, **tts_options)
    worker = PipelineWorker(Pipeline([errors, tts, sink]), params=PipelineParams(audio_out_sample_rate=sample_rate),
                            cancel_on_idle_timeout=False)
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def _started(worker, frame):
        started.set()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running = asyncio.create_task(runner.run())
    await asyncio.wait_for(started.wait(), 60)
    finished = False
    try:
        for index, answer in enumerate(answers):
            before = len(sink.turns)
            await worker.queue_frame(LLMFullResponseStartFrame())
            for token in llm_tokens(answer):
                await worker.queue_frame(LLMTextFrame(token))
                await asyncio.sleep(token_delay_s)
            await worker.queue_frame(LLMFullResponseEndFrame())
            if index in barge_in:
                await sink.wait_for(lambda before=before: len(sink.turns) > before and sink.turns[-1].frames > 0)
                await worker.queue_frame(InterruptionFrame())
                await sink.wait_for(lambda: sink.turns[-1].context_id in sink.interrupted)
            else:
                await sink.wait_for(lambda before=before: bool(errors.errors)
                                    or (len(sink.turns) > before and sink.turns[-1].stopped))
        await worker.stop_when_done()
        finished = True
    finally:
        if not finished:  # a turn failed or timed out: stop the pipeline, then let the error out
            await worker.cancel(reason="the agent run failed")
        await running
    return AgentRun(sink.turns, errors.errors, sample_rate)


def main() -> None:
    args = agent_arguments(__doc__.splitlines()[0])
    logger.remove()
    logger.add(sys.stderr, level="WARNING")  # Pipecat logs every frame at DEBUG
    run = asyncio.run(run_agent(args.url, ANSWERS, barge_in=[1], voice=args.voice,
                                options={"num_step": args.num_step}))
    for turn, answer in zip(run.turns, ANSWERS):
        state = "interrupted" if turn.audio_after_interruption or not turn.stopped else "complete"
        print(f"turn {turn.context_id}: {len(turn.audio) // 2 / run.sample_rate:.2f} s of audio, {state}: {answer}")
    for error in run.errors:
        print(f"error: {error.error}")
    if args.out:
        save_wav(args.out, run.sample_rate, b"".join(bytes(t.audio) for t in run.turns))
    raise SystemExit(1 if run.errors else 0)


if __name__ == "__main__":
    main()
