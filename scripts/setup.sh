#!/usr/bin/env bash
# Create or update .venv in the project root (the package, editable, with its dev extras).
# Re-installs only when pyproject.toml changed since the last successful install.
# The install goes through uv (from PyPI, into the venv): it fetches, unpacks and byte-compiles
# the ~6 GB of wheels (torch and its CUDA libraries) in parallel, about 45 s instead of pip's
# 2.5 minutes; where uv cannot be had, pip does the same install. Byte-compiling at install
# matters where PYTHONDONTWRITEBYTECODE is set: without it every process (each test server)
# would compile torch's sources again on import.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
stamp=".venv/.chorus-installed-$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  if [ -x .venv/bin/uv ] || .venv/bin/python -m pip install -q uv; then
    .venv/bin/uv pip install --python .venv/bin/python --compile-bytecode -q -e ".[dev]"
  else
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e ".[dev]"
  fi
  rm -f .venv/.chorus-installed-*
  touch "$stamp"
fi
# The Python client (`client/`) and the agent frameworks its plugins serve (Pipecat,
# LiveKit Agents) get an environment of their own, .venv-clients: the client must work
# without torch, and Pipecat pins soundfile, soxr and protobuf below the server's versions.
# tests/clients runs in it against a `chorus serve` of .venv.
if [ ! -x .venv-clients/bin/python ]; then
  "$python" -m venv .venv-clients
fi
clients_stamp=".venv-clients/.chorus-installed-$(cat client/pyproject.toml pyproject.toml | sha256sum | cut -c1-16)"
if [ ! -f "$clients_stamp" ]; then
  clients_deps=(-e "./client[pipecat,livekit]" "pytest>=8" "pytest-xdist>=3.5" "openai>=1.40")
  if [ -x .venv/bin/uv ]; then
    .venv/bin/uv pip install --python .venv-clients/bin/python --compile-bytecode -q "${clients_deps[@]}"
  else
    .venv-clients/bin/python -m pip install -q "${clients_deps[@]}"
  fi
  rm -f .venv-clients/.chorus-installed-*
  touch "$clients_stamp"
fi
