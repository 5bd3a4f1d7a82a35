"""The request path compiled with mypyc (setup.py), and run from its sources once they change
(``oipserve.how_compiled``)."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import oipserve
from oipserve import how_compiled

ROOT = Path(__file__).resolve().parents[2]


def _listed() -> list[str]:
    with open(ROOT / "pyproject.toml", "rb") as file:
        return list(tomllib.load(file)["tool"]["oipserve"]["compiled"])


@pytest.mark.skipif(
    os.environ.get("OIPSERVE_COMPILE") == "0", reason="installed with OIPSERVE_COMPILE=0"
)
def test_the_suite_runs_the_request_path_compiled() -> None:
    """The README's install compiles every listed module, and the tests run those builds:
    a module mypyc could not compile, or a source changed since the install, fails here."""
    listed = _listed()
    assert oipserve.compiled == f"compiled ({len(listed)} modules)"
    for path in listed:
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        assert module.__file__ is not None and module.__file__.endswith(".so"), path


def test_every_listed_module_exists_and_is_a_module_of_the_front_the_wire_or_a_worker() -> None:
    for path in _listed():
        assert (ROOT / path).is_file() and path.startswith(("oipserve/", "workers/")), path


def _build(tmp_path: Path, sources: dict[str, bytes]) -> Path:
    """A package ``pkg`` of these sources, as setup.py leaves a build: their hashes."""
    (tmp_path / "pkg").mkdir()
    for path, text in sources.items():
        (tmp_path / path).write_bytes(text)
    manifest = tmp_path / "pkg" / "compiled.json"
    hashes = {path: hashlib.sha256(text).hexdigest() for path, text in sources.items()}
    manifest.write_text(json.dumps(hashes))
    return manifest


def test_the_build_as_compiled_runs_compiled(tmp_path: Path) -> None:
    manifest = _build(tmp_path, {"pkg/a.py": b"A = 1\n", "pkg/b.py": b"B = 2\n"})
    assert how_compiled(manifest, switched_off=False) == ("compiled (2 modules)", None)


def test_one_changed_source_runs_every_compiled_module_from_its_source(tmp_path: Path) -> None:
    """A compiled module calls the others of its build directly: one changed source puts
    them all back to Python, and the line names it."""
    manifest = _build(tmp_path, {"pkg/a.py": b"A = 1\n", "pkg/b.py": b"B = 2\n"})
    (tmp_path / "pkg" / "b.py").write_bytes(b"B = 3\n")
    how, finder = how_compiled(manifest, switched_off=False)
    assert how.startswith("as Python (pkg/b.py changed since the build")
    assert finder is not None
    assert finder.sources == {"pkg.a": tmp_path / "pkg/a.py", "pkg.b": tmp_path / "pkg/b.py"}
    spec = finder.find_spec("pkg.b", None)
    assert spec is not None and spec.origin == str(tmp_path / "pkg/b.py")
    assert finder.find_spec("pkg.c", None) is None


def test_switched_off_or_never_compiled(tmp_path: Path) -> None:
    manifest = _build(tmp_path, {"pkg/a.py": b"A = 1\n"})
    how, finder = how_compiled(manifest, switched_off=True)
    assert how == "as Python (OIPSERVE_COMPILED=0)" and finder is not None
    assert how_compiled(tmp_path / "none.json", switched_off=False) == ("not compiled", None)


def test_oipserve_compiled_0_runs_the_sources() -> None:
    """What a profiler that should see Python frames is started with."""
    code = "import oipserve, oipserve.pool.link as m; print(oipserve.compiled); print(m.__file__)"
    env = {**os.environ, "OIPSERVE_COMPILED": "0"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    how, where = result.stdout.split("\n")[:2]
    assert where.endswith("oipserve/pool/link.py")
    assert how in ("as Python (OIPSERVE_COMPILED=0)", "not compiled")


def test_the_build_knows_the_types_the_package_uses_at_the_versions_it_uses() -> None:
    """pyproject.toml's build requirements name packages for their types (pip builds in an
    isolated environment); each as `dependencies` or the test extras name it."""
    with open(ROOT / "pyproject.toml", "rb") as file:
        project = tomllib.load(file)
    declared = {
        _name(spec): spec
        for spec in project["project"]["dependencies"]
        + project["project"]["optional-dependencies"]["test"]
    }
    for spec in project["build-system"]["requires"]:
        if _name(spec) not in ("setuptools", "mypy"):
            assert declared.get(_name(spec)) == spec, spec


def _name(spec: str) -> str:
    return spec.split("[")[0].split(">")[0].split("<")[0].split("=")[0].strip().lower()


_KINDS = """
import importlib, inspect, json, sys
from oipserve.errors import ServerError
kinds = {}
for module in sys.argv[1:]:
    for name, obj in vars(importlib.import_module(module)).items():
        if inspect.isclass(obj) and issubclass(obj, ServerError) and obj.__module__ == module:
            kinds[f"{module}.{name}"] = obj("x").kind.value
print(json.dumps(kinds))
"""


def _error_kinds(compiled: bool) -> dict[str, str]:
    """The kind of every error class the compiled modules define, as they run."""
    modules = [path.removesuffix(".py").replace("/", ".") for path in _listed()]
    env = dict(os.environ, OIPSERVE_COMPILED="1" if compiled else "0")
    out = subprocess.run(
        [sys.executable, "-c", _KINDS, *modules],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return dict(json.loads(out))


def test_an_error_class_keeps_its_kind_compiled() -> None:
    """mypyc made ``Withdrawn`` (a client gone from the batcher's queue), then declared in
    ``dataplane/batched.py``, a native class and dropped its class body's ``kind = ...``:
    it answered and logged a 500 instead of a 400. Every error class of a compiled module
    has the kind it has as Python."""
    as_python = _error_kinds(compiled=False)
    assert len(as_python) >= 2, as_python  # (WorkerDied, QueueRejected, ...)
    assert _error_kinds(compiled=True) == as_python
