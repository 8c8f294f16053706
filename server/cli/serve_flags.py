"""The `chorus serve` flags: their value types, help and defaults, and the `ServerConfig` they
make (flags over `CHORUS_*` environment variables over the built-in defaults)."""

from __future__ import annotations

import argparse
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from server import envs
from server.cli.values import VALUE_TYPES, port
from server.config import ServerConfig, parse_hosts, parse_origins

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


class Limit(NamedTuple):
    """A numeric `chorus serve` flag and the `ServerConfig` field it sets (`engine.` for the
    engine's, `stream.` for a text stream's)."""

    flag: str
    kind: Callable[[str], object]
    default: object
    field: str
    help: str


def _limits(table: dict) -> tuple[Limit, ...]:
    return tuple(Limit(entry["flag"], VALUE_TYPES[entry["type"]], entry.get("default"), entry["field"], entry["help"])
                 for entry in table["limit"])


# The server's limits and sizes, in the order `--help` lists them: a table of their own
# (flag, value type, default, field, help), read once.
LIMITS = _limits(tomllib.loads((Path(__file__).with_name("serve_flags.toml")).read_text(encoding="utf-8")))


def add_serve_arguments(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("--model", default=None, help="checkpoint folder or hub id (default: $CHORUS_MODEL, "
                       "else a tiny random demo checkpoint made once)")
    serve.add_argument("--host", default=envs.CHORUS_HOST or "127.0.0.1",
                       help="address to listen on; 0.0.0.0 for every interface ($CHORUS_HOST)")
    serve.add_argument("--port", type=port, default=envs.CHORUS_PORT or "8000",
                       help="port to listen on; 0 picks a free one ($CHORUS_PORT)")
    serve.add_argument("--device", default=envs.CHORUS_DEVICE or "cpu",
                       help="cpu, cuda (every visible GPU), cuda:N or cuda:0,1 ($CHORUS_DEVICE)")
    serve.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default=None,
                       help="default: float32 on cpu, bfloat16 on cuda")
    serve.add_argument("--api-key", default=None, help="require this key (default: $CHORUS_API_KEY)")
    serve.add_argument("--api-keys-file", default=None,
                       help="a file of API keys, one a line (blank lines and # comments skipped): any of them "
                            "is accepted, and each key's kept voices are its own (default: $CHORUS_API_KEYS_FILE)")
    serve.add_argument("--voices-dir", default=None,
                       help="voice library folder (default: $CHORUS_VOICES_DIR, else ./voices)")
    serve.add_argument("--voices-db", default=None,
                       help="postgresql://... voice library shared by several replicas (default: $CHORUS_VOICES_DB; "
                            "else the embedded SQLite library in --voices-dir)")
    serve.add_argument("--jobs-dir", default=None,
                       help="folder of the embedded job store (POST /v1/jobs): its index and each item's audio "
                            "(default: jobs/ in --voices-dir; with --voices-db, jobs and audio live in that database)")
    serve.add_argument("--aligner", default=None,
                       help="a local wav2vec2/MMS-style CTC checkpoint folder: word timestamps come from "
                            "forced alignment of the audio (\"source\": \"aligned\") instead of the model's estimate")
    serve.add_argument("--asr-model", default=None,
                       help="Whisper model used to transcribe uploaded voices sent without a transcript")
    for limit in LIMITS:
        serve.add_argument(limit.flag, type=limit.kind, default=limit.default, help=limit.help)
    serve.add_argument("--allowed-origins", default=None,
                       help="comma-separated browser Origins allowed besides the server's own, or * for any "
                            "(default: $CHORUS_ALLOWED_ORIGINS, else same origin only)")
    serve.add_argument("--allowed-hosts", default=None,
                       help="comma-separated host names clients may reach the server by (the Host header), "
                            "besides localhost, IP addresses and --host; *.example.com for subdomains, * for any "
                            "(default: $CHORUS_ALLOWED_HOSTS; a name not listed gets 403: DNS rebinding)")
    serve.add_argument("--page-embeds-key", action="store_true",
                       help="put the API key in the demo page so it works without typing it; anyone who can "
                            "load the page then has the key (private deployments only)")
    serve.add_argument("--attention", choices=["auto", "torch", "flashinfer"], default="auto",
                       help="attention kernels: flashinfer on CUDA when installed (auto), else torch's")
    serve.add_argument("--engine-processes", choices=["auto", "yes", "no"], default="auto",
                       help="run each device's engine in its own process (auto: when serving several GPUs, "
                            "so their step loops do not share one interpreter lock)")
    serve.add_argument("--quantize", choices=["none", "fp8"], default="none",
                       help="fp8: the layers' projections in FP8 on a Hopper GPU (more audio per second under "
                            "load, not a sooner first sound; not bit-exact: fidelity in docs/performance.md); "
                            "none: the --dtype weights as they are")
    serve.add_argument("--scheduling", choices=["deadline", "fifo"], default="deadline",
                       help="deadline: each step packs the chunks due soonest first (a new request's first "
                            "chunk before chunks far ahead of playback; whole-file requests fill what is left; "
                            "nothing starves); fifo: first come first served")
    serve.add_argument("--realtime-admission", choices=["on", "off"], default="off",
                       help="deadline scheduling: answer busy (with a retry hint) to a new line or stream turn "
                            "when the realtime work already accepted would need twice what the engine can do "
                            "(off by default: it refuses too early; docs/performance.md has its measurement), "
                            "or when its first audio could not come within --realtime-promise-ms")
    serve.add_argument("--log-level", type=str.lower, choices=LOG_LEVELS,
                       default=(envs.CHORUS_LOG_LEVEL or "info").lower(),
                       help="log detail; debug also shows the traceback of a failed start ($CHORUS_LOG_LEVEL)")


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    cfg = ServerConfig.from_env()
    if args.model:
        cfg.model = args.model
    cfg.host, cfg.port = args.host, args.port
    if args.api_key:
        cfg.api_key = args.api_key
    if args.api_keys_file:
        cfg.api_keys_file = Path(args.api_keys_file)
    if args.voices_dir:
        cfg.voices_dir = Path(args.voices_dir)
    if args.voices_db:
        cfg.voices_db = args.voices_db
    if args.jobs_dir:
        cfg.jobs_dir = Path(args.jobs_dir)
    cfg.asr_model = args.asr_model
    cfg.aligner = args.aligner
    for limit in LIMITS:
        owner, _, name = limit.field.rpartition(".")
        setattr(getattr(cfg, owner) if owner else cfg, name, getattr(args, limit.flag[2:].replace("-", "_")))
    cfg.stream.max_audio_seconds = args.max_audio_seconds
    if args.allowed_origins is not None:
        cfg.allowed_origins = parse_origins(args.allowed_origins)
    if args.allowed_hosts is not None:
        cfg.allowed_hosts = parse_hosts(args.allowed_hosts)
    if args.page_embeds_key:
        cfg.page_embeds_key = True
    cfg.engine.device = args.device
    cfg.engine.dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    cfg.engine.attention = args.attention
    cfg.engine.scheduling = args.scheduling
    cfg.engine.realtime_admission = args.realtime_admission == "on"
    cfg.engine.quantize = None if args.quantize == "none" else args.quantize
    cfg.engine.engine_processes = {"auto": None, "yes": True, "no": False}[args.engine_processes]
    return cfg
