"""The `chorus serve` flags: their value types, help and defaults, and the `ServerConfig` they
make (flags over `CHORUS_*` environment variables over the built-in defaults)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from server import envs
from server.cli_values import non_negative_float, non_negative_int, port, positive_float, positive_int, size
from server.config import ServerConfig, StreamLimits, parse_hosts, parse_origins

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


class Limit(NamedTuple):
    """A numeric `chorus serve` flag and the `ServerConfig` field it sets (`engine.` for the engine's)."""

    flag: str
    kind: Callable[[str], object]
    default: object
    field: str
    help: str


# The server's limits and sizes, in the order `--help` lists them.
LIMITS = (
    Limit("--max-batch-size", positive_int, 16, "engine.max_batch_size",
          "requests one engine steps together at most"),
    Limit("--max-packed-tokens", positive_int, 24576, "engine.max_packed_tokens",
          "tokens one packed forward holds at most (every row's canvas, both guidance halves)"),
    Limit("--max-queue", positive_int, 256, "max_queue",
          "requests accepted and not finished, all clients together; more get busy"),
    Limit("--max-audio-seconds", positive_float, 1800.0, "engine.max_audio_seconds",
          "audio one request (or one text stream, all its segments together) may produce, "
          "from its plan; more is refused up front (default 1800)"),
    Limit("--max-audio-seconds-inflight", positive_float, 14400.0, "engine.max_audio_seconds_inflight",
          "audio all accepted requests together may produce (it is held in memory until "
          "sent); a request over it gets busy (default 14400)"),
    Limit("--max-text-chars", positive_int, 5000, "max_text_chars",
          "longest text one request may have"),
    Limit("--max-instructions-chars", positive_int, 4096, "max_instructions_chars",
          "longest `instructions` of /v1/audio/speech (free text mapped to voice-design items); "
          "longer is refused before it is read (default 4096)"),
    Limit("--max-inflight", positive_int, 16, "max_inflight_per_connection",
          "requests one WebSocket connection may have in flight"),
    Limit("--max-frame-bytes", size, "16M", "max_frame_bytes",
          "largest WebSocket frame; a larger one closes the socket with 1009 (default 16M)"),
    Limit("--max-reference-bytes", size, "16M", "max_reference_bytes",
          "largest reference audio file, uploaded or base64 (default 16M)"),
    Limit("--max-references-bytes", size, "64M", "max_references_bytes",
          "one-shot reference audio (base64, as sent) held at once while it is decoded and "
          "encoded, all requests together; beyond, busy before it is decoded (default 64M)"),
    Limit("--max-voice-encodes", positive_int, None, "max_voice_encodes",
          "reference clips (uploads and one-shot references) encoded at once, all clients "
          "together; the rest wait in order. Encodes share the CPU with the step loop "
          "(default: 2 per engine)"),
    Limit("--max-reference-seconds", positive_float, 60.0, "max_reference_seconds",
          "longest reference audio clip (default 60)"),
    Limit("--max-voices", positive_int, 1000, "max_voices",
          "voices the library may hold (default 1000)"),
    Limit("--max-voices-bytes", size, "256M", "max_voices_bytes",
          "stored voice data the library may hold, all voices together (default 256M)"),
    Limit("--kept-voice-ttl", positive_float, 86400.0, "kept_voice_ttl",
          "seconds a voice kept by a request's keep_voice stays usable (default 86400: a day)"),
    Limit("--max-kept-voices", positive_int, 1000, "max_kept_voices",
          "kept voices the library holds at most; a new one replaces the one closest to expiry"),
    Limit("--idle-timeout", non_negative_float, 300.0, "idle_timeout",
          "close a WebSocket idle this many seconds with nothing in flight (0: never; default 300)"),
    Limit("--drain-seconds", non_negative_float, 30.0, "drain_seconds",
          "on SIGTERM/SIGINT, time in-flight requests get to finish before the rest are "
          "cancelled (default 30)"),
    Limit("--max-connections", positive_int, None, "max_connections",
          "open HTTP and WebSocket connections; more are answered 503 and closed (default 4096, "
          "and always at most the file descriptor limit less an eighth, at least 64)"),
    Limit("--max-connections-per-client", positive_int, None, "max_connections_per_client",
          "open connections one client address may hold; more get 503 busy (default: a quarter "
          "of --max-connections; behind a proxy every client has its address: raise it). "
          "Health requests are still answered past either cap"),
    Limit("--header-timeout", positive_float, 10.0, "header_timeout",
          "seconds a request's headers may take to arrive, from its first byte or the connect; "
          "then 408 and close (default 10)"),
    Limit("--body-timeout", positive_float, 60.0, "body_timeout",
          "seconds a request body may take to arrive after its headers; then 408 and close "
          "(default 60)"),
    Limit("--send-timeout", positive_float, 30.0, "send_timeout",
          "seconds a client may take none of what the server sends (audio, or a close) before "
          "its connection is dropped and its requests cancelled (default 30)"),
    Limit("--max-bodies-bytes", size, "128M", "max_bodies_bytes",
          "HTTP request bodies held at once, all requests together, counted as their bytes "
          "arrive; beyond, 503 busy (default 128M)"),
    Limit("--max-bodies-bytes-per-client", size, None, "max_bodies_bytes_per_client",
          "HTTP request bodies one client address may hold at once; beyond, 503 busy (default: "
          "a quarter of --max-bodies-bytes, at least one largest body)"),
    Limit("--max-outbox-bytes", size, "32M", "max_outbox_bytes",
          "frames queued for one WebSocket and not yet sent; beyond, new requests on it get busy "
          "and past --send-timeout it is closed (1008) (default 32M)"),
    Limit("--urgent-step-tokens", positive_int, 2048, "engine.urgent_step_tokens",
          "deadline scheduling: while a chunk due soon runs, a step holds at most this many "
          "packed tokens (more only when the urgent chunks alone need more), so their steps "
          "stay short; chunks far ahead of playback wait"),
    Limit("--graph-max-tokens", non_negative_int, 8192, "engine.graph_max_tokens",
          "CUDA: steps up to this many packed tokens replay CUDA graphs captured at start "
          "(fewer interpreter launches per step; at 8192 they hold about 1.5 GiB more GPU memory "
          "than at 4096); 0: no graphs"),
)


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
    serve.add_argument("--voices-dir", default=None,
                       help="voice library folder (default: $CHORUS_VOICES_DIR, else ./voices)")
    serve.add_argument("--voices-db", default=None,
                       help="postgresql://... voice library shared by several replicas (default: $CHORUS_VOICES_DB; "
                            "else the embedded SQLite library in --voices-dir)")
    serve.add_argument("--aligner", default=None,
                       help="a local wav2vec2/MMS-style CTC checkpoint folder: word timestamps come from "
                            "forced alignment of the audio (\"source\": \"aligned\") instead of the model's estimate")
    serve.add_argument("--asr-model", default=None,
                       help="Whisper model used to transcribe uploaded voices sent without a transcript")
    for limit in LIMITS:
        serve.add_argument(limit.flag, type=limit.kind, default=limit.default, help=limit.help)
    serve.add_argument("--stream-idle-seconds", type=positive_float, default=30.0,
                       help="end a text stream with stream_idle after this long without text (default 30)")
    serve.add_argument("--stream-max-buffered-chars", type=positive_int, default=5000,
                       help="text a stream may hold not yet synthesising; over it: stream_too_long (default 5000)")
    serve.add_argument("--stream-max-segments", type=positive_int, default=4,
                       help="segments of one stream synthesising at once (default 4)")
    serve.add_argument("--stream-max-seconds", type=positive_float, default=900.0,
                       help="longest a stream may last, open to done; over it: stream_too_long (default 900)")
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
                            "(off by default: it refuses too early; docs/performance.md has its measurement)")
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
    if args.voices_dir:
        cfg.voices_dir = Path(args.voices_dir)
    if args.voices_db:
        cfg.voices_db = args.voices_db
    cfg.asr_model = args.asr_model
    cfg.aligner = args.aligner
    for limit in LIMITS:
        owner, _, name = limit.field.rpartition(".")
        setattr(cfg.engine if owner else cfg, name, getattr(args, limit.flag[2:].replace("-", "_")))
    cfg.stream = StreamLimits(args.stream_idle_seconds, args.stream_max_buffered_chars, args.stream_max_segments,
                              args.stream_max_seconds, args.max_audio_seconds)
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
