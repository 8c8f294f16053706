"""NeMo's English text normaliser (`nemo-text-processing`): what `normalize_text: true` runs on
English text, chosen over the reference's WeTextProcessing by its readings on the scored set
(`docs/normalization.md`).

It is built on pynini like WeTextProcessing, but its grammars do not ship compiled: the first
construction compiles them (a minute or more of one core) and writes them to a cache folder,
from which every later process loads them in a second or two. The folder is
`$CHORUS_CACHE_DIR/nemo-tn-en-<version>` (default the checkout's `.cache`, beside the demo
checkpoint), named by NeMo's version so an upgrade builds afresh; a server whose cache dir has
none loads the checkout's where that one is built (a test's server with a cache dir of its own
need not compile them again). One process builds at a time (a lock file beside the folder: the
others wait for it and then load), into a temporary folder renamed into place once complete, so
a build cut short never leaves a half-written cache.

`python -m server.text.normalize_nemo` builds the cache and exits (`scripts/setup.sh` runs it,
and an image can, so no server pays for it). A server that finds no cache starts that build in
the background at start (`start_background_build`), so that the first request needing it waits
less.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

from server import envs

log = logging.getLogger("chorus.text")

_BUILT = "chorus-built"  # written last into a complete cache folder
CHECKOUT_CACHE = Path(__file__).resolve().parents[2] / ".cache"  # CHORUS_CACHE_DIR's default
_builder: subprocess.Popen | None = None


@cache
def available() -> bool:
    """Whether `nemo-text-processing` is installed (the `tn` extra)."""
    return importlib.util.find_spec("nemo_text_processing") is not None


def _folder(root: Path) -> Path:
    return root / f"nemo-tn-en-{importlib.metadata.version('nemo_text_processing')}"


def cache_dir() -> Path:
    """Where this server builds the compiled grammars (`CHORUS_CACHE_DIR`, else the checkout's
    `.cache`, as `server.checkpoint.demo_checkpoint_dir`)."""
    base = envs.CHORUS_CACHE_DIR
    return _folder(Path(base) if base else CHECKOUT_CACHE)


def built_dir() -> Path | None:
    """The complete cache it loads: its own, else the checkout's, else None."""
    for folder in dict.fromkeys((cache_dir(), _folder(CHECKOUT_CACHE))):
        if (folder / _BUILT).is_file():
            return folder
    return None


def is_built() -> bool:
    return built_dir() is not None


@contextmanager
def _build_lock(block: bool = True) -> Iterator[bool]:
    """The lock on building the cache (held: True). Where there is no `fcntl` (not Unix) or the
    folder cannot be written, builds are not serialised (True all the same)."""
    try:
        import fcntl  # lazy: Unix only; without it builds are not serialised
    except ImportError:
        yield True
        return
    path = cache_dir().with_name(cache_dir().name + ".lock")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a")  # noqa: SIM115 - held across the yield
    except OSError:
        yield True
        return
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _quiet_nemo() -> None:
    """NeMo logs every punctuation mark it leaves alone at INFO, on a handler of its own."""
    logging.getLogger("NeMo-text-processing").addFilter(lambda record: record.levelno >= logging.WARNING)


def _construct(folder: Path | None):
    from nemo_text_processing.text_normalization.normalize import Normalizer  # lazy: optional, workers only

    _quiet_nemo()
    return Normalizer(input_case="cased", lang="en", cache_dir=None if folder is None else str(folder))


def _load_or_build():
    """The normaliser, loaded from the cache, or built into it (once, under the lock)."""
    if (found := built_dir()) is not None:
        return _construct(found)
    final = cache_dir()
    with _build_lock():
        if (found := built_dir()) is not None:  # another process built it while this one waited
            return _construct(found)
        log.warning("normalize_text: compiling NeMo's English grammars into %s (once; a minute or more)", final)
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=".nemo-build-", dir=final.parent))
        except OSError as exc:
            log.warning("normalize_text: cannot write the grammar cache (%s); compiling them in memory", exc)
            return _construct(None)
        try:
            normalizer = _construct(staging)
            (staging / _BUILT).write_text("complete\n")
            staging.chmod(0o755)  # mkdtemp's is 0700: an image builds it as root, the server reads it as itself
            shutil.rmtree(final, ignore_errors=True)  # a folder left by an older layout
            os.replace(staging, final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return normalizer


@cache
def normalizer() -> Callable[[str], str] | None:
    """NeMo's English `normalize`, loaded once a process; None where it is not installed or
    could not be loaded (said once in the log: English then gets the reference's normaliser)."""
    if not available():
        return None
    try:
        loaded = _load_or_build()
    except Exception:
        log.exception("normalize_text: NeMo's English normaliser failed to load; English uses the reference's")
        return None
    return lambda text: loaded.normalize(text, punct_post_process=True)


def start_background_build() -> None:
    """At a server's start, where the cache is missing and nobody is building it: build it in a
    process of its own, at the workers' low priority (`normalize_workers.WORKER_NICENESS`), so
    that the first request needing the grammars finds them built or nearly so (it waits for the
    build otherwise). The build ends by itself."""
    global _builder
    if not available() or is_built() or (_builder is not None and _builder.poll() is None):
        return
    with _build_lock(block=False) as free:
        if not free:  # another process is building it
            return
    log.warning("normalize_text: NeMo's English grammars are not compiled yet; compiling them in the background "
                "into %s (once, a minute or more; a request that needs them meanwhile waits)", cache_dir())
    _builder = subprocess.Popen([sys.executable, "-m", "server.text.normalize_nemo", "--low-priority"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)


def main(argv: list[str] | None = None) -> int:
    """Build the cache (or find it built) and print its folder."""
    if available() and (found := built_dir()) is not None:
        print(found)
        return 0
    if "--low-priority" in (sys.argv[1:] if argv is None else argv):  # the server's background build
        try:
            os.nice(10)
        except OSError:
            pass
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not available():
        print("nemo-text-processing is not installed (pip install 'chorus-tts[tn]')", file=sys.stderr)
        return 1
    if normalizer() is None:
        return 1
    print(built_dir() or "(not written: the cache folder cannot be written)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
