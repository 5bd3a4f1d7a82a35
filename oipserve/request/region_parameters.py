"""A tensor's shared-memory parameters as a request gives them (``client_regions``).

``shared_memory_region``, ``shared_memory_byte_size`` and ``shared_memory_offset`` on an
input or an output (REST and gRPC alike), read with one set of checks into a
``RegionRequest``: what the request names, before the registry looks the region up
(``ClientRegions.use``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from oipserve.errors import InvalidInput

#: The tensor parameters of the extension (oip-spec.md §10.1).
REGION: Final = "shared_memory_region"
BYTE_SIZE: Final = "shared_memory_byte_size"
OFFSET: Final = "shared_memory_offset"
PARAMETERS: Final = (REGION, BYTE_SIZE, OFFSET)


class RegionRequest:
    """A tensor's shared-memory parameters as a request gives them (not looked up yet)."""

    __slots__ = ("region", "byte_size", "offset")

    def __init__(self, region: str, byte_size: int, offset: int) -> None:
        self.region = region
        self.byte_size = byte_size
        self.offset = offset


def wants_region(params: Mapping[str, object] | None) -> bool:
    """Whether ``params`` name any shared-memory parameter (``region_parameters`` checks them).

    PERF: three lookups, not any() over a generator: every REST input and output with
    parameters (the binary extension's) comes here, in the front's request path."""
    if not params:
        return False
    return REGION in params or BYTE_SIZE in params or OFFSET in params


def region_parameters(where: str, params: Mapping[str, object] | None) -> RegionRequest | None:
    """The shared-memory parameters of one input or output, checked; None when absent.

    ``shared_memory_region`` and ``shared_memory_byte_size`` come together (Triton's
    rule); ``shared_memory_offset`` is optional (0).
    """
    if params is None or not wants_region(params):
        return None
    return region_request(where, params)


def region_request(where: str, params: Mapping[str, object]) -> RegionRequest:
    """``region_parameters`` of ``params`` that name one (``wants_region``)."""
    region = params.get(REGION)
    if region is None or BYTE_SIZE not in params:
        raise InvalidInput(
            f"{where} must give both '{REGION}' and '{BYTE_SIZE}' to use shared memory"
        )
    if not isinstance(region, str) or not region:
        raise InvalidInput(f"'{REGION}' of {where} must be a region name (a string)")
    numbers = []
    for key in (BYTE_SIZE, OFFSET):
        value = params.get(key, 0)
        if type(value) is not int or value < 0:
            raise InvalidInput(f"'{key}' of {where} must be a non-negative integer, got {value!r}")
        numbers.append(value)
    return RegionRequest(region, numbers[0], numbers[1])
