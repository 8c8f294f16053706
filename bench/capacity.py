"""The realtime capacity curve: how much of the card keeps every listener's promise.

One run measures the server's throughput (the 256 mix over 16 sockets), then steps offered
load from a tenth to nine tenths of it. At each level it runs, one after the other:

- voice agents as people run them (`bench.agents.voice_agent_turn`): each holds a socket and,
  turn after turn, streams a 2-4 sentence answer in 4-character pieces at 60 tokens a second,
  plays the audio in real time from its first frame and pauses 0.5-1.5 s for the user; as
  many agents as the level's share of the throughput in audio seconds per second, joining
  evenly over `--ramp-seconds`;
- Poisson arrivals of 10 s lines at the same share (`bench.ws_bench.loaded`).

A level passes with p95 first audio within `--p95-ms` and no underrun (a frame that arrives
after its `offset_samples` is due on the turn's playback clock). `realtime_capacity_fraction`
is the highest level up to which every agent level passed.

Two more passes, each after the one before:

- `--voice NAME` (e.g. `alloy`, a built-in voice: a 5 s prompt in every conditional half, as
  agents are deployed) runs the agent levels again (`--voice-fractions`, default the same)
  with every turn in that voice: `realtime_capacity_fraction_voiced`. Without it the agents'
  streams take their first segment as the voice of the rest (the chained voice).
- `--burst-fractions 0.6` runs a level whose agents all join within `--burst-seconds` (2 s,
  a reconnect storm after a deploy) instead of over the ramp, counted from the first join:
  turns served, turns refused `busy` (each agent's client retries `busy` with
  `retry_after_ms` after the hint plus jitter; the retries are counted), turns with an
  underrun, and p95 first audio of the turns served (`burst_0_6_*` in the summary; with
  `--voice`, also `burst_0_6_voiced_*`).

    python -m bench.capacity -- --model ckpt-full --device cuda --dtype bfloat16
    python -m bench.capacity --fractions 0.5 --level-seconds 3 -- --model ckpt-tiny
    python -m bench.capacity --fractions 0.6 --voice alloy --burst-fractions 0.6 -- --model ckpt-full --device cuda
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import shlex
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

from chorus_client import ChorusClient

from bench import ws_bench
from bench.agents import VoiceTurn, voice_agent_loop
from bench.metrics import emit_report, percentile, stats
from bench.mixes import plain_mix
from bench.ws_bench import StepWatch
from server.cli.checkout import git_commit
from server.cli.launcher import ServerProcess
from server.loadtest.cli import split_serve_args

DEFAULT_FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
AGENT_AUDIO_S_PER_S = 1.0  # an agent plays what it gets in real time, bar its pauses: about one audio-s/s


def _agents_share(url: str, indices: list[int], seed: int, until: float, starts: list[float],
                  options: dict, voice: str | None = None) -> list[dict]:
    """One client process's share of a level's agents (a single event loop would time its own
    backlog beside the server's at a few hundred agents)."""

    async def run() -> list[list[VoiceTurn]]:
        return await asyncio.gather(*(voice_agent_loop(url, i, seed, until, options, start, voice)
                                      for i, start in zip(indices, starts)))

    return [{**asdict(turn), "first_audio_ms": turn.first_audio_ms, "served_first_audio_ms": turn.served_first_audio_ms}
            for turns in asyncio.run(run()) for turn in turns]


async def agent_level(url: str, agents: int, args, options: dict, pool: ProcessPoolExecutor,
                      voice: str | None = None, burst: bool = False) -> dict:
    """`agents` voice agents joining over the ramp, measured for `level_seconds` after it, with
    what the server's steps did meanwhile. A `burst`: they join within `burst_seconds`, and
    every turn counts, from the first join (the burst is what is measured)."""
    join, seconds = (args.burst_seconds if burst else args.ramp_seconds), args.level_seconds
    t0 = time.perf_counter()
    measured_from, until = (t0 if burst else t0 + join), t0 + join + seconds
    starts = [join * i / max(1, agents) for i in range(agents)]
    shares = [list(range(k, agents, args.client_processes)) for k in range(args.client_processes)]
    futures = [pool.submit(_agents_share, url, share, args.seed, until, [starts[i] for i in share], options, voice)
               for share in shares if share]
    async with StepWatch(ws_bench.http_base(url), every=1.0) as steps:
        shares_done = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
    turns = [t for share in shares_done for t in share if t["started_at"] >= measured_from]
    level = level_report(turns, agents, until - measured_from, args.p95_ms)
    return {**level, "join_seconds": join, "burst": burst, "voice": voice,
            "server_steps": steps.result(measured_from, until)}


def level_report(turns: list[dict], agents: int, seconds: float, p95_ms: float) -> dict:
    """A level's turns (`_agents_share`'s rows) summed up. `first_audio_ms`: from the first
    sentence to the first audio, as the listener heard it (a retried turn's waits included);
    `served_first_audio_ms`: the turns served, from the first sentence of the attempt the
    server took. `busy_turns`: turns refused `busy` at least once; `busy_retries`: the retries
    that made; `busy_failed_turns`: turns still refused when the client gave up. Passed: every
    turn done, no underrun, p95 first audio within `p95_ms`."""
    first = [t["first_audio_ms"] for t in turns if t["first_audio_ms"] is not None]
    served = [t for t in turns if t["outcome"] == "done"]
    served_first = [t["served_first_audio_ms"] for t in served if t.get("served_first_audio_ms") is not None]
    late = [u for t in turns for u in t["underruns"]]
    audio = sum(t["audio_seconds"] for t in turns)
    p95 = percentile(first, 95)
    return {"agents": agents, "seconds": round(seconds, 3), "turns": len(turns),
            "turns_failed": sum(1 for t in turns if t["outcome"] != "done"),
            "outcomes": _count(t["outcome"] or "missing" for t in turns),
            "first_audio_ms": stats(first, 1),
            "turns_with_underrun": sum(1 for t in turns if t["underruns"]),
            "underruns": len(late), "late_seconds": round(sum(late), 3),
            "worst_late_s": round(max(late, default=0.0), 3),
            "audio_s_per_s": round(audio / seconds, 2) if seconds > 0 else None,
            "turns_served": len(served), "served_first_audio_ms": stats(served_first, 1),
            "busy_turns": sum(1 for t in turns if t.get("busy_retries") or t["outcome"] == "error:busy"),
            "busy_retries": sum(t.get("busy_retries", 0) for t in turns),
            "busy_failed_turns": sum(1 for t in turns if t["outcome"] == "error:busy"),
            "busy_waited_s": round(sum(t.get("busy_waited_s", 0.0) for t in turns), 3),
            "passed": bool(turns) and all(t["outcome"] == "done" for t in turns) and not late
            and p95 is not None and p95 <= p95_ms}


def burst_passed(level: dict, p95_ms: float) -> bool:
    """A burst keeps its promise when every turn it served was on time (no underrun) and their
    p95 first audio, from the attempt served, is within `p95_ms`; turns refused `busy` are the
    admission's answer, not a broken promise."""
    p95 = level["served_first_audio_ms"].get("p95")
    served_late = level["turns_with_underrun"]
    return level["turns_served"] > 0 and served_late == 0 and p95 is not None and p95 <= p95_ms


def _count(values) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def capacity_fraction(levels: list[dict], key: str = "agents") -> float | None:
    """The highest load fraction up to which every level passed (levels in rising load)."""
    best = None
    for level in levels:
        if not level[key]["passed"]:
            break
        best = level["fraction"]
    return best


def fraction_key(fraction: float) -> str:
    """`0.6` -> `0_6`: a fraction as a summary key's part."""
    return f"{fraction:g}".replace(".", "_")


def summary(result: dict, gpu: str | None, commit: str | None) -> dict:
    levels = result["levels"]
    fraction = capacity_fraction(levels)
    at = next((lv for lv in levels if lv["fraction"] == fraction), None)
    at_70 = next((lv for lv in levels if abs(lv["fraction"] - 0.7) < 1e-9), None)
    voiced = result.get("voiced")
    voiced_levels = voiced["levels"] if voiced else []
    voiced_fraction = capacity_fraction(voiced_levels) if voiced else None
    voiced_at = next((lv for lv in voiced_levels if lv["fraction"] == voiced_fraction), None)
    out = {
        "realtime_capacity_fraction": fraction,
        "agents_at_250ms": at["agents"]["agents"] if at else 0,
        "realtime_capacity_fraction_voiced": voiced_fraction,
        "agents_at_250ms_voiced": (voiced_at["agents"]["agents"] if voiced_at else 0) if voiced else None,
        "voice": voiced["voice"] if voiced else None,
        "ws_loaded_p95_first_audio_ms": (at_70["poisson"]["client_first_audio_ms"].get("p95")
                                         if at_70 and at_70.get("poisson") else None),
        "throughput_audio_s_per_s": result["throughput"]["audio_s_per_s"],
    }
    for burst in result.get("bursts", []):
        a = burst["agents"]
        key = f"burst_{fraction_key(burst['fraction'])}" + ("_voiced" if burst.get("voice") else "")
        out.update({f"{key}_agents": a["agents"], f"{key}_turns": a["turns"],
                    f"{key}_turns_served": a["turns_served"], f"{key}_busy_turns": a["busy_turns"],
                    f"{key}_busy_retries": a["busy_retries"], f"{key}_busy_failed_turns": a["busy_failed_turns"],
                    f"{key}_underrun_turns": a["turns_with_underrun"], f"{key}_worst_late_s": a["worst_late_s"],
                    f"{key}_p95_first_audio_ms": a["served_first_audio_ms"].get("p95"),
                    f"{key}_p95_first_audio_ms_as_heard": a["first_audio_ms"].get("p95"),
                    f"{key}_passed": burst["passed"]})
    out.update({"gpu": gpu, "commit": commit})
    return out


def _agents_for(fraction: float, capacity: float) -> int:
    return max(1, round(fraction * capacity / AGENT_AUDIO_S_PER_S))


def _print_level(name: str, fraction: float, a: dict, extra: str = "") -> None:
    retried = f", {a['busy_turns']} refused busy ({a['busy_retries']} retries)" if a["busy_turns"] else ""
    print(f"  {name} {fraction:.0%}: {a['agents']} agents p95 {a['first_audio_ms'].get('p95')} ms, "
          f"{a['turns_with_underrun']}/{a['turns']} turns late{retried}{extra}", file=sys.stderr)


async def warm_voice(url: str, voice: str, options: dict) -> None:
    """Speak one line in `voice` first: a built-in voice is made on its first use, which no
    level should time."""
    async with ChorusClient(url) as client:
        await client.synthesize("Hello there.", voice=voice, options=options).collect()


def run_curve(url: str, args) -> dict:
    options = {"num_step": args.num_step}
    specs = plain_mix(args.throughput_requests, seed=args.seed)
    thr = ws_bench.run(ws_bench.throughput(url, specs, connections=min(16, len(specs))))
    capacity = thr["audio_s_per_s"]
    print(f"throughput {capacity} audio-s/s", file=sys.stderr)
    levels = []
    result: dict = {"throughput": thr, "levels": levels}
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(args.client_processes, mp_context=ctx) as pool:
        for fraction in args.fractions:
            agents = _agents_for(fraction, capacity)
            level = {"fraction": fraction, "agents": ws_bench.run(agent_level(url, agents, args, options, pool))}
            if not args.no_poisson:
                poisson = ws_bench.run(ws_bench.loaded(url, capacity, load=fraction,
                                                       duration_s=args.poisson_seconds, seed=args.seed))
                if not args.keep_steps:
                    poisson.pop("server_steps", None)
                level["poisson"] = poisson
            levels.append(level)
            _print_level("agents", fraction, level["agents"], "; poisson p95 "
                         f"{(level.get('poisson') or {}).get('client_first_audio_ms', {}).get('p95')} ms")
        if args.voice:
            ws_bench.run(warm_voice(url, args.voice, options))
            voiced = {"voice": args.voice, "levels": []}
            result["voiced"] = voiced
            for fraction in args.fractions if args.voice_fractions is None else args.voice_fractions:
                a = ws_bench.run(agent_level(url, _agents_for(fraction, capacity), args, options, pool,
                                             voice=args.voice))
                voiced["levels"].append({"fraction": fraction, "agents": a})
                _print_level(f"agents in {args.voice}", fraction, a)
        bursts = []
        for voice in [None, args.voice] if args.voice else [None]:
            for fraction in args.burst_fractions:
                a = ws_bench.run(agent_level(url, _agents_for(fraction, capacity), args, options, pool,
                                             voice=voice, burst=True))
                bursts.append({"fraction": fraction, "voice": voice, "agents": a,
                               "passed": burst_passed(a, args.p95_ms)})
                _print_level(f"burst{' in ' + voice if voice else ''}", fraction, a,
                             f"; served {a['turns_served']}, their p95 {a['served_first_audio_ms'].get('p95')} ms")
        if bursts:
            result["bursts"] = bursts
    return result


def _fractions(text: str) -> list[float]:
    if text.strip().lower() == "none":
        return []
    try:
        values = sorted(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of fractions: {text!r} (e.g. 0.5,0.8)") from None
    if not values or not all(0 < v <= 1.5 for v in values):
        raise argparse.ArgumentTypeError("fractions must be in (0, 1.5]")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.capacity", description=__doc__.splitlines()[0],
                                epilog="Arguments after `--` go to the `chorus serve` this starts.")
    p.add_argument("--url", default=None, help="a running server instead of starting one")
    p.add_argument("--fractions", type=_fractions, default=list(DEFAULT_FRACTIONS),
                   help="load levels as fractions of the measured throughput (default 0.1,...,0.9)")
    p.add_argument("--level-seconds", type=float, default=30.0, help="measured seconds per agent level")
    p.add_argument("--ramp-seconds", type=float, default=5.0, help="agents join evenly over this long first")
    p.add_argument("--voice", default=None, metavar="NAME",
                   help="run the agent levels again with every turn in this voice (a built-in name such as "
                        "alloy, or a library voice): realtime_capacity_fraction_voiced")
    p.add_argument("--voice-fractions", type=_fractions, default=None,
                   help="the voiced levels (default: --fractions)")
    p.add_argument("--burst-fractions", type=_fractions, default=[],
                   help="burst levels, after the others: the level's agents join within --burst-seconds "
                        "(e.g. 0.6; default none)")
    p.add_argument("--burst-seconds", type=float, default=2.0, help="a burst level's agents join within this")
    p.add_argument("--poisson-seconds", type=float, default=20.0, help="seconds of Poisson arrivals per level")
    p.add_argument("--no-poisson", action="store_true", help="agents only")
    p.add_argument("--keep-steps", action="store_true", help="keep the server's step log of each Poisson level")
    p.add_argument("--p95-ms", type=float, default=250.0, help="first-audio promise a level must keep")
    p.add_argument("--num-step", type=int, default=32)
    p.add_argument("--throughput-requests", type=int, default=256)
    p.add_argument("--client-processes", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 2)),
                   help="processes the agents are spread over")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="default: bench/results/<date>-<gpu|cpu>-capacity.json")
    return p


def main(argv: list[str] | None = None) -> int:
    argv, serve_args = split_serve_args(argv)
    args = build_parser().parse_args(argv)
    t0 = time.perf_counter()
    gpu = None
    try:
        import torch

        gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - torch missing: a client-only machine
        pass
    if args.url:
        result = run_curve(args.url.replace("http", "ws", 1) + "/v1/stream", args)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            server = ServerProcess(["--voices-dir", str(Path(tmp) / "voices"), "--log-level", "warning",
                                    *serve_args], Path(tmp) / "server.log").start()
            try:
                result = run_curve(server.ws_url, args)
            finally:
                server.stop()
    date = datetime.now(UTC)
    commit = git_commit(os.environ.get("CHORUS_COMMIT"))
    command = ["python", "-m", "bench.capacity", *argv, *(["--", *serve_args] if serve_args else [])]
    report = {"summary": summary(result, gpu, commit),
              "meta": {"command": shlex.join(command), "date_utc": date.strftime("%Y-%m-%dT%H:%M:%SZ"),
                       "gpu": gpu, "commit": commit, "minutes": round((time.perf_counter() - t0) / 60, 2),
                       "settings": {k: v for k, v in vars(args).items() if k != "url"}, "serve_args": serve_args},
              **result}
    name = f"{date:%Y-%m-%d}-{'gpu' if gpu else 'cpu'}-capacity.json"
    out = args.out or str(Path(__file__).parent / "results" / name)
    emit_report(report, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
