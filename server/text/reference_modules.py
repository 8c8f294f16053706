"""Modules of the reference package that need only the standard library, loaded by path.

Importing `omnivoice.utils.x` runs the package's `__init__`, which loads the model and torch;
the web layer must not, so the few pure modules it uses (the text normaliser, its language
table, the duration estimator's character weights) are executed from their files instead.
"""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path
from types import ModuleType


@cache
def reference_module(name: str) -> ModuleType:
    """`omnivoice/utils/{name}.py`, loaded once."""
    spec = importlib.util.find_spec("omnivoice")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the omnivoice package is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "utils" / f"{name}.py"
    module_spec = importlib.util.spec_from_file_location(f"chorus_reference_{name}", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module
