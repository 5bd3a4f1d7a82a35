"""The package's build: the request path compiled with mypyc, the rest as Python.

The modules listed in pyproject.toml's ``[tool.oipserve] compiled`` become C extensions
(mypyc, part of mypy: type-annotated Python to C; docs/performance.md, "The request path
compiled with mypyc"). Each build also writes ``oipserve/compiled.json``: the SHA-256 of
every compiled module's source, which ``oipserve.how_compiled`` compares at import, so
that an extension whose source changed since (an editable install, edited) is not run in
its place.

The package works without them: with ``OIPSERVE_COMPILE=0`` at install, or where the
build cannot compile (no C compiler, no Python headers, a type error mypy finds in the
build environment), it installs as Python and says so on the build's output; the server's
start-up log says so too, and the test suite fails (``tests/unit/test_compiled.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tomllib
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
MANIFEST = Path("oipserve", "compiled.json")


def compiled_sources() -> list[str]:
    with open(ROOT / "pyproject.toml", "rb") as file:
        return list(tomllib.load(file)["tool"]["oipserve"]["compiled"])


def source_hashes(paths: list[str]) -> dict[str, str]:
    return {path: hashlib.sha256((ROOT / path).read_bytes()).hexdigest() for path in paths}


class CompileOrNot(build_ext):
    """Builds the extensions and writes the manifest; a build that fails leaves the
    package as Python (nothing compiled, no manifest) instead of failing the install."""

    #: The sources' hashes as mypyc read them (``extensions``): a source edited while the
    #: C compiles (minutes) must not be named in the manifest as compiled.
    translated: dict[str, str] = {}

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:  # (the C files on every core this build may use)
            self.parallel = len(os.sched_getaffinity(0))

    def run(self) -> None:
        if not self.extensions:
            return
        try:
            super().run()
        except Exception as exc:  # a compiler missing, or failing
            self._as_python(f"{type(exc).__name__}: {exc}")
            return
        hashes = self.translated or source_hashes(compiled_sources())
        self._manifest().write_text(json.dumps(hashes, indent=1, sort_keys=True) + "\n")

    def _manifest(self) -> Path:
        """Where the manifest goes: beside the sources for ``build_ext --inplace``, in the
        build's tree otherwise (a wheel; an editable install, whose build setuptools then
        copies beside the sources with the extensions)."""
        return (ROOT if self.inplace else Path(self.build_lib)) / MANIFEST

    def _as_python(self, why: str) -> None:
        print(
            f"oipserve: the request path is not compiled ({why}); it runs as Python",
            file=sys.stderr,
        )
        for ext in self.extensions:
            built = Path(self.get_ext_fullpath(ext.name))
            built.unlink(missing_ok=True)
        self._manifest().unlink(missing_ok=True)


#: The commands that build the extensions; the others (metadata) need not compile.
BUILDS = {"build", "build_ext", "bdist_wheel", "editable_wheel", "develop", "install"}


def extensions() -> list:
    if os.environ.get("OIPSERVE_COMPILE", "1") == "0" or not BUILDS.intersection(sys.argv):
        return []
    from mypyc.build import mypycify

    # NOTE: mypy reads pyproject.toml's [tool.mypy] (the project's own checks); its note
    #   on config sections for modules not in this build would stop mypyc. No cache: types
    #   cached by another environment's mypy (the checkout's .mypy_cache) would stand in
    #   for the build environment's packages.
    flags = ["--no-warn-unused-configs", "--cache-dir", os.devnull]
    CompileOrNot.translated = source_hashes(compiled_sources())
    try:
        # PERF: a C file per module (multi_file), compiled side by side: gcc -O3 took ~3 min
        #   over the one 48 MB file of 60 modules, 1.5 min over theirs, and the front spends
        #   the same CPU a request (benchmarks/results/2026-12-01-lane-cycle.md).
        return mypycify(
            [*flags, *compiled_sources()], opt_level="3", group_name="oipserve", multi_file=True
        )
    except (SystemExit, Exception) as exc:  # mypy's errors end in SystemExit
        print(f"oipserve: the request path is not compiled (mypyc: {exc!r}); it runs as Python")
        return []


setup(ext_modules=extensions(), cmdclass={"build_ext": CompileOrNot})
