"""Where a run's outputs go: straight into clients' regions, or into the worker's segment.

``bound_outputs`` decides before the run whether ONNX Runtime can write every output
into the client's shared-memory region itself (I/O binding), ``run_bound`` runs so and
``bound_descs`` describes what it wrote; ``write_outputs`` copies
the outputs after an ordinary run into the worker's output segment (or a region), large
ones the client wants as JSON printed as text (``json_text.print_output``).

An output region that overlaps an input's bytes (one region used for both, in place) is
never bound: ONNX Runtime would write an output over an input that a later node still
reads (``simple``: OUTPUT1 = INPUT0 - INPUT1 read an INPUT1 that OUTPUT0 had already
replaced). Such a request takes the copy path: every output is computed in ONNX
Runtime's own memory first and only then copied over the inputs, as Triton's ONNX
Runtime backend does (docs/shared-memory.md).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from oipserve.wire.datatypes import NUMPY_DTYPES, element_count
from oipserve.wire.messages import TEXT_OUTPUT_MIN, OutputTarget, TensorDesc
from oipserve.wire.shm import BufferPool, layout
from workers import json_text, runtime
from workers.regions import RegionCache, overlaps_an_input

__all__ = ["bound_descs", "bound_outputs", "run_bound", "write_outputs"]

log = logging.getLogger("oipserve.worker")


def bound_outputs(
    regions: RegionCache,
    session: runtime.ModelSession,
    names: list[str],
    feeds: dict[str, object],
    targets: dict[str, OutputTarget],
    inputs: Sequence[TensorDesc] = (),
) -> dict[str, np.ndarray] | None:
    """Arrays over the clients' regions for ONNX Runtime to write the outputs into.

    Only when every output goes into a region with a shape known before the run, of
    a fixed-width datatype, no output's room overlaps one of ``inputs`` in a client's
    object, and every input is a plain numpy array; None otherwise (the outputs are
    then copied once after the run). A shape is known from the
    model's metadata (the front sends it) or from the graph's dim names and this
    request's input shapes (``ModelSession.output_shapes``); a region too small for
    it is refused here, before the run.
    """
    if not targets or session.has_bf16 or any(name not in targets for name in names):
        return None
    if any(not isinstance(v, np.ndarray) or v.dtype == object for v in feeds.values()):
        return None
    if any(session.output_types[name] in ("BYTES", "BF16") for name in names):
        return None
    if overlaps_an_input(inputs, targets.values()):
        return None
    resolved: dict[str, list[int]] = {}
    if any(targets[name].shape is None for name in names):
        found = session.output_shapes(names, feeds)
        if found is None:
            return None
        resolved = found
    bound = {}
    for name in names:
        target = targets[name]
        shape = target.shape if target.shape is not None else resolved[name]
        dtype = NUMPY_DTYPES[session.output_types[name]]
        count = element_count(shape)
        nbytes = count * dtype.itemsize
        if nbytes > target.nbytes:
            raise runtime.RequestError(
                f"output '{name}' needs {nbytes} bytes but its shared memory region gives "
                f"{target.nbytes} (shared_memory_byte_size)"
            )
        view = regions.view(target.region, target.offset, nbytes)
        bound[name] = np.frombuffer(view, dtype=dtype, count=count).reshape(shape)
    return bound


def run_bound(
    session: runtime.ModelSession,
    names: list[str],
    feeds: dict[str, object],
    bound: dict[str, np.ndarray],
    targets: dict[str, OutputTarget],
    key: str,
) -> tuple[dict[str, np.ndarray] | None, list[object] | None]:
    """Run ``session`` writing its outputs into the clients' regions (``bound``):
    ``(bound, None)``; or, when an output's shape came from the graph's dim names and the
    run disagreed with them, run again the ordinary way: ``(None, values)``."""
    try:
        session.run_into(names, feeds, bound)
    except Exception:
        if all(targets[name].shape is not None for name in names):
            raise
        # NOTE: ONNX Runtime holds to the graph's dim names for bound outputs only. If the
        #   ordinary run works, the names were wrong: this model copies from now on.
        values = session.run(names, feeds)
        session.dim_names_hold = False
        log.warning(
            "model '%s': an output's declared dim names do not match what it makes; its "
            "outputs are copied into clients' regions from now on",
            key,
        )
        return None, values
    return bound, None


def bound_descs(
    session: runtime.ModelSession,
    names: list[str],
    bound: dict[str, np.ndarray],
    targets: dict[str, OutputTarget],
) -> list[TensorDesc]:
    """What ``run_bound`` wrote, each output where its client's region holds it."""
    return [
        TensorDesc(
            name,
            session.output_types[name],
            list(bound[name].shape),
            "",
            targets[name].offset,
            bound[name].nbytes,
            None,
            targets[name].region,
        )
        for name in names
    ]


def write_outputs(
    regions: RegionCache,
    pool: BufferPool,
    output_types: dict[str, str],
    names: list[str],
    values: list[object],
    targets: dict[str, OutputTarget],
    text_outputs: list[str],
) -> tuple[str, list[TensorDesc]]:
    """Copy the outputs into the worker's own segment, or into the clients' regions.

    ``output_types``: each output's datatype (a session's, or an ensemble chain's by
    their ensemble names). A large output in ``text_outputs`` goes into the segment as
    its JSON text.
    """
    # PERF: no zip (its strict= keyword alone is a new str a call), no set of the printed.
    if len(names) != len(values):
        raise RuntimeError(f"{len(values)} output values for {len(names)} names")
    prepared = []
    sizes = []
    for i, name in enumerate(names):
        shape, nbytes, ready = runtime.output_size(output_types[name], values[i])
        target = targets.get(name)
        printed = False
        if nbytes >= TEXT_OUTPUT_MIN and name in text_outputs and target is None:
            text = json_text.print_output(output_types[name], ready, nbytes)
            if text is not None:
                ready, nbytes = text, len(text)
                printed = True
        if target is not None and nbytes > target.nbytes:
            raise runtime.RequestError(
                f"output '{name}' needs {nbytes} bytes but its shared memory region gives "
                f"{target.nbytes} (shared_memory_byte_size); the model ran"
            )
        prepared.append((name, shape, nbytes, ready, target, printed))
        if target is None:
            sizes.append(nbytes)
    descs = []
    for name, shape, nbytes, ready, target, _ in prepared:
        if target is not None:
            view = regions.view(target.region, target.offset, nbytes)
            runtime.write_output(view, 0, nbytes, ready)
            del view
            datatype = output_types[name]
            descs.append(
                TensorDesc(name, datatype, shape, "", target.offset, nbytes, None, target.region)
            )
    if not sizes:
        return "", descs
    offsets, total = layout(sizes)
    lease = pool.acquire(total)
    spots = iter(offsets)
    for name, shape, nbytes, ready, target, printed in prepared:
        if target is None:
            offset = next(spots)
            runtime.write_output(lease.buf, offset, nbytes, ready)
            descs.append(
                TensorDesc(
                    name,
                    output_types[name],
                    shape,
                    lease.name,
                    offset,
                    nbytes,
                    text=printed,
                )
            )
    if targets:  # (the regions' descs came first)
        order = {name: i for i, name in enumerate(names)}
        descs.sort(key=lambda d: order[d.name])
    return lease.name, descs
