"""Image inputs (encoded JPEG/PNG sent as BYTES) end to end, through tritonclient.http and raw
HTTP: exact pixels, resizing, batches, both layouts, RGB + mean/scale, base64 JSON, errors."""

from __future__ import annotations

import base64
import http.client
import json
import re
import struct
import zlib
from collections.abc import Iterator

import cv2
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.server import ServerProcess


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    # NOTE: closed at teardown: the ExceptionInfo of a pytest.raises holds a test's frame,
    #   and so this client, in a cycle; left to the collector, it may be closed in another
    #   thread, where tritonclient's HTTP client fails (gevent).
    with httpclient.InferenceServerClient(server.host_port) as client:
        yield client


def _noise(height: int, width: int, channels: int = 3, seed: int = 0) -> np.ndarray:
    shape = (height, width, channels) if channels > 1 else (height, width)
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def _smooth(height: int, width: int) -> np.ndarray:
    """A gradient image: JPEG keeps it close to the original, unlike noise."""
    y, x = np.mgrid[0:height, 0:width]
    return np.stack([x * 255 // width, y * 255 // height, (x + y) * 127 // (height + width)], -1)


def _encode(ext: str, img: np.ndarray, *params: int) -> bytes:
    ok, buf = cv2.imencode(ext, img.astype(np.uint8), list(params))
    assert ok
    return buf.tobytes()


def _infer(
    client: httpclient.InferenceServerClient,
    model: str,
    images: list[bytes],
    output: str = "pixels",
    binary_data: bool = True,
) -> np.ndarray:
    tensor = httpclient.InferInput("image", [len(images)], "BYTES")
    tensor.set_data_from_numpy(np.array(images, dtype=object), binary_data=binary_data)
    result = client.infer(model, [tensor], outputs=[httpclient.InferRequestedOutput(output)])
    array = result.as_numpy(output)
    assert array is not None
    return array


def _error(client: httpclient.InferenceServerClient, model: str, images: list[bytes]) -> str:
    with pytest.raises(InferenceServerException) as info:
        _infer(client, model, images)
    assert info.value.status() == "400", info.value.message()
    return str(info.value.message())


def _post(
    server: ServerProcess, model: str, body: bytes, header_length: int | None = None
) -> tuple[int, dict[str, object]]:
    headers = {"Content-Type": "application/octet-stream"}
    if header_length is not None:
        headers["Inference-Header-Content-Length"] = str(header_length)
    conn = http.client.HTTPConnection(server.host_port, timeout=30)
    try:
        conn.request("POST", f"/v2/models/{model}/infer", body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def _post_binary(server: ServerProcess, model: str, count: int, blob: bytes) -> tuple[int, str]:
    """A binary-extension request whose BYTES chunk is ``blob`` as given (prefixes included)."""
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "image",
                    "shape": [count],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(blob)},
                }
            ],
            "outputs": [{"name": "mean"}],
        }
    ).encode()
    status, body = _post(server, model, header + blob, len(header))
    return status, str(body.get("error", body))


def _prefixed(*elements: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


# ---- decoding ----------------------------------------------------------------------------------


def test_png_exact_pixels(client: httpclient.InferenceServerClient) -> None:
    img = _noise(224, 224)
    pixels = _infer(client, "image_nhwc_u8", [_encode(".png", img)])
    assert pixels.shape == (1, 224, 224, 3) and pixels.dtype == np.uint8
    np.testing.assert_array_equal(pixels[0], img)  # BGR, as OpenCV decodes: no channel swap
    mean = _infer(client, "image_nhwc_u8", [_encode(".png", img)], output="mean")
    np.testing.assert_allclose(mean[0], img.reshape(-1, 3).mean(axis=0), rtol=1e-5)


def test_png_resized_bilinear(client: httpclient.InferenceServerClient) -> None:
    png = _encode(".png", _noise(80, 100, seed=1))
    decoded = cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_UNCHANGED)
    expected = cv2.resize(decoded, (224, 224), interpolation=cv2.INTER_LINEAR)
    np.testing.assert_array_equal(_infer(client, "image_nhwc_u8", [png])[0], expected)


def test_jpeg_close_to_opencv(client: httpclient.InferenceServerClient) -> None:
    img = _smooth(224, 224)
    jpeg = _encode(".jpg", img, cv2.IMWRITE_JPEG_QUALITY, 90)
    decoded = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    pixels = _infer(client, "image_nhwc_u8", [jpeg])[0].astype(int)
    assert np.abs(pixels - decoded.astype(int)).max() <= 2
    assert np.abs(pixels - img).mean() < 2  # and it is really the image that was sent


def test_batch_of_three_mixed_formats_and_sizes(client: httpclient.InferenceServerClient) -> None:
    a, b, c = _noise(224, 224, seed=2), _noise(50, 60, seed=3), _smooth(224, 224)
    images = [_encode(".png", a), _encode(".png", b), _encode(".jpg", c)]
    pixels = _infer(client, "image_nhwc_u8", images)
    assert pixels.shape == (3, 224, 224, 3)
    np.testing.assert_array_equal(pixels[0], a)
    np.testing.assert_array_equal(pixels[1], cv2.resize(b, (224, 224)))
    decoded_c = cv2.imdecode(np.frombuffer(images[2], np.uint8), cv2.IMREAD_COLOR)
    assert np.abs(pixels[2].astype(int) - decoded_c).max() <= 2


def test_nchw_fp32_transposed_cast_then_resized(client: httpclient.InferenceServerClient) -> None:
    exact, small = _noise(32, 32, seed=4), _noise(20, 24, seed=5)
    pixels = _infer(client, "image_nchw_fp32", [_encode(".png", exact), _encode(".png", small)])
    assert pixels.shape == (2, 3, 32, 32) and pixels.dtype == np.float32
    np.testing.assert_array_equal(pixels[0], exact.transpose(2, 0, 1).astype(np.float32))
    resized = cv2.resize(small.astype(np.float32), (32, 32), interpolation=cv2.INTER_LINEAR)
    np.testing.assert_allclose(pixels[1], resized.transpose(2, 0, 1), atol=1e-4)


def test_rgb_mean_scale_and_free_size(client: httpclient.InferenceServerClient) -> None:
    """image_rgb_fp32: color_order RGB, mean 10, scale 2, H and W free (no resize)."""
    img = _noise(17, 23, seed=6)
    pixels = _infer(client, "image_rgb_fp32", [_encode(".png", img)] * 2)
    assert pixels.shape == (2, 17, 23, 3)
    expected = (img[:, :, ::-1].astype(np.float32) - 10) / 2
    np.testing.assert_array_equal(pixels[0], expected)
    np.testing.assert_array_equal(pixels[1], expected)


def test_base64_json(server: ServerProcess, client: httpclient.InferenceServerClient) -> None:
    img = _noise(224, 224, seed=7)
    text = base64.b64encode(_encode(".png", img)).decode()
    body = {"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES", "data": [text]}]}
    status, reply = _post(server, "image_nhwc_u8", json.dumps(body).encode())
    assert status == 200, reply
    outputs = {o["name"]: o for o in reply["outputs"]}  # type: ignore[union-attr]
    np.testing.assert_allclose(outputs["mean"]["data"], img.reshape(-1, 3).mean(axis=0), rtol=1e-5)
    assert outputs["pixels"]["data"] == img.reshape(-1).tolist()
    # tritonclient's JSON form sends the strings as they are, so base64 works there too.
    tensor = httpclient.InferInput("image", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([text.encode()], dtype=object), binary_data=False)
    result = client.infer("image_nhwc_u8", [tensor])
    np.testing.assert_array_equal(result.as_numpy("pixels")[0], img)


# ---- errors ------------------------------------------------------------------------------------


def test_not_an_image(client: httpclient.InferenceServerClient) -> None:
    message = _error(client, "image_nhwc_u8", [b"this is plain text, not a picture"])
    assert "element 0" in message and "JPEG/PNG" in message


def test_a_broken_png_is_a_400_and_nothing_in_the_servers_log(
    server: ServerProcess, client: httpclient.InferenceServerClient
) -> None:
    """libpng, through OpenCV, printed "[ERROR...] IHDR chunk shall be first" on the
    worker's stderr for this client's mistake."""
    png = _encode(".png", _noise(8, 8))
    broken = png[:12] + b"XXXX" + png[16:]  # the first chunk is no longer IHDR
    # libpng's own lines ("libpng warning: Image width is zero in IHDR", "libpng error:
    # Not enough image data"), which it writes to stderr itself (found by fuzzing)
    no_width = _with_ihdr(png, 0, 8)
    claims_more = _with_ihdr(png, 4096, 4096)  # its pixel data is an 8x8 image's
    logged = len(server.log)
    for bad in (broken, no_width, claims_more):
        assert "element 0" in _error(client, "image_nhwc_u8", [bad])
    assert _infer(client, "image_nhwc_u8", [png]).shape == (1, 224, 224, 3)  # after it
    since = server.log[logged:]
    assert "ERROR" not in since and "libpng" not in since, since


def _with_ihdr(png: bytes, width: int, height: int) -> bytes:
    """``png`` with its IHDR's width and height replaced (and the chunk's CRC made right)."""
    header = bytearray(png[8 : 8 + 25])  # length, "IHDR", 13 bytes of data, CRC
    struct.pack_into(">II", header, 8, width, height)
    struct.pack_into(">I", header, 21, zlib.crc32(bytes(header[4:21])))
    return png[:8] + bytes(header) + png[33:]


def test_empty_element(client: httpclient.InferenceServerClient) -> None:
    png = _encode(".png", _noise(224, 224))
    assert "element 1" in _error(client, "image_nhwc_u8", [png, b""])
    assert "empty" in _error(client, "image_nhwc_u8", [png, b""])


def test_truncated_file(client: httpclient.InferenceServerClient) -> None:
    png = _encode(".png", _noise(224, 224))
    jpeg = _encode(".jpg", _smooth(224, 224))
    assert "truncated" in _error(client, "image_nhwc_u8", [png[: len(png) // 2]])
    assert "truncated" in _error(client, "image_nhwc_u8", [jpeg[: len(jpeg) // 2]])


def test_channel_mismatch(client: httpclient.InferenceServerClient) -> None:
    grey = _encode(".png", _noise(224, 224, channels=1))
    assert "1 channel but the model input takes 3" in _error(client, "image_nhwc_u8", [grey])
    rgba = _encode(".png", _noise(224, 224, channels=4))
    assert "4 channels" in _error(client, "image_nhwc_u8", [rgba])  # alpha is kept, not dropped


def test_different_sizes_without_fixed_size(client: httpclient.InferenceServerClient) -> None:
    images = [_encode(".png", _noise(10, 10)), _encode(".png", _noise(12, 10))]
    assert "same size" in _error(client, "image_rgb_fp32", images)


def test_batch_too_large(client: httpclient.InferenceServerClient) -> None:
    """Any request's batch size check, in Triton's words (the images are its rows)."""
    png = _encode(".png", _noise(8, 8))
    assert _error(client, "image_rgb_fp32", [png] * 3) == (
        "[request id: <id_unknown>] inference request batch-size must be <= 2 for "
        "'image_rgb_fp32': input 'image' has batch size 3"
    )


def test_broken_length_prefixes(server: ServerProcess) -> None:
    png = _encode(".png", _noise(224, 224))
    good = _prefixed(png)
    assert _post_binary(server, "image_nhwc_u8", 1, good)[0] == 200
    cases = {
        "declares": png,  # no prefix: the PNG signature is read as a length
        "cut off": good + b"\x01\x00",
        "only": struct.pack("<I", len(png) + 10) + png,
        "has 2": good + good,  # shape [1] but two elements
    }
    for expected, blob in cases.items():
        status, message = _post_binary(server, "image_nhwc_u8", 1, blob)
        assert status == 400, (expected, message)
        assert "input 'image'" in message and expected in message, (expected, message)


def test_bad_request_shape(server: ServerProcess) -> None:
    png = _encode(".png", _noise(224, 224))
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "image",
                    "shape": [1, 1],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(png) + 4},
                }
            ]
        }
    ).encode()
    status, reply = _post(server, "image_nhwc_u8", header + _prefixed(png), len(header))
    assert status == 400 and "shape [N]" in str(reply["error"])


def test_bad_base64(server: ServerProcess) -> None:
    for data in (["not base64!!"], ["aGVsbG8"], [5]):
        body = {"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES", "data": data}]}
        status, reply = _post(server, "image_nhwc_u8", json.dumps(body).encode())
        assert status == 400, (data, reply)
        assert "base64" in str(reply["error"]), (data, reply)


def test_bytes_to_non_image_input(client: httpclient.InferenceServerClient) -> None:
    tensor = httpclient.InferInput("INPUT0", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([b"abc"], dtype=object))
    with pytest.raises(InferenceServerException) as info:
        client.infer("identity_fp32", [tensor])
    assert info.value.status() == "400"
    assert "BYTES is accepted only for image inputs (4-D)" in str(info.value.message())


def test_grpc_raw_and_bytes_contents(server: ServerProcess) -> None:
    """The same data plane path serves gRPC: length-prefixed raw contents and bytes_contents."""
    import tritonclient.grpc as grpcclient
    from tritonclient.grpc import service_pb2

    match = re.search(r"grpc=(\S+:\d+)", server.log)
    if match is None:
        pytest.skip("the server does not serve gRPC")
    client = grpcclient.InferenceServerClient(match.group(1))
    img = _noise(224, 224, seed=8)
    png = _encode(".png", img)
    tensor = grpcclient.InferInput("image", [2], "BYTES")
    tensor.set_data_from_numpy(np.array([png, png], dtype=object))
    pixels = client.infer("image_nhwc_u8", [tensor]).as_numpy("pixels")
    assert pixels is not None
    np.testing.assert_array_equal(pixels, np.stack([img, img]))

    request = service_pb2.ModelInferRequest(model_name="image_nhwc_u8")
    request.outputs.add().name = "pixels"
    entry = request.inputs.add(name="image", datatype="BYTES", shape=[1])
    entry.contents.bytes_contents.append(png)
    reply = client._client_stub.ModelInfer(request)
    got = np.frombuffer(reply.raw_output_contents[0], np.uint8).reshape(1, 224, 224, 3)
    np.testing.assert_array_equal(got[0], img)

    tensor = grpcclient.InferInput("image", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([b"junk"], dtype=object))
    with pytest.raises(InferenceServerException) as info:
        client.infer("image_nhwc_u8", [tensor])
    assert "INVALID_ARGUMENT" in str(info.value.status())


# ---- what a header declares is what a request costs (issue #18) --------------------------------


def _claiming(jpeg: bytes, height: int, width: int) -> bytes:
    """``jpeg`` with its frame header (SOF) rewritten to declare height x width."""
    data = bytearray(jpeg)
    pos = 2
    while data[pos + 1] not in (0xC0, 0xC1, 0xC2):
        pos += 2 + struct.unpack_from(">H", data, pos + 2)[0]
    struct.pack_into(">HH", data, pos + 5, height, width)
    return bytes(data)


def test_a_small_jpeg_claiming_a_huge_frame_is_refused(
    client: httpclient.InferenceServerClient,
) -> None:
    # 1.4 KB of scan data under a header claiming 8000x8000: OpenCV pads it with grey and
    # returns a 192 MB image; its data ends long before the pixels it declares.
    bomb = _claiming(_encode(".jpg", _smooth(64, 64)), 8000, 8000)
    assert len(bomb) < 4096
    message = _error(client, "image_nhwc_u8", [bomb])
    assert "element 0 of input 'image' is a truncated JPEG image" in message
    assert "premature end" in message
    good = _encode(".jpg", _smooth(224, 224))
    assert _infer(client, "image_nhwc_u8", [good]).shape == (1, 224, 224, 3)


def test_a_bmp_shorter_than_its_header_declares_is_refused(
    client: httpclient.InferenceServerClient,
) -> None:
    bmp = _encode(".bmp", _noise(64, 64))
    assert "element 0 of input 'image' is a truncated BMP image" in _error(
        client, "image_nhwc_u8", [bmp[:-1]]
    )
    assert _infer(client, "image_nhwc_u8", [bmp]).shape == (1, 224, 224, 3)


def test_the_pixel_limit_holds_for_a_whole_request(
    client: httpclient.InferenceServerClient,
) -> None:
    # Two 6000x6000 images: each is under the 64 Mpx limit, together they are over it, and
    # both are refused from their headers (a few KB of PNG each, never decoded).
    big = _encode(".png", np.zeros((6000, 6000), dtype=np.uint8))
    assert len(big) < 200_000
    message = _error(client, "image_nhwc_u8", [big, big])
    assert "has 2 images of 72000000 pixels in all" in message
    assert "per request" in message
