"""The source checkout this server runs from, when it runs from one.

`chorus bench` needs the repository's `bench/` folder, which is not installed with the
package; reports name the git commit they measured. Both come from here.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from server import envs

REPO_ROOT = Path(__file__).resolve().parents[2]  # server/cli/checkout.py -> the repository


def checkout_root() -> Path | None:
    """The repository root holding this `server/` and its `bench/`, or None when installed."""
    return REPO_ROOT if (REPO_ROOT / "bench" / "cli.py").is_file() else None


def git_commit(given: str | None = None) -> str | None:
    """`given` if set, else `CHORUS_COMMIT`, else the checkout's `git rev-parse HEAD`, else None
    (a copy of the tree without its history names its commit in `CHORUS_COMMIT`)."""
    given = given or envs.CHORUS_COMMIT
    if given:
        return given
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=REPO_ROOT, timeout=10).stdout.strip() or None
    except Exception:  # noqa: BLE001 - no git, or not a checkout
        return None
