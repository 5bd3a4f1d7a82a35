"""Triton's ONNX Runtime session parameters, checked in the front before a load."""

from __future__ import annotations

import pytest

from oipserve.errors import InvalidInput
from oipserve.models.config.session_options import session_options


def test_only_the_session_parameters_are_taken() -> None:
    given = {
        "enable_mem_arena": "1",
        "enable_mem_pattern": "1",
        "memory.enable_memory_arena_shrinkage": "cpu:0;gpu:1;",
        "layout": "NCHW",  # an image option: not this module's
    }
    assert session_options("m", given) == {
        "enable_mem_arena": "1",
        "enable_mem_pattern": "1",
        "memory.enable_memory_arena_shrinkage": "cpu:0;gpu:1",
    }
    assert session_options("m", {}) == {}
    # Triton's spellings (its backends' ParseBoolValue), given to the worker as "1"/"0"
    triton = {"enable_mem_arena": "False", "enable_mem_pattern": " ON"}
    assert session_options("m", triton) == {"enable_mem_arena": "0", "enable_mem_pattern": "1"}


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"enable_mem_arena": "yes"}, '\'enable_mem_arena\' must be "1" or "0"'),
        ({"enable_mem_pattern": ""}, "'enable_mem_pattern' must be"),
        ({"memory.enable_memory_arena_shrinkage": "cpu"}, 'as "cpu:0" or "cpu:0;gpu:0"'),
        ({"memory.enable_memory_arena_shrinkage": ""}, "must list devices"),
        (
            {"enable_mem_arena": "0", "memory.enable_memory_arena_shrinkage": "cpu:0"},
            "names the CPU arena, which 'enable_mem_arena' = \"0\" turns off",
        ),
    ],
)
def test_bad_values_name_the_model_and_parameter(parameters: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidInput, match="model 'm': parameter") as info:
        session_options("m", parameters)
    assert message in str(info.value)
