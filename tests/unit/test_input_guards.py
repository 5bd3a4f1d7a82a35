"""Input that ``assert``s used to meet gets its 400, not an AssertionError (a 500, or
nothing at all under ``python -O``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import falcon.asgi
import falcon.testing
import pytest

from hardware import Inventory
from oipserve.errors import InvalidInput, http_status
from oipserve.front.rest.admin import HardwareResource
from oipserve.front.rest.binary import decode_header
from oipserve.management import LoadLimits
from oipserve.management.endpoint_plan import plan_echo, plan_onnx


def test_instances_null_is_refused_for_an_echo_endpoint() -> None:
    with pytest.raises(InvalidInput, match="parameter 'instances' must be a positive integer"):
        plan_echo("echo", {"instances": None}, LoadLimits())


def test_instances_null_is_refused_for_an_onnxruntime_endpoint(tmp_path: Path) -> None:
    def inventory() -> Inventory:
        raise AssertionError("instances is checked before the inventory is read")

    with pytest.raises(InvalidInput, match="parameter 'instances' must be a positive integer"):
        plan_onnx("m", {"model": "m", "instances": None}, inventory, LoadLimits(), tmp_path)


def test_an_absent_instances_is_one() -> None:
    assert plan_echo("echo", {}, LoadLimits()).instances == 1


class _NoManagement:
    """hasHardware must refuse the body before it asks management anything."""

    def has_hardware(self, name: str, num: int) -> bool:
        raise AssertionError("an empty body reached management")


@pytest.mark.parametrize("body", [b"", b" \r\n"])
def test_has_hardware_without_a_body_is_a_400(body: bytes) -> None:
    resource = HardwareResource(_NoManagement())  # type: ignore[arg-type]
    req = falcon.testing.create_asgi_req(body=body, method="POST", path="/v2/hardware")
    with pytest.raises(InvalidInput, match="No JSON body in hasHardware request") as caught:
        asyncio.run(resource.on_post(req, falcon.asgi.Response()))
    assert http_status(caught.value)[0] == 400


def test_a_header_length_past_the_json_names_where_the_json_ended() -> None:
    header = b'{"inputs": []}'
    with pytest.raises(InvalidInput, match="ends before byte 14"):
        decode_header(header + b"junk", len(header) + 4)


def test_trailing_bytes_without_a_header_length_are_a_400() -> None:
    with pytest.raises(InvalidInput):
        decode_header(b'{"inputs": []} junk', None)
