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
from importlib.metadata import PackageNotFoundError, version

from server import envs
from server.checkpoint import make_checkpoint
from server.cli.boot_checks import StartupError
from server.cli.checkout import checkout_root
from server.cli.logs import configure
from server.cli.serve_flags import add_serve_arguments, config_from_args
from server.cli.values import integer
from server.loadtest.cli import main as loadtest_main

__all__ = ["build_parser", "config_from_args", "main"]


def _version() -> str:
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
    add_serve_arguments(serve)

    make = sub.add_parser("make-checkpoint", help="write a random-weight OmniVoice checkpoint",
                          formatter_class=_HelpFormatter)
    make.add_argument("--size", choices=["tiny", "full"], required=True,
                      help="tiny: runs a request in well under a second on a CPU; full: the real architecture")
    make.add_argument("--out", required=True, help="folder to write the checkpoint to")
    make.add_argument("--seed", type=integer, default=0, help="seed of the random weights")
    aligner = sub.add_parser("make-aligner", help="write a small random-weight wav2vec2 CTC checkpoint (for "
                             "--aligner's tests: its alignments follow the text, not the sound)",
                             formatter_class=_HelpFormatter)
    aligner.add_argument("--out", required=True, help="folder to write the checkpoint to")
    aligner.add_argument("--seed", type=integer, default=0, help="seed of the random weights")

    # Options are bench's own (`chorus bench --help`); they pass through untouched.
    sub.add_parser("bench", add_help=False,
                   help="GPU benchmark: the reference and Chorus on the same requests (bench/README.md; "
                        "from a source checkout)")
    sub.add_parser("loadtest", add_help=False,
                   help="load and soak test: many WebSocket clients against a server, then a report")
    return parser


def _configure_logging(level: str) -> None:
    configure(level)


def _bench(argv: list[str]) -> int:
    """`chorus bench` runs the repository's `bench/`, which is not installed: checkouts only."""
    root = checkout_root()
    if root is None:
        print("chorus bench runs from a source checkout (it needs the repository's bench/ folder, which "
              "is not installed): clone the repository and run `python -m server bench ...` in it",
              file=sys.stderr)
        return 2
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from bench.cli import main as bench_main  # lazy: bench/ is on the path only from here on

    return bench_main(argv)


def main(argv: list[str] | None = None) -> int:
    # pydub (imported by omnivoice) warns when ffmpeg is missing; Chorus never asks it to
    # decode or encode a file (soundfile and PyAV do), so the warning only misleads.
    warnings.filterwarnings("ignore", message="Couldn't find ffmpeg or avconv", category=RuntimeWarning)
    quiet = "ignore:Couldn't find ffmpeg or avconv:RuntimeWarning"  # engine and finisher processes too
    os.environ["PYTHONWARNINGS"] = ",".join(filter(None, (envs.PYTHONWARNINGS, quiet)))
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if args.command == "bench":
        return _bench(rest)
    if args.command == "loadtest":
        return loadtest_main(rest)
    if rest:
        parser.error("unrecognized arguments: " + " ".join(rest))
    if args.command == "make-checkpoint":
        _configure_logging("info")
        path = make_checkpoint(args.size, args.out, seed=args.seed)
        print(f"wrote a random-weight {args.size} OmniVoice checkpoint to {path} (its audio is noise)")
        return 0
    if args.command == "make-aligner":
        _configure_logging("info")
        from server.engine.model.aligner import make_aligner_checkpoint  # lazy: torch, only for this command

        print(f"wrote a random-weight CTC aligner to {make_aligner_checkpoint(args.out, seed=args.seed)}")
        return 0
    if args.command == "serve":
        _configure_logging(args.log_level)
        return _serve(args)
    return 2


def _serve(args: argparse.Namespace) -> int:
    """`chorus serve`; a failed start is one line (and its traceback with --log-level debug)."""
    from server.cli.run import serve  # lazy: `chorus --help` and the other commands load no web server

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
