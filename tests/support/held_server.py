"""`python -m tests.support.held_server serve ...`: `chorus serve` whose engines sit behind a `HoldGate`
(`tests.support.hold_gate`): a request whose text contains `HOLD` stays in flight until it is cancelled.
For the tests that need a server process of their own (signals, draining)."""

from __future__ import annotations

import sys

from server.cli.logs import configure
from server.cli.main import build_parser, config_from_args
from server.cli.run import serve
from tests.support.hold_gate import HOLD, HoldGate


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    configure(args.log_level)
    return serve(config_from_args(args), wrap_engine=lambda engine: HoldGate(engine, HOLD))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
