"""An ensemble request's tensors: where each lies, and the hold on what it lies in.

A tensor between steps is never read into the front (docs/ensembles.md): an
``EnsembleTensor`` is the client's input as the protocol adapter parsed it, or a step's
output where it lies in the output segment of the worker that made it (a next step's
input names that segment, offset and size: ``InputTensor.located``). What it lies in is
``Held``: released once its last user (a step reading it, the response) is done.
"""

from __future__ import annotations

from collections.abc import Callable

from oipserve.pool.link import WorkerLink
from oipserve.request.client_regions import RegionUse
from oipserve.request.inference import InputTensor
from oipserve.wire.shm import Lease

__all__ = ["EnsembleTensor", "Held", "release_all"]


class Held:
    """What a tensor of an ensemble request lives in, released once its last user is done.

    A step output's segment (``name`` and the front's mapping ``buf``: what
    ``InputTensor.located`` wants), or the client's inputs. Each user takes a ``part``
    (the same object) and releases it once.
    """

    __slots__ = ("name", "buf", "worker", "_count", "_release")

    def __init__(
        self,
        name: str,
        buf: memoryview,
        release: Callable[[], None],
        worker: WorkerLink | None = None,
    ) -> None:
        self.name = name
        self.buf = buf
        #: The worker whose output segment this is (None: the client's inputs, or a copy).
        self.worker = worker
        self._count = 1  # the request's own, released when it ends
        self._release: Callable[[], None] | None = release

    def part(self) -> Held:
        self._count += 1
        return self

    def release(self) -> None:
        self._count -= 1
        if self._count == 0 and self._release is not None:
            release, self._release = self._release, None
            release()


class EnsembleTensor:
    """One ensemble tensor of a request, where it lies."""

    __slots__ = ("name", "datatype", "shape", "client", "data", "offset", "held")

    def __init__(
        self,
        name: str,
        datatype: str,
        shape: list[int],
        held: Held,
        client: InputTensor | None = None,
        data: memoryview | None = None,
        offset: int = -1,
    ) -> None:
        self.name = name
        self.datatype = datatype
        self.shape = shape
        self.held = held
        #: The client's input, as the protocol adapter parsed it.
        self.client = client
        #: A step's output as the front maps it, and its offset in ``held``'s segment
        #: (-1: not in a worker's segment, a batched step's share: copied when read).
        self.data = data
        self.offset = offset

    def as_input(self, name: str) -> InputTensor:
        """This tensor as input ``name`` of a step; its data where it lies."""
        client = self.client
        if client is not None:
            return InputTensor(
                name,
                client.datatype,
                client.shape,
                values=client.values,
                raw=client.raw,
                located=client.located,
                region=client.region,
            )
        data = self.data
        if self.offset >= 0 and data is not None:
            located = (self.held, self.offset, len(data))
            return InputTensor(name, self.datatype, self.shape, located=located)
        return InputTensor(name, self.datatype, self.shape, raw=data)


def release_all(owned: list[Lease | RegionUse] | list[Held]) -> None:
    for held in owned:
        held.release()
