"""A batch's outputs cut back per request (dataplane.batch_io.split): a scalar output of a
model that batches, one value for the whole batch, cannot be cut; the batch fails in the
words of Triton's output responder for the first request it fails (docs/model-config.md,
"Scalars")."""

from __future__ import annotations

import pytest

from oipserve.dataplane.batch_io import split
from oipserve.errors import Unsupported
from oipserve.wire.messages import TensorDesc


@pytest.mark.parametrize(("batches", "at_least"), [([1, 1], 2), ([1, 3], 4), ([2, 1], 2)])
def test_a_scalar_output_of_a_batch_is_refused(batches: list[int], at_least: int) -> None:
    segment = memoryview(bytearray(4))
    with pytest.raises(Unsupported) as info:
        split([TensorDesc("Y", "FP32", [], "s", 0, 4)], segment, batches)
    assert info.value.message.startswith(
        f"failed to split the output tensor 'Y' in responses: expected batch size of at least "
        f"{at_least} in model output, got 1: "
    )


def test_rows_are_cut_per_request() -> None:
    segment = memoryview(bytearray(12))
    parts = split([TensorDesc("Y", "FP32", [3], "s", 0, 12)], segment, [1, 2])
    assert [[desc.shape for desc, _ in part] for part in parts] == [[[1]], [[2]]]
