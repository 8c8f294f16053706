"""The shape of `server/`: the web layer never imports torch; the import graph has no cycle
(counting imports inside functions too); the engine's rooms import one way; every
function-local import says why it is lazy; no file is over 350 lines."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SERVER = Path(__file__).resolve().parents[2] / "server"
WEB_MODULES = ["server.app", "server.wire.messages", "server.turns.service", "server.voices", "server.voices.sqlite",
               "server.voices.postgres", "server.audio.files", "server.metrics", "server.api.stream",
               "server.api.speech", "server.api.voices", "server.api.ops", "server.audio.encoders",
               "server.voices.instructions", "server.voices.builtin", "server.wire.speech_body", "server.voices.kept",
               "server.text.normalize", "server.text.normalize_workers", "server.text.prepare",
               "server.api.schema_page", "server.text.lexicon",
               "server.api.pronunciations", "server.timestamps.clock", "server.timestamps.model_words"]
# The engine's rooms, highest first: a room imports only itself and the rooms after it. Modules
# directly in `server/engine/` (types, work, upstream) are the vocabulary every room shares.
ROOMS = ["runtime", "planning", "model", "scheduling", "kernels"]
# What the engine may import from the rest of `server/` (never the web layer)
ENGINE_OUTSIDE = {"server.envs", "server.config", "server.options", "server.visible_text", "server.checkpoint"}
MAX_LINES = 350


def test_web_layer_imports_no_torch():
    code = ("import sys\n" + "".join(f"import {m}\n" for m in WEB_MODULES)
            + "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
              "assert not bad, bad[:5]\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def _modules() -> dict[str, Path]:
    out = {}
    for path in SERVER.rglob("*.py"):
        parts = list(path.relative_to(SERVER.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The module of ours that `name` (a module, or a name inside one) is, if any."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> list[tuple[str, ast.stmt, bool]]:
    """(our module imported, the statement, whether it sits inside a function) for every import."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                targets = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - child.level + 1]
                                    + ([child.module] if child.module else []))
                targets = [f"{base}.{alias.name}" for alias in child.names]
            else:
                visit(child, inside)
                continue
            for target in targets:
                if (ours := _resolve(target)) is not None and ours != module:
                    found.append((ours, child, in_function))

    visit(tree, False)
    return found


GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


def _cycle() -> list[str] | None:
    """One import cycle, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target, _, _ in GRAPH[module]:
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (found := walk(target)):
                return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(GRAPH):
        if module not in state and (found := walk(module)):
            return found
    return None


def test_the_import_graph_has_no_cycle():
    assert sum(len(edges) for edges in GRAPH.values()) > 100  # the graph was really read
    cycle = _cycle()
    assert cycle is None, " -> ".join(cycle)


def _room(module: str) -> int | None:
    parts = module.split(".")
    if parts[:2] != ["server", "engine"] or len(parts) < 4:
        return None
    return ROOMS.index(parts[2])


def test_every_engine_module_sits_in_a_room_or_is_shared_vocabulary():
    for module, path in MODULES.items():
        parts = module.split(".")
        if parts[:2] == ["server", "engine"] and len(parts) >= 3 and path.name == "__init__.py":
            assert len(parts) == 2 or parts[2] in ROOMS, f"{module}: a package that is not a room"


def test_the_engine_rooms_import_one_way():
    wrong = []
    for module, edges in GRAPH.items():
        if not module.startswith("server.engine"):
            continue
        room = _room(module)
        for target, node, _ in edges:
            if not target.startswith("server.engine"):
                if target not in ENGINE_OUTSIDE:
                    wrong.append(f"{module}:{node.lineno} imports {target} (outside the engine)")
                continue
            target_room = _room(target)
            if target_room is None:
                continue  # the shared vocabulary
            if room is None or target_room < room:
                wrong.append(f"{module}:{node.lineno} imports {target}, a room above it")
    assert not wrong, "\n".join(wrong)


def test_every_function_local_import_says_why_it_is_lazy():
    """An import inside a function is an optional or heavy dependency loaded on purpose, never a
    way round a cycle: it carries a `# lazy: reason` (a block of them, on its first line)."""
    silent = []
    for module, path in MODULES.items():
        lines = path.read_text().splitlines()
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            imports = sorted((node for node in ast.walk(function) if isinstance(node, (ast.Import, ast.ImportFrom))),
                             key=lambda node: node.lineno)
            blocks: list[list[ast.stmt]] = []
            for node in imports:  # consecutive import lines form one block
                if blocks and node.lineno == blocks[-1][-1].end_lineno + 1:
                    blocks[-1].append(node)
                else:
                    blocks.append([node])
            for block in blocks:
                if "# lazy:" not in " ".join(lines[block[0].lineno - 2 : block[-1].end_lineno]):
                    silent.append(f"{module}:{block[0].lineno}")
    assert not silent, "function-local imports without a `# lazy: reason`: " + ", ".join(sorted(set(silent)))


def test_no_file_in_server_is_over_350_lines():
    long = {str(p.relative_to(SERVER.parent)): n for p in SERVER.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long
