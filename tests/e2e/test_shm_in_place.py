"""One shared-memory region for a request's inputs and outputs (issue #35, row 9).

``simple`` computes OUTPUT0 = INPUT0 + INPUT1 and OUTPUT1 = INPUT0 - INPUT1. With the
outputs placed over the inputs, ONNX Runtime used to write the first output over an
input the second node still read: 200 with wrong numbers. Now every output is computed
before any is written over an input (docs/shared-memory.md, "in place"), whatever the
overlap (whole, crossed, partial, through a second registration name), while ranges
that only touch are served as before; two outputs over each other are a 400. Over REST
and gRPC, with tritonclient's shared-memory helpers.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import NamedTuple

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.support.server import ServerProcess

IN0 = np.arange(16, dtype=np.int32).reshape(1, 16)
IN1 = np.arange(100, 116, dtype=np.int32).reshape(1, 16)
#: The one object every test of the module uses; its registrations are per test.
SIZE = 256


@pytest.fixture
def shared() -> Iterator[tuple[str, object]]:
    """The object (key, handle), INPUT0 at byte 0 and INPUT1 at byte 64."""
    key = f"/oipserve-inplace-{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region("inplace", key, SIZE)
    shm.set_shared_memory_region(handle, [IN0, IN1])
    yield key, handle
    shm.destroy_shared_memory_region(handle)


@pytest.fixture(params=["http", "grpc"])
def client(request: pytest.FixtureRequest, shm_server: ServerProcess) -> Iterator[object]:
    if request.param == "http":
        made: object = httpclient.InferenceServerClient(shm_server.host_port)
    else:
        made = grpcclient.InferenceServerClient(shm_server.grpc_url)
    yield made
    made.unregister_system_shared_memory()  # type: ignore[attr-defined]
    made.close()  # type: ignore[attr-defined]


class Place(NamedTuple):
    """A tensor in a region: the region's name and the offset in it."""

    region: str
    offset: int


def _infer(client: object, inputs: tuple[Place, Place], outputs: tuple[Place, Place]) -> None:
    """``simple`` with both inputs and both outputs in regions (64 bytes each)."""
    lib = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    tensors = []
    for name, place in zip(("INPUT0", "INPUT1"), inputs, strict=True):
        tensor = lib.InferInput(name, [1, 16], "INT32")
        tensor.set_shared_memory(place.region, 64, offset=place.offset)
        tensors.append(tensor)
    wanted = []
    for name, place in zip(("OUTPUT0", "OUTPUT1"), outputs, strict=True):
        output = lib.InferRequestedOutput(name)
        output.set_shared_memory(place.region, 64, offset=place.offset)
        wanted.append(output)
    client.infer("simple", tensors, outputs=wanted)  # type: ignore[attr-defined]


def _read(handle: object, offset: int) -> np.ndarray:
    return shm.get_contents_as_numpy(handle, np.int32, [1, 16], offset=offset)


def _check(handle: object, out0: int, out1: int) -> None:
    """The outputs' bytes (offsets in the object) are the right numbers."""
    np.testing.assert_array_equal(_read(handle, out0), IN0 + IN1)
    np.testing.assert_array_equal(_read(handle, out1), IN0 - IN1)


def test_outputs_written_over_their_inputs(client: object, shared: tuple[str, object]) -> None:
    key, handle = shared
    client.register_system_shared_memory("both", key, 128)  # type: ignore[attr-defined]
    inputs = (Place("both", 0), Place("both", 64))
    _infer(client, inputs, (Place("both", 0), Place("both", 64)))
    _check(handle, 0, 64)  # was OUTPUT1 == INPUT0: INPUT1 replaced by OUTPUT0 first


def test_outputs_written_over_each_others_inputs(
    client: object, shared: tuple[str, object]
) -> None:
    key, handle = shared
    client.register_system_shared_memory("both", key, 128)  # type: ignore[attr-defined]
    _infer(client, (Place("both", 0), Place("both", 64)), (Place("both", 64), Place("both", 0)))
    _check(handle, 64, 0)


def test_an_output_overlapping_two_inputs_in_part(
    client: object, shared: tuple[str, object]
) -> None:
    """OUTPUT0 on the second half of INPUT0 and the first half of INPUT1."""
    key, handle = shared
    client.register_system_shared_memory("all", key, 192)  # type: ignore[attr-defined]
    _infer(client, (Place("all", 0), Place("all", 64)), (Place("all", 32), Place("all", 128)))
    _check(handle, 32, 128)


def test_one_object_under_two_names(client: object, shared: tuple[str, object]) -> None:
    """The inputs under one name, the outputs under others over the same bytes: the
    overlap is found by the object's identity, not by region name."""
    key, handle = shared
    register = client.register_system_shared_memory  # type: ignore[attr-defined]
    register("inputs", key, 128)
    register("outputs", key, 128)
    register("tail", key, 64, offset=64)  # INPUT1's bytes, at offset 0 of this name
    _infer(
        client, (Place("inputs", 0), Place("inputs", 64)), (Place("outputs", 0), Place("tail", 0))
    )
    _check(handle, 0, 64)


def test_adjacent_ranges_of_one_region_are_served(
    client: object, shared: tuple[str, object]
) -> None:
    """Outputs right after the inputs, touching but not overlapping them."""
    key, handle = shared
    client.register_system_shared_memory("all", key, SIZE)  # type: ignore[attr-defined]
    _infer(client, (Place("all", 0), Place("all", 64)), (Place("all", 128), Place("all", 192)))
    _check(handle, 128, 192)
    np.testing.assert_array_equal(_read(handle, 0), IN0)  # the inputs are untouched
    np.testing.assert_array_equal(_read(handle, 64), IN1)


def test_two_outputs_over_each_other_are_refused(
    client: object, shared: tuple[str, object]
) -> None:
    key, handle = shared
    register = client.register_system_shared_memory  # type: ignore[attr-defined]
    register("all", key, SIZE)
    register("late", key, 128, offset=128)
    inputs = (Place("all", 0), Place("all", 64))
    for outputs in (
        (Place("all", 128), Place("all", 160)),  # in part, one name
        (Place("all", 128), Place("late", 0)),  # the same bytes, two names
    ):
        with pytest.raises(InferenceServerException) as refused:
            _infer(client, inputs, outputs)
        if isinstance(client, httpclient.InferenceServerClient):
            assert refused.value.status() == "400", refused.value
        else:
            assert refused.value.status() == str(grpc.StatusCode.INVALID_ARGUMENT)
        assert "overlap" in refused.value.message(), refused.value.message()
        assert "OUTPUT0" in refused.value.message() and "OUTPUT1" in refused.value.message()
    np.testing.assert_array_equal(_read(handle, 0), IN0)  # nothing ran
    np.testing.assert_array_equal(_read(handle, 64), IN1)


def test_in_place_with_dynamic_batching(client: object, shared: tuple[str, object]) -> None:
    """``batched`` (OUTPUT0 = INPUT0 + 1) with OUTPUT0 over INPUT0: the front reads the
    input when the request arrives and writes the output after the batch."""
    key, handle = shared
    lib = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    rows = np.array([[0.5, 1.5, 2.5, 3.5]], dtype=np.float32)
    shm.set_shared_memory_region(handle, [rows])
    client.register_system_shared_memory("row", key, 16)  # type: ignore[attr-defined]
    tensor = lib.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_shared_memory("row", 16)
    text = lib.InferInput("TEXT", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"t"]], dtype=np.object_))
    output = lib.InferRequestedOutput("OUTPUT0")
    output.set_shared_memory("row", 16)
    client.infer("batched", [tensor, text], outputs=[output])  # type: ignore[attr-defined]
    got = shm.get_contents_as_numpy(handle, np.float32, [1, 4])
    np.testing.assert_array_equal(got, rows + 1)
