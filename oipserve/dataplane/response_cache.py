"""The response cache: Triton's ``response_cache { enable: true }`` per model, sized by
``--cache-config local,size=BYTES`` (docs/cache.md).

A version whose config enables it, on a server started with a cache, looks each request up
once its inputs are checked (``strategies``), before any input is placed or any worker
picked. A hit answers from here: no shared memory, no worker, no execution counted.
A miss runs as usual and its answer is stored, copied out of the worker's output segment
(which goes back to the worker as for any request): what is stored is the outputs a worker
gives the front (name, datatype, shape, bytes), so every front encodes a hit exactly as it
encodes a worker's answer (REST JSON or binary, gRPC).

The key (``_key``): the version (its ``serial``: a reload starts afresh), the requested
outputs, those the client gets as JSON (``binary_data: false``, which decides what a worker
returns) and the classification asked for, then each input's name, datatype, shape and
bytes, as the model gets them (JSON values converted: a JSON request and a binary one with
the same values share the key's input part). Inputs of up to ``WHOLE`` bytes enter the key
whole; a larger one enters it as ``SAMPLES`` slices spread over it, and the entry keeps its
whole bytes, compared (memcmp) on every hit. Why not a digest of the bytes: hashing costs
1.4 ms a MiB with blake2b on the benchmark machine (xxhash is not a dependency), comparing
24 µs; and a full key never answers one request with another's outputs.

Never cached: inputs or outputs in clients' shared-memory regions, failed requests, echo
models (answered in the front anyway), sequence requests (a sequence model with the cache
fails its load, in Triton's words: an answer depends on the sequence's earlier requests).
An ensemble's own ``response_cache`` is not used (``DataPlane._choose`` gives ensembles
no cache); each of its steps is a request of its composing model, looked up here when that
model enables the cache. Decoupled models are refused at load.

Bounded by bytes (the key's and the entry's tensor bytes, plus ``ENTRY_OVERHEAD`` an
entry and ``TENSOR_OVERHEAD`` a tensor: what Python's objects take besides), least recently
used first out. A request whose inputs take more than ``ADMIT_AT`` bytes is stored at its
second miss among the last ``SEEN`` such misses: storing it copies its inputs at the lookup
(their segments go back to the pool before the answer comes) and its outputs after, so a
one-off 1 MiB request would cost two 1 MiB copies and push useful entries out (measured:
benchmarks/results/2026-11-28-response-cache.md).

One cache per front process: with ``--http-workers N`` each front has its own.
"""

from __future__ import annotations

from collections import OrderedDict
from time import monotonic_ns
from typing import TYPE_CHECKING, Any

import numpy as np

from oipserve.request.inference import InferResult, OutputTensor
from oipserve.request.tensors import Deferred
from oipserve.runtime.off_loop import nothing_to_release

if TYPE_CHECKING:
    from oipserve.request.inference import Inference, InputTensor
    from oipserve.request.placement import Payload, Placement
    from oipserve.telemetry.stats import ModelStats

__all__ = [
    "ADMIT_AT",
    "ENTRY_OVERHEAD",
    "TENSOR_OVERHEAD",
    "Entry",
    "Probe",
    "ResponseCache",
    "answer",
]

#: Inputs of up to this many bytes enter the key whole.
WHOLE = 4096
#: A larger input enters the key as this many slices of ``SLICE`` bytes, spread over it.
SAMPLES = 32
SLICE = 64
#: Bytes an entry is counted for besides its tensors' bytes: the Python objects that hold
#: them, measured with tracemalloc (an entry of ``simple``, 2 inputs and 2 outputs of 64
#: bytes, its names fresh strings and its share of the dict's table included, takes 1,109
#: bytes, 1,453 before ``Entry`` was flat: counted 256 + 4 x 192 + 256 = 1,280).
ENTRY_OVERHEAD = 256
#: And for each of its inputs and outputs.
TENSOR_OVERHEAD = 192
#: A request whose inputs' key and whole bytes pass this is stored at its second miss only.
ADMIT_AT = 64 * 1024
#: Large misses remembered for that (their keys' hashes).
SEEN = 4096


#: A stored answer, one flat tuple: ``serial, whole, size`` (the version's serial, copies of
#: the key's sampled inputs, the bytes the entry counts for), then per output ``name,
#: datatype, text, data, ndim`` and its ``ndim`` dimensions (``data``: its bytes, copied out
#: of the worker's segment). PERF: a miss while the cache filled cost 7 µs, 3 of them in the
#: collector: a tuple is a container it tracks until a collection finds it holds none, and an
#: entry and its key were 9 tuples (one per output and per shape); flat, they are 2. A class
#: per entry would stay tracked for good (full collections walk each); bytes are not tracked
#: (one allocation for all outputs' bytes measured no cheaper, and a hit then slices it).
Entry = tuple[Any, ...]
#: Where an entry's outputs start.
_OUTPUTS = 3


def answer(entry: Entry, inference: Inference) -> InferResult:
    """A hit's result, as a worker's would be (fresh tensors: fronts set attributes on them)."""
    outputs = []
    i, stop = _OUTPUTS, len(entry)
    while i < stop:
        j = i + 5 + entry[i + 4]
        outputs.append(
            OutputTensor(
                entry[i],
                entry[i + 1],
                list(entry[i + 5 : j]),
                memoryview(entry[i + 3]),
                entry[i + 2],
            )
        )
        i = j
    return InferResult(inference.model, outputs, nothing_to_release)


class Probe:
    """A lookup: its hit (``entry``), or what its answer is stored under once it succeeds.

    ``whole`` holds copies of the inputs that entered the key sampled, made at the lookup
    (the segments they lie in go back to the pool once the worker read them, before the
    answer is stored); None when the answer is not to be stored (``ADMIT_AT``).
    ``lookup_ns``: the lookup's time, counted in the miss's once the answer came.
    """

    __slots__ = ("entry", "key", "key_bytes", "whole", "serial", "lookup_ns")

    def __init__(
        self,
        entry: Entry | None,
        key: tuple[object, ...],
        key_bytes: int,
        whole: tuple[bytes, ...] | None,
        serial: int,
        lookup_ns: int = 0,
    ) -> None:
        self.entry = entry
        self.key = key
        self.key_bytes = key_bytes
        self.whole = whole
        self.serial = serial
        self.lookup_ns = lookup_ns


class ResponseCache:
    """Answers by key, at most ``capacity`` bytes of them, least recently used out first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        #: Bytes the entries count for (each entry's last item).
        self.used = 0
        self._entries: OrderedDict[tuple[object, ...], Entry] = OrderedDict()
        #: Hashes of the keys of recent large misses (``ADMIT_AT``).
        self._seen: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(
        self, inference: Inference, placements: list[Placement], stats: ModelStats
    ) -> Probe | None:
        """The request's ``Probe`` (``entry`` set on a hit, counted in ``stats``); None
        when it is not cacheable (it uses clients' regions). A miss counts once its
        answer came (``store``), as Triton's: a request that then fails is no miss, and
        the hits and misses of a model add up to its successes."""
        began = monotonic_ns()
        if inference.into_regions:
            return None
        found = _key(inference, placements)
        if found is None:
            return None
        key, key_bytes, views = found
        serial = inference.model.serial
        entry = self._entries.get(key)
        if entry is not None and _same(entry[1], views):
            self._entries.move_to_end(key)
            stats.cache_hit_count += 1
            stats.cache_hit_ns += monotonic_ns() - began
            return Probe(entry, key, key_bytes, None, serial)
        whole: tuple[bytes, ...] | None = ()
        if views:
            large = key_bytes + sum(len(view) for view in views) > ADMIT_AT
            whole = tuple(bytes(v) for v in views) if not large or self._seen_before(key) else None
        return Probe(None, key, key_bytes, whole, serial, monotonic_ns() - began)

    def store(self, probe: Probe, result: InferResult, stats: ModelStats) -> None:
        """Keep a successful answer: a miss, its time the lookup's and the insertion's."""
        began = monotonic_ns()
        if probe.whole is not None:
            self._insert(probe, probe.whole, result)
        stats.cache_miss_count += 1
        stats.cache_miss_ns += probe.lookup_ns + monotonic_ns() - began

    def _insert(self, probe: Probe, whole: tuple[bytes, ...], result: InferResult) -> None:
        # PERF: plain loops: a generator expression costs more than the work here.
        size = ENTRY_OVERHEAD + probe.key_bytes
        for data in whole:
            size += len(data)
        entry: list[object] = [probe.serial, whole, 0]
        for t in result.outputs:
            if t.region is not None:
                return
            size += len(t.data) + TENSOR_OVERHEAD
        if size > self.capacity:
            return
        entry[2] = size
        for t in result.outputs:
            shape = t.shape
            entry += (t.name, t.datatype, t.text, bytes(t.data), len(shape))
            entry += shape
        entries = self._entries
        old = entries.pop(probe.key, None)
        if old is not None:
            self.used -= old[2]
        while entries and self.used + size > self.capacity:
            self.used -= entries.popitem(last=False)[1][2]
        entries[probe.key] = tuple(entry)
        self.used += size

    def _seen_before(self, key: tuple[object, ...]) -> bool:
        """Whether a large request's key missed recently; remembered now if not."""
        mark = hash(key)
        if mark in self._seen:
            del self._seen[mark]
            return True
        self._seen[mark] = None
        if len(self._seen) > SEEN:
            self._seen.popitem(last=False)
        return False

    def forget(self, serials: set[int]) -> None:
        """Drop the entries of versions no longer served (unloaded, reloaded)."""
        gone = [key for key, entry in self._entries.items() if entry[0] in serials]
        for key in gone:
            self.used -= self._entries.pop(key)[2]


def _same(whole: tuple[bytes, ...], views: list[memoryview]) -> bool:
    """Whether the sampled inputs are the stored ones, byte for byte (memcmp; their
    lengths are in the key)."""
    return all(mine.startswith(theirs) for mine, theirs in zip(whole, views, strict=True))


def _key(
    inference: Inference, placements: list[Placement]
) -> tuple[tuple[object, ...], int, list[memoryview]] | None:
    """(key, its bytes, the inputs that entered it sampled); None if not cacheable.

    One flat tuple (PERF: see ``Entry``), each list in it after its length, so two keys are
    equal only when every part is: the version's serial, the requested outputs, those asked
    as JSON text, the classes asked for, then each input's name, datatype, kind, byte count,
    bytes (whole or sampled), rank and dimensions."""
    names = inference.output_names
    parts: list[object] = [inference.model.serial, len(names), *names]
    if inference.text_outputs or inference.classification:
        _asked(parts, inference)
    else:
        parts += _NOTHING_ASKED
    whole: list[memoryview] = []
    size = 0
    for tensor, _, _, data in placements:
        # PERF: inputs in a segment (REST binary, large gRPC) or in the body (gRPC) inline.
        located = tensor.located
        if data is None and located is not None:
            kind, view = "b", located[0].buf[located[1] : located[1] + located[2]]
        elif type(data) is memoryview and data.format == "B" and data.ndim == 1:
            kind, view = "b", data
        else:
            found = _bytes_of(tensor, data)
            if found is None:
                return None
            kind, view = found
        nbytes = len(view)
        if nbytes <= WHOLE:
            sample = bytes(view)
        else:
            sample = _sample(view)
            whole.append(view)
        size += len(sample) + TENSOR_OVERHEAD
        shape = tensor.shape
        parts += (tensor.name, tensor.datatype, kind, nbytes, sample, len(shape))
        parts += shape
    return tuple(parts), size, whole


#: No outputs asked as JSON text, no classes.
_NOTHING_ASKED = (0, 0)


def _asked(parts: list[object], inference: Inference) -> None:
    """The key's outputs asked as JSON text and classes asked for, each after its length."""
    text = inference.text_outputs or ()
    classes = sorted(inference.classification.items()) if inference.classification else []
    parts.append(len(text))
    parts += text
    parts.append(len(classes))
    for item in classes:
        parts += item


def _bytes_of(tensor: InputTensor, data: Payload) -> tuple[str, memoryview] | None:
    """An input's bytes, tagged: "b" as the model gets them, "j" JSON text a worker
    decodes (json_offload); None for a client's region (never cached)."""
    if tensor.region is not None:
        return None
    if data is None:
        if tensor.located is None:
            return None
        held, start, size = tensor.located
        return "b", held.buf[start : start + size]
    if isinstance(data, Deferred):
        if data.text is None:
            return None
        held, start, size = data.text
        return "j", held.buf[start : start + size]
    if isinstance(data, np.ndarray):
        return "b", np.ascontiguousarray(data).reshape(-1).view(np.uint8).data
    view = memoryview(data)
    return "b", view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _sample(view: memoryview) -> bytes:
    """``SAMPLES`` slices of ``SLICE`` bytes spread over a large input, its last bytes too."""
    step = (len(view) - SLICE) // (SAMPLES - 1)
    slices = [view[i * step : i * step + SLICE] for i in range(SAMPLES)]
    slices.append(view[-SLICE:])
    return b"".join(slices)
