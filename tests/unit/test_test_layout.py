"""The tests' own layout: helpers live in tests/support/, and no test module imports another.

A helper imported from a test module ties the two together: deleting or splitting the one
breaks the other, and pytest collects the importer's tests with the helper's module's
fixtures in reach. So every import of ``tests.*`` names ``tests.support`` (or a module in
it), nested imports included, and relative imports are not used at all.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
SUPPORT = "tests.support"


def _imported(node: ast.AST) -> list[str]:
    """The dotted ``tests.*`` names one import statement brings in (``.`` for a relative
    import, which this layout does not allow)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name.split(".")[0] == "tests"]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        return ["." * node.level + (node.module or "")]
    if node.module == "tests":
        return [f"tests.{alias.name}" for alias in node.names]
    if node.module and node.module.split(".")[0] == "tests":
        return [node.module]
    return []


def _outside_support(name: str) -> bool:
    return name != SUPPORT and not name.startswith(SUPPORT + ".")


def violations(root: Path) -> list[str]:
    """``file:line imports module`` for each import of test code from outside support."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            for name in _imported(node):
                if _outside_support(name):
                    where = path.relative_to(root.parent)
                    found.append(f"{where}:{node.lineno} imports {name}")
    return found


def test_no_test_module_imports_another() -> None:
    assert violations(TESTS) == [], "move the helper into tests/support/ and import it there"


def test_the_check_finds_each_kind_of_import(tmp_path: Path) -> None:
    """The rule itself: each way of reaching a test module is found; support is allowed."""
    root = tmp_path / "tests"
    (root / "e2e").mkdir(parents=True)
    (root / "e2e" / "test_a.py").write_text(
        "from tests.e2e.test_b import helper\n"
        "from tests.e2e import test_b\n"
        "import tests.unit.test_c\n"
        "from tests import server\n"
        "from .test_b import helper\n"
        "def f():\n"
        "    from tests.unit.test_c import other\n"
        "from tests.support.server import ServerProcess\n"
        "from tests import support\n"
        "import tests.support.http\n"
    )
    found = violations(root)
    assert [line.split(" imports ")[1] for line in found] == [
        "tests.e2e.test_b",
        "tests.e2e",
        "tests.unit.test_c",
        "tests.server",
        ".test_b",
        "tests.unit.test_c",
    ], found
