"""The benchmark suite: `chorus bench` (`bench.cli`) and the load, agents, soak and pool
benchmarks (see bench/README.md). Runs from a checkout; not installed with the package.

The agents benchmark and the client-overhead benchmark drive the server through
`chorus_client`, the same client agents use. The server's environment does not install it,
so where it is not installed the checkout's `client/` folder goes on the import path (the
client needs only `websockets` and `httpx`, which the server's environment has too).
"""

import importlib.util
import sys
from pathlib import Path

CLIENT_DIR = Path(__file__).resolve().parents[1] / "client"
if importlib.util.find_spec("chorus_client") is None and CLIENT_DIR.is_dir():
    sys.path.insert(0, str(CLIENT_DIR))
