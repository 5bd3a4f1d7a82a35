"""One ONNX Runtime session and the conversions at its edges.

Inputs arrive as numpy views of shared memory (no copy); BYTES become the
``str`` object arrays ONNX Runtime wants, BF16 becomes an OrtValue. Outputs
are copied once into the worker's output segment: ONNX Runtime allocates its
own output buffers when shapes are dynamic, so this copy is the one left.
Outputs that go into clients' regions with shapes known before the run
(``output_shapes``) are written there by ONNX Runtime itself (``run_into``).
"""

from __future__ import annotations

import ctypes
from typing import Any, Final, TypeAlias

import numpy as np
import onnxruntime as ort
from mypy_extensions import mypyc_attr
from onnxruntime.capi import onnxruntime_pybind11_state as ort_c
from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

from oipserve.wire.datatypes import (
    BY_ONNX,
    NUMPY_DTYPES,
    bytes_elements_size,
    element_count,
    split_bytes_elements,
    write_bytes_elements,
)
from oipserve.wire.messages import TensorMeta
from oipserve.wire.session_keys import ARENA, GRAPH_LEVEL, PATTERN, SHRINKAGE

_BF16: Final = 16  # ONNX TensorProto.BFLOAT16
#: Where ``run_into`` binds outputs: the host's memory (ONNX Runtime's C++ device).
_CPU: Final = ort.OrtDevice.make("cpu", 0)._get_c_device()
#: What ``ModelSession`` uses of ``ort.InferenceSession`` besides its public methods: the
#: C++ session (``_sess``).
_PRIVATE: Final = ("_sess",)

#: What ONNX Runtime (or our metadata check) raises for a model it cannot load: a
#: broken or missing file, an unsupported graph, bad provider options. Its message is
#: the answer; anything else is unexpected.
LOAD_ERRORS: Final[tuple[type[Exception], ...]] = (
    ort_errors.Fail,
    ort_errors.InvalidArgument,
    ort_errors.NoSuchFile,
    ort_errors.NoModel,
    ort_errors.InvalidProtobuf,
    ort_errors.InvalidGraph,
    ort_errors.NotImplemented,
    ort_errors.RuntimeException,
    ort_errors.EPFail,
    ValueError,
)


class RequestError(Exception):
    """Bad request data found only in the worker (e.g. BYTES that are not UTF-8)."""


def rejects_input(exc: Exception) -> bool:
    """Whether an error ONNX Runtime raised from ``run`` is about the request's values.

    INVALID_ARGUMENT is (an out-of-range Gather index). So is a FAIL that a kernel
    returned while running a node (a Reshape target or a broadcast that this request's
    data makes impossible): the session ran before, and the front already checked
    names, datatypes and shapes, so what the node refused are this request's values.
    So, too, is a Cast node that could not read a string as a number (ONNX Runtime's
    RUNTIME_EXCEPTION naming the C++ parser that threw, ``stoll``, ``stof``...): the
    string is a BYTES element the request sent (``simple_string``'s "abc").
    Anything else, or a node that ran out of memory, is the server's or model's fault.
    """
    if isinstance(exc, ort_errors.InvalidArgument):
        return True
    text = str(exc)
    if isinstance(exc, ort_errors.Fail):
        return "while running" in text and "alloc" not in text and "memory" not in text
    if isinstance(exc, ort_errors.RuntimeException) and "while running Cast node" in text:
        return text.rpartition("Status Message: ")[2].strip() in _STRING_PARSERS
    return False


#: The C++ functions ONNX Runtime's Cast reads strings with; an exception from one is
#: reported as its name alone (``std::invalid_argument("stoll")``).
_STRING_PARSERS: Final = frozenset(
    {"stoi", "stol", "stoll", "stoul", "stoull", "stof", "stod", "stold"}
)


def _dims(shape: list[object] | None) -> list[int]:
    if shape is None:
        return []
    return [d if isinstance(d, int) and d >= 0 else -1 for d in shape]


def _meta(args: list[ort.NodeArg]) -> list[TensorMeta]:
    metas = []
    for arg in args:
        row = BY_ONNX.get(arg.type)
        if row is None:
            raise ValueError(f"tensor '{arg.name}' has type {arg.type}, which OIP cannot carry")
        metas.append(TensorMeta(arg.name, row.name, _dims(arg.shape)))
    return metas


# NOTE: tests stand in for a session with a subclass (a model that fails as they say).
@mypyc_attr(allow_interpreted_subclasses=True)
class ModelSession:
    """A loaded model: its session, metadata, and the run with conversions."""

    def __init__(
        self,
        path: str,
        intra_op_threads: int,
        providers: list[tuple[str, dict[str, str]]],
        session_options: dict[str, str] | None = None,
    ) -> None:
        tuning = session_options or {}
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # NOTE: fatal only: a failing run's error (a client's Reshape or Cast that its
        #   values break) is an exception this worker answers with, and logs with its
        #   traceback when it is the server's (``failures``); at 3 ONNX Runtime printed
        #   it to stderr as well, a line for every such client request.
        options.log_severity_level = 4
        # PERF: spinning threads steal the core the front process needs; on a
        #   small node an idle wait costs less than the spin.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if ARENA in tuning:
            options.enable_cpu_mem_arena = tuning[ARENA] == "1"
        if PATTERN in tuning:
            options.enable_mem_pattern = tuning[PATTERN] == "1"
        if GRAPH_LEVEL in tuning:  # a name the front chose (session_keys.GRAPH_LEVELS)
            options.graph_optimization_level = getattr(
                ort.GraphOptimizationLevel, tuning[GRAPH_LEVEL]
            )
        self.session = ort.InferenceSession(path, sess_options=options, providers=providers)
        _check_private(self.session)
        _no_fallback(self.session)
        #: Run options of every run: only set for arena shrinkage (None is ONNX Runtime's default).
        self.run_options = _shrinkage(tuning.get(SHRINKAGE, ""), self.session.get_providers())
        self.inputs = _meta(self.session.get_inputs())
        #: Inputs with a default value (an initializer), which a request may leave out.
        self.optional_inputs = _meta(self.session.get_overridable_initializers())
        self.outputs = _meta(self.session.get_outputs())
        #: What ``run`` asks for when given no output names: every output.
        self._output_names = [m.name for m in self.outputs]
        #: Inputs a run must be fed (not of an ``optional`` type), as ONNX Runtime's
        #: wrapper checks them (``_run``).
        self._required = [
            a.name for a in self.session.get_inputs() if not a.type.startswith("optional")
        ]
        self.output_types = {m.name: m.datatype for m in self.outputs}
        self.input_types = {m.name: m.datatype for m in self.inputs}
        self.has_bf16 = any(m.datatype == "BF16" for m in self.inputs + self.outputs)
        #: Dims as the graph declares them: an int, a symbolic name (dim_param) or None.
        self._input_dims = {a.name: list(a.shape or []) for a in self.session.get_inputs()}
        self._output_dims = {a.name: list(a.shape or []) for a in self.session.get_outputs()}
        #: False once a run showed that an output's dim names do not hold (the graph
        #: declares an output dim with an input's name but makes another size).
        self.dim_names_hold = True

    def feed(self, name: str, datatype: str, shape: list[int], buf: memoryview) -> object:
        """Build one input from its shared-memory bytes, without copying fixed-width data."""
        if datatype == "BYTES":
            return _decode_strings(name, buf, shape)
        count = element_count(shape)
        # PERF: frombuffer's arguments by position: each keyword given is looked up by a
        #   str made from its C name at every call (two new objects a feed).
        if datatype == "BF16":
            words = np.frombuffer(buf, np.uint16, count).reshape(shape)
            return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(words, _BF16)
        return np.frombuffer(buf, NUMPY_DTYPES[datatype], count).reshape(shape)

    def feed_at(
        self,
        name: str,
        datatype: str,
        shape: list[int],
        segment: memoryview,
        offset: int,
        nbytes: int,
    ) -> object:
        """``feed`` of the ``nbytes`` at ``offset`` of ``segment``.

        PERF: a fixed-width input is one array over the segment, made with its shape: a
        view of its bytes, an array over them and its reshaped view were three objects.
        """
        dtype = NUMPY_DTYPES.get(datatype)
        if (
            dtype is None
            or datatype == "BYTES"
            or datatype == "BF16"
            or offset + nbytes > len(segment)
            or element_count(shape) * dtype.itemsize != nbytes
        ):
            return self.feed(name, datatype, shape, segment[offset : offset + nbytes])
        return np.ndarray(shape, dtype, segment, offset)

    def output_shapes(
        self, output_names: list[str], feeds: dict[str, object]
    ) -> dict[str, list[int]] | None:
        """Each output's shape before the run, where the graph says it.

        A dim is known when the graph fixes it, or when it is a symbolic name
        (``dim_param``) that also names a dim of an input this request gives: it then
        takes that input's size (a name the inputs give two sizes stays unknown). None
        unless every dim of every output is known; a rank-0 output counts as unknown,
        since ONNX Runtime reports an output of unknown rank as ``[]`` too.
        """
        if not self.dim_names_hold:
            return None
        sizes: dict[str, int] = {}
        clashes: set[str] = set()
        for name, value in feeds.items():
            declared = self._input_dims.get(name)
            shape = getattr(value, "shape", None)
            if declared is None or shape is None or len(declared) != len(shape):
                continue
            for dim, size in zip(declared, shape, strict=True):
                if isinstance(dim, str) and sizes.setdefault(dim, int(size)) != size:
                    clashes.add(dim)
        shapes = {}
        for name in output_names:
            declared = self._output_dims.get(name)
            if not declared:
                return None
            shape = []
            for dim in declared:
                if isinstance(dim, int) and dim >= 0:
                    shape.append(dim)
                elif isinstance(dim, str) and dim in sizes and dim not in clashes:
                    shape.append(sizes[dim])
                else:
                    return None
            shapes[name] = shape
        return shapes

    # PERF: ONNX Runtime's ``InferenceSession.run`` is interpreted Python around the C++
    #   session's run: it checks the feed's names against the inputs (``_check_fed``
    #   here, compiled), builds the output names (``_output_names``), checks WebGPU graph
    #   capture (moot: a session gets CPU or CUDA providers only) and that an OrtValue
    #   fed belongs to no other session (ours belong to none: made from numpy arrays),
    #   and on EPFail makes the session again on the CPU (turned off here, see
    #   ``_no_fallback``). Calling the C++ session saves ~3-4 us a run.
    def run(self, output_names: list[str], feeds: dict[str, object]) -> list[object]:
        names = output_names or self._output_names
        self._check_fed(feeds)
        native: Any = self.session._sess
        if self.has_bf16:
            values = {
                k: (
                    v if isinstance(v, ort.OrtValue) else ort.OrtValue.ortvalue_from_numpy(v)
                )._get_c_value()
                for k, v in feeds.items()
            }
            results = native.run_with_ort_values(values, names, self.run_options)
            return [
                ort.OrtValue(r) if r.data_type() == "tensor(bfloat16)" else r.numpy()
                for r in results
            ]
        return native.run(names, feeds, self.run_options)

    def _check_fed(self, feeds: dict[str, object]) -> None:
        """Every required input fed, or ValueError (as ONNX Runtime's wrapper raises: the
        C++ session would answer a FAIL "while running" a node, which ``rejects_input``
        takes for the client's). The front checked a request's names; an ensemble
        chain's step or a sequence's state feeds are the worker's own."""
        for name in self._required:
            if name not in feeds:
                missing = [n for n in self._required if n not in feeds]
                raise ValueError(
                    f"Required inputs ({missing}) are missing from input feed ({list(feeds)})."
                )

    def run_into(
        self, output_names: list[str], feeds: dict[str, object], outputs: dict[str, np.ndarray]
    ) -> None:
        """Run with every output written into the given arrays (ONNX Runtime's I/O binding).

        The arrays lie in clients' shared memory: no copy of the outputs at all. The C++
        binding and run, as ONNX Runtime's ``IOBinding`` and ``run_with_iobinding`` call
        them (its wrapper adds WebGPU graph capture's checks, and no EPFail fallback);
        ``feeds`` keeps the input arrays alive for the run.
        """
        native = self.session._sess
        binding = ort_c.SessionIOBinding(native)
        for name, value in feeds.items():
            binding.bind_input(name, value)
        for name in output_names:
            array = outputs[name]
            binding.bind_output(name, _CPU, array.dtype, list(array.shape), array.ctypes.data)
        native.run_with_iobinding(binding, self.run_options)


def _no_fallback(session: ort.InferenceSession) -> None:
    """A run that fails in its execution provider (EPFail: a CUDA provider on a GPU that
    faults) fails, as in Triton, and the session keeps its providers.

    ONNX Runtime's Python wrapper would instead make the session again on the CPU for
    good, on the first such failure: a GPU instance the server still reports on its GPU
    would run many times slower, as a session whose CUDA provider cannot start at load
    would, which the front refuses (``oipserve.models.placement.gpu_fallback_refusal``).
    The run's EPFail is the server's fault (``failures.run_failure``: internal).
    """
    session.disable_fallback()


def _check_private(session: ort.InferenceSession) -> None:
    """Fail the load, not every run, when this ONNX Runtime lacks what ``run`` uses."""
    missing = [name for name in _PRIVATE if not hasattr(session, name)]
    native = getattr(session, "_sess", None)
    for method in ("run", "run_with_ort_values", "run_with_iobinding"):
        if native is not None and not hasattr(native, method):
            missing.append(f"_sess.{method}")
    if missing:
        raise RuntimeError(
            f"onnxruntime {ort.__version__}: InferenceSession has no {', '.join(missing)}, "
            "which the worker calls instead of its Python wrapper (workers/runtime.py); "
            "install a version that has them (pyproject.toml)"
        )


def _shrinkage(devices: str, providers: list[str]) -> ort.RunOptions | None:
    """Run options that shrink the arenas of ``devices`` ("cpu:0;gpu:0") after each run.

    Only the devices this session has an arena on are kept: ONNX Runtime fails every run
    that names another (a CUDA entry on a session that fell back to the CPU, say).
    """
    on_gpu = "CUDAExecutionProvider" in providers
    kept = [
        d for d in devices.split(";") if d.startswith("cpu:") or (on_gpu and d.startswith("gpu:"))
    ]
    if not kept:
        return None
    run_options = ort.RunOptions()
    run_options.add_run_config_entry(SHRINKAGE, ";".join(kept))
    return run_options


def _decode_strings(name: str, buf: memoryview, shape: list[int]) -> np.ndarray:
    # NOTE: the front checked that the length prefixes tile the data, shape's count of them.
    elements = split_bytes_elements(buf)
    out = np.empty(len(elements), dtype=object)
    for i, element in enumerate(elements):
        try:
            out[i] = str(element, "utf-8")
        except UnicodeDecodeError:
            raise RequestError(
                f"element {i} of BYTES input '{name}' is not valid UTF-8, "
                "which this model's string input requires"
            ) from None
    return out.reshape(shape)


#: One output as ``output_size`` prepares it: an array, BYTES elements, a BF16 OrtValue.
Prepared: TypeAlias = np.ndarray | list[bytes] | ort.OrtValue


def output_size(datatype: str, value: object) -> tuple[list[int], int, Prepared]:
    """Shape, byte size and a writer-ready form of one output value."""
    if isinstance(value, ort.OrtValue):  # BF16
        shape = list(value.shape())
        return shape, element_count(shape) * 2, value
    array = np.asarray(value)
    shape = list(array.shape)
    if datatype == "BYTES":
        encoded = [s.encode("utf-8") if isinstance(s, str) else bytes(s) for s in array.reshape(-1)]
        return shape, bytes_elements_size(encoded), encoded
    return shape, array.nbytes, array


def write_output(target: memoryview, offset: int, nbytes: int, prepared: Prepared | bytes) -> None:
    """Copy one prepared output (or its JSON text, bytes) into shared memory at ``offset``."""
    if isinstance(prepared, bytes):  # printed as JSON text (workers.json_text)
        target[offset : offset + nbytes] = prepared
        return
    if isinstance(prepared, list):  # BYTES elements
        write_bytes_elements(target, offset, prepared)
        return
    if isinstance(prepared, ort.OrtValue):
        dest = np.frombuffer(target, np.uint8, nbytes, offset)
        ctypes.memmove(dest.ctypes.data, prepared.data_ptr(), nbytes)
        return
    array = prepared
    # PERF: arguments by position (see ``ModelSession.feed``); the target array made with
    #   its shape (``ModelSession.feed_at``).
    np.copyto(np.ndarray(array.shape, array.dtype, target, offset), array, "no")
