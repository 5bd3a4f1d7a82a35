"""The gRPC adapter's pure helpers, and wire compatibility of our proto with Triton's."""

from __future__ import annotations

import gc

import grpc
import numpy as np
import pytest
from google.protobuf.descriptor import Descriptor
from tritonclient.grpc import model_config_pb2, service_pb2

from oipserve.errors import (
    INTERNAL_MESSAGE,
    InferenceFailed,
    InvalidInput,
    NotFound,
    Unavailable,
    Unsupported,
)
from oipserve.front.grpc.codec import SMALL_MESSAGE, InferReply, model_named, split_infer_request
from oipserve.front.grpc.convert import input_tensors
from oipserve.front.grpc.status import status_of
from oipserve.grpc_generated import grpc_service_pb2 as pb
from oipserve.models.registry import ModelVersion
from oipserve.request.client_regions import ClientRegions
from oipserve.request.inference import InferResult, OutputTensor
from oipserve.request.tensors import Deferred


def _fields(descriptor: Descriptor, prefix: str = "") -> dict[str, dict[str, tuple[int, int]]]:
    out = {prefix + descriptor.name: {f.name: (f.number, f.type) for f in descriptor.fields}}
    for nested in descriptor.nested_types:
        out.update(_fields(nested, prefix + descriptor.name + "."))
    return out


def _all(module: object) -> dict[str, dict[str, tuple[int, int]]]:
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for descriptor in module.DESCRIPTOR.message_types_by_name.values():  # type: ignore[attr-defined]
        out.update(_fields(descriptor))
    return out


def test_every_field_matches_tritons_numbers_and_types() -> None:
    ours = _all(pb)
    theirs = {**_all(service_pb2), **_all(model_config_pb2)}
    for message, fields in ours.items():
        assert message in theirs, message
        for name, wire in fields.items():
            assert theirs[message].get(name) == wire, f"{message}.{name}"
    # Every message of Triton's service file exists here, complete.
    for message, fields in _all(service_pb2).items():
        assert ours.get(message) == fields, message
    ours_rpcs = [m.name for m in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods]
    theirs_rpcs = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods
    assert ours_rpcs == [m.name for m in theirs_rpcs]


def _request(raw: list[bytes]) -> bytes:
    message = service_pb2.ModelInferRequest(model_name="m", model_version="2", id="x")
    message.parameters["p"].int64_param = 5
    for index in range(max(len(raw), 1)):
        message.inputs.add(name=f"I{index}", datatype="FP32", shape=[1, 4])
    message.raw_input_contents.extend(raw)
    message.outputs.add(name="O")
    return message.SerializeToString()


def test_split_keeps_raw_entries_as_views_and_parses_the_rest() -> None:
    raw = [np.arange(4, dtype=np.float32).tobytes(), b"", b"\x01" * (SMALL_MESSAGE + 300)]
    data = _request(raw)
    call = split_infer_request(data)
    assert [bytes(v) for v in call.raw] == raw
    assert all(isinstance(v, memoryview) and v.obj is data for v in call.raw)
    message = call.message
    assert (message.model_name, message.model_version, message.id) == ("m", "2", "x")
    assert message.parameters["p"].int64_param == 5
    assert [i.name for i in message.inputs] == ["I0", "I1", "I2"]
    assert [o.name for o in message.outputs] == ["O"]
    assert not message.raw_input_contents


@pytest.mark.parametrize("extra", [300, SMALL_MESSAGE + 300])
def test_an_unknown_group_field_is_skipped_at_any_size(extra: int) -> None:
    """A group (wire type 3) is valid protobuf, skipped as an unknown field: a message past
    SMALL_MESSAGE was refused 'unsupported wire type 3' by the walk (found by fuzzing)."""
    raw = [b"\x01" * extra]
    group = bytes([(15 << 3) | 3, 8, 1, (15 << 3) | 4])  # field 15: a group holding 1:1
    call = split_infer_request(_request(raw) + group)
    assert [bytes(v) for v in call.raw] == raw
    assert call.message.model_name == "m" and [i.name for i in call.message.inputs] == ["I0"]


def test_a_small_request_is_parsed_whole() -> None:
    raw = [np.arange(4, dtype=np.float32).tobytes(), b"", b"\x01" * 300]
    call = split_infer_request(_request(raw))
    assert [bytes(v) for v in call.raw] == raw
    message = call.message
    assert (message.model_name, message.model_version, message.id) == ("m", "2", "x")
    assert [i.name for i in message.inputs] == ["I0", "I1", "I2"]
    owned: list[object] = []
    tensors = input_tensors(message, call.raw, _NO_REGIONS, owned)
    assert [bytes(t.raw) for t in tensors] == raw


def test_split_without_raw_and_malformed() -> None:
    call = split_infer_request(_request([]))
    assert call.raw == [] and call.message.model_name == "m"
    data = _request([b"\0" * 16])
    with pytest.raises(Exception, match="truncated|Error"):
        split_infer_request(data[:-3])


_NO_REGIONS = ClientRegions(False, "oipserve-test-")


def test_mixing_raw_and_contents_is_refused() -> None:
    message = pb.ModelInferRequest()
    tensor = message.inputs.add(name="a", datatype="INT32", shape=[1])
    tensor.contents.int_contents.append(1)
    with pytest.raises(InvalidInput, match="must not be specified"):
        input_tensors(message, [memoryview(b"\0\0\0\0")], _NO_REGIONS, [])


def test_typed_contents_become_values() -> None:
    message = pb.ModelInferRequest()
    tensor = message.inputs.add(name="a", datatype="BYTES", shape=[2])
    tensor.contents.bytes_contents.extend([b"x", b"yz"])
    tensor = message.inputs.add(name="b", datatype="UINT64", shape=[1])
    tensor.contents.uint64_contents.append(2**64 - 1)
    first, second = input_tensors(message, [], _NO_REGIONS, [])
    # Converted only when the data plane asks, after checking the shapes.
    assert isinstance(first.values, Deferred) and isinstance(second.values, Deferred)
    assert (first.values.most, second.values.most) == (2, 1)
    assert first.values.load() == [b"x", b"yz"] and first.raw is None
    assert second.values.load() == [2**64 - 1]


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (InvalidInput("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (NotFound("x"), grpc.StatusCode.NOT_FOUND),
        (Unavailable("x"), grpc.StatusCode.UNAVAILABLE),
        (Unsupported("x"), grpc.StatusCode.UNIMPLEMENTED),
        (InferenceFailed("x"), grpc.StatusCode.INTERNAL),
        (ValueError("boom"), grpc.StatusCode.INTERNAL),
    ],
)
def test_status_mapping(error: Exception, code: grpc.StatusCode) -> None:
    got, message = status_of(error)
    assert got == code
    # NOTE: an unexpected error's own text stays in the log, never goes to the client.
    assert message == (INTERNAL_MESSAGE if isinstance(error, ValueError) else "x")


def test_infer_reply_serializes_like_protobuf_and_releases_once() -> None:
    released: list[int] = []
    big = np.arange(70_000, dtype=np.float32).tobytes()  # a multi-byte length varint
    outputs = [
        OutputTensor("A", "FP32", [1, 70_000], memoryview(big)),
        OutputTensor("B", "BYTES", [0], memoryview(b"")),
    ]
    model = ModelVersion("m", "3", "", None)
    reply = InferReply(InferResult(model, outputs, lambda: released.append(1)), "id-1")
    expected = service_pb2.ModelInferResponse(model_name="m", model_version="3", id="id-1")
    expected.outputs.add(name="A", datatype="FP32", shape=[1, 70_000])
    expected.outputs.add(name="B", datatype="BYTES", shape=[0])
    expected.raw_output_contents.extend([big, b""])
    assert service_pb2.ModelInferResponse.FromString(reply.serialize()) == expected
    assert released == [1]
    del reply
    gc.collect()
    assert released == [1]


def test_unserialized_infer_reply_is_released_when_collected() -> None:
    released: list[int] = []
    model = ModelVersion("m", "1", "", None)
    reply = InferReply(InferResult(model, [], lambda: released.append(1)), "")
    assert service_pb2.ModelInferResponse.FromString(reply.serialize()).model_name == "m"
    assert released == [1]
    reply = InferReply(InferResult(model, [], lambda: released.append(2)), "")
    del reply
    gc.collect()
    assert released == [1, 2]


def test_model_named_reads_the_names_as_protobuf_does() -> None:
    """What a front reads of a stream's request to know whether it serves its model: its
    top-level fields, the last of a field given twice counting, as in protobuf's parse
    (the first routed the request, and the front answered for the last)."""
    message = pb.ModelInferRequest(model_name="echo", model_version="3", id="x")
    message.raw_input_contents.append(b"\x00" * 64)
    data = message.SerializeToString()
    assert model_named(data) == ("echo", "3")
    assert model_named(memoryview(data)) == ("echo", "3")
    assert model_named(pb.ModelInferRequest(model_name="m").SerializeToString()) == ("m", "")
    # Fields in another order than protobuf writes them: parsed whole.
    reordered = pb.ModelInferRequest(id="x").SerializeToString() + data
    assert model_named(reordered) == ("echo", "3")
    # No model named, or not a message: nothing to forward (refused where it is).
    assert model_named(pb.ModelInferRequest(id="x").SerializeToString()) == ("", "")
    assert model_named(b"\x0a\x7fshort") == ("", "")
    assert model_named(b"") == ("", "")
    # The name (and version) given twice: the last, as protobuf reads them.
    twice = data + pb.ModelInferRequest(model_name="other", model_version="7").SerializeToString()
    assert pb.ModelInferRequest.FromString(twice).model_name == "other"
    assert model_named(twice) == ("other", "7")
    # A group (wire type 3) among the fields: protobuf decides.
    group = b"\x5b\x5c" + data  # field 11, start group and end group
    assert model_named(group) == ("echo", "3")
