#!/usr/bin/env bash
# Set up .venv with the dev extras and run the whole test suite (unit, integration, browser).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
