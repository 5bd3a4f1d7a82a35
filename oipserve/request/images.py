"""The front's half of image inputs: deciding that a request input is encoded images.

An input is an image input when the request sends ``BYTES`` to a model input that is a 4-D
numeric tensor. The front only validates (request shape ``[N]``, batch size, the model input
can take images) and turns base64 JSON strings into bytes; the decoding itself happens in the
worker (``workers.images.decode_batch``) so the event loop never spends time on pixels.
See docs/images.md.
"""

from __future__ import annotations

import binascii
from typing import TYPE_CHECKING

from oipserve.errors import InvalidInput
from oipserve.models.registry import ModelVersion, TensorSpec
from oipserve.request.tensors import flatten
from oipserve.wire.datatypes import DATATYPES, encode_bytes_elements
from oipserve.wire.images import ImageError, ImageSpec, image_spec_for

if TYPE_CHECKING:
    from oipserve.request.inference import InputTensor

__all__ = ["image_payload", "image_target"]


def _spec_for(model: ModelVersion, spec: TensorSpec) -> ImageSpec:
    """ImageSpec of one model input, computed once per model version (kept on it: a
    reloaded version's object is new, and computes its own)."""
    cache = model.image_specs
    found = cache.get(spec.name)
    if found is None:
        element = DATATYPES[spec.datatype].element
        try:
            found = image_spec_for(spec.name, spec.shape, element, model.parameters)
        except ImageError as exc:
            found = exc
        cache[spec.name] = found
    if isinstance(found, ImageError):
        raise InvalidInput(f"model '{model.name}': {found}")
    return found


def image_target(model: ModelVersion, spec: TensorSpec, tensor: InputTensor) -> ImageSpec | None:
    """The ImageSpec when ``tensor`` (an InputTensor) is encoded images for ``spec``, else None.

    Raises InvalidInput for BYTES sent to an input that cannot take images, for a request
    shape other than ``[N]`` and for an N other than a fixed batch dimension (an N past
    max_batch_size: any request's check, ``checks.check_inputs``, before this one).
    """
    if tensor.datatype != "BYTES" or spec.datatype == "BYTES":
        return None
    name = spec.name
    if len(spec.shape) != 4:
        raise InvalidInput(
            f"input '{name}' takes {spec.datatype} tensors; BYTES is accepted only for image"
            f" inputs (4-D), and '{name}' has shape {list(spec.shape)}"
        )
    image = _spec_for(model, spec)
    shape = tensor.shape
    if len(shape) != 1:
        raise InvalidInput(
            f"input '{name}' is an image input: send shape [N] (N encoded images), not"
            f" {list(shape)}"
        )
    count = shape[0]
    if count < 1:
        raise InvalidInput(f"input '{name}' is an image input and needs at least one image")
    if image.batch > 0 and count != image.batch:
        raise InvalidInput(
            f"input '{name}' has {count} images but model '{model.name}' takes a batch of"
            f" exactly {image.batch}"
        )
    return image


def image_payload(name: str, values: object, count: int) -> bytearray:
    """Length-prefixed bytes of JSON/gRPC image elements, ready for shared memory.

    JSON strings are base64 (strict: no stray characters); ``bytes`` values (gRPC
    ``bytes_contents``) are the images themselves.
    """
    if not isinstance(values, list):
        raise InvalidInput(f"'data' of input '{name}' must be an array")
    flat: list[object] = []
    flatten(values, flat)
    if len(flat) != count:
        raise InvalidInput(
            f"input '{name}': its shape holds {count} images but 'data' has {len(flat)}"
        )
    elements: list[bytes] = []
    for index, value in enumerate(flat):
        if isinstance(value, bytes):
            elements.append(value)
        elif isinstance(value, str):
            try:
                elements.append(binascii.a2b_base64(value, strict_mode=True))
            except (binascii.Error, ValueError) as exc:
                raise InvalidInput(
                    f"element {index} of image input '{name}' is not valid base64 ({exc});"
                    " images in JSON 'data' must be base64 strings"
                ) from None
        else:
            raise InvalidInput(
                f"element {index} of image input '{name}' is a {type(value).__name__};"
                " images in JSON 'data' must be base64 strings"
            )
    return encode_bytes_elements(elements)
