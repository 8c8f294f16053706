"""`chorus serve | make-checkpoint | bench | loadtest`.

Every flag says what it does and its default (`--help`); a mistake (a bad value, a port in
use, a missing model folder, no GPU...) is one or two lines on stderr and a non-zero exit,
never a traceback unless `--log-level debug` asks for one.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from pathlib import Path

from server.cli_net import add_connection_flags, apply_connection_flags
from server.cli_values import non_negative_float, non_negative_int, port, positive_float, positive_int, size
from server.config import ServerConfig, StreamLimits, parse_hosts, parse_origins

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("chorus-tts")
    except PackageNotFoundError:
        return "unknown (not installed)"


class _HelpFormatter(argparse.HelpFormatter):
    """Every flag's help ends with its default, unless the text already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """A mistake is two lines: what is wrong, and where the options are listed."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\nSee `{self.prog} --help` for the options.\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="chorus", description="Chorus: streaming OmniVoice TTS server",
                     formatter_class=_HelpFormatter)
    parser.add_argument("--version", action="version", version=f"chorus {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    serve = sub.add_parser("serve", help="run the HTTP/WebSocket server", formatter_class=_HelpFormatter)
    serve.add_argument("--model", default=None, help="checkpoint folder or hub id (default: $CHORUS_MODEL, "
                       "else a tiny random demo checkpoint made once)")
    serve.add_argument("--host", default=os.environ.get("CHORUS_HOST", "127.0.0.1"),
                       help="address to listen on; 0.0.0.0 for every interface ($CHORUS_HOST)")
    serve.add_argument("--port", type=port, default=os.environ.get("CHORUS_PORT", "8000"),
                       help="port to listen on; 0 picks a free one ($CHORUS_PORT)")
    serve.add_argument("--device", default=os.environ.get("CHORUS_DEVICE", "cpu"),
                       help="cpu, cuda (every visible GPU), cuda:N or cuda:0,1 ($CHORUS_DEVICE)")
    serve.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default=None,
                       help="default: float32 on cpu, bfloat16 on cuda")
    serve.add_argument("--api-key", default=None, help="require this key (default: $CHORUS_API_KEY)")
    serve.add_argument("--voices-dir", default=None,
                       help="voice library folder (default: $CHORUS_VOICES_DIR, else ./voices)")
    serve.add_argument("--voices-db", default=None,
                       help="postgresql://... voice library shared by several replicas (default: $CHORUS_VOICES_DB; "
                            "else the embedded SQLite library in --voices-dir)")
    serve.add_argument("--asr-model", default=None,
                       help="Whisper model used to transcribe uploaded voices sent without a transcript")
    serve.add_argument("--max-batch-size", type=positive_int, default=16,
                       help="requests one engine steps together at most")
    serve.add_argument("--max-packed-tokens", type=positive_int, default=24576,
                       help="tokens one packed forward holds at most (every row's canvas, both guidance halves)")
    serve.add_argument("--max-queue", type=positive_int, default=256,
                       help="requests accepted and not finished, all clients together; more get busy")
    serve.add_argument("--max-audio-seconds", type=positive_float, default=1800.0,
                       help="audio one request (or one text stream, all its segments together) may produce, "
                            "from its plan; more is refused up front (default 1800)")
    serve.add_argument("--max-audio-seconds-inflight", type=positive_float, default=14400.0,
                       help="audio all accepted requests together may produce (it is held in memory until "
                            "sent); a request over it gets busy (default 14400)")
    serve.add_argument("--max-text-chars", type=positive_int, default=5000, help="longest text one request may have")
    serve.add_argument("--max-instructions-chars", type=positive_int, default=4096,
                       help="longest `instructions` of /v1/audio/speech (free text mapped to voice-design items); "
                            "longer is refused before it is read (default 4096)")
    serve.add_argument("--max-inflight", type=positive_int, default=16,
                       help="requests one WebSocket connection may have in flight")
    serve.add_argument("--max-frame-bytes", type=size, default="16M",
                       help="largest WebSocket frame; a larger one closes the socket with 1009 (default 16M)")
    serve.add_argument("--max-reference-bytes", type=size, default="16M",
                       help="largest reference audio file, uploaded or base64 (default 16M)")
    serve.add_argument("--max-references-bytes", type=size, default="64M",
                       help="one-shot reference audio (base64, as sent) held at once while it is decoded and "
                            "encoded, all requests together; beyond, busy before it is decoded (default 64M)")
    serve.add_argument("--max-voice-encodes", type=positive_int, default=None,
                       help="reference clips (uploads and one-shot references) encoded at once, all clients "
                            "together; the rest wait in order. Encodes share the CPU with the step loop "
                            "(default: 2 per engine)")
    serve.add_argument("--max-reference-seconds", type=positive_float, default=60.0,
                       help="longest reference audio clip (default 60)")
    serve.add_argument("--max-voices", type=positive_int, default=1000,
                       help="voices the library may hold (default 1000)")
    serve.add_argument("--max-voices-bytes", type=size, default="256M",
                       help="stored voice data the library may hold, all voices together (default 256M)")
    serve.add_argument("--idle-timeout", type=non_negative_float, default=300.0,
                       help="close a WebSocket idle this many seconds with nothing in flight (0: never; default 300)")
    serve.add_argument("--drain-seconds", type=non_negative_float, default=30.0,
                       help="on SIGTERM/SIGINT, time in-flight requests get to finish before the rest are "
                            "cancelled (default 30)")
    serve.add_argument("--stream-idle-seconds", type=positive_float, default=30.0,
                       help="end a text stream with stream_idle after this long without text (default 30)")
    serve.add_argument("--stream-max-buffered-chars", type=positive_int, default=5000,
                       help="text a stream may hold not yet synthesising; over it: stream_too_long (default 5000)")
    serve.add_argument("--stream-max-segments", type=positive_int, default=4,
                       help="segments of one stream synthesising at once (default 4)")
    serve.add_argument("--stream-max-seconds", type=positive_float, default=900.0,
                       help="longest a stream may last, open to done; over it: stream_too_long (default 900)")
    add_connection_flags(serve)
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
    serve.add_argument("--urgent-step-tokens", type=positive_int, default=2048,
                       help="deadline scheduling: while a chunk due soon runs, a step holds at most this many "
                            "packed tokens (more only when the urgent chunks alone need more), so their steps "
                            "stay short; chunks far ahead of playback wait")
    serve.add_argument("--graph-max-tokens", type=non_negative_int, default=8192,
                       help="CUDA: steps up to this many packed tokens replay CUDA graphs captured at start "
                            "(fewer interpreter launches per step; at 8192 they hold about 1.5 GiB more GPU memory "
                            "than at 4096); 0: no graphs")
    serve.add_argument("--log-level", type=str.lower, choices=LOG_LEVELS,
                       default=os.environ.get("CHORUS_LOG_LEVEL", "info").lower(),
                       help="log detail; debug also shows the traceback of a failed start ($CHORUS_LOG_LEVEL)")

    make = sub.add_parser("make-checkpoint", help="write a random-weight OmniVoice checkpoint",
                          formatter_class=_HelpFormatter)
    make.add_argument("--size", choices=["tiny", "full"], required=True,
                      help="tiny: runs a request in well under a second on a CPU; full: the real architecture")
    make.add_argument("--out", required=True, help="folder to write the checkpoint to")
    make.add_argument("--seed", type=int, default=0, help="seed of the random weights")

    # Options are bench's own (`chorus bench --help`); they pass through untouched.
    sub.add_parser("bench", add_help=False,
                   help="GPU benchmark: the reference and Chorus on the same requests (bench/README.md; "
                        "from a source checkout)")
    sub.add_parser("loadtest", add_help=False,
                   help="load and soak test: many WebSocket clients against a server, then a report")
    return parser


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
    cfg.max_queue = args.max_queue
    cfg.max_text_chars = args.max_text_chars
    cfg.max_instructions_chars = args.max_instructions_chars
    cfg.max_inflight_per_connection = args.max_inflight
    cfg.max_frame_bytes = args.max_frame_bytes
    cfg.max_reference_bytes = args.max_reference_bytes
    cfg.max_reference_seconds = args.max_reference_seconds
    cfg.max_references_bytes = args.max_references_bytes
    cfg.max_voice_encodes = args.max_voice_encodes
    cfg.max_voices = args.max_voices
    cfg.max_voices_bytes = args.max_voices_bytes
    cfg.idle_timeout = args.idle_timeout
    cfg.drain_seconds = args.drain_seconds
    cfg.stream = StreamLimits(args.stream_idle_seconds, args.stream_max_buffered_chars, args.stream_max_segments,
                              args.stream_max_seconds, args.max_audio_seconds)
    apply_connection_flags(cfg, args)
    if args.allowed_origins is not None:
        cfg.allowed_origins = parse_origins(args.allowed_origins)
    if args.allowed_hosts is not None:
        cfg.allowed_hosts = parse_hosts(args.allowed_hosts)
    if args.page_embeds_key:
        cfg.page_embeds_key = True
    cfg.engine.device = args.device
    cfg.engine.dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    cfg.engine.max_batch_size = args.max_batch_size
    cfg.engine.max_packed_tokens = args.max_packed_tokens
    cfg.engine.max_audio_seconds = args.max_audio_seconds
    cfg.engine.max_audio_seconds_inflight = args.max_audio_seconds_inflight
    cfg.engine.attention = args.attention
    cfg.engine.scheduling = args.scheduling
    cfg.engine.urgent_step_tokens = args.urgent_step_tokens
    cfg.engine.graph_max_tokens = args.graph_max_tokens
    cfg.engine.quantize = None if args.quantize == "none" else args.quantize
    cfg.engine.engine_processes = {"auto": None, "yes": True, "no": False}[args.engine_processes]
    return cfg


def _configure_logging(level: str) -> None:
    from server.logs import configure

    configure(level)


def _bench(argv: list[str]) -> int:
    """`chorus bench` runs the repository's `bench/`, which is not installed: checkouts only."""
    from server.checkout import checkout_root

    root = checkout_root()
    if root is None:
        print("chorus bench runs from a source checkout (it needs the repository's bench/ folder, which "
              "is not installed): clone the repository and run `python -m server bench ...` in it",
              file=sys.stderr)
        return 2
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from bench.cli import main as bench_main

    return bench_main(argv)


def main(argv: list[str] | None = None) -> int:
    # pydub (imported by omnivoice) warns when ffmpeg is missing; Chorus never asks it to
    # decode or encode a file (soundfile and PyAV do), so the warning only misleads.
    warnings.filterwarnings("ignore", message="Couldn't find ffmpeg or avconv", category=RuntimeWarning)
    quiet = "ignore:Couldn't find ffmpeg or avconv:RuntimeWarning"  # engine and finisher processes too
    os.environ["PYTHONWARNINGS"] = ",".join(filter(None, (os.environ.get("PYTHONWARNINGS"), quiet)))
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if args.command == "bench":
        return _bench(rest)
    if args.command == "loadtest":
        from server.loadtest.cli import main as loadtest_main

        return loadtest_main(rest)
    if rest:
        parser.error("unrecognized arguments: " + " ".join(rest))
    if args.command == "make-checkpoint":
        _configure_logging("info")
        from server.checkpoint import make_checkpoint

        path = make_checkpoint(args.size, args.out, seed=args.seed)
        print(f"wrote a random-weight {args.size} OmniVoice checkpoint to {path} (its audio is noise)")
        return 0
    if args.command == "serve":
        _configure_logging(args.log_level)
        return _serve(args)
    return 2


def _serve(args: argparse.Namespace) -> int:
    """`chorus serve`; a failed start is one line (and its traceback with --log-level debug)."""
    from server.boot_checks import StartupError
    from server.run import serve

    try:
        return serve(config_from_args(args))
    except StartupError as exc:
        logging.getLogger("chorus").debug("the start failed", exc_info=True)
        print(f"chorus serve: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # anything else that stops a start: still one line
        logging.getLogger("chorus").debug("the start failed", exc_info=True)
        print(f"chorus serve: could not start: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}\n"
              "Run with --log-level debug for the details.", file=sys.stderr)
        return 1
