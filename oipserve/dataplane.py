"""Health, metadata and inference, independent of any wire protocol.

REST (and gRPC) adapters parse their wire format into ``InputTensor``s and
render ``InferResult``s; everything between (validation against the model's
metadata, placing tensors in shared memory, choosing a worker, waiting for
it) happens here, once, for every protocol.

The inference path, top to bottom (``DataPlane.infer``):
1. resolve the model version (404 unknown, 503 not ready);
2. check every input against the model's metadata (names, datatype, shape,
   element count, batch size) and the requested outputs;
3. put input data into shared memory: JSON values and host buffers are
   copied into one pooled segment; binary payloads already received into a
   segment are referenced where they lie;
4. send a descriptor to the least busy worker and await its reply;
5. return views of the worker's output segment; the caller releases them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from time import monotonic_ns

import numpy as np

import oipserve
from oipserve.errors import InvalidInput
from oipserve.images import image_payload, image_target
from oipserve.models import ModelRegistry, ModelVersion, TensorSpec
from oipserve.pool import WorkerHandle, WorkerPool
from oipserve.stats import StatsRegistry, failure_reason, refusal_reason
from oipserve.tensors import array_from_values, bytes_from_values
from oipserve.wire.datatypes import (
    DATATYPES,
    ELEMENT_SIZES,
    element_count,
    encode_bytes_elements,
    split_bytes_elements,
)
from oipserve.wire.images import ImageSpec
from oipserve.wire.messages import TensorDesc
from oipserve.wire.shm import BufferPool, Lease, SegmentCache, align

log = logging.getLogger("oipserve.dataplane")

SERVER_NAME = "oipserve"


class InputTensor:
    """One request input, as a protocol adapter parsed it.

    Exactly one of ``values`` (JSON / typed values), ``raw`` (bytes in this
    process's memory) and ``located`` (bytes already in a pooled segment:
    lease, offset, size) holds the data.
    """

    __slots__ = ("name", "datatype", "shape", "values", "raw", "located", "image")

    def __init__(
        self,
        name: str,
        datatype: str,
        shape: list[int],
        *,
        values: object = None,
        raw: memoryview | bytes | None = None,
        located: tuple[Lease, int, int] | None = None,
    ) -> None:
        self.name = name
        self.datatype = datatype
        self.shape = shape
        self.values = values
        self.raw = raw
        self.located = located
        #: Set by the data plane when the input is encoded images (see oipserve.images).
        self.image: ImageSpec | None = None


class OutputTensor:
    __slots__ = ("name", "datatype", "shape", "data")

    def __init__(self, name: str, datatype: str, shape: list[int], data: memoryview) -> None:
        self.name = name
        self.datatype = datatype
        self.shape = shape
        #: The tensor's bytes (BYTES: length-prefixed) in the worker's output segment.
        self.data = data

    @property
    def count(self) -> int:
        return element_count(self.shape)


class InferResult:
    """Outputs that live in a worker's shared memory until ``release``."""

    __slots__ = ("model", "outputs", "_release")

    def __init__(
        self, model: ModelVersion, outputs: list[OutputTensor], release: Callable[[], None]
    ) -> None:
        self.model = model
        self.outputs = outputs
        self._release: Callable[[], None] | None = release

    def release(self) -> None:
        """Give the output segment back to the worker; call once nothing reads it."""
        release, self._release = self._release, None
        if release is not None:
            release()


class DataPlane:
    def __init__(self, registry: ModelRegistry, pool: WorkerPool, max_queue: int) -> None:
        self.registry = registry
        self.pool = pool
        self.max_queue = max_queue
        self.inputs = BufferPool(pool.prefix + "in-", on_drop=self._forget_input)
        self.outputs = SegmentCache()
        #: Per model version: what the statistics extension and /metrics report.
        self.stats = StatsRegistry(registry)
        self.shutting_down = False

    def _forget_input(self, name: str) -> None:
        for worker in self.pool.workers:
            worker.forget_inputs([name])

    def worker_gone(self, worker: WorkerHandle) -> None:
        self.outputs.forget_prefix(worker.segment_prefix)

    # ---- health and metadata ------------------------------------------------

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return not self.shutting_down and self.registry.all_ready()

    def server_metadata(self) -> dict[str, object]:
        return {
            "name": SERVER_NAME,
            "version": oipserve.__version__,
            "extensions": [
                "binary_tensor_data",
                "model_configuration",
                "model_repository",
                "statistics",
            ],
        }

    def model_metadata(self, name: str, version: str | None) -> dict[str, object]:
        model = self.registry.resolve(name, version)
        versions = self.registry.models[name]
        return {
            "name": name,
            "versions": [version]
            if version is not None
            else [v for v, m in versions.items() if m.state == "READY"],
            "platform": model.platform,
            "inputs": [_tensor_metadata(t.name, t.datatype, t.shape) for t in model.inputs],
            "outputs": [_tensor_metadata(t.name, t.datatype, t.shape) for t in model.outputs],
        }

    def model_config(self, name: str, version: str | None) -> dict[str, object]:
        """The model's configuration in Triton's JSON form (model_configuration extension)."""
        model = self.registry.resolve(name, version)
        groups = model.config.instance_groups if model.config else ()
        batched = model.max_batch_size > 0

        def tensor(spec: TensorSpec) -> dict[str, object]:
            dims = list(spec.shape[1:] if batched else spec.shape)
            return {"name": spec.name, "data_type": DATATYPES[spec.datatype].triton, "dims": dims}

        return {
            "name": name,
            "platform": "onnxruntime_onnx",
            "backend": "onnxruntime",
            "max_batch_size": model.max_batch_size,
            "input": [tensor(t) for t in model.inputs],
            "output": [tensor(t) for t in model.outputs],
            "instance_group": [
                {"count": g.count, "kind": g.kind, "gpus": list(g.gpus)} for g in groups
            ]
            or [{"count": len(model.workers), "kind": "KIND_CPU"}],
            "parameters": {k: {"string_value": v} for k, v in model.parameters.items()},
        }

    # ---- inference ----------------------------------------------------------

    def resolve(self, name: str, version: str | None) -> ModelVersion:
        return self.registry.resolve(name, version)

    async def infer(
        self,
        model: ModelVersion,
        inputs: list[InputTensor],
        output_names: list[str],
        owned: list[Lease],
    ) -> InferResult:
        """Run one request; ``owned`` leases are released once the worker is done reading.

        Every request is counted once in the version's statistics: a success with the
        worker's phase times, or a failure with its reason (``oipserve.stats``).
        """
        stats = self.stats.of(model)
        start = monotonic_ns()
        if model.echo:
            try:
                result = _echo(model, inputs, output_names, owned)
            except BaseException as exc:
                stats.request_failed(refusal_reason(exc), monotonic_ns() - start)
                raise
            stats.executed(1, 0, 0, 0)  # answered here: no queue, no compute phases
            stats.request_succeeded(1, monotonic_ns() - start, 0, 0, 0, 0)
            return result
        lease: Lease | None = None
        try:
            placements = self._check(model, inputs, output_names)
            descs, lease = self._place(placements)
            worker = model.pick(self.max_queue)
        except BaseException as exc:
            for held in owned:
                held.release()
            if lease is not None:
                lease.release()
            stats.request_failed(refusal_reason(exc), monotonic_ns() - start)
            raise
        if lease is not None:
            owned.append(lease)

        def inputs_free() -> None:
            for held in owned:
                held.release()

        batch = inputs[0].shape[0] if model.max_batch_size > 0 and inputs[0].shape else 1
        # NOTE: pending until the worker answers: the front cannot see when a pipelined
        #   worker starts a request (docs/metrics.md).
        stats.pending += 1
        sent = monotonic_ns()
        try:
            done = await worker.infer(model.key, descs, output_names, inputs_free)
        except BaseException as exc:
            stats.request_failed(failure_reason(exc), monotonic_ns() - start)
            raise
        finally:
            stats.pending -= 1
        for name in done.dropped:
            self.outputs.forget(name)
        segment = self.outputs.get(done.segment)
        outputs = [
            OutputTensor(d.name, d.datatype, d.shape, segment.buf[d.offset : d.offset + d.nbytes])
            for d in done.outputs
        ]
        stats.executed(batch, done.input_ns, done.infer_ns, done.output_ns)
        stats.request_succeeded(
            batch,
            monotonic_ns() - start,
            max(0, done.started_ns - sent),
            done.input_ns,
            done.infer_ns,
            done.output_ns,
        )
        return InferResult(model, outputs, lambda: worker.release_outputs(done.segment))

    def refused(self, model: ModelVersion, exc: BaseException) -> None:
        """Count a request a protocol adapter refused after resolving its model.

        (A malformed body for a known model.) Its time is not measured: the data plane
        never saw it; it counts with 0 ns.
        """
        self.stats.of(model).request_failed(refusal_reason(exc), 0)

    def _check(
        self, model: ModelVersion, inputs: list[InputTensor], output_names: list[str]
    ) -> list[tuple[InputTensor, int, object]]:
        """Validate against the model; returns (input, nbytes, host data or None) each."""
        if not inputs:
            raise InvalidInput("'inputs' must list at least one input")
        seen: set[str] = set()
        placements: list[tuple[InputTensor, int, object]] = []
        for tensor in inputs:
            spec = model.input_map.get(tensor.name)
            if spec is None:
                raise InvalidInput(
                    f"unexpected input '{tensor.name}' for model '{model.name}' "
                    f"(its inputs: {', '.join(model.input_map)})"
                )
            if tensor.name in seen:
                raise InvalidInput(f"input '{tensor.name}' is given more than once")
            seen.add(tensor.name)
            tensor.image = image_target(model, spec, tensor)
            if tensor.image is not None:
                placements.append((tensor, *_image_payload(tensor)))
                continue
            if tensor.datatype != spec.datatype:
                raise InvalidInput(
                    f"input '{tensor.name}' has datatype {tensor.datatype}, but model "
                    f"'{model.name}' expects {spec.datatype}"
                )
            _check_shape(model, tensor, spec.shape)
            placements.append((tensor, *_payload(tensor)))
        if len(seen) != len(model.input_map):
            missing = [n for n in model.input_map if n not in seen]
            raise InvalidInput(
                f"model '{model.name}' needs input(s) {', '.join(repr(m) for m in missing)}, "
                "which the request does not give"
            )
        wanted: set[str] = set()
        for name in output_names:
            if name not in model.output_map:
                raise InvalidInput(
                    f"unexpected requested output '{name}' for model '{model.name}' "
                    f"(its outputs: {', '.join(model.output_map)})"
                )
            if name in wanted:
                raise InvalidInput(f"output '{name}' is requested more than once")
            wanted.add(name)
        return placements

    def _place(
        self, placements: list[tuple[InputTensor, int, object]]
    ) -> tuple[list[TensorDesc], Lease | None]:
        """Descriptors for every input, copying host-side data into one pooled segment."""
        total = 0
        for tensor, nbytes, _ in placements:
            if tensor.located is None:
                total = align(total + nbytes)
        lease = self.inputs.acquire(total) if total else None
        descs = []
        offset = 0
        for tensor, nbytes, data in placements:
            if tensor.located is not None:
                held, start, size = tensor.located
                descs.append(
                    TensorDesc(
                        tensor.name,
                        tensor.datatype,
                        tensor.shape,
                        held.name,
                        start,
                        size,
                        tensor.image,
                    )
                )
                continue
            assert lease is not None
            target = lease.buf
            if isinstance(data, np.ndarray):
                target[offset : offset + nbytes] = data.view(np.uint8).reshape(-1).data
            else:
                target[offset : offset + nbytes] = data  # type: ignore[index]
            descs.append(
                TensorDesc(
                    tensor.name,
                    tensor.datatype,
                    tensor.shape,
                    lease.name,
                    offset,
                    nbytes,
                    tensor.image,
                )
            )
            offset = align(offset + nbytes)
        return descs, lease


def _tensor_metadata(name: str, datatype: str, shape: tuple[int, ...]) -> dict[str, object]:
    return {"name": name, "datatype": datatype, "shape": list(shape)}


def _check_shape(model: ModelVersion, tensor: InputTensor, expected: tuple[int, ...]) -> None:
    shape = tensor.shape
    fits = len(shape) == len(expected)
    if fits:
        for got, want in zip(shape, expected, strict=True):
            if got < 0:
                raise InvalidInput(
                    f"input '{tensor.name}' has a negative dimension in {list(shape)}"
                )
            if want != -1 and got != want:
                fits = False
    if not fits:
        raise InvalidInput(
            f"input '{tensor.name}' has shape {list(shape)}, but model '{model.name}' expects "
            f"{list(expected)} (-1 may be any size)"
        )
    if model.max_batch_size > 0 and shape and shape[0] > model.max_batch_size:
        raise InvalidInput(
            f"input '{tensor.name}' has batch size {shape[0]}, but model '{model.name}' "
            f"takes at most {model.max_batch_size}"
        )


def _payload(tensor: InputTensor) -> tuple[int, object]:
    """Byte size of an input and its host-side data (None when already in shared memory)."""
    count = element_count(tensor.shape)
    datatype = tensor.datatype
    if tensor.values is not None:
        if datatype == "BYTES":
            blob = encode_bytes_elements(bytes_from_values(tensor.name, tensor.values, count))
            return len(blob), blob
        array = array_from_values(tensor.name, datatype, tensor.values, count)
        return array.nbytes, array
    if tensor.located is not None:
        held, start, size = tensor.located
        _check_size(tensor, held.buf[start : start + size], count)
        return size, None
    if tensor.raw is not None:
        raw = memoryview(tensor.raw).cast("B")
        _check_size(tensor, raw, count)
        return len(raw), raw
    raise InvalidInput(f"input '{tensor.name}' carries no data")


def _image_payload(tensor: InputTensor) -> tuple[int, object]:
    """Like _payload for encoded images: JSON strings are base64 (oipserve.images)."""
    if tensor.values is not None:
        blob = image_payload(tensor.name, tensor.values, element_count(tensor.shape))
        return len(blob), blob
    return _payload(tensor)


def _check_size(tensor: InputTensor, data: memoryview, count: int) -> None:
    if tensor.datatype == "BYTES":
        try:
            found = len(split_bytes_elements(data))
        except ValueError as exc:
            raise InvalidInput(f"BYTES data of input '{tensor.name}' is malformed: {exc}") from None
        if found != count:
            raise InvalidInput(
                f"input '{tensor.name}': its shape holds {count} elements but its BYTES data "
                f"has {found}"
            )
        return
    expected = ELEMENT_SIZES[tensor.datatype] * count
    if len(data) != expected:
        raise InvalidInput(
            f"input '{tensor.name}' should have {expected} bytes of data for shape "
            f"{tensor.shape} and datatype {tensor.datatype}, but has {len(data)}"
        )


def _echo(
    model: ModelVersion, inputs: list[InputTensor], output_names: list[str], owned: list[Lease]
) -> InferResult:
    """Every input back as an output (same name, datatype, shape, data).

    The ``echo`` worker kind exists for orchestration tests (load, naming, share,
    unload): it needs no worker process and no ONNX Runtime session, so the
    front answers it by copying the inputs.
    """
    try:
        if not inputs:
            raise InvalidInput("'inputs' must list at least one input")
        by_name: dict[str, OutputTensor] = {}
        for tensor in inputs:
            if tensor.name in by_name:
                raise InvalidInput(f"input '{tensor.name}' is given more than once")
            if any(d < 0 for d in tensor.shape):
                raise InvalidInput(
                    f"input '{tensor.name}' has a negative dimension in {list(tensor.shape)}"
                )
            _, data = _payload(tensor)
            if data is None:
                assert tensor.located is not None
                held, start, size = tensor.located
                blob = bytes(held.buf[start : start + size])
            elif isinstance(data, np.ndarray):
                blob = data.tobytes()
            else:
                blob = bytes(data)  # type: ignore[arg-type]
            by_name[tensor.name] = OutputTensor(
                tensor.name, tensor.datatype, list(tensor.shape), memoryview(blob)
            )
        for name in output_names:
            if name not in by_name:
                raise InvalidInput(
                    f"unexpected requested output '{name}' for echo endpoint '{model.name}' "
                    f"(it returns its inputs: {', '.join(by_name)})"
                )
        names = output_names or list(by_name)
        return InferResult(model, [by_name[n] for n in names], lambda: None)
    finally:
        for held in owned:
            held.release()
