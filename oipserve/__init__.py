"""oipserve: an Open Inference Protocol (KServe v2) server for ONNX models.

The request path's modules (pyproject.toml, ``[tool.oipserve] compiled``) are built as C
extensions by mypyc when the package is installed (setup.py), and run compiled, unless
their sources changed since that build: in an editable install, an edited module would
otherwise keep running as it was compiled, and a compiled module calls the others of the
build directly, not through their Python. So ``compiled`` below says how they run, and
when any source differs from what was compiled (or ``OIPSERVE_COMPILED=0``, for a
profiler that should see Python frames), every one of them is imported from its
source instead. The server logs which at start.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import ModuleType

try:
    #: From the installed package's metadata (pyproject.toml's ``version``): one source.
    __version__ = version("oipserve")
except PackageNotFoundError:  # pragma: no cover - a tree that was never installed
    __version__ = "0+unknown"

#: What setup.py compiled: each module's source path -> the SHA-256 of the source compiled.
COMPILED_MANIFEST = Path(__file__).with_name("compiled.json")


class _FromSource(importlib.abc.MetaPathFinder):
    """Finds the listed modules in their ``.py`` files, before the extensions beside them."""

    def __init__(self, sources: dict[str, Path]) -> None:
        self.sources = sources

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        source = self.sources.get(fullname)
        return None if source is None else importlib.util.spec_from_file_location(fullname, source)


def how_compiled(manifest: Path, switched_off: bool) -> tuple[str, _FromSource | None]:
    """How the modules that ``manifest`` lists run: ``compiled (N modules)``, ``not
    compiled`` (no manifest) or ``as Python (why)``, with the finder that imports them from
    their sources in that last case (``switched_off``: OIPSERVE_COMPILED=0)."""
    try:
        built: dict[str, str] = json.loads(manifest.read_text())
    except FileNotFoundError:
        return "not compiled", None
    root = manifest.parent.parent
    if switched_off:
        why = "OIPSERVE_COMPILED=0"
    else:
        changed = [
            path
            for path, digest in sorted(built.items())
            if hashlib.sha256((root / path).read_bytes()).hexdigest() != digest
        ]
        if not changed:
            return f"compiled ({len(built)} modules)", None
        why = f"{changed[0]} changed since the build; `pip install -e .` compiles it again"
    sources = {path.removesuffix(".py").replace("/", "."): root / path for path in built}
    return f"as Python ({why})", _FromSource(sources)


#: How the request path runs: ``compiled (N modules)``, ``not compiled`` (built without a
#: C compiler, or with OIPSERVE_COMPILE=0) or ``as Python (why)``.
compiled, _finder = how_compiled(COMPILED_MANIFEST, os.environ.get("OIPSERVE_COMPILED") == "0")
if _finder is not None:
    sys.meta_path.insert(0, _finder)
