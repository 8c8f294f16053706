"""Shared fixtures: one tiny random checkpoint per test run, the reference model on it; the
markers each folder gives its tests; and the split between the kernel tests (tests/kernels,
run by a process started with `TRITON_INTERPRET=1`) and every other test (run by a process
without it)."""

from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest

from server import envs

warnings.filterwarnings("ignore", message=".*ffmpeg.*")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SAMPLE_RATE = 24000

INTERPRETER_ON = envs.TRITON_INTERPRET  # read once, as Triton and `triton_env` read it at import


def _cuda_available() -> bool:
    import torch  # lazy: the client tests (tests/clients) run this conftest in an environment without torch

    return torch.cuda.is_available()


TESTS = Path(__file__).resolve().parent
FOLDER_MARKERS = {"kernels": "kernels", "bench": "bench"}  # tests/<folder> -> the marker of its tests
DEFAULT_FOLDERS = ("unit", "engine", "integration")  # `pytest`'s default set (pyproject's testpaths)


# The files that take longest, longest first (most of their time is waiting: audio read in real
# time, drain windows, timeouts, processes that start and stop). `pytest -n` hands files to its
# workers in collection order, so these start first and their waits overlap the other files
# instead of trailing after them.
LONGEST_FIRST = (
    "integration/test_hardening_outbox.py", "integration/test_hostile_clients.py", "engine/test_engine_process.py",
    "integration/test_hardening_shutdown.py", "integration/test_loadtest.py", "integration/test_audio_limits.py",
    "integration/test_cli.py", "integration/test_cli_errors.py", "bench/test_agents_bench.py",
    "bench/test_timeline.py", "integration/test_fuzz.py", "integration/test_builtin_voices.py",
    "bench/test_capacity_bench.py", "integration/test_limits.py",
)


def _under_tests(item) -> Path | None:
    """An item's file relative to tests/ (None outside tests/)."""
    try:
        return Path(item.path).resolve().relative_to(TESTS)
    except ValueError:
        return None


def _folder(item) -> str | None:
    """The folder under tests/ an item lives in (None outside tests/)."""
    path = _under_tests(item)
    return None if path is None else path.parts[0]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """The folder is the marker, before `-m` selects: tests/kernels are `kernels`, tests/bench
    are `bench`, so `pytest tests/kernels` and `pytest -m kernels tests` run the same tests.
    A test of the default folders that carries either marker is a test in the wrong folder."""
    for item in items:
        folder = _folder(item)
        if folder in FOLDER_MARKERS:
            item.add_marker(FOLDER_MARKERS[folder])
        elif folder in DEFAULT_FOLDERS:
            wrong = [m for m in FOLDER_MARKERS.values() if item.get_closest_marker(m) is not None]
            if wrong:
                raise pytest.UsageError(f"{item.nodeid} is marked {wrong[0]}: move it to tests/{wrong[0]}/")
    _split_by_interpreter(items)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def file_rank(item) -> int:
        path = _under_tests(item)
        return rank.get(path.as_posix() if path is not None else "", len(rank))

    items.sort(key=file_rank)  # stable: the rest keep their order


def _split_by_interpreter(items) -> None:
    """Triton chooses its interpreter when it is imported, so one process runs either the kernel
    tests (under the interpreter) or the others (compiled kernels, torch paths), never both;
    tests marked `gpu` are skipped without CUDA."""
    need_interpreter = pytest.mark.skip(
        reason="a Triton-interpreter test: run it with `TRITON_INTERPRET=1 pytest tests/kernels`")
    no_triton = pytest.mark.skip(reason="needs Triton")
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    not_here = pytest.mark.skip(
        reason="TRITON_INTERPRET=1 is set: this process runs the kernel tests (tests/kernels) only")
    for item in items:
        is_kernel_test = item.get_closest_marker("kernels") is not None
        if is_kernel_test and not INTERPRETER_ON:
            item.add_marker(need_interpreter)
        elif is_kernel_test and importlib.util.find_spec("triton") is None:
            item.add_marker(no_triton)
        elif not is_kernel_test and INTERPRETER_ON:
            item.add_marker(not_here)
        if item.get_closest_marker("gpu") is not None and not _cuda_available():
            item.add_marker(no_gpu)


def pytest_addoption(parser):
    parser.addoption("--tiny-checkpoint", metavar="DIR", default=None,
                     help="a tiny checkpoint made beforehand (`chorus make-checkpoint --size tiny --seed 0 --out "
                          "DIR`), used instead of making one: scripts/test.sh makes one for all its runs")


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, pytestconfig) -> Path:
    """Made once per run: the workers of one `pytest -n` run share it (under their common
    temporary folder, the first to take the lock makes it), unless `--tiny-checkpoint` names
    one; tests only read it."""
    from server.checkpoint import make_checkpoint

    given = pytestconfig.getoption("tiny_checkpoint")
    if given:
        return Path(given)
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder, above each worker's own
    folder = root / "ckpt" / "tiny"
    with open(root / "tiny-checkpoint.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not folder.exists():  # written whole, then renamed into place
            make_checkpoint("tiny", folder, seed=0)
    return folder


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    """A float32 CPU model for one test module's engines (their own instance: engine tests
    wrap and patch what they run; `tests.support.engine_helpers.load_model`)."""
    from tests.support.engine_helpers import load_model

    return load_model(tiny_checkpoint)


@pytest.fixture(scope="module")
def engine(model):
    """A started CPU engine (default settings) on the module's model."""
    from tests.support.engine_helpers import start_engine

    eng = start_engine(model)
    yield eng
    eng.stop()


@pytest.fixture(scope="session")
def reference_model(tiny_checkpoint):
    """The reference `OmniVoice`, loaded by its own `from_pretrained`, float32 on CPU (a copy
    of the process's one load: `tests.support.engine_helpers.load_model`)."""
    from tests.support.engine_helpers import load_model

    return load_model(tiny_checkpoint)


def make_reference_clip(seconds: float = 2.0, sample_rate: int = 16000, seed: int = 7) -> np.ndarray:
    """A speech-like test clip: a gliding harmonic tone with syllable-rate amplitude bursts."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sample_rate)) / sample_rate
    f0 = 140 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / sample_rate
    voice = sum(np.sin(k * phase) / k for k in range(1, 6))
    envelope = np.clip(np.sin(2 * np.pi * 3.0 * t), 0, None) ** 0.5
    clip = 0.3 * voice * envelope + 0.003 * rng.standard_normal(t.shape)
    return clip.astype(np.float32)


@pytest.fixture(scope="session")
def reference_clip() -> tuple[np.ndarray, int]:
    return make_reference_clip(), 16000


@pytest.fixture(scope="session")
def shared_engine(tiny_checkpoint):
    """The engine every in-process server runs on: loaded and started once, the way
    `chorus serve` does (`server.app.load_engines`, its default settings on CPU)."""
    import asyncio

    from server.app import load_engines
    from server.cli.main import build_parser, config_from_args

    cfg = config_from_args(build_parser().parse_args(["serve", "--model", str(tiny_checkpoint)]))
    engine = asyncio.run(load_engines(cfg))
    yield engine
    engine.stop()


@pytest.fixture(scope="session")
def start_inproc(shared_engine, tiny_checkpoint):
    """`start_inproc(workdir, *flags)`: a started `tests.support.inproc.InProcessServer` (stop it)."""
    from tests.support.inproc import InProcessServer

    def start(workdir: Path, *flags: str) -> InProcessServer:
        return InProcessServer(shared_engine, tiny_checkpoint, workdir, *flags).start()

    return start


@pytest.fixture(scope="session")
def chorus_server(start_inproc, tmp_path_factory):
    """One real Chorus server (in-process, `tests.support.inproc`) on the tiny checkpoint, shared by
    the integration tests that need no special flags."""
    server = start_inproc(tmp_path_factory.mktemp("server"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres():
    """One throwaway PostgreSQL server per test process (`tests.support.pg_server`); skipped
    where PostgreSQL is not installed, unless CHORUS_REQUIRE_POSTGRES=1 (scripts/test.sh)."""
    from tests.support import pg_server  # not at the top: the client tests' environment has no psycopg

    if not pg_server.available():
        if os.environ.get("CHORUS_REQUIRE_POSTGRES") == "1":
            pytest.fail("PostgreSQL is required here (scripts/test.sh installs it)")
        pytest.skip("PostgreSQL is not installed")
    root = tempfile.mkdtemp(prefix="chorus-pg-")  # not under pytest's: the postgres user must reach it
    server = pg_server.PostgresServer(root).start()
    yield server
    server.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def postgres_dsn(postgres) -> str:
    """A new, empty database of the run's PostgreSQL server."""
    return postgres.new_database()


@pytest.fixture
def postgres_replicas(postgres_dsn):
    """Two PostgreSQL voice libraries on one new database, as two replicas of a server see it."""
    from server.voices.postgres import PostgresVoiceStore

    a, b = PostgresVoiceStore(postgres_dsn), PostgresVoiceStore(postgres_dsn)
    yield a, b
    a.close()
    b.close()
