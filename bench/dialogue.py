"""A two-speaker dialogue's first audio against `chorus serve`, as a client sees it.

A script of `--minutes` (5) of speech, sized by the reference's duration estimator, in lines of
1-3 sentences that alternate between two built-in voices, is sent as one `dialogue` frame over
the WebSocket: `dialogue_first_audio_ms` is from the frame sent to its first audio frame
received (median of `--runs`, after `--warmup` runs that also make the voices), with the whole
dialogue's time beside it. The same script over `POST /v1/audio/dialogue` (`pcm`): time to the
response's first audio bytes.

    python -m bench.dialogue --checkpoint ckpt-full -- --device cuda
    python -m bench.dialogue --url http://127.0.0.1:8000 --minutes 0.2 --runs 2 --num-step 2

Arguments after `--` go to the `chorus serve` it starts (not with `--url`).
"""

from __future__ import annotations

import argparse
import random
import sys
import time

import httpx

from bench import ws_bench
from bench.jobs import sentence, ws_url
from bench.metrics import stats
from bench.served import run_served, server_parser
from server.jobs.split import estimate_seconds

SPEAKERS = ("alloy", "echo")
SUMMARY_KEYS = ("dialogue_first_audio_ms", "dialogue_first_audio_p95_ms", "dialogue_done_s", "dialogue_lines",
                "dialogue_audio_seconds", "http_dialogue_first_audio_ms", "gpu", "commit")


def script(seconds: float, seed: int = 0) -> list[dict]:
    """Lines of 1-3 sentences, the speakers taking turns, until the estimator puts them at `seconds`."""
    rng = random.Random(seed)
    lines: list[dict] = []
    total = 0.0
    while total < seconds:
        text = " ".join(sentence(rng) for _ in range(rng.randint(1, 3)))
        lines.append({"voice": SPEAKERS[len(lines) % len(SPEAKERS)], "text": text})
        total += estimate_seconds(text)
    return lines


async def over_websocket(url: str, lines: list[dict], args) -> dict:
    """The script sent `warmup + runs` times, one at a time on one connection (each seeded apart)."""
    client = await ws_bench.Client.connect(url)
    rows = []
    try:
        for i in range(args.warmup + args.runs):
            await client.send_message({"type": "dialogue", "id": f"dialogue{i}", "lines": lines,
                                       "options": {"seed": i, "num_step": args.num_step}})
            timing = await client.wait(f"dialogue{i}", timeout=600)
            if i >= args.warmup:
                rows.append(timing)
    finally:
        await client.close()
    done = [t for t in rows if t.outcome == "done"]
    return {"runs": len(rows), "outcomes": {o: sum(t.outcome == o for t in rows) for o in {t.outcome for t in rows}},
            "client_first_audio_ms": stats([t.first_ms for t in done if t.first_ms is not None], 2),
            "client_done_s": stats([t.total_ms / 1e3 for t in done], 3),
            "audio_seconds": round(sum(t.samples / t.sample_rate for t in done) / max(1, len(done)), 2)}


def over_http(base: str, lines: list[dict], args) -> dict:
    """The script as `POST /v1/audio/dialogue` with raw PCM: time to the first audio bytes."""
    firsts = []
    with httpx.Client(base_url=base, timeout=600) as http:
        for i in range(args.warmup + args.runs):
            body = {"lines": lines, "response_format": "pcm", "seed": i, "num_step": args.num_step}
            t0 = time.perf_counter()
            with http.stream("POST", "/v1/audio/dialogue", json=body) as response:
                response.raise_for_status()
                first = None
                for chunk in response.iter_bytes():
                    if first is None and chunk:
                        first = (time.perf_counter() - t0) * 1e3
            if i >= args.warmup and first is not None:
                firsts.append(first)
    return {"first_audio_ms": stats(firsts, 2)}


def measure(base: str, args) -> dict:
    lines = script(args.minutes * 60.0, args.seed)
    result: dict = {"script": {"lines": len(lines), "speakers": list(SPEAKERS),
                               "estimated_seconds": round(sum(estimate_seconds(x["text"]) for x in lines), 1)}}
    result["websocket"] = ws_bench.run(over_websocket(ws_url(base), lines, args))
    ws = result["websocket"]
    print(f"dialogue of {len(lines)} lines: first audio {ws['client_first_audio_ms'].get('median')} ms "
          f"(p95 {ws['client_first_audio_ms'].get('p95')}), done in {ws['client_done_s'].get('median')} s",
          file=sys.stderr)
    if not args.no_http:
        result["http"] = over_http(base, lines, args)
    return result


def summary(result: dict, gpu: str | None, commit: str | None) -> dict:
    ws = result["websocket"]
    return {"dialogue_first_audio_ms": ws["client_first_audio_ms"].get("median"),
            "dialogue_first_audio_p95_ms": ws["client_first_audio_ms"].get("p95"),
            "dialogue_done_s": ws["client_done_s"].get("median"), "dialogue_lines": result["script"]["lines"],
            "dialogue_audio_seconds": ws["audio_seconds"],
            "http_dialogue_first_audio_ms": ((result.get("http") or {}).get("first_audio_ms") or {}).get("median"),
            "gpu": gpu, "commit": commit}


def build_parser() -> argparse.ArgumentParser:
    p = server_parser("bench.dialogue", __doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=5.0, help="speech the script is sized to (default 5)")
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--num-step", type=int, default=32)
    p.add_argument("--no-http", action="store_true", help="the WebSocket only")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="default: bench/results/<date>-<gpu|cpu>-dialogue.json")
    return p


def main(argv: list[str] | None = None) -> int:
    return run_served("bench.dialogue", "dialogue", argv, build_parser(), measure, summary)


if __name__ == "__main__":
    sys.exit(main())
