"""`python -m tests.support.held_server serve ...`: `chorus serve` whose engines sit behind a `HoldGate`
(`tests.support.hold_gate`): a request whose text contains `HOLD` stays in flight until it is cancelled.
For the tests that need a server process of their own (signals, draining)."""

from __future__ import annotations

import asyncio
import sys

from server.app import create_app
from server.cli.logs import configure
from server.cli.main import build_parser, config_from_args
from server.cli.run import load, prepare, serve_app
from tests.support.hold_gate import HOLD, HoldGate


async def _serve(cfg, sock) -> None:
    engine = HoldGate(await load(cfg), HOLD)
    await serve_app(cfg, sock, create_app(cfg, engine, owns_engine=True))


def main(argv: list[str]) -> int:
    """`chorus serve`'s own steps (`server.cli.run.serve`), the engines behind a gate."""
    args = build_parser().parse_args(argv)
    configure(args.log_level)
    cfg = config_from_args(args)
    sock = prepare(cfg)
    try:
        asyncio.run(_serve(cfg, sock))
    finally:
        sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
