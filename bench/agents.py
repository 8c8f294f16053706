"""Voice agents against `chorus serve`: how many a server sustains, deadline vs FIFO scheduling.

Each simulated agent is a `chorus_client.ChorusClient` (the client agents use, one
connection). It opens a text stream per turn and appends an LLM-like answer (2-8
sentences, word by word at a seeded 20-80 words a second), closes it, plays the audio back in
simulated real time, thinks (1-3 s) and starts the next turn. Per turn it records the first
audio after the first sentence was complete (its last character sent; the audio's time is
`AudioChunk.received_at`, when the frame came off the socket) and every underrun: the moment
playback had nothing left to play before the stream's `done`, and for how long.

A level runs N agents: they join one by one over `--ramp-seconds` (as users arrive; N first
sentences in the same instant is a burst, which the Poisson scenario measures), then all of
them for `--level-seconds`; only turns that start after the ramp count. It passes with p95
first audio <= `--p95-ms` and no underrun or error. N doubles from `--start` while levels
pass, then is bisected between the last pass and the first failure. This runs once per
`--scheduling` mode, each against its own server (`chorus serve --scheduling MODE ...`,
arguments after `--`; `default` passes no flag), followed by `bench.ws_bench`'s throughput
and Poisson loaded scenarios (10 s lines at 70%).

    python -m bench.agents --num-step 32 -- --model ckpt-full --device cuda
    python -m bench.agents --scheduling default --start 2 --max-agents 2 --level-seconds 3 \
        --ramp-seconds 0 -- --model ckpt-tiny

`--levels 96 --level-seconds 300` runs just those levels (a long confirmation run). Modes run
separately, side by side on the GPUs of one host (`CUDA_VISIBLE_DEVICES=0 ... --scheduling
deadline`, `CUDA_VISIBLE_DEVICES=1 ... --scheduling fifo`) or one after another, merge into one
report with `--combine A B`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from chorus_client import AudioChunk, Cancelled, ChorusClient, ChorusError, Done, TextStream

from bench import ws_bench
from bench.metrics import emit_report, percentile, stats
from bench.mixes import WORDS, plain_mix
from server.cli.checkout import git_commit
from server.cli.launcher import ServerProcess
from server.loadtest.cli import split_serve_args

SENTENCE_ENDS = ".!?"


def answer(rng: random.Random, sentences_range: tuple[int, int] = (2, 8), words: tuple[int, int] = (5, 16)) -> str:
    """An LLM-like answer: 2-8 sentences of 5-16 words (by default)."""
    sentences = []
    for _ in range(rng.randint(*sentences_range)):
        words_ = [rng.choice(WORDS) for _ in range(rng.randint(*words))]
        s = " ".join(words_)
        sentences.append(s[0].upper() + s[1:] + rng.choice(".....!?"))
    return " ".join(sentences)


@dataclass
class Turn:
    started_at: float = field(default_factory=time.perf_counter)
    first_sentence_at: float | None = None  # the first sentence's last character was sent
    first_audio_at: float | None = None
    underruns: list[tuple[float, float]] = field(default_factory=list)  # (at s into playback, seconds)
    audio_seconds: float = 0.0
    outcome: str | None = None

    @property
    def first_audio_ms(self) -> float | None:
        if self.first_audio_at is None or self.first_sentence_at is None:
            return None
        return (self.first_audio_at - self.first_sentence_at) * 1000.0


async def speak(stream: TextStream, feed: Callable[[], Awaitable[None]], turn: Turn,
                on_audio: Callable[[AudioChunk], None]) -> None:
    """Open the stream, feed its text (`feed`, a task) while its events are read: each audio
    frame to `on_audio`, the end to `turn.outcome` (`done`, `cancelled` or `error:CODE`)."""
    feeder = None
    try:
        await stream.start()
        feeder = asyncio.create_task(feed())
        async for event in stream:
            if isinstance(event, AudioChunk):
                on_audio(event)
            elif isinstance(event, Done):
                turn.outcome = "done"
            elif isinstance(event, Cancelled):
                turn.outcome = "cancelled"
    except ChorusError as exc:  # the server's error for this stream, or the connection lost
        turn.outcome = f"error:{exc.code}"
    finally:
        if feeder is not None:
            await feeder


async def _feed(stream: TextStream, text: str, wps: float, turn: Turn) -> None:
    try:
        words = text.split(" ")
        for i, word in enumerate(words):
            await stream.append(word if i == 0 else " " + word)
            if turn.first_sentence_at is None and word[-1] in SENTENCE_ENDS:
                turn.first_sentence_at = time.perf_counter()
            await asyncio.sleep(1.0 / wps)
        await stream.close()
    except ChorusError:  # the connection is gone: the stream's reader reports it
        pass


async def run_turn(client: ChorusClient, rng: random.Random, options: dict, sentences: tuple[int, int]) -> Turn:
    """One answer spoken: send it at the agent's pace, play what comes back in real time."""
    turn = Turn()
    text, wps = answer(rng, sentences), rng.uniform(20, 80)
    play_end = None  # when the audio received so far will have finished playing (perf_counter)

    def play(chunk: AudioChunk) -> None:
        nonlocal play_end
        now = chunk.received_at
        if play_end is None:
            turn.first_audio_at, play_end = now, now
        elif now > play_end:  # playback ran dry before this frame came
            turn.underruns.append((round(play_end - turn.first_audio_at, 3), round(now - play_end, 4)))
            play_end = now
        play_end += chunk.seconds
        turn.audio_seconds += chunk.seconds

    stream = client.stream(progress=False, options=options)
    await speak(stream, lambda: _feed(stream, text, wps, turn), turn, play)
    if play_end is not None:
        await asyncio.sleep(max(0.0, play_end - time.perf_counter()))  # listen to the end
    return turn


# ---- voice agents as people run them (the capacity curve's profile) ---------------------------

PIECE_CHARS = 4  # an LLM's token, about
TOKENS_PER_S = 60.0


def voice_agent_answer(rng: random.Random) -> str:
    """A spoken answer as an LLM writes it: 2-4 sentences of 7-18 words."""
    return answer(rng, (2, 4), words=(7, 18))


def first_sentence_piece(pieces: list[str]) -> int | None:
    """Index of the piece that completes the first sentence: the one holding the whitespace
    after its mark (until then the segmenter cannot know the sentence has ended)."""
    text = ""
    for i, piece in enumerate(pieces):
        before = len(text)
        text += piece
        for j in range(max(1, before), len(text)):
            if text[j].isspace() and text[j - 1] in SENTENCE_ENDS:
                return i
    return None


@dataclass
class VoiceTurn(Turn):
    """One turn of a voice agent, as its client saw it (perf_counter seconds); its underruns are
    the seconds each stall of playback lasted (`PlaybackClock`). A turn the server refused
    `busy` with `retry_after_ms` was sent again by the client (`busy_retries`, after
    `busy_waited_s` in all); `sent_at` is when its last attempt went out, with its text so far."""

    underruns: list[float] = field(default_factory=list)
    busy_retries: int = 0
    busy_waited_s: float = 0.0
    sent_at: float | None = None

    @property
    def served_first_audio_ms(self) -> float | None:
        """First audio from when the attempt that was served had its first sentence: the
        promise the server made when it took the turn (`first_audio_ms` less the retries' waits)."""
        if self.first_audio_at is None or self.first_sentence_at is None:
            return None
        since = max(self.first_sentence_at, self.sent_at or self.first_sentence_at)
        return (self.first_audio_at - since) * 1000.0


class PlaybackClock:
    """Real-time playback from the first frame: a frame is due when playback reaches its
    `offset_samples`; one that comes later stalls playback by that much (an underrun), and
    the clock resumes from its arrival."""

    def __init__(self):
        self.anchor: float | None = None  # perf_counter() when offset 0 plays

    def arrive(self, now: float, offset_samples: int, sample_rate: int) -> float:
        """Seconds this frame is late (0.0 when on time)."""
        if self.anchor is None:
            self.anchor = now
            return 0.0
        late = now - (self.anchor + offset_samples / sample_rate)
        if late <= 0:
            return 0.0
        self.anchor += late
        return late

    def ends_at(self, total_samples: int, sample_rate: int) -> float | None:
        return None if self.anchor is None else self.anchor + total_samples / sample_rate


async def _feed_pieces(stream: TextStream, pieces: list[str], turn: VoiceTurn) -> None:
    try:
        first = first_sentence_piece(pieces)
        t0 = time.perf_counter()
        for i, piece in enumerate(pieces):
            await stream.append(piece)
            if i == first:
                turn.first_sentence_at = time.perf_counter()
            await asyncio.sleep(max(0.0, t0 + (i + 1) / TOKENS_PER_S - time.perf_counter()))
        if turn.first_sentence_at is None:  # no whitespace after the last mark: the close completes it
            turn.first_sentence_at = time.perf_counter()
        await stream.close()
    except ChorusError:  # the connection is gone: the stream's reader reports it
        pass


async def voice_agent_turn(client: ChorusClient, rng: random.Random, options: dict,
                           voice: str | None = None) -> VoiceTurn:
    """One answer streamed in as an LLM writes it and played back in real time (in `voice`, a
    library or built-in voice; None: the stream's first segment is the voice of the rest)."""
    text = voice_agent_answer(rng)
    pieces = [text[i:i + PIECE_CHARS] for i in range(0, len(text), PIECE_CHARS)]
    turn = VoiceTurn()
    clock = PlaybackClock()
    total = rate = 0

    def play(chunk: AudioChunk) -> None:
        nonlocal total, rate
        rate = chunk.sample_rate
        if turn.first_audio_at is None:
            turn.first_audio_at = chunk.received_at
        late = clock.arrive(chunk.received_at, chunk.offset_samples, rate)
        if late > 0:
            turn.underruns.append(round(late, 4))
        total = max(total, chunk.offset_samples + chunk.samples)

    stream = client.stream(progress=False, options=options, voice=voice)
    await speak(stream, lambda: _feed_pieces(stream, pieces, turn), turn, play)
    turn.busy_retries, turn.busy_waited_s, turn.sent_at = stream.busy_retries, stream.busy_waited_s, stream.sent_at
    turn.audio_seconds = total / rate if rate else 0.0
    end = clock.ends_at(total, rate) if rate else None
    if end is not None:
        await asyncio.sleep(max(0.0, end - time.perf_counter()))  # listen to the end
    return turn


async def voice_agent_loop(url: str, index: int, seed: int, until: float, options: dict,
                           start_in: float = 0.0, voice: str | None = None) -> list[VoiceTurn]:
    """One voice agent: turn after turn on one connection until `until`, a 0.5-1.5 s pause after
    each; a turn refused `busy` with `retry_after_ms` is retried by the client (its defaults)."""
    rng = random.Random(seed * 100003 + index)
    turns: list[VoiceTurn] = []
    async with ChorusClient(url) as client:
        await client.connect()  # the server's `ready`
        await asyncio.sleep(start_in)
        while time.perf_counter() < until:
            turns.append(await voice_agent_turn(client, rng, options, voice))
            await asyncio.sleep(rng.uniform(0.5, 1.5))  # the user answers
    return turns


async def agent(url: str, index: int, seed: int, until: float, options: dict,
                sentences: tuple[int, int], start_in: float = 0.0) -> list[Turn]:
    rng = random.Random(seed * 100003 + index)
    turns: list[Turn] = []
    async with ChorusClient(url) as client:
        await client.connect()  # the server's `ready`
        await asyncio.sleep(start_in)
        while time.perf_counter() < until:
            turns.append(await run_turn(client, rng, options, sentences))
            think = rng.uniform(1.0, 3.0)  # the user speaks, the LLM thinks
            if time.perf_counter() + think >= until:
                break  # no turn would start in this level: do not wait for nothing
            await asyncio.sleep(think)
    return turns


async def level(url: str, agents: int, args, options: dict) -> dict:
    seconds, p95_ms, ramp = args.level_seconds, args.p95_ms, args.ramp_seconds
    jitter = random.Random(args.seed)
    offsets = [ramp * (i + jitter.random()) / agents if ramp else 0.0 for i in range(agents)]
    t0 = time.perf_counter()
    until = t0 + ramp + seconds
    per_agent = await asyncio.gather(*(agent(url, i, args.seed, until, options, args.sentences, offsets[i])
                                       for i in range(agents)))
    turns = [t for ts in per_agent for t in ts if t.started_at >= t0 + ramp]  # all agents in
    first = [t.first_audio_ms for t in turns if t.first_audio_ms is not None]
    underruns = [u for t in turns for u in t.underruns]
    failed = sum(1 for t in turns if t.outcome != "done")
    p95 = percentile(first, 95)
    return {"agents": agents, "seconds": seconds, "ramp_seconds": ramp, "turns": len(turns), "turns_failed": failed,
            "first_audio_ms": stats(first, 1), "underruns": len(underruns),
            "underrun_seconds": round(sum(s for _, s in underruns), 3), "underrun_list": underruns[:50],
            "audio_seconds": round(sum(t.audio_seconds for t in turns), 2),
            "passed": bool(turns) and failed == 0 and not underruns and p95 is not None and p95 <= p95_ms}


async def sustained(url: str, args, options: dict, done: dict | None = None) -> dict:
    """Doubling from `start` while levels pass, then bisection: the most agents that pass."""
    levels: list[dict] = []

    async def run(n: int) -> bool:
        result = await level(url, n, args, options)
        levels.append(result)
        if args.out:  # a run cut short keeps the modes done and the levels it measured
            partial = {"partial": True, "modes": done or {}, "levels": levels}
            Path(args.out).write_text(json.dumps(partial, indent=2) + "\n")
        print(f"  {n} agents: p95 first audio {result['first_audio_ms'].get('p95')} ms, "
              f"{result['underruns']} underruns, {result['turns']} turns -> "
              f"{'pass' if result['passed'] else 'fail'}", file=sys.stderr)
        return result["passed"]

    if args.levels:  # exactly these levels, e.g. one long confirmation run
        passed = [n for n in args.levels if await run(n)]
        good = max(passed, default=0)
        at = next((lv for lv in reversed(levels) if lv["agents"] == good and lv["passed"]), None)
        return {"agents_sustained": good, "at_sustained": at, "levels": levels}
    good, bad, n = 0, None, args.start
    while n <= args.max_agents and await run(n):
        good, n = n, n * 2
    if n <= args.max_agents:
        bad = n
    while bad is not None and bad - good > max(1, good // 8):
        mid = (good + bad) // 2
        if await run(mid):
            good = mid
        else:
            bad = mid
    at = next((lv for lv in reversed(levels) if lv["agents"] == good and lv["passed"]), None)
    return {"agents_sustained": good, "at_sustained": at, "levels": levels}


async def one_mode(url: str, args, options: dict, done: dict | None = None) -> dict:
    out = await sustained(url, args, options, done)
    specs = [replace(s, num_step=args.num_step)
             for s in plain_mix(args.throughput_requests, seed=args.seed, lo=2.0, hi=12.0)]
    out["throughput"] = await ws_bench.throughput(url, specs, connections=min(16, len(specs)))
    out["loaded"] = await ws_bench.loaded(url, out["throughput"]["audio_s_per_s"], load=0.7,
                                          duration_s=args.loaded_seconds, seed=args.seed, num_step=args.num_step)
    return out


def summary(modes: dict, minutes: float, gpu: str | None, commit: str | None) -> dict:
    # the deadline keys: the deadline mode, or `default` (the server's own policy, deadline);
    # a FIFO-only run fills the FIFO keys alone
    main_mode = next((name for name in ("deadline", "default") if name in modes), None)
    m = modes.get(main_mode) or {}
    fifo = modes.get("fifo") or {}
    at = m.get("at_sustained") or {}

    def p95_loaded(mode: dict):
        return ((mode.get("loaded") or {}).get("client_first_audio_ms") or {}).get("p95")

    thr = lambda mode: (mode.get("throughput") or {}).get("audio_s_per_s")
    ratio = round(thr(m) / thr(fifo), 3) if thr(m) and thr(fifo) else None
    return {
        "agents_sustained": m.get("agents_sustained"),
        "agents_sustained_fifo": fifo.get("agents_sustained"),
        "p95_first_audio_ms": (at.get("first_audio_ms") or {}).get("p95"),
        "underruns": sum(lv["underruns"] for lv in m.get("levels", [])) if m else None,
        "loaded_p95_first_audio_ms_deadline": p95_loaded(m),
        "loaded_p95_first_audio_ms_fifo": p95_loaded(fifo),
        "throughput_ratio_deadline_vs_fifo": ratio,
        "minutes": round(minutes, 2),
        "gpu": gpu,
        "commit": commit,
    }


def _range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition("-")
    try:
        bounds = (int(lo), int(hi or lo))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a range: {text!r} (e.g. 2-8)") from None
    if not 1 <= bounds[0] <= bounds[1]:
        raise argparse.ArgumentTypeError("must be 1 <= LO <= HI")
    return bounds


def _levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of agent counts: {text!r} (e.g. 64,96)") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError("agent counts must be >= 1")
    return levels


def combine(paths: list[str]) -> dict:
    """One report from several runs of the same commit, one mode each (side by side on separate
    GPUs, or one after another where a run's time is limited): their modes, a summary over all
    of them (`minutes`: the longest run's), and each run's command and minutes."""
    reports = [json.loads(Path(p).read_text()) for p in paths]
    modes: dict[str, dict] = {}
    for report in reports:
        for name, mode in report["modes"].items():
            if name in modes:
                raise ValueError(f"mode {name!r} is in more than one report")
            modes[name] = mode
    metas = [r["meta"] for r in reports]
    commits = {m.get("commit") for m in metas}
    if len(commits) > 1:
        raise ValueError(f"reports from different commits: {sorted(map(str, commits))}")
    minutes = max(r["summary"]["minutes"] for r in reports)
    return {"summary": summary(modes, minutes, metas[0].get("gpu"), metas[0].get("commit")),
            "meta": {"combined_from": [{**m, "minutes": r["summary"]["minutes"]} for m, r in zip(metas, reports)],
                     "note": "modes run separately, each against its own server; merged by --combine"},
            "modes": modes}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.agents", description=__doc__.splitlines()[0],
                                epilog="Arguments after `--` go to every `chorus serve` this starts.")
    p.add_argument("--url", default=None, help="a running server (one mode, as it runs) instead of starting one")
    p.add_argument("--scheduling", default="deadline,fifo", help="modes, comma-separated; `default`: no flag")
    p.add_argument("--start", type=int, default=8, help="agents at the first level")
    p.add_argument("--max-agents", type=int, default=256)
    p.add_argument("--levels", type=_levels, default=None,
                   help="run exactly these agent counts (comma-separated), no doubling or bisection")
    p.add_argument("--level-seconds", type=float, default=60.0, help="measured seconds per level, after the ramp")
    p.add_argument("--ramp-seconds", type=float, default=10.0,
                   help="agents join evenly over this long before a level is measured (0: all at once)")
    p.add_argument("--p95-ms", type=float, default=300.0, help="first-audio bound a level must meet")
    p.add_argument("--num-step", type=int, default=32)
    p.add_argument("--throughput-requests", type=int, default=256)
    p.add_argument("--loaded-seconds", type=float, default=60.0)
    p.add_argument("--sentences", type=_range, default=(2, 8), help="sentences per answer, LO-HI (default 2-8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="default: bench/results/<date>-<gpu|cpu>-agents.json")
    p.add_argument("--combine", nargs="+", default=None, metavar="REPORT",
                   help="merge reports of one mode each, of the same commit (run side by side on separate GPUs "
                        "or one after another) into one, with its summary over all their modes; runs nothing")
    return p


def main(argv: list[str] | None = None) -> int:
    argv, serve_args = split_serve_args(argv)
    args = build_parser().parse_args(argv)
    if args.combine:
        emit_report(combine(args.combine), args.out)
        return 0
    if not args.url and not serve_args:
        print("no server arguments after `--`: each chorus serve runs the built-in demo checkpoint "
              "(e.g. `-- --model ckpt-full --device cuda` for a full-size one)", file=sys.stderr)
    options = {"num_step": args.num_step}
    t0 = time.perf_counter()
    modes: dict[str, dict] = {}
    gpu = None
    try:
        import torch

        gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - torch missing: a client-only machine
        pass
    for mode in [m.strip() for m in args.scheduling.split(",") if m.strip()]:
        print(f"scheduling {mode}:", file=sys.stderr)
        if args.url:
            modes[mode] = ws_bench.run(one_mode(args.url.replace("http", "ws", 1) + "/v1/stream", args, options, modes))
            continue
        flags = [] if mode == "default" else ["--scheduling", mode]
        with tempfile.TemporaryDirectory() as tmp:
            server = ServerProcess(["--voices-dir", str(Path(tmp) / "voices"), "--log-level", "warning",
                                    *serve_args, *flags], Path(tmp) / "server.log").start()
            try:
                modes[mode] = ws_bench.run(one_mode(server.ws_url, args, options, modes))
            finally:
                server.stop()
    date = datetime.now(UTC)
    commit = git_commit(os.environ.get("CHORUS_COMMIT"))  # set where the checkout has no git history
    command = ["python", "-m", "bench.agents", *argv, *(["--", *serve_args] if serve_args else [])]
    result = {
        "summary": summary(modes, (time.perf_counter() - t0) / 60.0, gpu, commit),
        "meta": {"command": shlex.join(command),
                 "date_utc": date.strftime("%Y-%m-%dT%H:%M:%SZ"),
                 "gpu": gpu, "commit": commit, "settings": vars(args), "serve_args": serve_args},
        "modes": modes,
    }
    out = args.out or str(Path(__file__).parent / "results" / f"{date:%Y-%m-%d}-{'gpu' if gpu else 'cpu'}-agents.json")
    emit_report(result, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
