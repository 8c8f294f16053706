"""What `chorus serve` checks before it loads anything, so a mistake costs a clear line and
not a traceback after a long model load: the model folder or hub id, the device, the voice
library folder, and the address to listen on. Each failure is a `StartupError` whose
message names the flag and says what to do."""

from __future__ import annotations

import errno
import re
import socket
from pathlib import Path

# org/name as the Hugging Face hub spells repository ids
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


class StartupError(Exception):
    """A mistake in how the server was started; the message is the one line shown."""


def looks_like_path(model: str) -> bool:
    return model.startswith(("/", ".", "~")) or "\\" in model or model.count("/") != 1


def check_model(model: str) -> None:
    """A folder that exists and holds a checkpoint, or something shaped like a hub id."""
    folder = Path(model).expanduser()
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise StartupError(f"--model {model}: the folder has no config.json; it is not an OmniVoice "
                               "checkpoint (make one with `chorus make-checkpoint`, or download k2-fsa/OmniVoice)")
        return
    if folder.exists():
        raise StartupError(f"--model {model}: not a folder")
    if looks_like_path(model) or not HUB_ID.match(model):
        raise StartupError(f"--model {model}: no such folder, and not a Hugging Face hub id (org/name)")


def check_device(device: str) -> None:
    if not re.fullmatch(r"cpu|cuda(:\d+(,\d+)*)?", device):
        raise StartupError(f"--device {device}: must be cpu, cuda or cuda:N (cuda:0,1 for several)")
    if device == "cpu":
        return
    import torch  # lazy: only a CUDA device needs it, and the cheap checks run first

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise StartupError(f"--device {device}: no CUDA GPU is visible to this process "
                           f"(torch {torch.__version__}); use --device cpu")
    wanted = [int(i) for i in device[5:].split(",")] if ":" in device else []
    if missing := [i for i in wanted if i >= count]:
        raise StartupError(f"--device {device}: no GPU {missing[0]}; this machine shows {count} (0..{count - 1})")


def check_aligner(path: str) -> None:
    """`--aligner` names a folder holding a CTC checkpoint (its config and its vocabulary)."""
    folder = Path(path)
    if not folder.is_dir():
        raise StartupError(f"--aligner {path}: no such folder")
    missing = [name for name in ("config.json", "vocab.json") if not (folder / name).is_file()]
    if missing:
        raise StartupError(f"--aligner {path}: the folder has no {missing[0]}; it is not a wav2vec2 CTC "
                           "checkpoint (`chorus make-aligner --out DIR` writes a small random one)")


def check_voices_dir(path: Path) -> None:
    """The library folder exists (or can be made) and is a writable folder."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".chorus-write-check"
        probe.write_bytes(b"")
        probe.unlink()
    except FileExistsError:
        raise StartupError(f"--voices-dir {path}: not a folder") from None
    except NotADirectoryError:
        raise StartupError(f"--voices-dir {path}: part of the path is a file, not a folder") from None
    except PermissionError:
        raise StartupError(f"--voices-dir {path}: no permission to write there") from None
    except OSError as exc:
        raise StartupError(f"--voices-dir {path}: cannot use it ({exc.strerror or exc})") from None


def bind_error(host: str, port: int, exc: OSError) -> StartupError:
    where = f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return StartupError(f"cannot listen on {where}: the port is in use (is another server running?); "
                            "choose another with --port")
    if exc.errno == errno.EACCES:
        return StartupError(f"cannot listen on {where}: permission denied (ports below 1024 need privileges)")
    if exc.errno == errno.EADDRNOTAVAIL or isinstance(exc, socket.gaierror):
        return StartupError(f"cannot listen on {where}: this machine has no such address (--host)")
    return StartupError(f"cannot listen on {where}: {exc.strerror or exc}")
