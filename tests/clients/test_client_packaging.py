"""`pip install ./client` resolves to a small set: the client's two dependencies and
theirs, no torch and no numpy (an agent on a CPU box must not pull in the server's
stack). Resolved by pip itself as a fresh install would (`--dry-run --ignore-installed`)."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib

from tests.clients.chorus_process import ROOT

HEAVY = {"torch", "torchaudio", "numpy", "omnivoice", "transformers", "litestar", "soundfile"}


def resolve(target: str, tmp_path) -> set[str]:
    report = tmp_path / "report.json"
    subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                    "--report", str(report), target], check=True, timeout=300, cwd=ROOT)
    return {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}


def test_the_client_installs_without_torch_or_numpy(tmp_path):
    names = resolve("./client", tmp_path)
    assert "chorus-client" in names and {"websockets", "httpx"} <= names
    assert not names & HEAVY, names & HEAVY
    assert len(names) <= 12, names  # websockets, httpx and httpx's few


def test_the_extras_name_the_frameworks():
    project = tomllib.loads((ROOT / "client" / "pyproject.toml").read_text())["project"]
    assert project["name"] == "chorus-client"
    assert sorted(project["dependencies"]) == ["httpx>=0.27", "websockets>=13"]
    extras = project["optional-dependencies"]
    assert any(req.startswith("pipecat-ai") for req in extras["pipecat"])
    assert any(req.startswith("livekit-agents") for req in extras["livekit"])
