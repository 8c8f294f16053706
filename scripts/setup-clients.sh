#!/usr/bin/env bash
# Create or update .venv-clients: the Python client (`client/`) and the agent frameworks its
# plugins serve (Pipecat, LiveKit Agents), in an environment of their own: the client must work
# without torch, and Pipecat pins soundfile, soxr and protobuf below the server's versions.
# tests/clients runs in it against a `chorus serve` of .venv (scripts/setup.sh makes that one).
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
if [ ! -x .venv-clients/bin/python ]; then
  "$python" -m venv .venv-clients
fi
clients_stamp=".venv-clients/.chorus-installed-$(cat client/pyproject.toml pyproject.toml | sha256sum | cut -c1-16)"
if [ ! -f "$clients_stamp" ]; then
  clients_deps=(-e "./client[pipecat,livekit]" "pytest>=8" "pytest-xdist>=3.5" "openai>=1.40")
  if [ -x .venv/bin/uv ]; then
    .venv/bin/uv pip install --python .venv-clients/bin/python -q "${clients_deps[@]}"
  else
    .venv-clients/bin/python -m pip install -q "${clients_deps[@]}"
  fi
  # byte-compiled by importing it once: what the client tests import, not all of the environment
  # (scripts/setup.sh says why, and what CHORUS_SETUP_WARM_IMPORTS=0 does)
  if [ "${CHORUS_SETUP_WARM_IMPORTS:-1}" != 0 ]; then
    PYTHONDONTWRITEBYTECODE= .venv-clients/bin/python -W ignore -c \
      "import chorus_client, httpx, openai, pytest, xdist, pipecat.frames.frames, pipecat.services.tts_service, livekit.agents"
  fi
  rm -f .venv-clients/.chorus-installed-*
  touch "$clients_stamp"
fi
