#!/usr/bin/env bash
# Create or update .venv in the project root (the package, editable, with its dev extras).
# Re-installs only when pyproject.toml changed since the last successful install.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
stamp=".venv/.chorus-installed-$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[dev]"
  rm -f .venv/.chorus-installed-*
  touch "$stamp"
fi
