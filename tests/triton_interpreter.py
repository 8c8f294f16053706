"""Running a kernel's CPU test script under Triton's interpreter. The interpreter is chosen
when Triton is imported, so the script runs in a fresh interpreter process with
`TRITON_INTERPRET=1`; it must print `ok` last."""

from __future__ import annotations

import os
import subprocess
import sys


def run_in_triton_interpreter(script: str, timeout: float = 300, args: list[str] | None = None) -> None:
    env = dict(os.environ, TRITON_INTERPRET="1")
    result = subprocess.run([sys.executable, "-c", script, *(args or [])], capture_output=True, text=True,
                            timeout=timeout, env=env)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]
