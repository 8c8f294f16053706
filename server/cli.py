"""`chorus serve | make-checkpoint | bench`."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from server.config import ServerConfig


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be a positive integer")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chorus", description="Chorus: streaming OmniVoice TTS server")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the HTTP/WebSocket server")
    serve.add_argument("--model", default=None, help="checkpoint folder or hub id (default: $CHORUS_MODEL, "
                       "else a tiny random demo checkpoint made once)")
    serve.add_argument("--host", default=os.environ.get("CHORUS_HOST", "127.0.0.1"))
    serve.add_argument("--port", type=int, default=int(os.environ.get("CHORUS_PORT", "8000")))
    serve.add_argument("--device", default=os.environ.get("CHORUS_DEVICE", "cpu"),
                       help="cpu, cuda (every visible GPU) or cuda:N")
    serve.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default=None,
                       help="default: float32 on cpu, bfloat16 on cuda")
    serve.add_argument("--api-key", default=None, help="require this key (default: $CHORUS_API_KEY)")
    serve.add_argument("--voices-dir", default=None, help="voice library folder (default: ./voices)")
    serve.add_argument("--voices-db", default=None,
                       help="postgresql://... voice library shared by several replicas (default: $CHORUS_VOICES_DB; "
                            "else the embedded SQLite library in --voices-dir)")
    serve.add_argument("--asr-model", default=None,
                       help="Whisper model used to transcribe uploaded voices sent without a transcript")
    serve.add_argument("--max-batch-size", type=_positive_int, default=16)
    serve.add_argument("--max-packed-tokens", type=_positive_int, default=24576)
    serve.add_argument("--max-queue", type=_positive_int, default=256)
    serve.add_argument("--max-text-chars", type=_positive_int, default=5000)
    serve.add_argument("--max-inflight", type=_positive_int, default=16,
                       help="requests one WebSocket connection may have in flight")
    serve.add_argument("--attention", choices=["auto", "torch", "flashinfer"], default="auto")
    serve.add_argument("--log-level", default=os.environ.get("CHORUS_LOG_LEVEL", "info"))

    make = sub.add_parser("make-checkpoint", help="write a random-weight OmniVoice checkpoint")
    make.add_argument("--size", choices=["tiny", "full"], required=True)
    make.add_argument("--out", required=True)
    make.add_argument("--seed", type=int, default=0)

    # Options are bench's own (`chorus bench --help`); they pass through untouched.
    sub.add_parser("bench", add_help=False,
                   help="GPU benchmark: the reference and Chorus on the same requests (bench/README.md)")
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
    cfg.max_inflight_per_connection = args.max_inflight
    cfg.engine.device = args.device
    cfg.engine.dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    cfg.engine.max_batch_size = args.max_batch_size
    cfg.engine.max_packed_tokens = args.max_packed_tokens
    cfg.engine.attention = args.attention
    return cfg


def _configure_logging(level: str) -> None:
    from server.logs import configure

    configure(level)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        from bench import main as bench_main

        return bench_main(rest)
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
        from server.run import serve

        return serve(config_from_args(args))
    return 2
