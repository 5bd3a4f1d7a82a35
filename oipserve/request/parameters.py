"""Request parameters (the protocol's ``parameters`` objects) read with one set of checks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from oipserve.errors import InvalidInput


def unsigned(params: Mapping[str, object] | None, key: str, where: str) -> int | None:
    """Parameter ``key`` as a non-negative JSON integer, None when absent; 400 otherwise.

    ``where`` names the parameter in the message (``binary_data_size of input 'x'``).
    A JSON ``true`` is not an integer here, nor is ``1.0``.
    """
    if not params or key not in params:
        return None
    value = params[key]
    if type(value) is not int or value < 0:
        raise InvalidInput(f"{where} must be a non-negative integer, got {value!r}")
    return value


#: The ranges gRPC's types give the schedule-policy parameters (``priority`` a
#: ``uint64_param``, ``timeout`` an ``int64_param``): a REST request is held to the same,
#: so that both fronts accept the same requests. A JSON integer has no bound of its own.
PRIORITY_MAX: Final = 2**64 - 1
TIMEOUT_MAX: Final = 2**63 - 1


def schedule_parameters(params: Mapping[str, object] | None) -> tuple[int, int]:
    """The request parameters ``priority`` and ``timeout`` (µs) of a REST request; 0 when
    absent; 400 unless each is a JSON integer in its gRPC type's range.

    A priority above the model's ``priority_levels`` is not an error (as in Triton);
    the scheduler places it (docs/scheduler.md).
    """
    if not params:
        return 0, 0
    priority = _bounded(params, "priority", PRIORITY_MAX, "an unsigned 64-bit integer")
    timeout = _bounded(
        params, "timeout", TIMEOUT_MAX, "a non-negative 64-bit integer of microseconds"
    )
    return priority, timeout


def _bounded(params: Mapping[str, object], key: str, top: int, what: str) -> int:
    value = params.get(key, 0)
    if type(value) is not int or not 0 <= value <= top:
        raise InvalidInput(f"parameter '{key}' must be {what} (0 to {top}), got {value!r}")
    return value


def check_request_parameters(params: Mapping[str, object]) -> None:
    """Triton's HTTP front's rule for a REST request's other parameters, whatever the
    model: no ``triton_`` key (all are reserved over HTTP). They were accepted, where gRPC
    refused them (found by fuzzing). A value that is not a string, number or boolean never
    comes here: the request's type refuses it (``wire.json_request``)."""
    for key in params:
        if key.startswith("triton_"):
            raise InvalidInput(
                "parameter keys starting with 'triton_' are reserved for Triton usage and "
                "should not be specified."
            )
