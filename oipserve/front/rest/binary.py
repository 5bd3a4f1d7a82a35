"""The binary tensor data extension: request body layout and response assembly.

A request body is a JSON header of ``Inference-Header-Content-Length`` bytes
followed by raw tensor chunks, in the order of the inputs that declare
``parameters.binary_data_size``. The body has already been received into a
shared-memory lease; this module only computes where each chunk lies there,
so workers read the client's bytes where the socket put them.

``decode_header`` decodes the JSON header and words its errors for this layout: a
header length that runs past the JSON into the binary data (most often the whole
body's length, given by mistake) is named as such, not as msgspec's "trailing
characters".
"""

from __future__ import annotations

import re
from typing import Final

import msgspec

from oipserve.errors import InvalidInput, request_tag
from oipserve.front.rest.media import HEADER_LENGTH as HEADER
from oipserve.request.parameters import unsigned
from oipserve.wire.datatypes import ELEMENT_SIZES, element_count
from oipserve.wire.json_request import InferRequest, RequestInput, decode_request

#: msgspec's words for bytes after a complete JSON value (N: just past the first one).
_TRAILING: Final = re.compile(r"trailing characters \(byte (\d+)\)")


def parse_header_length(text: str | None, body_size: int) -> int | None:
    """The JSON header's length from ``Inference-Header-Content-Length``, or None if absent."""
    if text is None:
        return None
    value = text.strip()
    # NOTE: isascii too: str.isdigit accepts '²', which int() then refuses (a 500).
    if not (value.isascii() and value.isdigit()):
        raise InvalidInput(
            f"Inference-Header-Content-Length must be a non-negative integer, got {text!r}"
        )
    # NOTE: int() refuses more than 4,300 digits (a 500); 19 are past any body already.
    length = int(value) if len(value) <= 19 else body_size + 1
    if length > body_size:
        raise InvalidInput(
            f"Inference-Header-Content-Length is {value[:24]}{'...' * (len(value) > 24)} but "
            f"the body has only {body_size} bytes"
        )
    return length


def decode_header(data: bytes | memoryview, header_length: int | None) -> InferRequest:
    """The request's JSON: all of ``data``, or its first ``header_length`` bytes; 400 if
    it is not a valid inference request.

    A header length equal to the body's length is valid when the body is one JSON
    request (no binary data follows); when there are bytes after the JSON in the header
    the message says where the JSON ended and what the header length should have been.
    """
    header = data if header_length is None else data[:header_length]
    try:
        return decode_request(header)
    except ValueError as exc:
        message = str(exc)
        trailing = _TRAILING.search(message) if header_length is not None else None
        if trailing is None or header_length is None:
            raise InvalidInput(message) from None
    # NOTE: msgspec counts the byte it stopped after: the first trailing one is at N - 1.
    raise InvalidInput(_past_the_json(int(trailing.group(1)) - 1, header_length, len(data)))


def _past_the_json(end: int, header_length: int, body_size: int) -> str:
    """The message for a header length that covers bytes after the JSON request."""
    whole = " (the whole body)" if header_length == body_size else ""
    return (
        f"{HEADER} is {header_length}{whole}, but the JSON request in the body ends before "
        f"byte {end}: the {header_length - end} bytes after it that the header length "
        f"covers are not JSON. {HEADER} must be the length of the JSON header alone "
        f"(here probably {end}), with the binary tensor data after it; a body that is "
        f"all JSON needs no {HEADER}"
    )


def binary_size(tensor: RequestInput) -> int | None:
    """``parameters.binary_data_size`` of an input, checked, or None if absent."""
    if not tensor.parameters or "binary_data_size" not in tensor.parameters:
        return None  # PERF: (the message's words are built only for a value to check)
    return unsigned(
        tensor.parameters, "binary_data_size", f"binary_data_size of input '{tensor.name}'"
    )


def chunk_spans(inputs: list[RequestInput], start: int, end: int) -> list[tuple[int, int] | None]:
    """Where each input's binary chunk lies in ``[start, end)``; None for JSON inputs.

    Chunks follow the order of the inputs. One input that has neither ``data`` nor
    ``binary_data_size`` takes the bytes the others leave, at its own place among them
    (convenient for hand-written clients; it took the last bytes, wherever it stood, and
    the inputs got each other's data: found by fuzzing); two such inputs are ambiguous
    and rejected.
    """
    sizes = _binary_sizes(inputs)
    unsized = next((i for i, size in enumerate(sizes) if size == _UNSIZED), None)
    if unsized is not None:
        sized = sum(size for size in sizes if size is not None and size >= 0)
        sizes[unsized] = max(end - start - sized, 0)
    spans: list[tuple[int, int] | None] = []
    pos = start
    last: str | None = None
    for tensor, size in zip(inputs, sizes, strict=True):
        if size is None:
            spans.append(None)
            continue
        if pos + size > end:
            raise InvalidInput(
                f"binary_data_size of input '{tensor.name}' is {size}, but only {end - pos} "
                "bytes of binary data remain in the body"
                + (
                    f" ({HEADER} is the whole body's length, {end}: it must be the length "
                    "of the JSON header alone, with the binary data after it)"
                    if start == end
                    else ""
                )
            )
        spans.append((pos, size))
        pos += size
        last = tensor.name
    if pos != end:
        after = f"binary input '{last}'" if last is not None else "the JSON header"
        raise InvalidInput(
            f"the body has {end - pos} unexpected bytes after {after}; "
            "binary_data_size values must add up to the binary part of the body"
        )
    return spans


#: ``_binary_sizes``' mark of the input that gives neither ``data`` nor a size.
_UNSIZED: Final = -1


def _binary_sizes(inputs: list[RequestInput]) -> list[int | None]:
    """Each input's ``binary_data_size``; None for one not in the body (``data``, or a
    client's shared memory), ``_UNSIZED`` for the one input that gives neither."""
    sizes: list[int | None] = []
    unsized: str | None = None
    for tensor in inputs:
        if tensor.parameters and "shared_memory_region" in tensor.parameters:
            sizes.append(None)  # in a client's shared memory, not in the body
            continue
        size = binary_size(tensor)
        has_data = tensor.data is not msgspec.UNSET
        if size is not None and has_data:
            raise InvalidInput(
                f"input '{tensor.name}' has both 'data' and binary_data_size; give one of them"
            )
        if size is None and not has_data:
            if unsized is not None:
                raise InvalidInput(
                    f"inputs '{unsized}' and '{tensor.name}' have neither "
                    "'data' nor binary_data_size; with more than one binary input each "
                    "must give binary_data_size"
                )
            unsized = tensor.name
            size = _UNSIZED
        sizes.append(size)
    return sizes


def raw_input_shape(
    name: str, datatype: str, model_shape: tuple[int, ...], batched: bool, nbytes: int
) -> list[int]:
    """Deduce the shape of a raw binary request (Inference-Header-Content-Length: 0).

    As Triton normalises it: a batch of 1 in front when the model batches
    (``model_shape`` then starts with the batch dimension, -1), then the config's dims,
    a variable one deduced from ``nbytes``. A BYTES input takes the whole body as its
    one element, so its dims must hold exactly one (no variable dimension).
    """
    shape = list(model_shape)
    if batched and shape and shape[0] == -1:
        shape[0] = 1
    if datatype == "BYTES":
        dims = model_shape[1:] if batched else model_shape
        if -1 in dims or element_count(list(dims)) != 1:
            raise InvalidInput(
                f"{request_tag(None)}For BYTE datatype raw input '{name}', the model must "
                "have input shape [1]: "
                f"a raw request's body is one BYTES element, and the model's dims are "
                f"{list(dims)}"
            )
        return shape
    unknown = [i for i, d in enumerate(shape) if d == -1]
    item = ELEMENT_SIZES[datatype]
    known = element_count([d for d in shape if d != -1]) * item
    if len(unknown) > 1:
        raise InvalidInput(
            f"{request_tag(None)}The shape of the raw input '{name}' can not be deduced "
            "because there are more than one variable-sized dimension: model shape "
            f"{list(model_shape)}"
        )
    if unknown:
        if known == 0 or nbytes % known:
            raise InvalidInput(
                f"raw input '{name}' has {nbytes} bytes, not a whole number of "
                f"{datatype} rows of shape {list(model_shape)}"
            )
        shape[unknown[0]] = nbytes // known
    return shape
