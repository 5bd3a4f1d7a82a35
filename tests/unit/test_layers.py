"""The import layers (docs/architecture.md, "Layers"), checked on the source and at run time.

    front (oipserve/*)  ──▶  wire contract (oipserve/wire/)  ◀──  workers (workers/*)
    front ──▶ hardware/          hardware imports neither side

The wire contract imports only numpy, msgspec, simdjson, mypy_extensions and the standard
library. The worker side imports the wire contract and nothing else of the front. The front never
imports the workers, ONNX Runtime or OpenCV.

Inside the front, packages import one way, from the top down (``PACKAGE_ORDER``): a module
may import its own package and those below it, never one above. And no two modules import
each other, however indirectly (``TYPE_CHECKING`` imports included).
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
    # mypy_extensions: ``mypyc_attr``, how a class says what mypyc may do with it (a no-op
    #   when the module runs interpreted).
    "wire": frozenset({"numpy", "msgspec", "simdjson", "mypy_extensions"}),
    "workers": frozenset(
        {
            "numpy",
            "msgspec",
            "simdjson",
            "orjson",
            "onnxruntime",
            "cv2",
            "simplejpeg",
            "mypy_extensions",
        }
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
    loaded = _loaded_after("import oipserve.app.server, oipserve.app.cli")
    assert "oipserve.app.server" in loaded
    assert not {m for m in loaded if m.partition(".")[0] in FRONT_FORBIDDEN}


def test_a_worker_process_loads_nothing_of_the_front() -> None:
    loaded = _loaded_after("import workers.worker, workers.images, workers.runtime")
    assert "onnxruntime" in loaded
    front = {m for m in loaded if m.startswith("oipserve.") and not m.startswith("oipserve.wire")}
    assert not front, sorted(front)


def test_another_http_front_loads_no_onnxruntime_and_no_management() -> None:
    """``--http-workers``: the other fronts run the data plane, never models or the manager."""
    loaded = _loaded_after("import oipserve.scaleout.process")
    assert "oipserve.dataplane.plane" in loaded and "oipserve.scaleout.forward" in loaded
    forbidden = {
        "oipserve.models.manager",
        "oipserve.models.placement",
        "oipserve.management",
        "oipserve.pool.worker_pool",
    }
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


# ---- the front's packages, top down ------------------------------------------------------

#: The front's packages, each importing only itself and those after it. Inside ``front``,
#: its own subpackages follow the same rule (``FRONT_ORDER``).
PACKAGE_ORDER = (
    "app",  # the program: start-up and shutdown order
    "scaleout",  # --http-workers: the other fronts
    "front",  # the protocol edges: REST, gRPC, HTTP/1.1, HTTP/2
    "management",  # hardware, worker endpoints, repository control
    "dataplane",  # the inference path
    "request",  # what a request is, its checks and placement
    "telemetry",  # statistics and metrics
    "models",  # the registry, the manager, config.pbtxt
    "scheduling",  # the dynamic batcher
    "pool",  # the worker processes
    "runtime",  # sockets, byte I/O, off-loop work, memory
    "config",  # Settings, the restricted-API groups
    "errors",
    "grpc_generated",
    "wire",
)
FRONT_ORDER = ("front.rest", "front.grpc", "front.http", "front.grpc.h2", "front.header_rules")


def _package(module: str) -> str | None:
    """The package of ``PACKAGE_ORDER`` (or ``FRONT_ORDER``) a dotted module belongs to."""
    parts = module.split(".")
    if parts[0] != "oipserve" or len(parts) < 2 or parts[1] in ("__main__", "__init__"):
        return None
    if parts[1] == "front" and len(parts) > 2:
        if parts[2] == "grpc" and len(parts) > 3 and parts[3] == "h2":
            return "front.grpc.h2"
        return f"front.{parts[2]}"
    return parts[1]


def _rank(package: str) -> tuple[int, int]:
    top = package.partition(".")[0]
    inner = FRONT_ORDER.index(package) if package in FRONT_ORDER else -1
    return PACKAGE_ORDER.index(top), inner


def _module_name(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return name.removesuffix(".__init__")


FRONT_SOURCES = [p for p in SOURCES if _layer(p) == "front"]


@pytest.mark.parametrize("path", FRONT_SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_front_packages_import_from_the_top_down(path: Path) -> None:
    own = _package(_module_name(path))
    if own is None:
        return  # oipserve/__init__.py, __main__.py: above every package
    problems = []
    for line, module in _imports(path):
        target = _package(module)
        if target is None or target == own or target.startswith(own + "."):
            continue
        if _rank(target) < _rank(own):
            problems.append(f"{path.relative_to(ROOT)}:{line}: {own} imports {module}, above it")
    assert not problems, "\n".join(problems)


def test_every_front_package_has_its_place() -> None:
    packages = {_package(_module_name(p)) for p in FRONT_SOURCES} - {None}
    unplaced = {p for p in packages if p.partition(".")[0] not in PACKAGE_ORDER}
    unplaced |= {p for p in packages if p.startswith("front.") and p not in FRONT_ORDER}
    assert not unplaced, f"add {sorted(unplaced)} to PACKAGE_ORDER / FRONT_ORDER"


def _module_graph() -> dict[str, set[str]]:
    """Each oipserve module -> the oipserve modules it imports (a package is its __init__)."""
    modules = {_module_name(p): p for p in SOURCES if _layer(p) in ("front", "wire")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for _, module in _imports(path):
            for target in (module, module.rpartition(".")[0]):
                if target in modules and target != name and not name.startswith(target + "."):
                    graph[name].add(target)
                    break
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_through_others() -> None:
    assert _cycles(_module_graph()) == []


def test_the_cycle_finder_finds_one() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _rank("front.rest") < _rank("front.http") < _rank("front.header_rules")
    assert _rank("app") < _rank("wire")
