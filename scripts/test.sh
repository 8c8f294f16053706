#!/usr/bin/env bash
# Set up .venv with the dev extras and run the whole test suite (unit, integration, browser).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The browser tests (e2e/) drive Debian's Chromium; install it when it is missing.
if [ ! -x /usr/bin/chromium ]; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
fi
# Here a missing browser is a failure, not a reason to skip the browser tests.
export CHORUS_E2E_REQUIRE_BROWSER=1
exec .venv/bin/python -m pytest -q "$@"
