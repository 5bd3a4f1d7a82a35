"""Triton's ONNX Runtime backend parameters that tune a session's memory, read from config.pbtxt.

Triton's onnxruntime backend takes these as ``parameters { key: ... value: { string_value:
... } }``; so does oipserve, with the same names and values:

* ``enable_mem_arena`` ("1"/"0"): ONNX Runtime's CPU memory arena. On by default (ONNX
  Runtime's default, and Triton's): fast, but what one large request grew it to stays in the
  worker for good. "0" allocates from malloc, which returns large blocks to the OS.
* ``enable_mem_pattern`` ("1"/"0"): ONNX Runtime's memory pattern planning.

  Both read true/false/on/off in any case as well, as Triton's backends do
  (``ParseBoolValue``); the worker is given "1" or "0".
* ``memory.enable_memory_arena_shrinkage`` (e.g. "cpu:0", "cpu:0;gpu:0"): a run option that
  asks ONNX Runtime to shrink the arenas listed after every run. Entries for a device the
  session does not run on are dropped in the worker (ONNX Runtime would fail every run on
  them). On the CPU it measured no effect (docs/model-config.md): bound a worker's heap
  with ``enable_mem_arena`` "0" instead.

And ``optimization { graph { level: N } }``, which Triton's backend maps to ONNX Runtime's
graph optimization level (``GRAPH_LEVELS``: -1 basic, 1 extended, 2 none, any other all);
the worker is given the level's name (``graph_optimization_level``).

The front only checks and forwards them (it never loads ONNX Runtime); the worker applies them.
Both sides spell the keys and the levels' names from one table, ``oipserve/wire/session_keys.py``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from oipserve.errors import InvalidInput
from oipserve.wire.session_keys import (
    ARENA,
    DEFAULT_GRAPH_LEVEL,
    GRAPH_LEVEL,
    GRAPH_LEVELS,
    PATTERN,
    SHRINKAGE,
)

_SHRINK_ENTRY = re.compile(r"(cpu|gpu):\d+")

#: Triton's backends' spellings of a boolean parameter (``ParseBoolValue``), as "1"/"0".
_BOOLS = {"1": "1", "true": "1", "on": "1", "0": "0", "false": "0", "off": "0"}


def session_options(
    model: str, parameters: Mapping[str, str], graph_level: int = 0
) -> dict[str, str]:
    """The session parameters among a model's ``parameters``, checked, and the graph
    optimization level ``optimization.graph.level`` gives (``GRAPH_LEVELS``, when given);
    InvalidInput if bad."""
    chosen: dict[str, str] = {}
    if graph_level:
        chosen[GRAPH_LEVEL] = GRAPH_LEVELS.get(graph_level, DEFAULT_GRAPH_LEVEL)
    for name in (ARENA, PATTERN):
        value = parameters.get(name)
        if value is None:
            continue
        flag = _BOOLS.get(value.strip().lower())
        if flag is None:
            raise InvalidInput(
                f"model '{model}': parameter '{name}' must be \"1\" or \"0\" (or true, false,"
                f" on, off, in any case, as Triton reads it), not {value!r}"
            )
        chosen[name] = flag
    shrink = parameters.get(SHRINKAGE)
    if shrink is not None:
        entries = [e for e in shrink.split(";") if e]
        if not entries or not all(_SHRINK_ENTRY.fullmatch(e) for e in entries):
            raise InvalidInput(
                f"model '{model}': parameter '{SHRINKAGE}' must list devices as"
                f' "cpu:0" or "cpu:0;gpu:0", not {shrink!r}'
            )
        if chosen.get(ARENA) == "0" and any(e.startswith("cpu:") for e in entries):
            raise InvalidInput(
                f"model '{model}': parameter '{SHRINKAGE}' names the CPU arena, which"
                f" '{ARENA}' = \"0\" turns off"
            )
        chosen[SHRINKAGE] = ";".join(entries)
    return chosen
