"""Issue #18: images cost what their headers declare, so headers are checked first.

A BMP whose pixel data is shorter than its header declares is refused before OpenCV
allocates the whole image, and the pixel limit holds for a request's images together.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from oipserve.wire.images import ImageError, ImageSpec
from workers.images import DEFAULT_MAX_REQUEST_PIXELS, decode_batch

SPEC = ImageSpec(layout="NHWC", height=-1, width=-1, channels=3, dtype="uint8")


def _bmp(height: int, width: int) -> bytes:
    ok, buf = cv2.imencode(".bmp", np.zeros((height, width, 3), dtype=np.uint8))
    assert ok
    return buf.tobytes()


def test_a_bmp_shorter_than_its_header_declares_is_truncated() -> None:
    whole = _bmp(64, 64)
    assert decode_batch("image", [whole], SPEC).shape == (1, 64, 64, 3)
    with pytest.raises(ImageError, match="element 1 of input 'image' is a truncated BMP image"):
        decode_batch("image", [whole, whole[:-1]], SPEC)


def test_the_pixel_limit_holds_for_the_whole_request() -> None:
    image = _bmp(100, 100)  # 10,000 pixels each
    assert decode_batch("image", [image] * 3, SPEC, max_request_pixels=30_000).shape[0] == 3
    with pytest.raises(ImageError, match="40000 pixels in all, more than the limit of 30000"):
        decode_batch("image", [image] * 4, SPEC, max_request_pixels=30_000)
    assert DEFAULT_MAX_REQUEST_PIXELS == 1 << 26
