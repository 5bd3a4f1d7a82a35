"""No ``assert`` statement in production code.

``python -O`` drops every ``assert``, so a check written as one is not a check: input a
client, a config, a worker or another front can cause gets an exception carrying its
``ErrorKind`` (``oipserve.errors``), and a state the code relies on gets an explicit
``if`` that raises ``InternalError`` (or, in the worker program, a ``RuntimeError``)
naming what was unexpected.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Every production module: the front, the worker program, the hardware inventory.
SOURCES = sorted(
    path
    for package in ("oipserve", "workers", "hardware")
    for path in (ROOT / package).rglob("*.py")
)


def _asserts(path: Path) -> list[int]:
    """The line of every ``assert`` statement in ``path`` (nested ones included)."""
    tree = ast.parse(path.read_text(), str(path))
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Assert)]


def test_the_production_sources_are_found() -> None:
    assert len(SOURCES) > 50  # a moved package must not make the gate vacuous


def test_no_assert_statement_in_production_code() -> None:
    found = [f"{path.relative_to(ROOT)}:{line}" for path in SOURCES for line in _asserts(path)]
    assert not found, (
        "assert statements in production code (raise an error with its ErrorKind for "
        "input, InternalError for a state the code relies on): " + ", ".join(found)
    )
