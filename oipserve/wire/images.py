"""How a model input takes encoded images: the image spec the front sends to a worker.

The front decides that a request input is encoded images and describes, with an
``ImageSpec``, how the worker must turn them into the model's tensor
(``workers.images.decode_batch`` does the decoding, with OpenCV, in the worker).
This module is pure: numpy and msgspec only, so the front never loads OpenCV.
See docs/images.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Final, Literal

import msgspec
import numpy as np

from oipserve.wire.datatypes import IMAGE_ELEMENTS

__all__ = ["SUPPORTED_DTYPES", "ImageError", "ImageSpec", "image_spec_for"]

#: Element types an image can be cast to: the list OVMS accepts (others get INVALID_PRECISION).
SUPPORTED_DTYPES: Final[frozenset[str]] = IMAGE_ELEMENTS


class ImageError(ValueError):
    """A request (or model configuration) the image path cannot serve; the text is for clients.

    Raised for client mistakes (bad bytes, wrong channel count, wrong batch size), which the
    server should answer with 400 / INVALID_ARGUMENT, and from :func:`image_spec_for` for model
    configurations that cannot take images.
    """


class ImageSpec(msgspec.Struct, frozen=True):
    """How one model input takes images; ``-1`` marks a dynamic dimension.

    ``dtype`` is the numpy name of the model input's element type. ``color_order`` is the
    channel order the model wants (OpenCV decodes to BGR). ``mean``/``scale`` hold one value
    or one per channel, in the channel order the model sees (after any BGR->RGB swap).
    """

    layout: Literal["NHWC", "NCHW"]
    height: int
    width: int
    channels: int
    dtype: str
    color_order: Literal["BGR", "RGB"] = "BGR"
    mean: tuple[float, ...] | None = None
    scale: tuple[float, ...] | None = None
    batch: int = -1


def image_spec_for(
    input_name: str, shape: Sequence[int], dtype: str, params: Mapping[str, str]
) -> ImageSpec:
    """Describe how a model input takes images, or raise ImageError if it cannot.

    ``shape`` is the model input's shape (any negative value = dynamic), ``dtype`` its numpy
    element type, ``params`` the model's string parameters. Keys read: ``layout`` (NHWC or
    NCHW), ``color_order`` (BGR or RGB, default BGR), ``mean`` and ``scale`` (comma-separated
    floats, one value or one per channel, optionally in brackets; float inputs only).

    The input must be 4-D and of a dtype in :data:`SUPPORTED_DTYPES`. Layout rule when no
    ``layout`` parameter is given, with d1 = shape[1] and d3 = shape[3]:

    * d1 is 1 or 3 and d3 is not 1 or 3  -> NCHW  (e.g. [N,3,224,224], [N,1,28,28]);
    * d3 is 1, 3 or 4 and d1 is not 1, 3 or 4  -> NHWC  (e.g. [N,224,224,3], [N,-1,-1,4]);
    * otherwise (both look like channels, e.g. [1,3,3,3], or neither does, e.g.
      [1,-1,-1,-1]) -> ImageError asking for the ``layout`` parameter.

    The channel dimension must be 1, 3, 4 or dynamic: decoded images never have other counts.
    """
    shape = tuple(int(d) for d in shape)
    try:
        np_dtype = np.dtype(dtype)
    except TypeError:
        np_dtype = None
    if np_dtype is None or np_dtype.name not in SUPPORTED_DTYPES:
        raise ImageError(
            f"input '{input_name}' is not an image input: its element type {dtype!r} cannot"
            f" hold image pixels (supported: {', '.join(sorted(SUPPORTED_DTYPES))})"
        )
    if len(shape) != 4:
        raise ImageError(
            f"input '{input_name}' is not an image input: it has {len(shape)} dimensions"
            f" {list(shape)}, image inputs need 4 (NHWC or NCHW)"
        )
    if 0 in shape:
        raise ImageError(
            f"input '{input_name}' is not an image input: shape {list(shape)} has a zero dimension"
        )
    dims = tuple(-1 if d < 0 else d for d in shape)

    layout = _layout_param(input_name, params.get("layout"))
    if layout is None:
        layout = _detect_layout(input_name, dims)
    if layout == "NCHW":
        batch, channels, height, width = dims
    else:
        batch, height, width, channels = dims
    if channels not in (-1, 1, 3, 4):
        raise ImageError(
            f"input '{input_name}' read as {layout} {list(shape)} has {channels} channels;"
            " images decode to 1, 3 or 4 channels (is the `layout` parameter right?)"
        )

    color_param = (params.get("color_order") or "BGR").strip().upper()
    color_order: Literal["BGR", "RGB"] = "RGB" if color_param == "RGB" else "BGR"
    if color_param != color_order:
        raise ImageError(
            f"input '{input_name}': parameter color_order must be BGR or RGB,"
            f" not {params['color_order']!r}"
        )
    mean = _floats_param(input_name, params, "mean", channels)
    scale = _floats_param(input_name, params, "scale", channels)
    if (mean is not None or scale is not None) and np_dtype.kind != "f":
        raise ImageError(
            f"input '{input_name}': mean/scale need a floating-point input, not {np_dtype.name}"
        )
    if scale is not None and 0.0 in scale:
        raise ImageError(f"input '{input_name}': parameter scale must not contain 0")
    if mean is not None or scale is not None:  # (a float input: checked above)
        _check_normalised_range(input_name, np_dtype, mean or (0.0,), scale or (1.0,))
    return ImageSpec(
        layout=layout,
        height=height,
        width=width,
        channels=channels,
        dtype=np_dtype.name,
        color_order=color_order,
        mean=mean,
        scale=scale,
        batch=batch,
    )


def _layout_param(input_name: str, value: str | None) -> Literal["NHWC", "NCHW"] | None:
    """Validate the optional ``layout`` parameter (case-insensitive)."""
    if value is None or not value.strip():
        return None
    layout = value.strip().upper()
    if layout == "NHWC":
        return "NHWC"
    if layout == "NCHW":
        return "NCHW"
    raise ImageError(f"input '{input_name}': parameter layout must be NHWC or NCHW, not {value!r}")


def _detect_layout(input_name: str, dims: tuple[int, ...]) -> Literal["NHWC", "NCHW"]:
    """Apply the shape rule documented on :func:`image_spec_for`."""
    d1, d3 = dims[1], dims[3]
    if d1 in (1, 3) and d3 not in (1, 3):
        return "NCHW"
    if d3 in (1, 3, 4) and d1 not in (1, 3, 4):
        return "NHWC"
    raise ImageError(
        f"cannot tell whether image input '{input_name}' with shape {list(dims)} is NHWC or"
        " NCHW; set the model parameter `layout` to NHWC or NCHW"
    )


#: The largest value of a pixel of an 8-bit image: ``mean``/``scale`` must keep every such
#: pixel finite in the model's type (a 16-bit PNG's pixels reach 65535).
_PIXEL_MAX: Final = 255.0


def _check_normalised_range(
    input_name: str, dtype: np.dtype, mean: Sequence[float], scale: Sequence[float]
) -> None:
    """ImageError when ``(pixel - mean) / scale`` of an 8-bit pixel would not be finite in
    ``dtype`` (nor in the float32 the workers compute in below float64): a mean of 1e39, a
    scale of 1e-50 or an FP16 mean of -1e6 passed the checks in Python's floats, and then
    every image request got NaN/inf back, with numpy's warnings in the log (fuzzing)."""
    compute = np.dtype(np.float64 if dtype == np.float64 else np.float32)
    largest = float(min(np.finfo(dtype.name).max, np.finfo(compute.name).max))
    count = max(len(mean), len(scale))
    for channel in range(count):
        m = mean[channel if len(mean) > 1 else 0]
        s = scale[channel if len(scale) > 1 else 0]
        if float(compute.type(s)) == 0.0 or max(abs(m), abs(_PIXEL_MAX - m)) / abs(s) > largest:
            raise ImageError(
                f"input '{input_name}': parameters mean {m:g} and scale {s:g} take pixels "
                f"(0 to {_PIXEL_MAX:g}) past what {dtype.name} holds"
            )


def _floats_param(
    input_name: str, params: Mapping[str, str], key: str, channels: int
) -> tuple[float, ...] | None:
    """Parse ``"a,b,c"`` (or ``"[a, b, c]"``) into one value or one per channel."""
    raw = params.get(key)
    if raw is None or not raw.strip():
        return None
    try:
        values = tuple(float(v) for v in raw.strip().strip("[]").split(","))
    except ValueError:
        raise ImageError(
            f"input '{input_name}': parameter {key} must be comma-separated numbers, not {raw!r}"
        ) from None
    if not all(math.isfinite(v) for v in values):
        raise ImageError(f"input '{input_name}': parameter {key} must be finite, not {raw!r}")
    allowed = (1, 3, 4) if channels == -1 else (1, channels)
    if len(values) not in allowed:
        wanted = "1, 3 or 4" if channels == -1 else f"1 or {channels}"
        raise ImageError(
            f"input '{input_name}': parameter {key} has {len(values)} values, expected {wanted}"
        )
    return values
