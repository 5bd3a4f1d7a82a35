"""Turn encoded images (KServe v2 BYTES elements) into model input tensors, the way OVMS does.

OpenVINO Model Server decodes each element with ``cv2.imdecode(..., IMREAD_UNCHANGED)``, so
pixels arrive as BGR (BGRA with alpha, one channel for grey) with their stored bit depth; it
casts to the model's element type without scaling *before* a bilinear resize, and only then
applies colour swap, mean, scale and the NCHW transpose. This module copies that order so a
model tuned against OVMS gets the same numbers here (see
``shared/reference/ovms-image-inputs.md``).

Deliberate differences from OVMS, all in the direction of being more useful to ONNX models:

* The layout may be NCHW (detected from the shape or set with the ``layout`` parameter); OVMS
  needs ``--layout NHWC:NCHW`` for that and otherwise reads C from the last dimension.
* Resizing happens whenever both height and width are fixed, even with a dynamic batch
  dimension (OVMS never resizes when any dimension, batch included, is ``-1``).
* Only JPEG, PNG, BMP and WebP are accepted (by magic bytes); OVMS takes whatever its OpenCV
  build can read. Truncated JPEG/PNG/WebP files are rejected before decoding because
  libjpeg in OpenCV 4.x returns a grey-padded image for them instead of failing.
* JPEGs are decoded by libjpeg-turbo through simplejpeg, which reports libjpeg's warnings:
  a JPEG whose scan data ends before the pixels its header declares (a small file claiming
  8000x8000, say) is refused, where OpenCV pads it with grey and returns 200. The pixels are
  the same as OpenCV's (same library, same IDCT and upsampling; tested). CMYK/YCCK JPEGs,
  which libjpeg-turbo cannot turn into BGR, are checked the same way and decoded by OpenCV.
* Images larger than ``max_pixels``, and requests whose images add up to more than
  ``max_request_pixels``, are refused from their headers, before decoding, so a small
  "decompression bomb" cannot make the worker allocate gigabytes.
* A BMP whose pixel data is shorter than its header declares is refused before decoding
  (OpenCV would allocate the whole image first).
* int8/int32/float16 inputs that need a resize are resized in float32 (OpenCV cannot resize
  those types, so OVMS fails with an internal error there).

Everything here is pure (no server imports) and thread-safe; cv2 releases the GIL, so a
caller may decode the elements of a batch from several threads.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import lru_cache

import cv2
import numpy as np
import simplejpeg

from oipserve.wire.images import SUPPORTED_DTYPES, ImageError, ImageSpec

__all__ = ["DEFAULT_MAX_PIXELS", "decode_batch", "quiet_opencv"]

#: Largest image (width * height, from the file header) decode_batch accepts by default:
#: 64 Mpx, e.g. 8192x8192. OpenCV's own limit is 2**30, which lets one request pin ~3 GB.
DEFAULT_MAX_PIXELS: int = 1 << 26
#: Most pixels (sum of width * height from the headers) the images of one request may have:
#: the same 64 Mpx, so a batch costs no more than the largest single image.
DEFAULT_MAX_REQUEST_PIXELS: int = 1 << 26


def quiet_opencv() -> None:
    """Stop OpenCV logging a client's malformed image on the worker's stderr.

    libpng, through OpenCV, prints an ``[ERROR...]`` line of its own for a broken PNG
    ("IHDR chunk shall be first"); the request already gets a 400 that says what is wrong,
    and the server's log is for the server's failures. Called once by the worker (a
    process-wide setting, not made on import). libpng's own warnings and errors, which it
    writes to stderr itself, are kept out by ``_libpng_silenced``.
    """
    cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)


class _Stderr:
    """The worker's stderr, and /dev/null to put in its place (opened at first use)."""

    saved = -1
    null = -1


@contextmanager
def _libpng_silenced() -> Iterator[None]:
    """Decode a PNG with file descriptor 2 pointed at /dev/null.

    libpng writes ``libpng warning: Image width is zero in IHDR`` or ``libpng error: Not
    enough image data`` to stderr itself, past OpenCV's logging, once per broken PNG: any
    client could fill the server's log with them (found by fuzzing). Two ``dup2`` calls a
    PNG; a line another thread of the worker logs in that moment is lost with them.
    """
    if _Stderr.saved < 0:
        _Stderr.saved = os.dup(2)
        _Stderr.null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(_Stderr.null, 2)
    try:
        yield
    finally:
        os.dup2(_Stderr.saved, 2)


_FORMATS = "JPEG/PNG/BMP/WebP"
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# SOF markers carry the frame size; C4 (DHT), C8 (JPG) and CC (DAC) share the range but do not.
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# Markers without a length field: TEM and RST0-7 (SOI/EOI are handled separately).
_JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})
# dtypes cv2.resize(INTER_LINEAR) handles; the others are resized in float32.
_CV2_RESIZABLE = frozenset({"uint8", "uint16", "int16", "float32", "float64"})


@dataclass(frozen=True, slots=True)
class _Plan:
    """Per-spec constants, computed once rather than per request."""

    dtype: np.dtype
    resize_dtype: np.dtype  # type cv2.resize runs in (the model type when OpenCV supports it)
    compute_dtype: np.dtype | None  # float type for mean/scale, None when not normalising
    mean: np.ndarray | None
    scale: np.ndarray | None
    int_max: int | None  # saturation bound for integer model types


@lru_cache(maxsize=256)
def _plan(spec: ImageSpec) -> _Plan:
    try:
        dtype = np.dtype(spec.dtype)
    except TypeError:
        dtype = np.dtype(object)
    if dtype.name not in SUPPORTED_DTYPES:
        raise ImageError(f"model input element type {spec.dtype!r} cannot hold image pixels")
    normalise = spec.mean is not None or spec.scale is not None
    compute = None
    if normalise:
        compute = np.dtype(np.float64 if dtype == np.float64 else np.float32)
    return _Plan(
        dtype=dtype,
        resize_dtype=dtype if dtype.name in _CV2_RESIZABLE else np.dtype(np.float32),
        compute_dtype=compute,
        mean=None if spec.mean is None else np.asarray(spec.mean, dtype=compute),
        scale=None if spec.scale is None else np.asarray(spec.scale, dtype=compute),
        int_max=int(np.iinfo(dtype).max) if dtype.kind in "iu" else None,
    )


def _check_target(
    input_name: str, count: int, spec: ImageSpec, max_pixels: int, max_request_pixels: int
) -> None:
    """ImageError when the model's fixed size makes the output larger than the limits.

    Images are resized to a fixed height and width whatever their own size, so a
    configuration's dims (say 50000x50000) would have a 4x4 PNG allocate 30 GB.
    """
    if spec.height <= 0 or spec.width <= 0:
        return
    target = spec.height * spec.width
    if target > max_pixels:
        raise ImageError(
            f"input '{input_name}' takes images of {spec.height}x{spec.width} (HxW) pixels, "
            f"more than the limit of {max_pixels} pixels"
        )
    if count * target > max_request_pixels:
        raise ImageError(
            f"input '{input_name}' takes images of {spec.height}x{spec.width} (HxW) pixels: "
            f"{count * target} pixels for {count} images, more than the limit of "
            f"{max_request_pixels} pixels per request"
        )


def decode_batch(
    input_name: str,
    elements: Sequence[bytes | memoryview],
    spec: ImageSpec,
    *,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    max_request_pixels: int = DEFAULT_MAX_REQUEST_PIXELS,
) -> np.ndarray:
    """Decode encoded images into one model-ready array (NHWC or NCHW, ``spec.dtype``).

    Per image, in OVMS order: decode unchanged (BGR/BGRA/grey, 8 or 16 bit), check the size
    against the first image when no resize is possible, check channels, cast to the model type
    with saturation and no scaling, resize bilinearly to the fixed (height, width) if needed,
    then swap to RGB, subtract ``mean`` and divide by ``scale`` (in float), and write into the
    preallocated output (through a transposed view for NCHW). With a dynamic height or width
    nothing is resized: the free dimension takes element 0's size, every image must match it,
    and a fixed one must already match. Element indices in messages are 0-based.
    """
    plan = _plan(spec)
    count = len(elements)
    if count == 0:
        raise ImageError(f"input '{input_name}' has no images")
    if spec.batch > 0 and count != spec.batch:
        raise ImageError(
            f"input '{input_name}' has {count} images but the model takes a batch of exactly"
            f" {spec.batch}"
        )
    # One private copy of each element: what is checked is what gets decoded even if the
    # source buffer (e.g. shared memory) changes meanwhile; bytes(bytes) is free.
    copies = [bytes(element) for element in elements]
    for index, data in enumerate(copies):
        if len(data) == 0:
            raise ImageError(f"element {index} of input '{input_name}' is empty")
    headers = []
    total = 0
    for index, data in enumerate(copies):
        header = _inspect(input_name, index, data)
        _, width, height = header
        if width * height > max_pixels:
            raise ImageError(
                f"element {index} of input '{input_name}' is {width}x{height} pixels, more"
                f" than the limit of {max_pixels} pixels"
            )
        total += width * height
        headers.append(header)
    # NOTE: decoded images are allocated whole; a batch of images each under the limit
    #   must not add up to gigabytes either. Checked from the headers, before any decoding.
    if total > max_request_pixels:
        raise ImageError(
            f"input '{input_name}' has {count} images of {total} pixels in all, more than the"
            f" limit of {max_request_pixels} pixels per request"
        )
    _check_target(input_name, count, spec, max_pixels, max_request_pixels)

    can_resize = spec.height > 0 and spec.width > 0
    out: np.ndarray | None = None
    hwc_out: np.ndarray | None = None  # NHWC view of `out`
    first_hw = (0, 0)
    height = width = channels = 0
    mean_row: np.ndarray | None = None
    scale_row: np.ndarray | None = None
    for index, data in enumerate(copies):
        img = _decode_one(input_name, index, data, headers[index][0])
        h, w, c = img.shape
        if out is None:
            first_hw = (h, w)
            channels = spec.channels if spec.channels > 0 else c
            height = spec.height if spec.height > 0 else h
            width = spec.width if spec.width > 0 else w
        elif not can_resize and (h, w) != first_hw:
            raise ImageError(
                f"element {index} of input '{input_name}' is {h}x{w} (HxW) but element 0 is"
                f" {first_hw[0]}x{first_hw[1]}; with a dynamic height/width every image in a"
                " request must have the same size"
            )
        if c != channels:
            raise ImageError(
                f"element {index} of input '{input_name}' has {c} channel{'s' * (c != 1)} but"
                f" the model input takes {channels}"
            )
        resize = (h, w) != (height, width)
        if resize and not can_resize:
            raise ImageError(
                f"element {index} of input '{input_name}' is {h}x{w} (HxW) but the model needs"
                f" {height}x{width}; images are resized only when both height and width are"
                " fixed"
            )
        if out is None:
            if spec.layout == "NCHW":
                out = np.empty((count, channels, height, width), dtype=plan.dtype)
                hwc_out = out.transpose(0, 2, 3, 1)
            else:
                out = np.empty((count, height, width, channels), dtype=plan.dtype)
                hwc_out = out
            mean_row = _per_pixel_row(input_name, "mean", plan.mean, width, channels)
            scale_row = _per_pixel_row(input_name, "scale", plan.scale, width, channels)
        if hwc_out is None:  # allocated with `out` for element 0
            raise RuntimeError(f"input '{input_name}': no output array for element {index}")
        if spec.color_order == "RGB" and c >= 3:
            img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB if c == 3 else cv2.COLOR_BGRA2RGBA)
        _convert_into(img, hwc_out[index], plan, resize, mean_row, scale_row)
    if out is None:  # count > 0 was checked above
        raise RuntimeError(f"input '{input_name}': no image was decoded")
    return out


def _convert_into(
    img: np.ndarray,
    dst: np.ndarray,
    plan: _Plan,
    resize: bool,
    mean_row: np.ndarray | None,
    scale_row: np.ndarray | None,
) -> None:
    """Cast (saturating), resize and normalise one HxWxC image into ``dst``."""
    height, width, channels = dst.shape
    if plan.compute_dtype is not None:
        # Float model with mean/scale: the cast to float is exact, so no saturation is needed.
        x = img.astype(plan.compute_dtype)
        if resize:
            x = _resize(x, width, height, channels)
        # (H, W*C) rows with per-pixel-repeated constants: long inner loops, ~10x faster than
        # broadcasting a 3-vector over (H, W, C).
        rows = x.reshape(height, width * channels)
        if mean_row is not None:
            np.subtract(rows, mean_row, out=rows)
        if scale_row is not None:
            np.divide(rows, scale_row, out=rows)
        dst[...] = rows.reshape(height, width, channels)
        return
    if plan.int_max is not None and np.iinfo(img.dtype).max > plan.int_max:
        img = np.minimum(img, plan.int_max)  # OpenCV's saturate_cast; pixels are never < 0
    if not resize:
        dst[...] = img
        return
    x = _resize(img.astype(plan.resize_dtype, copy=False), width, height, channels)
    if plan.resize_dtype != plan.dtype and plan.int_max is not None:
        np.rint(x, out=x)  # int8/int32 resized in float32: round like OpenCV would
    dst[...] = x


def _resize(x: np.ndarray, width: int, height: int, channels: int) -> np.ndarray:
    """cv2.resize drops a trailing 1-channel axis; put it back."""
    r = cv2.resize(x, (width, height), interpolation=cv2.INTER_LINEAR)
    return r.reshape(height, width, channels)


def _per_pixel_row(
    input_name: str, what: str, values: np.ndarray | None, width: int, channels: int
) -> np.ndarray | None:
    """Repeat per-channel values along a row so they broadcast over an (H, W*C) view."""
    if values is None:
        return None
    if values.shape[0] not in (1, channels):
        raise ImageError(
            f"input '{input_name}' has {channels}-channel images but the model's {what}"
            f" parameter has {values.shape[0]} values"
        )
    return np.tile(np.broadcast_to(values, (channels,)), width)


def _decode_one(input_name: str, index: int, data: bytes, fmt: str) -> np.ndarray:
    """Decode one element, already checked by ``_inspect``, to an HxWxC uint8/uint16 array."""
    img: np.ndarray | None = None
    if fmt == "JPEG":
        img = _decode_jpeg(input_name, index, data)
    if img is None:
        try:
            with _libpng_silenced() if fmt == "PNG" else nullcontext():
                img = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), cv2.IMREAD_UNCHANGED)
        except cv2.error:
            img = None
    if img is None or img.size == 0:
        raise ImageError(
            f"element {index} of input '{input_name}' could not be decoded as a {fmt} image"
            " (corrupt data)"
        )
    if img.dtype not in (np.uint8, np.uint16):
        raise ImageError(
            f"element {index} of input '{input_name}' has unsupported pixel type {img.dtype}"
        )
    if img.ndim == 2:
        img = img[:, :, np.newaxis]
    return img


#: libjpeg's warnings for scan data that ends before the image does (JWRN_HIT_MARKER and
#: JWRN_JPEG_EOF); libjpeg fills the rest with grey and only warns.
_JPEG_CUT_SHORT = ("premature end of data segment", "premature end of jpeg file")


def _decode_jpeg(input_name: str, index: int, data: bytes) -> np.ndarray | None:
    """Decode a JPEG strictly enough to refuse one cut short; None leaves it to OpenCV.

    Other recoverable damage libjpeg warns about (extraneous bytes before a marker, say) is
    tolerated as OpenCV and OVMS tolerate it: OpenCV decodes such files, as before.
    """
    try:
        _, _, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError:
        return None  # let OpenCV give its verdict ("could not be decoded")
    target = "GRAY" if colorspace == "Gray" else "BGR"
    if colorspace in ("CMYK", "YCCK"):
        target = "CMYK"  # libjpeg-turbo cannot convert these to BGR; only check them here
    try:
        img = simplejpeg.decode_jpeg(data, colorspace=target, strict=True)
    except ValueError as exc:
        message = str(exc)
        if any(phrase in message.lower() for phrase in _JPEG_CUT_SHORT):
            raise ImageError(
                f"element {index} of input '{input_name}' is a truncated JPEG image: its data"
                f" ends before the pixels its header declares ({message})"
            ) from None
        return None  # other damage, or a fatal error: OpenCV decides, as before
    return None if target == "CMYK" else img


def _inspect(input_name: str, index: int, data: bytes) -> tuple[str, int, int]:
    """Identify the format by magic bytes and check the container is complete.

    Returns (format, width, height) with 0 for a size the header does not state.
    """
    if data[:3] == b"\xff\xd8\xff":
        return "JPEG", *_jpeg_size(input_name, index, data)
    if data[:8] == _PNG_SIGNATURE:
        return "PNG", *_png_size(input_name, index, data)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WebP", *_webp_size(input_name, index, data)
    if data[:2] == b"BM":
        return "BMP", *_bmp_size(input_name, index, data)
    raise ImageError(f"element {index} of input '{input_name}' is not a {_FORMATS} image")


def _truncated(input_name: str, index: int, fmt: str) -> ImageError:
    return ImageError(f"element {index} of input '{input_name}' is a truncated {fmt} image")


def _jpeg_size(input_name: str, index: int, data: bytes) -> tuple[int, int]:
    """Walk the marker segments to the first scan, then require an EOI (FF D9) after it.

    Scan data cannot contain FF D9 (0xFF is byte-stuffed), so a missing EOI means the file
    was cut; bytes after the EOI are ignored, as libjpeg does. Segment lengths skip embedded
    EXIF thumbnails, whose own EOI would otherwise fool a plain search.
    """
    size = len(data)
    width = height = 0
    pos = 2
    while True:
        if pos + 4 > size:
            raise _truncated(input_name, index, "JPEG")
        if data[pos] != 0xFF:
            break  # not a marker where one should be: leave the verdict to the decoder
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte before a marker
            pos += 1
            continue
        if marker in _JPEG_STANDALONE:
            pos += 2
            continue
        if marker == 0xD9:  # EOI before any scan
            break
        (length,) = struct.unpack_from(">H", data, pos + 2)
        end = pos + 2 + length
        if end > size:
            raise _truncated(input_name, index, "JPEG")
        if marker in _JPEG_SOF and length >= 7:
            height, width = struct.unpack_from(">HH", data, pos + 5)
        pos = end
        if marker == 0xDA:  # start of scan: entropy-coded data follows
            break
    if data.rfind(b"\xff\xd9", pos) < 0:  # rfind: the EOI is normally at the very end
        raise _truncated(input_name, index, "JPEG")
    return width, height


def _png_size(input_name: str, index: int, data: bytes) -> tuple[int, int]:
    """Walk the chunks and require an IEND chunk that lies wholly inside the data."""
    size = len(data)
    width = height = 0
    pos = 8
    while True:
        if pos + 8 > size:
            raise _truncated(input_name, index, "PNG")
        length, kind = struct.unpack_from(">I4s", data, pos)
        end = pos + 12 + length
        if end > size:
            raise _truncated(input_name, index, "PNG")
        if kind == b"IHDR" and length >= 8:
            width, height = struct.unpack_from(">II", data, pos + 8)
        elif kind == b"IEND":
            return width, height
        pos = end


def _webp_size(input_name: str, index: int, data: bytes) -> tuple[int, int]:
    """Check the RIFF length and read the canvas size of a VP8/VP8L/VP8X WebP."""
    (riff_size,) = struct.unpack_from("<I", data, 4)
    if len(data) < 8 + riff_size:
        raise _truncated(input_name, index, "WebP")
    chunk = data[12:16]
    if len(data) < 30:
        width = height = 0  # too short for any size field: the decoder will reject it
    elif chunk == b"VP8X":
        width = 1 + int.from_bytes(data[24:27], "little")
        height = 1 + int.from_bytes(data[27:30], "little")
    elif chunk == b"VP8L":
        (bits,) = struct.unpack_from("<I", data, 21)
        width, height = 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
    elif chunk == b"VP8 ":
        w, h = struct.unpack_from("<HH", data, 26)
        width, height = w & 0x3FFF, h & 0x3FFF
    else:
        width = height = 0
    return width, height


def _bmp_size(input_name: str, index: int, data: bytes) -> tuple[int, int]:
    """Read the DIB header size fields; require the pixel data an uncompressed BMP declares."""
    if len(data) < 26:
        raise _truncated(input_name, index, "BMP")
    (pixels_at, header_size) = struct.unpack_from("<II", data, 10)
    if header_size == 12:  # OS/2 BITMAPCOREHEADER: 16-bit sizes
        width, height = struct.unpack_from("<HH", data, 18)
        (bits,), compression = struct.unpack_from("<H", data, 24), 0
    else:
        width, height = struct.unpack_from("<ii", data, 18)
        if len(data) < 34:
            raise _truncated(input_name, index, "BMP")
        bits, compression = struct.unpack_from("<HI", data, 28)
    width, height = abs(width), abs(height)
    # BI_RGB (0) and BI_BITFIELDS (3) store rows of ceil(width * bits / 32) words.
    if compression in (0, 3) and bits:
        row = (width * bits + 31) // 32 * 4
        if len(data) < pixels_at + row * height:
            raise _truncated(input_name, index, "BMP")
    return width, height
