"""Request parameters (the protocol's ``parameters`` objects) read with one set of checks."""

from __future__ import annotations

from collections.abc import Mapping

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
