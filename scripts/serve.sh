#!/usr/bin/env bash
# Set up .venv (first run only) and start the server. Extra arguments go to `chorus serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
# scripts/setup.sh installs only when its stamp for this pyproject.toml is missing: say so first,
# as that install is silent for a minute or more
if [ -f ".venv/.chorus-installed-$(sha256sum pyproject.toml | cut -c1-16)" ]; then
  scripts/setup.sh
else
  echo "Installing Chorus into .venv: the first time about 7 GB (mostly PyTorch and its CUDA libraries)," \
       "a minute or two on a fast connection, longer on a slow one. Later runs skip this." >&2
  scripts/setup.sh
  echo "Installed in ${SECONDS} s; starting the server." >&2
fi
exec .venv/bin/chorus serve "$@"
