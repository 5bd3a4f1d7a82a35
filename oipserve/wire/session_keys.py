"""The keys of a model's ONNX Runtime session options, as the front sends them to a worker.

``LoadModel.session_options`` carries, by these names, what the front read from a model's
config.pbtxt (``oipserve/models/config/session_options.py`` checks it); the worker applies
them to its session and its runs (``workers/runtime.py``). One table, so the two sides
spell each key once.
"""

from __future__ import annotations

from typing import Final

#: ``enable_mem_arena``, "1" or "0": ONNX Runtime's CPU memory arena (Triton's name).
ARENA: Final = "enable_mem_arena"
#: ``enable_mem_pattern``, "1" or "0": ONNX Runtime's memory pattern planning (Triton's name).
PATTERN: Final = "enable_mem_pattern"
#: The arenas to shrink after every run ("cpu:0;gpu:0"): ONNX Runtime's run option key,
#: which Triton's parameter of the same name is.
SHRINKAGE: Final = "memory.enable_memory_arena_shrinkage"
#: The graph optimization level: one of the names of ``GRAPH_LEVELS`` or
#: ``DEFAULT_GRAPH_LEVEL``, members of ONNX Runtime's ``GraphOptimizationLevel``.
GRAPH_LEVEL: Final = "graph_optimization_level"

#: Triton's ONNX Runtime backend's reading of ``optimization.graph.level``; any other
#: value (0, not given, included) is ONNX Runtime's default, ``ORT_ENABLE_ALL``.
GRAPH_LEVELS: Final = {-1: "ORT_ENABLE_BASIC", 1: "ORT_ENABLE_EXTENDED", 2: "ORT_DISABLE_ALL"}
DEFAULT_GRAPH_LEVEL: Final = "ORT_ENABLE_ALL"
