"""What a request and its answer are, between the protocol fronts and the data plane.

REST and gRPC parse their wire format into ``InputTensor``s; the data plane answers
with an ``InferResult`` whose outputs are views of a worker's shared memory until it
is released.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from oipserve.wire.datatypes import element_count
from oipserve.wire.images import ImageSpec
from oipserve.wire.shm import Lease

if TYPE_CHECKING:
    from oipserve.models import ModelVersion

__all__ = ["InferResult", "InputTensor", "OutputTensor"]


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
