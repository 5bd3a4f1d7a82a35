"""Worker processes: ONNX Runtime sessions fed through shared memory.

Some of these modules are compiled with the front's (pyproject.toml's ``[tool.oipserve]
compiled``), and a compiled module calls the others of its build directly: importing
``oipserve.wire`` here, before any of them, runs ``oipserve``'s check of the build first
(``oipserve.how_compiled``), so that a worker runs them all compiled or all from their
sources, as the front does.
"""

import oipserve.wire  # noqa: F401
