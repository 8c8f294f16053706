#!/usr/bin/env bash
# Set up .venv with the dev extras, lint, and run the whole test suite: the default set (tests/unit,
# tests/engine, tests/integration), the benchmark suite's tests, the kernels under Triton's
# interpreter, the client tests (in their own environment) and the browser tests. Arguments go to
# every pytest run (e.g. `--durations=20`).
set -euo pipefail
cd "$(dirname "$0")/.."
# Bytecode is written below (each module compiled by the first process to import it), so the
# setup scripts leave their own compiling imports to the runs (CHORUS_SETUP_WARM_IMPORTS=0).
export CHORUS_SETUP_WARM_IMPORTS=0
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
# Here a missing browser, database or agent framework is a failure, not a reason to skip.
export CHORUS_E2E_REQUIRE_BROWSER=1 CHORUS_REQUIRE_POSTGRES=1 CHORUS_REQUIRE_CLIENT_FRAMEWORKS=1
# One compute thread per process: the phases, workers and servers below already fill the cores,
# and thread pools that spin while they wait would take CPU time from one another.
export OMP_NUM_THREADS=1
# Each module byte-compiled once, by the first process that imports it, where the environment
# would have every process compile it again.
unset PYTHONDONTWRITEBYTECODE

logs=$(mktemp -d)
lanes=()
# On the way out (an interrupt too), the lanes' process groups go with the script.
trap 'for lane in "${lanes[@]}"; do kill -- "-$lane" 2> /dev/null || true; done; rm -rf "$logs"' EXIT
trap 'exit 130' INT TERM

# phase NAME COMMAND...: run COMMAND with its output in a log of its own; when it ends, print
# its status, its time and its log in one piece (phases run side by side) and return its status.
phase() {
  local name=$1 start=$SECONDS status=0
  shift
  "$@" > "$logs/$name.log" 2>&1 || status=$?
  {
    flock 9
    if [ "$status" -eq 0 ]; then echo "=== $name: passed in $((SECONDS - start)) s"
    else echo "=== $name: FAILED (exit $status) after $((SECONDS - start)) s"; fi
    cat "$logs/$name.log"
  } 9> "$logs/print.lock"
  return "$status"
}

# The client tests' environment (.venv-clients) is made while the fork server below starts:
# each takes about one core. The client tests wait for it.
set -m
{ status=0; scripts/setup-clients.sh > "$logs/setup-clients.log" 2>&1 || status=$?
  echo "$status" > "$logs/setup-clients.status"; } &
lanes+=($!)
set +m

# One fork server for every phase (tests/support/forkserver.py): it imports torch and the
# server's other libraries once, and the tests' `chorus serve` processes are forks of it. It
# ends with this script (its stdin closes).
forkserver="chorus-forkserver-$$-$RANDOM"
coproc FORKSERVER { exec .venv/bin/python -m tests.support.forkserver "$forkserver" 2> /dev/null; }
if read -r ready <&"${FORKSERVER[0]}" && [ "$ready" = ready ]; then
  export CHORUS_TEST_FORKSERVER_AT="$forkserver"
fi

# One tiny random checkpoint for every run below (they only read it), made by a fork of it too.
.venv/bin/python -m tests.support.forkserver --run "$forkserver" server make-checkpoint --size tiny --seed 0 \
  --out "$logs/tiny" > /dev/null

pytest_in() {  # pytest_in NAME ARGS...: pytest of .venv with a temporary folder of its own
  local name=$1
  shift
  .venv/bin/python -m pytest -q -p no:cacheprovider --basetemp="$logs/tmp-$name" --tiny-checkpoint="$logs/tiny" "$@"
}

kernel_tests() {  # Triton picks its interpreter when it is imported: a process of their own
  TRITON_INTERPRET=1 pytest_in kernels -n 2 --dist loadfile tests/kernels "$@"
}

browser_tests() {  # e2e/ has no tests/conftest.py: its servers run the demo checkpoint
  .venv/bin/python -m pytest -q -p no:cacheprovider --basetemp="$logs/tmp-browser" e2e "$@"
}

client_tests() {  # the client and its Pipecat and LiveKit plugins, against a `chorus serve` of .venv
  while [ ! -f "$logs/setup-clients.status" ]; do sleep 1; done
  cat "$logs/setup-clients.log"
  [ "$(cat "$logs/setup-clients.status")" = 0 ] || return 1
  CHORUS_SERVER_PYTHON=.venv/bin/python .venv-clients/bin/python -m pytest -q -p no:cacheprovider \
    --basetemp="$logs/tmp-clients" --tiny-checkpoint="$logs/tiny" -n 2 tests/clients "$@"
}

# Beside the default set, in one lane: the browser tests (one process: Playwright's sync API
# keeps an event loop running in it), then the client tests and the Triton kernels on the CPU
# through Triton's interpreter side by side (the kernels on two workers: what runs last can
# use both cores). Much of the default set waits on sockets and on audio played in real time,
# so the two lanes share the CPU well; this lane runs at a lower priority (nice 10): it takes
# the CPU the default set leaves, and the default set's bounds on latency (an event loop that
# keeps answering, audio that keeps up with real time) are not measured on a machine this lane
# holds. Every phase runs even when one before it failed; any failure fails the script.
side_lane() {
  local failed=0 clients
  renice -n 10 -p "$BASHPID" > /dev/null
  phase browser browser_tests "$@" || failed=1
  phase clients client_tests "$@" &  # much of it waits (servers that restart): the kernels beside it
  clients=$!
  phase kernels kernel_tests "$@" || failed=1
  wait "$clients" || failed=1
  return "$failed"
}
set -m  # the side lane in a process group of its own
side_lane "$@" &
lanes+=($!)
set +m
failed=0
# The default set with the benchmark suite's tests (and the kernel micro-benchmarks' own) on
# three workers (pytest-xdist: much of it waits), each test file on one worker, so a file's
# server or engine is started once; the files that wait longest go first (tests/conftest.py).
phase default pytest_in default -n 3 --dist loadfile --no-loadscope-reorder tests/unit tests/engine tests/integration tests/bench \
  microbench/tests "$@" || failed=1
for lane in "${lanes[@]}"; do
  wait "$lane" || failed=1
done
lanes=()
exit "$failed"
