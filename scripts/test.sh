#!/usr/bin/env bash
# Set up .venv with the dev extras, lint, and run the whole test suite: the default set (unit and
# integration), the benchmark suite's tests, the kernels under Triton's interpreter, the client
# tests (in their own environment) and the browser tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The linter first (pyproject.toml's [tool.ruff]): a finding fails the run before any test.
.venv/bin/ruff check .
# The browser tests (e2e/) drive Debian's Chromium, the shared voice library is tested
# against a real PostgreSQL server, and the word aligner on speech espeak-ng makes: install
# what is missing.
missing=()
[ -x /usr/bin/chromium ] || missing+=(chromium)
compgen -G "/usr/lib/postgresql/*/bin/initdb" > /dev/null || missing+=(postgresql)
command -v espeak-ng > /dev/null || missing+=(espeak-ng)
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
# Here a missing browser or database is a failure, not a reason to skip their tests.
export CHORUS_E2E_REQUIRE_BROWSER=1 CHORUS_REQUIRE_POSTGRES=1
# tests/ on two workers (pytest-xdist: much of it waits on servers and sockets); then the
# benchmark suite's tests (marker `bench`, left out of a plain `pytest`) with the kernel
# micro-benchmarks' own; then the client and its Pipecat and LiveKit plugins in their own
# environment (scripts/setup-clients.sh) against a `chorus serve` run by .venv (a missing
# framework is a failure, not a skip); last the browser tests in one process (Playwright's
# sync API keeps an event loop running in it).
.venv/bin/python -m pytest -q -n 2 tests --ignore=tests/clients "$@"
.venv/bin/python -m pytest -q -n 2 -m bench tests microbench/tests --ignore=tests/clients "$@"
# The Triton kernels on the CPU (marker `kernels`): Triton picks its interpreter when it is
# imported, so they run in a process of their own started with TRITON_INTERPRET=1 (where every
# other test is skipped: tests/conftest.py).
TRITON_INTERPRET=1 .venv/bin/python -m pytest -q -n 2 -m kernels tests --ignore=tests/clients "$@"
scripts/setup-clients.sh
CHORUS_REQUIRE_CLIENT_FRAMEWORKS=1 CHORUS_SERVER_PYTHON=.venv/bin/python \
  .venv-clients/bin/python -m pytest -q -n 2 -m "bench or not bench" tests/clients "$@"
exec .venv/bin/python -m pytest -q -m browser e2e "$@"
