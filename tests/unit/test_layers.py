"""The import layers (docs/architecture.md, "Layers"), checked on the source and at run time.

    front (oipserve/*)  ──▶  wire contract (oipserve/wire/)  ◀──  workers (workers/*)
    front ──▶ hardware/          hardware imports neither side

The wire contract imports only numpy, msgspec, simdjson and the standard library. The
worker side imports the wire contract and nothing else of the front. The front never
imports the workers, ONNX Runtime or OpenCV.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STDLIB = sys.stdlib_module_names

#: Top-level third-party packages each layer may import (besides the stdlib and its own).
ALLOWED: dict[str, frozenset[str]] = {
    "wire": frozenset({"numpy", "msgspec", "simdjson"}),
    "workers": frozenset(
        {"numpy", "msgspec", "simdjson", "orjson", "onnxruntime", "cv2", "simplejpeg"}
    ),
    "hardware": frozenset({"msgspec", "psutil", "pynvml"}),
}
#: What the front must never import.
FRONT_FORBIDDEN = frozenset({"workers", "onnxruntime", "cv2", "simplejpeg"})


def _layer(path: Path) -> str:
    parts = path.relative_to(ROOT).parts
    if parts[0] == "oipserve":
        return "wire" if parts[1] == "wire" else "front"
    return parts[0]


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, dotted module) of every absolute import in a file, nested ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.extend(
                (node.lineno, f"{node.module}.{alias.name}")
                if node.module == "oipserve"
                else (node.lineno, node.module)
                for alias in node.names
            )
    return found


def _violation(layer: str, module: str) -> str | None:
    top = module.partition(".")[0]
    if top in STDLIB or top == "__future__":
        return None
    in_wire = module == "oipserve.wire" or module.startswith("oipserve.wire.")
    if layer == "front":
        return f"the front imports {module}" if top in FRONT_FORBIDDEN else None
    if layer == "wire":
        ok = in_wire or top in ALLOWED["wire"]
        return None if ok else f"the wire contract imports {module}"
    if layer == "workers":
        ok = top == "workers" or in_wire or top in ALLOWED["workers"]
        return None if ok else f"a worker module imports {module}"
    if layer == "hardware":
        ok = top == "hardware" or top in ALLOWED["hardware"]
        return None if ok else f"hardware imports {module}"
    return None


SOURCES = sorted(
    p
    for package in ("oipserve", "workers", "hardware")
    for p in (ROOT / package).rglob("*.py")
    if "grpc_generated" not in p.parts
)


def test_sources_were_found() -> None:
    layers = {_layer(p) for p in SOURCES}
    assert layers == {"front", "wire", "workers", "hardware"}


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_follow_the_layers(path: Path) -> None:
    layer = _layer(path)
    problems = [
        f"{path.relative_to(ROOT)}:{line}: {why}"
        for line, module in _imports(path)
        if (why := _violation(layer, module)) is not None
    ]
    assert not problems, "\n".join(problems)


def _loaded_after(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nprint('\\n'.join(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    return set(result.stdout.split())


def test_the_front_process_never_loads_onnxruntime_or_opencv() -> None:
    loaded = _loaded_after("import oipserve.server, oipserve.cli")
    assert "oipserve.server" in loaded
    assert not {m for m in loaded if m.partition(".")[0] in FRONT_FORBIDDEN}


def test_a_worker_process_loads_nothing_of_the_front() -> None:
    loaded = _loaded_after("import workers.worker, workers.images, workers.runtime")
    assert "onnxruntime" in loaded
    front = {m for m in loaded if m.startswith("oipserve.") and not m.startswith("oipserve.wire")}
    assert not front, sorted(front)


def test_another_http_front_loads_no_onnxruntime_and_no_management() -> None:
    """``--http-workers``: the other fronts run the data plane, never models or the manager."""
    loaded = _loaded_after("import oipserve.replicas.process")
    assert "oipserve.dataplane" in loaded and "oipserve.replicas.forward" in loaded
    forbidden = {"oipserve.model_manager", "oipserve.management", "oipserve.pool"}
    assert not forbidden & loaded, sorted(forbidden & loaded)
    assert not {m for m in loaded if m.partition(".")[0] in FRONT_FORBIDDEN}


def test_the_checker_catches_a_violation(tmp_path: Path) -> None:
    assert _violation("workers", "oipserve.dataplane") is not None
    assert _violation("workers", "oipserve.wire.shm") is None
    assert _violation("wire", "oipserve.errors") is not None
    assert _violation("front", "onnxruntime") is not None
    assert _violation("hardware", "oipserve.wire") is not None
    source = tmp_path / "x.py"
    source.write_text("def f():\n    from oipserve import dataplane\n")
    assert _imports(source) == [(2, "oipserve.dataplane")]
