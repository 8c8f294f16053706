#!/usr/bin/env bash
# Set up .venv (first run only) and start the server. Extra arguments go to `chorus serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/chorus serve "$@"
