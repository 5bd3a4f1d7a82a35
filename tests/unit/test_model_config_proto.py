"""Our compiled model_config.proto is Triton's schema, field for field.

tritonclient ships the descriptor Triton compiles; ours is a reconstruction of it
(proto/model_config.proto). Any drift (a renamed field, a changed number or type, a
missing enum value) would make config.pbtxt files parse differently from Triton, or
ModelConfigResponse differ on the wire.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import Descriptor, EnumDescriptor
from tritonclient.grpc import model_config_pb2 as triton

from oipserve.grpc_generated import POOL, grpc_service_pb2, model_config_pb2

Row = tuple[object, ...]


def _enum_rows(enum: EnumDescriptor) -> dict[str, Row]:
    return {f"{enum.full_name}={v.name}": (v.number,) for v in enum.values}


def _message_rows(message: Descriptor) -> dict[str, Row]:
    rows: dict[str, Row] = {}
    for field in message.fields:
        rows[field.full_name] = (
            field.number,
            field.type,
            field.is_repeated,
            field.message_type.full_name if field.message_type else None,
            field.enum_type.full_name if field.enum_type else None,
            field.containing_oneof.name if field.containing_oneof else None,
        )
    for enum in message.enum_types:
        rows.update(_enum_rows(enum))
    for nested in message.nested_types:
        rows.update(_message_rows(nested))
    return rows


def _file_rows(module: object) -> dict[str, Row]:
    file = module.DESCRIPTOR  # type: ignore[attr-defined]
    rows: dict[str, Row] = {}
    for enum in file.enum_types_by_name.values():
        rows.update(_enum_rows(enum))
    for message in file.message_types_by_name.values():
        rows.update(_message_rows(message))
    return rows


def test_every_field_and_enum_value_matches_triton() -> None:
    ours, theirs = _file_rows(model_config_pb2), _file_rows(triton)
    assert len(theirs) > 200  # the walk really saw Triton's schema
    for name, row in theirs.items():
        assert ours.get(name) == row, name
    assert set(ours) == set(theirs)


def test_file_descriptor_is_identical() -> None:
    ours, theirs = descriptor_pb2.FileDescriptorProto(), descriptor_pb2.FileDescriptorProto()
    model_config_pb2.DESCRIPTOR.CopyToProto(ours)
    triton.DESCRIPTOR.CopyToProto(theirs)
    assert ours == theirs


def test_generated_code_lives_in_the_private_pool() -> None:
    assert model_config_pb2.DESCRIPTOR.pool is POOL
    assert grpc_service_pb2.DESCRIPTOR.pool is POOL
    # The service's ModelConfigResponse carries Triton's full ModelConfig.
    config_field = grpc_service_pb2.ModelConfigResponse.DESCRIPTOR.fields_by_name["config"]
    assert config_field.message_type is model_config_pb2.ModelConfig.DESCRIPTOR
    assert grpc_service_pb2.ModelConfig is model_config_pb2.ModelConfig
