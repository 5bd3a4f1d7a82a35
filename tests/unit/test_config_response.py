"""The config response (``models.config_response``): Triton's JSON form, with what its
``NormalizeModelConfig`` fills in and every field without presence printed."""

from __future__ import annotations

from oipserve.models.config.parse import parse_model_config
from oipserve.models.config_response import model_config_document
from oipserve.models.registry import ModelVersion

CONFIG = """
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU } ]
sequence_batching {
  oldest { max_candidate_sequences: 4 }
  control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START
                                              int32_false_true: [ 0, 1 ] } ] } ]
}
"""


def test_what_triton_normalises_is_shown_as_the_server_does_it() -> None:
    """Triton shows a sequence's idle time, the oldest strategy's (and a batcher's)
    preferred batch size, the model file and each group's name filled in; the response
    showed 0 and [] where this server used 1 s and max_batch_size (comparing with core)."""
    config = parse_model_config(CONFIG)
    document = model_config_document(ModelVersion("seq", "1", "model.onnx", config))
    sequence = document["sequence_batching"]
    assert isinstance(sequence, dict)
    assert sequence["max_sequence_idle_microseconds"] == 1_000_000
    assert sequence["oldest"]["preferred_batch_size"] == [8]
    assert document["default_model_filename"] == "model.onnx"
    (group,) = document["instance_group"]  # type: ignore[misc]
    assert group["name"] == "seq_0"
    # Fields at their defaults are printed (START is enum 0), and the config is left as
    # it was given.
    (start,) = sequence["control_input"]
    assert start["control"][0]["kind"] == "CONTROL_SEQUENCE_START"
    assert "max_sequence_idle_microseconds" not in config.document["sequence_batching"]


def test_a_batchers_preferred_size_is_its_largest_batch() -> None:
    config = parse_model_config("max_batch_size: 4\ndynamic_batching { }\n")
    document = model_config_document(ModelVersion("m", "1", "model.onnx", config))
    assert document["dynamic_batching"]["preferred_batch_size"] == [4]  # type: ignore[index]


def test_a_float32_field_is_printed_as_its_shortest_decimal() -> None:
    """As protobuf's JSON printers (and so Triton's) write it: 0.1, not 0.10000000149011612."""
    config = parse_model_config(
        'max_batch_size: 4\ninput [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'sequence_batching { control_input [ { name: "READY" control [ {\n'
        "  kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0.1, 1.3 ] } ] } ] }\n"
    )
    document = model_config_document(ModelVersion("m", "1", "model.onnx", config))
    (ready,) = document["sequence_batching"]["control_input"]  # type: ignore[index]
    assert ready["control"][0]["fp32_false_true"] == [0.1, 1.3]
