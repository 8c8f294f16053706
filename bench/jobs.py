"""Long-form jobs against `chorus serve`: an hour of text as one job, alone and beside voice agents.

(a) A text of varied sentences, sized by the reference's duration estimator to `--minutes` of
speech (60), is submitted as one job (`POST /v1/jobs` with `input`: the server cuts it into items,
the later ones in the first one's voice unless `--voice` names one) and polled to completion:
`job_audio_s_per_s` is its audio seconds over the wall time from submission to completion.

(b) With `--with-agents FRACTION`, voice agents (`bench.capacity`'s level: `bench.agents`'
`chorus_client` agents, turn after turn, playing in real time) as many as that share of the
throughput (the job's rate from (a), or `--throughput`) speak while a job runs beside them (a new
one is submitted whenever one finishes, the last cancelled at the end): their p95 first audio and
underruns are `agents_with_job_p95_first_audio_ms` and `agents_with_job_underruns`, and the jobs'
rate meanwhile `job_audio_s_per_s_beside_agents`. `--baseline` runs the same agents alone first.

    python -m bench.jobs --checkpoint ckpt-full --with-agents 0.5 --baseline -- --device cuda \
        --max-batch-size 64 --max-packed-tokens 32768 --job-concurrency 24 --max-queue 2048
    python -m bench.jobs --url http://127.0.0.1:8000 --minutes 0.1 --num-step 2 --with-agents 0.5 \
        --level-seconds 2 --ramp-seconds 0 --agents-in-threads

Arguments after `--` go to the `chorus serve` it starts (not with `--url`).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import random
import sys
import time
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor

import httpx

from bench import capacity, ws_bench
from bench.mixes import WORDS
from bench.served import run_served, server_parser
from bench.ws_bench import StepWatch
from server.jobs.split import estimate_seconds

FINISHED = ("completed", "failed", "cancelled")
POLL_S = 0.1
SUMMARY_KEYS = ("job_audio_s_per_s", "job_audio_seconds", "job_wall_seconds", "job_items", "job_first_item_s",
                "agents", "agents_with_job_p95_first_audio_ms", "agents_with_job_underruns",
                "agents_with_job_passed", "job_audio_s_per_s_beside_agents", "agents_alone_p95_first_audio_ms",
                "agents_alone_underruns", "gpu", "commit")


def sentence(rng: random.Random) -> str:
    """4-22 common words, now and then a clause, a question or an exclamation."""
    words = [rng.choice(WORDS) for _ in range(rng.randint(4, 22))]
    if len(words) > 8 and rng.random() < 0.4:
        words[rng.randint(3, len(words) - 4)] += rng.choice([",", ",", ";", " -"])
    text = " ".join(words)
    return text[0].upper() + text[1:] + rng.choice("........?!")


def long_text(seconds: float, seed: int = 0) -> str:
    """Paragraphs of 2-8 sentences until the duration estimator puts the text at `seconds`."""
    rng = random.Random(seed)
    paragraphs: list[str] = []
    total = 0.0
    while total < seconds:
        paragraph = " ".join(sentence(rng) for _ in range(rng.randint(2, 8)))
        paragraphs.append(paragraph)
        total += estimate_seconds(paragraph)
    return "\n\n".join(paragraphs)


def _job_body(text: str, args) -> dict:
    body = {"input": text, "response_format": args.format, "num_step": args.num_step}
    if args.voice:
        body["voice"] = args.voice
    if args.no_normalize:
        body["normalize_text"] = False
    return body


async def run_job(http: httpx.AsyncClient, body: dict, stop: asyncio.Event | None = None) -> dict:
    """Submit one job and poll it to its end (cancelled when `stop` is set first): its timings."""
    t0 = time.perf_counter()
    created = await http.post("/v1/jobs", json=body)
    created.raise_for_status()
    job_id = created.json()["id"]
    first_item_s = None
    while True:
        view = (await http.get(f"/v1/jobs/{job_id}")).json()
        if first_item_s is None and view["items_done"]:
            first_item_s = round(time.perf_counter() - t0, 3)
        if view["status"] in FINISHED:
            break
        if stop is not None and stop.is_set():
            view = (await http.delete(f"/v1/jobs/{job_id}")).json()
            break
        await asyncio.sleep(POLL_S)
    wall = time.perf_counter() - t0
    return {"id": job_id, "status": view["status"], "items": view["items_total"], "items_done": view["items_done"],
            "attempts": view.get("attempts"), "audio_seconds": view["audio_seconds"], "wall_seconds": round(wall, 3),
            "first_item_s": first_item_s, "audio_s_per_s": round(view["audio_seconds"] / wall, 2) if wall else None,
            "error": view.get("error")}


async def job_alone(base: str, text: str, args) -> dict:
    """(a): the long text as one job, with what the server's steps did meanwhile; its zip fetched."""
    async with httpx.AsyncClient(base_url=base, timeout=120) as http, StepWatch(base, every=1.0) as steps:
        job = await run_job(http, _job_body(text, args))
        if not args.no_download and job["items_done"]:
            t0 = time.perf_counter()
            archive = await http.get(f"/v1/jobs/{job['id']}/archive")
            job["archive"] = {"bytes": len(archive.content), "seconds": round(time.perf_counter() - t0, 3)}
    return {**job, "server_steps": steps.result()}


async def _job_audio_made(http: httpx.AsyncClient) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = (await http.get("/metrics")).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "chorus_job_audio_seconds_total")


async def agents_beside_a_job(base: str, text: str, agents: int, args, pool: Executor) -> dict:
    """(b): a job kept running (another submitted whenever one ends) while `agents` voice agents run
    a level; the agents' level, and the jobs' audio rate over the same time."""
    stop = asyncio.Event()
    async with httpx.AsyncClient(base_url=base, timeout=120) as http:
        jobs: list[dict] = []

        async def keep_a_job_running() -> None:
            while not stop.is_set():
                jobs.append(await run_job(http, _job_body(text, args), stop))

        running = asyncio.create_task(keep_a_job_running())
        await asyncio.sleep(args.job_lead_seconds)  # the job fills the steps before the agents come
        made_before, t0 = await _job_audio_made(http), time.perf_counter()
        level = await capacity.agent_level(ws_url(base), agents, args, {"num_step": args.num_step}, pool)
        made, seconds = await _job_audio_made(http) - made_before, time.perf_counter() - t0
        stop.set()
        await running
    return {"agents": level, "jobs": jobs, "job_audio_s_per_s_during": round(made / seconds, 2)}


def ws_url(base: str) -> str:
    return base.replace("http", "ws", 1) + "/v1/stream"


def measure(base: str, args) -> dict:
    text = long_text(args.minutes * 60.0, args.seed)
    result: dict = {"text": {"chars": len(text), "estimated_seconds": round(estimate_seconds(text), 1),
                             "paragraphs": text.count("\n\n") + 1}}
    alone = ws_bench.run(job_alone(base, text, args))
    result["job"] = alone
    print(f"job: {alone['audio_seconds']} audio-s in {alone['wall_seconds']} s = {alone['audio_s_per_s']} audio-s/s "
          f"({alone['items']} items, {alone['status']})", file=sys.stderr)
    if args.with_agents:
        throughput = args.throughput or alone["audio_s_per_s"]
        agents = max(1, round(args.with_agents * throughput / capacity.AGENT_AUDIO_S_PER_S))
        result["agents_level"] = {"fraction": args.with_agents, "throughput_audio_s_per_s": throughput,
                                  "agents": agents}
        pool: Executor = (ThreadPoolExecutor(args.client_processes) if args.agents_in_threads else
                          ProcessPoolExecutor(args.client_processes, mp_context=multiprocessing.get_context("spawn")))
        with pool:
            if args.baseline:
                result["agents_alone"] = ws_bench.run(capacity.agent_level(ws_url(base), agents, args,
                                                                           {"num_step": args.num_step}, pool))
            result["agents_with_job"] = ws_bench.run(agents_beside_a_job(base, text, agents, args, pool))
        level = result["agents_with_job"]["agents"]
        print(f"{agents} agents beside a job: p95 first audio {level['first_audio_ms'].get('p95')} ms, "
              f"{level['underruns']} underruns; jobs {result['agents_with_job']['job_audio_s_per_s_during']} "
              "audio-s/s meanwhile", file=sys.stderr)
    return result


def summary(result: dict, gpu: str | None, commit: str | None) -> dict:
    job = result["job"]
    beside = (result.get("agents_with_job") or {}).get("agents") or {}
    alone = result.get("agents_alone") or {}
    return {
        "job_audio_s_per_s": job["audio_s_per_s"], "job_audio_seconds": job["audio_seconds"],
        "job_wall_seconds": job["wall_seconds"], "job_items": job["items"], "job_first_item_s": job["first_item_s"],
        "agents": (result.get("agents_level") or {}).get("agents"),
        "agents_with_job_p95_first_audio_ms": (beside.get("first_audio_ms") or {}).get("p95"),
        "agents_with_job_underruns": beside.get("underruns"),
        "agents_with_job_passed": beside.get("passed"),
        "job_audio_s_per_s_beside_agents": (result.get("agents_with_job") or {}).get("job_audio_s_per_s_during"),
        "agents_alone_p95_first_audio_ms": (alone.get("first_audio_ms") or {}).get("p95"),
        "agents_alone_underruns": alone.get("underruns"),
        "gpu": gpu, "commit": commit,
    }


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1.5:
        raise argparse.ArgumentTypeError("a share of the throughput in (0, 1.5]")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = server_parser("bench.jobs", __doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=60.0, help="speech the job's text is sized to (default 60)")
    p.add_argument("--voice", default=None, help="the job's voice (default none: the first item's voice)")
    p.add_argument("--format", default="mp3", choices=("mp3", "opus", "aac", "flac", "wav", "pcm"))
    p.add_argument("--num-step", type=int, default=32)
    p.add_argument("--no-normalize", action="store_true", help="the job's text as written (normalize_text false)")
    p.add_argument("--no-download", action="store_true", help="do not fetch the job's zip")
    p.add_argument("--with-agents", type=_fraction, default=None, metavar="FRACTION",
                   help="voice agents at this share of the throughput beside a running job")
    p.add_argument("--throughput", type=float, default=None, help="audio-s/s the agents' share is of "
                   "(default: the job's rate measured first)")
    p.add_argument("--baseline", action="store_true", help="the same agents alone first")
    p.add_argument("--job-lead-seconds", type=float, default=3.0, help="the job runs this long before the agents")
    p.add_argument("--level-seconds", type=float, default=30.0, help="the agents' measured seconds")
    p.add_argument("--ramp-seconds", type=float, default=5.0, help="agents join evenly over this long first")
    p.add_argument("--p95-ms", type=float, default=250.0, help="first-audio promise the agents must keep")
    p.add_argument("--client-processes", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 2)),
                   help="processes (threads with --agents-in-threads) the agents are spread over")
    p.add_argument("--agents-in-threads", action="store_true", help="agents in threads of this process "
                   "(small runs: no process start-up)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="default: bench/results/<date>-<gpu|cpu>-jobs.json")
    return p


def main(argv: list[str] | None = None) -> int:
    return run_served("bench.jobs", "jobs", argv, build_parser(), measure, summary)


if __name__ == "__main__":
    sys.exit(main())
