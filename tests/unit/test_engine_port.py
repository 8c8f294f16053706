"""No test hooks in `server/`, and `bench/` watches the engine only through its port.

A test hook is product code that is there for tests or benches, not for the product. Read from the
source (comments through `tokenize`, the rest through `ast`), it is any of:

1. a comment or docstring in `server/` that gives tests or benches as the reason for code:
   "for (the) tests", "for the bench", "(tests)", "(tests and benches)", "(for clients and tests)",
   "so (that) tests can ...", "tests wrap / patch / inject / replace / swap / set / pass / widen /
   override it", "what a test puts". Tests named as evidence ("tests compare ...", "the yardstick of
   `check` and the tests") are not reasons, and pass;
2. a property setter (`@name.setter`) in `server/engine/`: an engine's parts are wired when it is
   made (`EngineLoop(..., backbone=, observer=)`), never re-wired through an attribute;
3. a `getattr(obj, name, default)` or `hasattr(obj, name)` in `server/` inside a function whose
   docstring, or on a line whose comment, speaks of a fake, stub, stand-in, mock or double: a
   fallback for test doubles (one whose docstring says "tests pass one" is caught by 1);
4. a parameter in `server/` named as a hook: `wrap_*`, `*_for_tests`, `test_*`.

And in `bench/` and `microbench/` (the engine is observed through `server/engine/runtime/observer.py`):

5. no import of a private name of `server.engine`: `from server.engine.x import _y`, `import
   server.engine.x._y`, `from server.engine.x import _y as z`;
6. no private attribute of the engine read or written: `obj._name` (read, assigned or deleted) and
   `setattr`/`getattr`/`monkeypatch.setattr(obj, "_name", ...)` where `obj` is a module or class
   imported from `server.engine`, or an engine part by its usual name (`engine`, `runner`,
   `finisher`, `codec`, `scheduler`, `sampler`, `book`, `e`).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVER, BENCHES = ROOT / "server", [ROOT / "bench", ROOT / "microbench"]

_TESTS = r"(?:tests?|bench(?:es|marks?)?|the bench)"
REASONS = [
    re.compile(rf"\bfor (?:the )?{_TESTS}\b(?!\w)", re.I),  # "for tests", "for the bench"
    re.compile(rf"\((?:for )?(?:the )?(?:\w+ and )?{_TESTS}(?: and \w+)?\)", re.I),  # "(tests and benches)"
    re.compile(rf"\bso (?:that )?(?:the )?{_TESTS} can\b", re.I),
    re.compile(rf"\b{_TESTS} (?:wrap|patch|monkeypatch|inject|replace|swap|set|pass|widen|override)s?\b", re.I),
    re.compile(r"\bwhat a test puts\b", re.I),
]
DOUBLES = re.compile(r"\b(?:fakes?|stubs?|stand-ins?|mocks?|(?:test )?doubles?)\b", re.I)
HOOK_PARAMS = re.compile(r"^(?:wrap_\w+|\w+_for_tests|test_\w+)$")
ENGINE_PARTS = {"engine", "runner", "finisher", "codec", "scheduler", "sampler", "book", "e"}


def _py_files(*roots: Path) -> list[Path]:
    return sorted(p for root in roots for p in root.rglob("*.py") if "results" not in p.parts)


def _comments(source: str) -> list[tuple[int, str]]:
    return [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
            if tok.type == tokenize.COMMENT]


def _docstrings(tree: ast.AST) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                out.append((node.body[0].lineno, doc))
    return out


def hooks_in(source: str, name: str, engine: bool) -> list[str]:
    """Rules 1 to 4 on one module of `server/` (`engine`: it is under `server/engine/`)."""
    tree = ast.parse(source)
    found = []
    comments = _comments(source)
    for line, text in comments + _docstrings(tree):
        flat = " ".join(text.split())
        for reason in REASONS:
            if (match := reason.search(flat)) is not None:
                found.append(f"{name}:{line}: gives tests or benches as a reason: {match.group(0)!r}")
    comment_at = dict(comments)
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for decorator in function.decorator_list:
            if engine and isinstance(decorator, ast.Attribute) and decorator.attr == "setter":
                found.append(f"{name}:{decorator.lineno}: a property setter in the engine ({function.name})")
        arguments = function.args
        for arg in arguments.posonlyargs + arguments.args + arguments.kwonlyargs:
            if HOOK_PARAMS.match(arg.arg):
                found.append(f"{name}:{function.lineno}: a hook parameter ({function.name}({arg.arg}))")
        doc = ast.get_docstring(function) or ""
        for call in ast.walk(function):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)):
                continue
            fallback = (call.func.id == "getattr" and len(call.args) == 3) or call.func.id == "hasattr"
            said = doc + " " + comment_at.get(call.lineno, "")
            if fallback and DOUBLES.search(said):
                found.append(f"{name}:{call.lineno}: a {call.func.id} fallback for test doubles")
    return found


def _engine_aliases(tree: ast.AST) -> set[str]:
    """Names bound in a module to modules, classes or functions of `server.engine`."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("server.engine"):
            names |= {alias.asname or alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            names |= {alias.asname or alias.name.split(".")[0] for alias in node.names
                      if alias.name.startswith("server.engine")}
    return names


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _root(node: ast.AST) -> str | None:
    """The name an attribute chain starts from (`engine` for `engine.runner.x`)."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _is_engine_object(node: ast.AST, aliases: set[str]) -> bool:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    root = node.id if isinstance(node, ast.Name) else None
    return root in aliases or root in ENGINE_PARTS or bool(ENGINE_PARTS & set(parts)) or (
        root == "self" and bool(parts) and parts[-1] in ENGINE_PARTS)


def privates_used_in(source: str, name: str) -> list[str]:
    """Rules 5 and 6 on one module of `bench/` or `microbench/`."""
    tree = ast.parse(source)
    aliases = _engine_aliases(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("server.engine"):
            if _is_private(node.module.rsplit(".", 1)[-1]):
                found.append(f"{name}:{node.lineno}: imports the private module {node.module}")
            found += [f"{name}:{node.lineno}: imports {node.module}.{alias.name}"
                      for alias in node.names if _is_private(alias.name)]
        elif isinstance(node, ast.Import):
            found += [f"{name}:{node.lineno}: imports {alias.name}" for alias in node.names
                      if alias.name.startswith("server.engine") and any(map(_is_private, alias.name.split(".")))]
        elif isinstance(node, ast.Attribute) and _is_private(node.attr) and _is_engine_object(node.value, aliases):
            found.append(f"{name}:{node.lineno}: reaches the engine's private {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and len(node.args) >= 2:
            func = node.func
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            target, attr = node.args[0], node.args[1]
            if (called in ("setattr", "getattr", "delattr") and isinstance(attr, ast.Constant)
                    and isinstance(attr.value, str) and _is_private(attr.value)
                    and _is_engine_object(target, aliases)):
                found.append(f"{name}:{node.lineno}: {called} of the engine's private {attr.value!r}")
    return found


# ---- the repository -------------------------------------------------------------------------


def test_server_has_no_test_hooks():
    found = []
    for path in _py_files(SERVER):
        rel = str(path.relative_to(ROOT))
        found += hooks_in(path.read_text(), rel, engine=rel.startswith("server/engine/"))
    assert not found, "test hooks in server/:\n" + "\n".join(found)


def test_bench_uses_no_private_engine_name():
    found = []
    for path in _py_files(*BENCHES):
        found += privates_used_in(path.read_text(), str(path.relative_to(ROOT)))
    assert not found, "bench/ reaches into the engine's privates:\n" + "\n".join(found)


# ---- the rules, on what they must catch and what they must let pass -------------------------


def _line_of(source: str, marker: str) -> int:
    """The line of `source` (1-based, as `ast` counts) where `marker` first appears."""
    return next(i for i, line in enumerate(source.splitlines(), 1) if marker in line)


def _found_exactly_at(found: list[str], source: str, markers: tuple[str, ...]) -> None:
    """`found` (`file:line: ...` findings) names each marker's line of `source`, and nothing more."""
    for marker in markers:
        assert any(f":{_line_of(source, marker)}:" in f for f in found), (marker, found)
    assert len(found) == len(markers), found


def test_each_kind_of_hook_is_caught():
    hooks = '''
class EngineLoop:
    @property
    def backbone(self):
        """The packed forward the runner calls (tests wrap it to inject faults)."""
        return self.runner.backbone

    @backbone.setter
    def backbone(self, backbone):
        self.runner.backbone = backbone

    def run_on_lane(self, lane, fn):
        """`fn()` on that lane's thread (tests and benches)."""

    def _decoded(self, launched):
        """Wait for its copies (a separate call so benches can time it)."""
        # timed where it ran, for the bench


def engine_count(engine):
    """Engines behind `engine`: a pool lists them; a lone engine is one."""
    return len(getattr(engine, "engines", (engine,)))  # a fake has none


def serve(cfg, wrap_engine=None):
    """Serve (the engines behind `wrap_engine`: what a test puts between the app and them)."""
'''
    found = hooks_in(hooks, "x.py", engine=True)
    _found_exactly_at(found, hooks, ("tests wrap it", "@backbone.setter", "(tests and benches)", "so benches can",
                                     "for the bench", "getattr(engine,", "wrap_engine=None", "what a test puts"))


def test_tests_named_as_evidence_pass():
    evidence = '''
def post_process(audio):
    """The reference's post-processing, bit-identical (tests/unit/test_postprocess_port.py)."""


def text_ids(model, text):
    """Built on the host; tests check equality with the reference's canvas."""


def reference(x, alpha):
    """`Snake1d.forward`, verbatim (the yardstick of `check` and the tests)."""
    return getattr(x, "alpha", None)  # a module without one keeps its forward
'''
    assert hooks_in(evidence, "x.py", engine=True) == []


def test_each_reach_into_engine_privates_is_caught():
    bench = '''
import server.engine.runtime.finisher as fin
from server.engine.model import runner as runner_module
from server.engine.runtime.finisher import _Launched, Finisher
from server.engine.model.runner import _private_helper as helper


def install(engine, monkeypatch):
    e = engine
    e._admit = lambda state: None
    engine.finisher._decoded = None
    runner_module._secret = 1
    setattr(engine.codec, "_post", None)
    monkeypatch.setattr(fin, "_timed", None)
    return engine._steps
'''
    found = privates_used_in(bench, "b.py")
    _found_exactly_at(found, bench, ("import _Launched", "_private_helper", "e._admit", "finisher._decoded",
                                     "runner_module._secret", '"_post"', '"_timed"', "engine._steps"))


def test_the_port_and_the_reference_model_pass():
    bench = '''
from server.engine.runtime.observer import QuietObserver


class Timer(QuietObserver):
    def __init__(self, engine):
        self._board = engine.observer  # its own private: fine
        self._board.attach(self)


def capture(model):
    original = model._decode_and_post_process  # the reference model's, not the engine's
    model._decode_and_post_process = original
'''
    assert privates_used_in(bench, "b.py") == []
