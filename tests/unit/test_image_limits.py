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


def _jpeg(params: list[int], channels: int = 3) -> bytes:
    y, x = np.mgrid[0:120, 0:160]
    noise = np.random.default_rng(1).integers(0, 40, (120, 160, 3))
    img = (np.stack([x, y, x + y], -1) + noise).clip(0, 255).astype(np.uint8)
    ok, buf = cv2.imencode(".jpg", img if channels == 3 else img[:, :, 0], params)
    assert ok
    return buf.tobytes()


@pytest.mark.parametrize(
    "params",
    [
        [],
        [cv2.IMWRITE_JPEG_PROGRESSIVE, 1],
        [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444],
    ],
)
def test_jpeg_pixels_are_opencvs(params: list[int]) -> None:
    jpeg = _jpeg(params)
    expected = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_UNCHANGED)
    np.testing.assert_array_equal(decode_batch("image", [jpeg], SPEC)[0], expected)


def test_grey_jpeg_pixels_are_opencvs() -> None:
    jpeg = _jpeg([], channels=1)
    grey = ImageSpec(layout="NHWC", height=-1, width=-1, channels=1, dtype="uint8")
    expected = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_UNCHANGED)
    np.testing.assert_array_equal(decode_batch("image", [jpeg], grey)[0, :, :, 0], expected)


def test_a_jpeg_whose_scan_ends_early_is_truncated() -> None:
    jpeg = _jpeg([])
    # Cut the scan data in half but keep the end-of-image marker: the container walk sees a
    # whole file, and libjpeg pads the missing rows with grey unless told to be strict.
    cut = jpeg[: len(jpeg) // 2] + b"\xff\xd9"
    with pytest.raises(ImageError, match="element 0 of input 'image' is a truncated JPEG image"):
        decode_batch("image", [cut], SPEC)


def test_other_recoverable_jpeg_damage_is_tolerated_as_opencv_does() -> None:
    jpeg = _jpeg([])
    # Stray bytes before the end-of-image marker: libjpeg warns ("extraneous bytes"), the
    # image is whole, and OpenCV (like OVMS) decodes it.
    damaged = jpeg[:-2] + b"\x00\x00" + jpeg[-2:]
    expected = cv2.imdecode(np.frombuffer(damaged, np.uint8), cv2.IMREAD_UNCHANGED)
    np.testing.assert_array_equal(decode_batch("image", [damaged], SPEC)[0], expected)
