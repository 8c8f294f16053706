#!/usr/bin/env bash
# Create or update .venv in the project root (the package, editable, with its dev extras).
# Re-installs only when pyproject.toml changed since the last successful install.
# The install goes through uv (from PyPI, into the venv): it fetches and unpacks the ~6 GB of
# wheels (torch and its CUDA libraries) in parallel, much faster than pip; where uv cannot be
# had, pip does the same install. Then what a server imports (torch, transformers, OmniVoice,
# Litestar and Chorus itself) is byte-compiled, by importing it once:
# where PYTHONDONTWRITEBYTECODE is set, every process (each test server) would otherwise compile
# those sources again on import. Compiling all ~20,000 files of the environment instead (uv's
# --compile-bytecode) costs far more CPU, for modules nothing here imports.
# CHORUS_SETUP_WARM_IMPORTS=0 leaves the compiling to the caller's first processes
# (scripts/test.sh: they import all of it, with bytecode written).
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
stamp=".venv/.chorus-installed-$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  if [ -x .venv/bin/uv ] || .venv/bin/python -m pip install -q uv; then
    .venv/bin/uv pip install --python .venv/bin/python -q -e ".[dev]"
  else
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e ".[dev]"
  fi
  if [ "${CHORUS_SETUP_WARM_IMPORTS:-1}" != 0 ]; then  # 0: the caller's own processes import it next
    PYTHONDONTWRITEBYTECODE= .venv/bin/python -W ignore -c "import omnivoice.models.omnivoice, server.app, server.cli.main, server.cli.run"
  fi
  rm -f .venv/.chorus-installed-*
  touch "$stamp"
fi
# NeMo's English grammars for normalize_text, compiled once (a minute or two) into .cache/, where
# every server after this, the tests' included, loads them in seconds (docs/normalization.md)
.venv/bin/python -m server.text.normalize_nemo > /dev/null
