"""Tests for the image spec (oipserve.wire.images) and OVMS-compatible decoding of encoded
images into model tensors (workers.images).

Fixtures are generated with cv2.imencode; PNG is used wherever exact pixel values matter.
"""

from __future__ import annotations

import struct
from typing import Any, Literal

import cv2
import numpy as np
import pytest

from oipserve.wire.datatypes import split_bytes_elements
from oipserve.wire.images import ImageError, ImageSpec, image_spec_for
from workers.images import decode_batch

RNG = np.random.default_rng(1234)


def _noise(h: int, w: int, c: int | None = 3, dtype: type = np.uint8) -> np.ndarray:
    hi = 65536 if dtype == np.uint16 else 256
    shape = (h, w) if c is None else (h, w, c)
    return RNG.integers(0, hi, shape).astype(dtype)


def _smooth(h: int, w: int) -> np.ndarray:
    """A gradient image: JPEG-friendly, so compression error stays small."""
    yy, xx = np.mgrid[0:h, 0:w]
    return np.dstack(
        [xx * 255 // max(w - 1, 1), yy * 255 // max(h - 1, 1), (xx + yy) % 256]
    ).astype(np.uint8)


def _encode(img: np.ndarray, ext: str = ".png", params: list[int] | None = None) -> bytes:
    ok, buf = cv2.imencode(ext, img, params or [])
    assert ok
    return buf.tobytes()


def _spec(
    h: int = -1,
    w: int = -1,
    c: int = 3,
    dtype: str = "uint8",
    layout: Literal["NHWC", "NCHW"] = "NHWC",
    **kw: Any,
) -> ImageSpec:
    return ImageSpec(layout=layout, height=h, width=w, channels=c, dtype=dtype, **kw)


def _prefixed(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(i)) + i for i in items)


# --- decoding: channel order, grey, alpha, formats -------------------------------------------


def test_png_exact_bgr_by_default() -> None:
    img = _noise(5, 7)
    out = decode_batch("image", [_encode(img)], _spec(5, 7))
    assert out.shape == (1, 5, 7, 3) and out.dtype == np.uint8
    np.testing.assert_array_equal(out[0], img)  # cv2 arrays are BGR, so no swap expected


def test_png_rgb_color_order_reverses_channels() -> None:
    img = _noise(5, 7)
    out = decode_batch("image", [_encode(img)], _spec(5, 7, color_order="RGB"))
    np.testing.assert_array_equal(out[0], img[:, :, ::-1])


def test_single_red_pixel_is_bgr() -> None:
    red_bgr = np.array([[[36, 27, 237]]], dtype=np.uint8)  # the OVMS rgb.jpg value
    out = decode_batch("image", [_encode(red_bgr)], _spec(1, 1))
    assert out.reshape(-1).tolist() == [36, 27, 237]


def test_grey_png_stays_one_channel() -> None:
    grey = _noise(6, 4, c=None)
    out = decode_batch("image", [_encode(grey)], _spec(6, 4, c=1, color_order="RGB"))
    assert out.shape == (1, 6, 4, 1)
    np.testing.assert_array_equal(out[0, :, :, 0], grey)


def test_grey_png_on_three_channel_model_is_rejected() -> None:
    with pytest.raises(ImageError, match=r"element 0 of input 'image' has 1 channel but .* 3"):
        decode_batch("image", [_encode(_noise(6, 4, c=None))], _spec(6, 4, c=3))


def test_colour_png_on_one_channel_model_is_rejected() -> None:
    with pytest.raises(ImageError, match="has 3 channels but the model input takes 1"):
        decode_batch("image", [_encode(_noise(6, 4))], _spec(6, 4, c=1))


def test_rgba_png_keeps_alpha_as_bgra() -> None:
    bgra = _noise(3, 5, c=4)
    out = decode_batch("image", [_encode(bgra)], _spec(3, 5, c=4))
    assert out.shape == (1, 3, 5, 4)
    np.testing.assert_array_equal(out[0], bgra)


def test_rgba_png_rgb_order_swaps_colour_but_not_alpha() -> None:
    bgra = _noise(3, 5, c=4)
    out = decode_batch("image", [_encode(bgra)], _spec(3, 5, c=4, color_order="RGB"))
    np.testing.assert_array_equal(out[0], bgra[:, :, [2, 1, 0, 3]])


def test_rgba_png_on_three_channel_model_is_rejected() -> None:
    png = _encode(_noise(3, 5, c=4))
    with pytest.raises(ImageError, match="element 1 of input 'image' has 4 channels .* takes 3"):
        decode_batch("image", [_encode(_noise(3, 5)), png], _spec(3, 5, c=3))


def test_dynamic_channels_take_the_first_image_and_must_agree() -> None:
    out = decode_batch("image", [_encode(_noise(3, 5, c=4))], _spec(3, 5, c=-1))
    assert out.shape == (1, 3, 5, 4)
    batch = [_encode(_noise(3, 5, c=4)), _encode(_noise(3, 5))]
    with pytest.raises(ImageError, match="element 1 .* has 3 channels but the model input takes 4"):
        decode_batch("image", batch, _spec(3, 5, c=-1))


def test_jpeg_matches_cv2_imdecode_within_tolerance() -> None:
    jpeg = _encode(_smooth(48, 64), ".jpg", [cv2.IMWRITE_JPEG_QUALITY, 90])
    expected = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_UNCHANGED)
    out = decode_batch("image", [jpeg], _spec(48, 64))
    assert out.shape == (1, 48, 64, 3)
    assert np.abs(out[0].astype(int) - expected.astype(int)).max() <= 1


def test_progressive_jpeg_and_trailing_bytes_after_eoi_are_accepted() -> None:
    jpeg = _encode(_smooth(32, 32), ".jpg", [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])
    plain = decode_batch("image", [jpeg], _spec(32, 32))
    trailing = decode_batch("image", [jpeg + b"\x00 vendor trailer"], _spec(32, 32))
    np.testing.assert_array_equal(plain, trailing)


def test_bmp_and_lossless_webp_are_exact() -> None:
    img = _noise(9, 11)
    bmp = _encode(img, ".bmp")
    webp = _encode(img, ".webp", [cv2.IMWRITE_WEBP_QUALITY, 101])  # >100 = lossless
    out = decode_batch("image", [bmp, webp], _spec(9, 11))
    np.testing.assert_array_equal(out[0], img)
    np.testing.assert_array_equal(out[1], img)


def test_other_formats_are_refused() -> None:
    ppm = _encode(_noise(4, 4), ".ppm")
    with pytest.raises(ImageError, match="element 0 of input 'x' is not a JPEG/PNG/BMP/WebP"):
        decode_batch("x", [ppm], _spec(4, 4))


def test_sixteen_bit_png_keeps_depth_and_saturates_like_ovms() -> None:
    img = _noise(4, 6, dtype=np.uint16)
    png = _encode(img)
    np.testing.assert_array_equal(decode_batch("i", [png], _spec(4, 6, dtype="uint16"))[0], img)
    np.testing.assert_array_equal(
        decode_batch("i", [png], _spec(4, 6, dtype="float32"))[0], img.astype(np.float32)
    )
    as_u8 = decode_batch("i", [png], _spec(4, 6, dtype="uint8"))[0]
    np.testing.assert_array_equal(as_u8, np.minimum(img, 255))  # saturate_cast, not wrap-around


def test_uint8_to_int8_saturates() -> None:
    img = np.array([[[0, 127, 200]]], dtype=np.uint8)
    out = decode_batch("i", [_encode(img)], _spec(1, 1, dtype="int8"))
    assert out.reshape(-1).tolist() == [0, 127, 127]


# --- resize, layout, precision, normalisation ------------------------------------------------


def test_resize_to_fixed_224_matches_cv2_inter_linear() -> None:
    img = _noise(300, 200)
    out = decode_batch("image", [_encode(img)], _spec(224, 224))
    expected = cv2.resize(img, (224, 224), interpolation=cv2.INTER_LINEAR)
    assert out.shape == (1, 224, 224, 3)
    np.testing.assert_array_equal(out[0], expected)


def test_resize_uses_width_height_order_and_resizes_each_image() -> None:
    a, b = _noise(30, 40), _noise(17, 9)
    out = decode_batch("image", [_encode(a), _encode(b)], _spec(20, 10))
    assert out.shape == (2, 20, 10, 3)
    np.testing.assert_array_equal(out[0], cv2.resize(a, (10, 20), interpolation=cv2.INTER_LINEAR))
    np.testing.assert_array_equal(out[1], cv2.resize(b, (10, 20), interpolation=cv2.INTER_LINEAR))


def test_resize_grey_keeps_channel_axis() -> None:
    grey = _noise(10, 10, c=None)
    out = decode_batch("image", [_encode(grey)], _spec(5, 7, c=1))
    assert out.shape == (1, 5, 7, 1)
    expected = cv2.resize(grey, (7, 5), interpolation=cv2.INTER_LINEAR)
    np.testing.assert_array_equal(out[0, :, :, 0], expected)


def test_nchw_output_is_the_transpose() -> None:
    imgs = [_noise(6, 8), _noise(6, 8)]
    elements = [_encode(i) for i in imgs]
    nhwc = decode_batch("image", elements, _spec(6, 8))
    nchw = decode_batch("image", elements, _spec(6, 8, layout="NCHW"))
    assert nchw.shape == (2, 3, 6, 8) and nchw.flags.c_contiguous
    np.testing.assert_array_equal(nchw, nhwc.transpose(0, 3, 1, 2))


def test_float32_is_a_plain_cast_without_scaling() -> None:
    img = _noise(4, 5)
    img[0, 0] = [0, 128, 255]
    out = decode_batch("image", [_encode(img)], _spec(4, 5, dtype="float32"))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out[0], img.astype(np.float32))
    assert out.max() == 255.0


def test_float32_resize_casts_before_resizing() -> None:
    img = _noise(31, 23)
    out = decode_batch("image", [_encode(img)], _spec(16, 16, dtype="float32"))
    cast_first = cv2.resize(img.astype(np.float32), (16, 16), interpolation=cv2.INTER_LINEAR)
    np.testing.assert_array_equal(out[0], cast_first)
    resize_first = cv2.resize(img, (16, 16), interpolation=cv2.INTER_LINEAR).astype(np.float32)
    assert not np.array_equal(out[0], resize_first)  # the order is observable


@pytest.mark.parametrize("dtype", ["float16", "int8", "int32", "int16", "uint16", "float64"])
def test_every_supported_dtype_resizes(dtype: str) -> None:
    img = _noise(9, 9) // 2  # < 128 so int8 does not saturate
    out = decode_batch("image", [_encode(img)], _spec(4, 6, dtype=dtype))
    assert out.dtype == np.dtype(dtype) and out.shape == (1, 4, 6, 3)
    ref = cv2.resize(img.astype(np.float32), (6, 4), interpolation=cv2.INTER_LINEAR)
    assert np.abs(out[0].astype(np.float64) - ref).max() <= 1.0
    if dtype in ("int8", "int32"):  # OpenCV cannot resize these: float32 resize, then rounding
        np.testing.assert_array_equal(out[0], np.rint(ref).astype(dtype))


def test_mean_and_scale_are_per_channel_after_rgb_swap() -> None:
    img = _noise(4, 5)
    params = {
        "color_order": "RGB",
        "mean": "123.675, 116.28, 103.53",
        "scale": "[58.395,57.12,57.375]",
    }
    spec = image_spec_for("image", [1, 3, 4, 5], "float32", params)
    out = decode_batch("image", [_encode(img)], spec)
    rgb = img[:, :, ::-1].astype(np.float32)
    mean = np.array([123.675, 116.28, 103.53], np.float32)
    scale = np.array([58.395, 57.12, 57.375], np.float32)
    expected = ((rgb - mean) / scale).transpose(2, 0, 1)
    assert out.shape == (1, 3, 4, 5)
    np.testing.assert_allclose(out[0], expected, rtol=0, atol=1e-6)


def test_single_mean_and_scale_broadcast_and_cast_to_float16() -> None:
    img = _noise(4, 5)
    spec = _spec(4, 5, dtype="float16", mean=(127.5,), scale=(127.5,))
    out = decode_batch("image", [_encode(img)], spec)
    assert out.dtype == np.float16
    expected = ((img.astype(np.float32) - 127.5) / 127.5).astype(np.float16)
    np.testing.assert_array_equal(out[0], expected)
    assert -1.0 <= float(out.min()) and float(out.max()) <= 1.0


def test_mean_count_must_match_dynamic_channels() -> None:
    spec = _spec(4, 5, c=-1, dtype="float32", mean=(1.0, 2.0, 3.0))
    with pytest.raises(
        ImageError, match="has 1-channel images but the model's mean parameter has 3 values"
    ):
        decode_batch("image", [_encode(_noise(4, 5, c=None))], spec)


# --- dynamic sizes and batch -----------------------------------------------------------------


def test_dynamic_hw_keeps_size_when_all_images_agree() -> None:
    imgs = [_noise(10, 12), _noise(10, 12), _noise(10, 12)]
    out = decode_batch("image", [_encode(i) for i in imgs], _spec(-1, -1))
    assert out.shape == (3, 10, 12, 3)
    np.testing.assert_array_equal(out, np.stack(imgs))


def test_dynamic_hw_mixed_sizes_are_rejected() -> None:
    batch = [_encode(_noise(10, 12)), _encode(_noise(12, 10))]
    with pytest.raises(
        ImageError, match=r"element 1 of input 'image' is 12x10 .* element 0 is 10x12"
    ):
        decode_batch("image", batch, _spec(-1, -1))


def test_one_dynamic_dimension_never_resizes() -> None:
    one_by_one = _encode(_noise(1, 1))
    assert decode_batch("image", [one_by_one], _spec(-1, 1)).shape == (1, 1, 1, 3)
    with pytest.raises(ImageError, match=r"is 1x1 \(HxW\) but the model needs 1x4"):
        decode_batch("image", [one_by_one], _spec(-1, 4))


def test_fixed_batch_must_match() -> None:
    png = _encode(_noise(2, 2))
    assert decode_batch("image", [png, png], _spec(2, 2, batch=2)).shape == (2, 2, 2, 3)
    with pytest.raises(ImageError, match="has 2 images but the model takes a batch of exactly 1"):
        decode_batch("image", [png, png], _spec(2, 2, batch=1))


def test_no_images_is_rejected() -> None:
    with pytest.raises(ImageError, match="input 'image' has no images"):
        decode_batch("image", [], _spec(2, 2))


# --- bad bytes -------------------------------------------------------------------------------


@pytest.mark.parametrize("empty", [b"", memoryview(b"")])
def test_empty_element_is_rejected_before_decoding(empty: bytes | memoryview) -> None:
    with pytest.raises(ImageError, match="element 1 of input 'image' is empty"):
        decode_batch("image", [b"INVALID IMAGE", empty], _spec(2, 2))


def test_garbage_bytes_are_not_an_image() -> None:
    with pytest.raises(ImageError, match="element 0 of input 'image' is not a JPEG/PNG/BMP/WebP"):
        decode_batch("image", [b"INVALID IMAGE"], _spec(2, 2))


def test_right_magic_with_corrupt_body_fails_to_decode() -> None:
    png = bytearray(_encode(_noise(8, 8)))
    idat = png.index(b"IDAT")
    png[idat + 4 : idat + 20] = b"\x00" * 16  # break the zlib stream, keep the chunk layout
    with pytest.raises(ImageError, match="could not be decoded as a PNG image"):
        decode_batch("image", [bytes(png)], _spec(8, 8))


@pytest.mark.parametrize("cut", [2, 50, 0.5, 0.9, "header"])
def test_truncated_jpeg_is_detected(cut: float | str) -> None:
    jpeg = _encode(_smooth(64, 64), ".jpg")
    if cut == "header":
        end = 30  # inside the JFIF/quantisation headers
    elif isinstance(cut, int):
        end = len(jpeg) - cut
    else:
        end = int(len(jpeg) * cut)
    with pytest.raises(ImageError, match="element 0 of input 'image' is a truncated JPEG image"):
        decode_batch("image", [jpeg[:end]], _spec(64, 64))


@pytest.mark.parametrize("cut", [4, 12, 0.5, 0.95])
def test_truncated_png_is_detected(cut: float) -> None:
    png = _encode(_noise(16, 16))
    end = len(png) - cut if isinstance(cut, int) else int(len(png) * cut)
    with pytest.raises(ImageError, match="element 0 of input 'image' is a truncated PNG image"):
        decode_batch("image", [png[:end]], _spec(16, 16))


def test_truncated_webp_is_detected() -> None:
    webp = _encode(_noise(16, 16), ".webp")
    with pytest.raises(ImageError, match="truncated WebP image"):
        decode_batch("image", [webp[:-10]], _spec(16, 16))


def test_pixel_limit_is_checked_from_the_header() -> None:
    for ext in (".png", ".jpg", ".bmp", ".webp"):
        data = _encode(_smooth(40, 50), ext)
        assert decode_batch("i", [data], _spec(40, 50), max_pixels=2000).shape == (1, 40, 50, 3)
        with pytest.raises(ImageError, match="is 50x40 pixels, more than the limit of 1999"):
            decode_batch("i", [data], _spec(40, 50), max_pixels=1999)


def test_memoryview_elements_decode_like_bytes() -> None:
    img = _noise(5, 5)
    buf = memoryview(_prefixed(_encode(img), _encode(img)))
    out = decode_batch("image", split_bytes_elements(buf), _spec(5, 5))
    np.testing.assert_array_equal(out, np.stack([img, img]))


# --- layout rule and spec parameters ---------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "layout", "hwc", "batch"),
    [
        ([1, 3, 224, 224], "NCHW", (224, 224, 3), 1),
        ([-1, 1, 28, 28], "NCHW", (28, 28, 1), -1),
        ([1, 3, 224, 4], "NCHW", (224, 4, 3), 1),
        ([1, 224, 224, 3], "NHWC", (224, 224, 3), 1),
        ([8, 28, 28, 1], "NHWC", (28, 28, 1), 8),
        (["-1", -1, -1, 4], "NHWC", (-1, -1, 4), -1),
        ([1, 3, -1, -1], "NCHW", (-1, -1, 3), 1),
    ],
)
def test_layout_detection(
    shape: list[int], layout: str, hwc: tuple[int, int, int], batch: int
) -> None:
    spec = image_spec_for("image", shape, "uint8", {})
    assert spec.layout == layout
    assert (spec.height, spec.width, spec.channels, spec.batch) == (*hwc, batch)
    assert (spec.color_order, spec.mean, spec.scale) == ("BGR", None, None)


@pytest.mark.parametrize(
    "shape", [[1, 3, 3, 3], [1, 1, 8, 1], [1, 4, 8, 4], [1, 224, 224, 224], [1, -1, -1, -1]]
)
def test_ambiguous_or_unrecognised_layout_asks_for_the_parameter(shape: list[int]) -> None:
    with pytest.raises(ImageError, match="set the model parameter `layout`"):
        image_spec_for("image", shape, "uint8", {})


def test_layout_parameter_overrides_detection() -> None:
    assert image_spec_for("i", [1, 3, 3, 3], "uint8", {"layout": "nchw"}).layout == "NCHW"
    spec = image_spec_for("i", [1, 3, 3, 3], "uint8", {"layout": " NHWC "})
    assert (spec.layout, spec.height, spec.width, spec.channels) == ("NHWC", 3, 3, 3)
    with pytest.raises(ImageError, match="layout must be NHWC or NCHW"):
        image_spec_for("i", [1, 3, 3, 3], "uint8", {"layout": "NHWC:NCHW"})


def test_layout_parameter_giving_impossible_channels_is_rejected() -> None:
    with pytest.raises(ImageError, match="has 224 channels; images decode to 1, 3 or 4"):
        image_spec_for("i", [1, 3, 224, 224], "float32", {"layout": "NHWC"})


@pytest.mark.parametrize("shape", [[1, 3, 224], [1, 1, 3, 224, 224], [], [1]])
def test_non_4d_input_is_not_an_image_input(shape: list[int]) -> None:
    with pytest.raises(
        ImageError, match=f"input 'x' is not an image input: it has {len(shape)} dim"
    ):
        image_spec_for("x", shape, "float32", {})


@pytest.mark.parametrize("dtype", ["object", "bool", "int64", "uint64", "complex64", "U8", "nope"])
def test_unsupported_dtype_is_not_an_image_input(dtype: str) -> None:
    with pytest.raises(ImageError, match="input 'x' is not an image input: its element type"):
        image_spec_for("x", [1, 224, 224, 3], dtype, {})


def test_spec_parameters_are_parsed_and_validated() -> None:
    params = {"color_order": "rgb", "mean": "0.5", "scale": "1,2,3"}
    spec = image_spec_for("i", [1, 224, 224, 3], "float32", params)
    assert (spec.color_order, spec.mean, spec.scale) == ("RGB", (0.5,), (1.0, 2.0, 3.0))
    bad = [
        ({"color_order": "RGBA"}, "float32", "color_order must be BGR or RGB"),
        ({"mean": "1,2"}, "float32", "mean has 2 values, expected 1 or 3"),
        ({"mean": "a,b,c"}, "float32", "mean must be comma-separated numbers"),
        ({"scale": "1,nan,1"}, "float32", "scale must be finite"),
        ({"scale": "1,0,1"}, "float32", "scale must not contain 0"),
        ({"mean": "1"}, "uint8", "mean/scale need a floating-point input"),
        # Finite as Python floats, not in the model's type (found by fuzzing: NaN answers).
        ({"mean": "1e39"}, "float32", "mean 1e[+]39 and scale 1 take pixels .* past what float32"),
        ({"scale": "1,1e-50,1"}, "float32", "scale 1e-50 take pixels .* past what float32"),
        ({"scale": "1e-40"}, "float32", "past what float32 holds"),  # subnormal in float32
        ({"mean": "-1e6"}, "float16", "past what float16 holds"),
    ]
    for fits in ({"mean": "0", "scale": "1"}, {"scale": "0.01"}, {"mean": "-60000"}):
        image_spec_for("i", [1, 224, 224, 3], "float16", fits)  # FP16's range holds these
    image_spec_for("i", [1, 224, 224, 3], "float64", {"scale": "1e-300"})
    for params, dtype, message in bad:
        with pytest.raises(ImageError, match=message):
            image_spec_for("i", [1, 224, 224, 3], dtype, params)


def test_zero_dimension_is_rejected() -> None:
    with pytest.raises(ImageError, match="zero dimension"):
        image_spec_for("i", [1, 0, 224, 3], "uint8", {})
