"""The command line as a user meets it: help, version, and every start-up mistake answered
with a short message and a non-zero exit, never a traceback (unless --log-level debug)."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys

import pytest

from server.cli.main import build_parser


def chorus(*args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", **env}
    environment.pop("CHORUS_MODEL", None)
    return subprocess.run([sys.executable, "-m", "server", *args], capture_output=True, text=True,
                          timeout=timeout, env=environment)


def short_failure(result: subprocess.CompletedProcess, expected: str) -> str:
    """Non-zero, the message on stderr, no traceback, at most two lines besides log lines."""
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if " INFO " not in line and " WARNING " not in line]
    assert 1 <= len(lines) <= 2, result.stderr
    assert expected in lines[0], result.stderr
    return result.stderr


def test_bare_chorus_prints_help_and_version_is_there():
    result = chorus()
    assert result.returncode == 0 and result.stdout.startswith("usage: chorus") and "serve" in result.stdout
    result = chorus("--version")
    assert result.returncode == 0 and result.stdout.strip().startswith("chorus 0.")


def test_every_flag_has_help_and_shows_its_default():
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name in ("serve", "make-checkpoint"):
        sub = commands.choices[name]
        text = sub.format_help()
        for action in sub._actions:
            if not action.option_strings or action.dest == "help":
                continue
            assert action.help, f"{name} {action.option_strings[0]} has no help"
            if action.default not in (None, False):
                help_line = sub._get_formatter()._get_help_string(action)
                assert "default" in help_line, f"{name} {action.option_strings[0]}: no default shown"
        if name == "serve":
            assert "requests one engine steps together at most (default: 16)" in " ".join(text.split())


def test_bad_option_values_are_two_lines():
    err = short_failure(chorus("serve", "--log-level", "foo"), "argument --log-level: invalid choice: 'foo'")
    assert "chorus serve --help" in err
    short_failure(chorus("serve", "--port", "99999"),
                  "argument --port: 99999 is out of range (expected a port number 0..65535")
    short_failure(chorus("serve", "--graph-max-tokens", "-1"),
                  "argument --graph-max-tokens: -1 is negative (expected an integer >= 0")


def test_graph_limit_reaches_the_engine_settings():
    from server.cli.main import config_from_args

    for given, want in ((["--graph-max-tokens", "0"], 0), (["--graph-max-tokens", "4096"], 4096), ([], 8192)):
        cfg = config_from_args(build_parser().parse_args(["serve", *given]))
        assert cfg.engine.graph_max_tokens == want


def test_missing_model_folder_and_folder_without_checkpoint(tmp_path):
    short_failure(chorus("serve", "--model", "/nonexistent/dir"), "--model /nonexistent/dir: no such folder")
    short_failure(chorus("serve", "--model", str(tmp_path)), "the folder has no config.json")


def test_voices_dir_that_is_a_file(tmp_path, tiny_checkpoint):
    blocker = tmp_path / "voices"
    blocker.write_text("not a folder")
    short_failure(chorus("serve", "--model", str(tiny_checkpoint), "--voices-dir", str(blocker)),
                  f"--voices-dir {blocker}: not a folder")


def test_port_in_use(tmp_path, tiny_checkpoint):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        short_failure(chorus("serve", "--model", str(tiny_checkpoint), "--port", str(port),
                             "--voices-dir", str(tmp_path / "v")),
                      f"cannot listen on 127.0.0.1:{port}: the port is in use")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU")
def test_no_cuda_device(tmp_path, tiny_checkpoint):
    short_failure(chorus("serve", "--model", str(tiny_checkpoint), "--device", "cuda",
                         "--voices-dir", str(tmp_path / "v")), "--device cuda: no CUDA GPU is visible")


def test_bad_hub_id_is_one_line_and_debug_shows_the_traceback(tmp_path):
    args = ("serve", "--model", "no-such-org/no-such-model", "--voices-dir", str(tmp_path / "v"), "--port", "0")
    err = short_failure(chorus(*args), "--model no-such-org/no-such-model: could not load it")
    assert "ffmpeg" not in err  # pydub's warning at import: Chorus never needs ffmpeg
    debug = chorus(*args, "--log-level", "debug")
    assert debug.returncode == 1 and "Traceback" in debug.stderr
