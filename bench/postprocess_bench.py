"""Post-processing cost per chunk on this CPU: the reference's pydub path vs the vectorised port.

`python -m bench.postprocess_bench --out result.json` times `OmniVoice._post_process_audio`
and `server.engine.model.codec.post_process` on speech-like chunks of 10 s and 30 s (each with
internal silences, so every step of the silence removal runs), checks that both give the same
samples, and times a round trip of the port through a spawned worker process (what the
finisher used to do). Wall and thread-CPU milliseconds per chunk: on a shared, loaded machine
the CPU times are the steadier measure. `port_after_idle` runs the port as the engine does:
on a worker thread that slept ~70 ms before each call (a 10 s line's steps), with the page
faults it took, to tell a cold core from a warm loop; `port_after_busy` the same after
spinning instead of sleeping (a core kept busy, and so awake and clocked up), and
`port_after_idle_and_another_chunk` after the port of another chunk right before (code,
branch history and allocator warm again).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import resource
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from types import SimpleNamespace

import numpy as np

from bench.metrics import stats
from server.engine.model.codec import post_process

RATE = 24000


def reference_post_process(audio: np.ndarray, ref_rms, postprocess: bool) -> np.ndarray:
    from omnivoice.models.omnivoice import OmniVoice, OmniVoiceGenerationConfig

    config = OmniVoiceGenerationConfig(postprocess_output=postprocess)
    out = OmniVoice._post_process_audio(SimpleNamespace(sampling_rate=RATE), audio, ref_rms=ref_rms, gen_config=config)
    return np.ascontiguousarray(out.squeeze(0), dtype=np.float32)


def speech_chunk(seconds: float, seed: int = 7) -> np.ndarray:
    """A gliding harmonic tone in syllable bursts, with a 1 s and a 0.6 s pause inside."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    phase = 2 * np.pi * np.cumsum(140 + 30 * np.sin(2 * np.pi * 0.7 * t)) / RATE
    voice = sum(np.sin(k * phase) / k for k in range(1, 6))
    audio = 0.3 * voice * np.clip(np.sin(2 * np.pi * 3.0 * t), 0, None) ** 0.5 + 0.003 * rng.standard_normal(t.shape)
    audio[2 * RATE:3 * RATE] = 0
    audio[5 * RATE:int(5.6 * RATE)] *= 1e-3
    return audio.astype(np.float32)[np.newaxis, :]


def timed(fn, repeats: int) -> dict:
    fn()
    wall, cpu = [], []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.thread_time()
        fn()
        cpu.append((time.thread_time() - c0) * 1e3)
        wall.append((time.perf_counter() - w0) * 1e3)
    return {"wall_ms": stats(wall), "cpu_ms": stats(cpu)}


def _thread_minor_faults() -> int | None:
    """Minor page faults of the calling thread so far (Linux only; None elsewhere)."""
    who = getattr(resource, "RUSAGE_THREAD", None)
    return None if who is None else resource.getrusage(who).ru_minflt


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def after_idle(fn, repeats: int, idle_s: float = 0.07, busy: bool = False, prepare=None) -> dict:
    """`fn` on one thread that sleeps `idle_s` before each call (spins instead when `busy`;
    then runs `prepare`, untimed): wall and CPU ms, and the minor page faults each call took
    where the system counts them per thread."""
    wall, cpu, faults = [], [], []

    def loop():
        fn()
        for _ in range(repeats):
            _spin(idle_s) if busy else time.sleep(idle_s)
            if prepare is not None:
                prepare()
            f0 = _thread_minor_faults()
            w0, c0 = time.perf_counter(), time.thread_time()
            fn()
            cpu.append((time.thread_time() - c0) * 1e3)
            wall.append((time.perf_counter() - w0) * 1e3)
            if f0 is not None:
                faults.append(_thread_minor_faults() - f0)

    worker = threading.Thread(target=loop)
    worker.start()
    worker.join()
    return {"idle_ms": idle_s * 1e3, "wall_ms": stats(wall), "cpu_ms": stats(cpu),
            "minor_faults": stats(faults) if faults else None}


def _wall_ms(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def run(repeats: int) -> dict:
    out: dict = {"cpu": platform.processor() or platform.machine(), "cores": multiprocessing.cpu_count(), "chunks": {}}
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        for seconds in (10, 30):
            audio = speech_chunk(seconds)
            identical = all(
                np.array_equal(post_process(audio, rms, pp, RATE), reference_post_process(audio, rms, pp))
                for rms in (None, 0.05) for pp in (True, False))
            hop = lambda: pool.submit(post_process, audio, 0.05, True, RATE).result()
            hop()
            port = lambda a=audio: post_process(a, 0.05, True, RATE)
            other = speech_chunk(seconds, seed=8)
            out["chunks"][f"{seconds}s"] = {
                "identical": identical,
                "reference": timed(lambda: reference_post_process(audio, 0.05, True), max(5, repeats // 5)),
                "port": timed(lambda: post_process(audio, 0.05, True, RATE), repeats),
                "port_after_idle": after_idle(port, max(5, repeats // 4)),
                "port_after_busy": after_idle(port, max(5, repeats // 4), busy=True),
                "port_after_idle_and_another_chunk": after_idle(port, max(5, repeats // 4),
                                                                prepare=lambda: port(other)),
                "port_postprocess_off": timed(lambda: post_process(audio, 0.05, False, RATE), repeats),
                "port_through_a_worker_process": {"wall_ms": stats([_wall_ms(hop) for _ in range(repeats)])},
            }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.postprocess_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    result = {"command": "python -m bench.postprocess_bench " + " ".join(sys.argv[1:] if argv is None else argv),
              "load_average_before": os.getloadavg()[0], **run(args.repeats)}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
