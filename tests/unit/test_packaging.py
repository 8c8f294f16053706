"""What an install holds: the one top-level package `server` (the page's files inside it as
`server/web/`), no `web` or `bench` package; the page found from the install even with a
`web/` folder in the working directory; `chorus bench` saying it needs a checkout."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_every_server_package_is_listed():
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "server").rglob("__init__.py")}
    found |= {"server.web." + ".".join(d.relative_to(REPO / "web").parts)
              for d in (REPO / "web").rglob("*") if d.is_dir() and d.name != "__pycache__"}
    assert listed == found


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The wheel, unpacked: what `pip install` puts into site-packages. Built from a copy of
    what the wheel is made of, so a stale `build/` of the checkout (setuptools reuses it and
    keeps modules deleted since) cannot slip into it."""
    out = tmp_path_factory.mktemp("wheel")
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    for name in ("server", "web"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
                    str(source)], check=True, capture_output=True, timeout=300)
    (wheel,) = out.glob("*.whl")
    site = out / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    return site


def test_the_wheel_holds_server_alone_with_the_page_inside(installed):
    top = {p.name for p in installed.iterdir() if not p.name.endswith(".dist-info")}
    assert top == {"server"}
    page_files = {p.relative_to(REPO / "web") for p in (REPO / "web").rglob("*") if p.is_file()
                  and "__pycache__" not in p.parts}
    shipped = {p.relative_to(installed / "server" / "web") for p in (installed / "server" / "web").rglob("*")
               if p.is_file()}
    assert page_files and shipped == page_files
    modules = {p.relative_to(REPO) for p in (REPO / "server").rglob("*.py")}
    assert {p.relative_to(installed) for p in (installed / "server").rglob("*.py")} == modules


def run_installed(site: Path, cwd: Path, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120)


def test_a_web_folder_in_the_working_directory_changes_nothing(installed, tmp_path):
    for name in ("web", "bench"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("raise SystemExit('imported the wrong package')\n")
    code = ("import server.api.pages as p, server.app\n"
            "print(p.WEB_DIR)\n")
    result = run_installed(installed, tmp_path, code)
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()) == installed / "server" / "web"


def test_bench_needs_a_checkout_and_says_so(installed, tmp_path):
    result = run_installed(installed, tmp_path,
                           "import sys; from server.cli.main import main; sys.exit(main(['bench']))")
    assert result.returncode == 2 and "source checkout" in result.stderr, result.stderr
    result = run_installed(installed, tmp_path, "from server.cli.main import main; main(['loadtest', '--help'])")
    assert "--clients" in result.stdout, result.stderr
