"""Text normalisers scored on the English set: which reads written forms as a listener expects.

`python -m bench.normalization [--rounds 3] [--no-cold] [--out FILE]` runs each candidate over
`docs/normalization_set.toml` (no GPU):

- `nemo`: NeMo's English normaliser, as `normalize_text: true` runs it for English
  (`server.text.normalize_nemo`: `Normalizer(input_case="cased", lang="en")`);
- `reference`: the reference's own `normalize_text` (WeTextProcessing for English), as
  `normalize_text: "reference"` runs it;
- `num2words`: bare integers only, what English gets where neither is installed (the
  reference's fallback for other languages).

All three go through the server's own function (`server.text.normalize`), so the inline-syntax
protection is the same. Each output is compared with the item's accepted readings after
lowercasing and turning every run of punctuation and spaces into one space: `exact` counts the
items read exactly right, `token` is the mean over items of 1 - word error rate against the
closest accepted reading (at least 0). Besides: each normaliser's cost per character (the set's
items one by one, and all of them as one text cut into the workers' pieces) and its first load
in a fresh process, from its disk cache and (`--cold`, the default) with none. Writes one JSON
document (default `bench/results/DATE-cpu-normalization.json`); docs/normalization.md tabulates
it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from bench.metrics import emit_report

REPO = Path(__file__).resolve().parents[1]
SET = REPO / "docs" / "normalization_set.toml"
CANDIDATES = ("nemo", "reference", "num2words")
CHOICE = {"nemo": True, "reference": "reference"}  # each one's `normalize_text`


@dataclass(frozen=True)
class Item:
    category: str
    written: str
    accepted: tuple[str, ...]  # canonical readings, every variant spelled out


def expand(pattern: str) -> list[str]:
    """Every reading a compact pattern stands for: `{a|b}` one of the alternatives (`{a|}`: a or
    nothing), `(x)` optional; the two nest."""

    def sequence(at: int, stops: str) -> tuple[list[str], int]:
        outs = [""]
        while at < len(pattern) and pattern[at] not in stops:
            char = pattern[at]
            if char == "(":
                inner, at = sequence(at + 1, ")")
                options, at = [*inner, ""], at + 1
            elif char == "{":
                options = []
                while True:
                    inner, at = sequence(at + 1, "|}")
                    options += inner
                    if pattern[at] == "}":
                        at += 1
                        break
            else:
                options, at = [char], at + 1
            outs = [head + tail for head in outs for tail in options]
        return outs, at

    return sequence(0, "")[0]


def canonical(text: str) -> str:
    """Lowercased, every run of punctuation and spaces one space: how readings are compared."""
    return " ".join(re.sub(r"[\W_]+", " ", text.lower()).split())


def load_set(path: Path = SET) -> list[Item]:
    with open(path, "rb") as f:
        raw = tomllib.load(f)["item"]
    return [Item(item["category"], item["written"],
                 tuple(dict.fromkeys(canonical(r) for pattern in item["spoken"] for r in expand(pattern))))
            for item in raw]


def _distance(a: list[str], b: list[str]) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def token_score(output: str, accepted: tuple[str, ...]) -> float:
    """1 - word error rate against the closest accepted reading, at least 0."""
    words = canonical(output).split()
    return max(max(0.0, 1 - _distance(ref.split(), words) / max(1, len(ref.split()))) for ref in accepted)


def is_exact(output: str, item: Item) -> bool:
    return canonical(output) in item.accepted


def score(outputs: list[str], items: list[Item]) -> dict:
    """Exact and token scores, overall and by category, and the items missed."""
    by_category: dict[str, list[int]] = {}
    misses = []
    exact = 0
    tokens = 0.0
    for out, item in zip(outputs, items, strict=True):
        hit = is_exact(out, item)
        exact += hit
        tokens += token_score(out, item.accepted)
        tally = by_category.setdefault(item.category, [0, 0])
        tally[0] += hit
        tally[1] += 1
        if not hit:
            misses.append({"written": item.written, "got": out, "expected": item.accepted[0]})
    return {"exact": exact, "size": len(items), "exact_share": round(exact / len(items), 4),
            "token": round(tokens / len(items), 4),
            "by_category": {k: f"{hits}/{total}" for k, (hits, total) in by_category.items()}, "misses": misses}


def normaliser(name: str) -> Callable[[str], str]:
    """The candidate `name` as the server runs it on English text."""
    from server.text import normalize

    if name == "num2words":
        module = normalize._text()
        return lambda text: module._apply_with_protection(
            text, lambda piece: module._num2words_segment(piece, "en"), protect_pinyin=False)
    if name == "nemo" and normalize.which(True, "en") != "nemo":
        raise RuntimeError("nemo-text-processing is not installed")
    return lambda text: normalize.normalize(text, "en", CHOICE[name])


_LOAD = """
import json, os, sys, time
from pathlib import Path
started = time.perf_counter()
if {cold!r}:  # no cache anywhere: nor the checkout's, which a server with a cache dir of its own reads too
    from server.text import normalize_nemo
    normalize_nemo.CHECKOUT_CACHE = Path(os.environ["CHORUS_CACHE_DIR"])
from bench.normalization import normaliser
normaliser({name!r})("1")
print(json.dumps(time.perf_counter() - started))
"""


def first_load(name: str, cache_dir: str | None) -> dict:
    """A fresh process's import and first call (its grammars loaded or compiled), and the whole
    process's wall time; `cache_dir`: its only grammar cache, empty (None: the server's own)."""
    env = dict(os.environ)
    if cache_dir is not None:
        env["CHORUS_CACHE_DIR"] = cache_dir
    began = time.perf_counter()
    code = _LOAD.format(name=name, cold=cache_dir is not None)
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True,
                          timeout=1800)
    return {"load_s": round(json.loads(done.stdout.strip().splitlines()[-1]), 2),
            "process_s": round(time.perf_counter() - began, 2)}


def cost(run: Callable[[str], str], items: list[Item], rounds: int) -> dict:
    """Milliseconds a character: the items one call each, and all of them as one text cut into
    the workers' pieces (`normalize_pieces`), the best of `rounds`."""
    from server.text.normalize_pieces import pieces

    texts = [item.written for item in items]
    joined = " ".join(texts)
    chars = sum(map(len, texts))
    one_by_one, as_pieces = [], []
    for _ in range(rounds):
        began = time.perf_counter()
        for text in texts:
            run(text)
        one_by_one.append(time.perf_counter() - began)
        began = time.perf_counter()
        for piece in pieces(joined):
            run(piece.text)
        as_pieces.append(time.perf_counter() - began)
    return {"ms_per_char_items": round(1000 * min(one_by_one) / chars, 3),
            "ms_per_char_pieces": round(1000 * min(as_pieces) / len(joined), 3), "chars": chars}


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for package in ("nemo_text_processing", "WeTextProcessing", "pynini", "num2words", "omnivoice"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", default=str(SET), help="the scored set (TOML)")
    parser.add_argument("--candidates", default=",".join(CANDIDATES))
    parser.add_argument("--rounds", type=int, default=3, help="timing rounds (the best is kept)")
    parser.add_argument("--no-cold", action="store_true", help="skip the first load with no grammar cache")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    from server.cli.checkout import git_commit

    items = load_set(Path(args.set))
    report: dict = {"normalizers": {}}
    for name in args.candidates.split(","):
        run = normaliser(name)
        run("1")  # here first: NeMo's grammars compiled into the server's cache if they are not yet
        entry: dict = {"load": {"cached": first_load(name, None)}}
        if not args.no_cold and name == "nemo":
            with tempfile.TemporaryDirectory() as empty:
                entry["load"]["cold"] = first_load(name, empty)
        outputs = [run(item.written) for item in items]
        entry.update(score(outputs, items))
        entry["cost"] = cost(run, items, args.rounds)
        entry["outputs"] = outputs
        report["normalizers"][name] = entry
        print(f"{name}: {entry['exact']}/{len(items)} exact, token {entry['token']}", file=sys.stderr)
    ranked = sorted(report["normalizers"], key=lambda n: (report["normalizers"][n]["exact"],
                                                         report["normalizers"][n]["token"]), reverse=True)
    date = datetime.now(UTC)
    command = ["python", "-m", "bench.normalization", *(sys.argv[1:] if argv is None else argv)]
    report = {
        "summary": {"set_size": len(items), "best": ranked[0],
                    "scores": {n: {k: report["normalizers"][n][k] for k in ("exact", "exact_share", "token")}
                               for n in ranked}},
        "meta": {"command": shlex.join(command), "date_utc": date.strftime("%Y-%m-%dT%H:%M:%SZ"),
                 "commit": git_commit(os.environ.get("CHORUS_COMMIT")), "cpus": os.cpu_count(),
                 "machine": platform.platform(), "python": platform.python_version(), "versions": versions(),
                 "set": str(Path(args.set).resolve().relative_to(REPO)) if Path(args.set).resolve().is_relative_to(
                     REPO) else args.set},
        **report,
    }
    out = args.out or str(REPO / "bench" / "results" / f"{date:%Y-%m-%d}-cpu-normalization.json")
    emit_report(report, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
