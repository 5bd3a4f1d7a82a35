"""Clients' shared memory, issue #35 rows 8 and 9, in process: the bound on registrations,
no descriptor held per region, descriptor exhaustion as 503, and which output ranges
overlap an input's (the worker then copies instead of binding)."""

from __future__ import annotations

import errno
import os

import pytest

from oipserve.errors import InvalidInput, Unavailable, grpc_status, http_status
from oipserve.request.client_regions import ClientRegions, RegionRequest
from oipserve.wire.messages import ObjectRef, OutputTarget, TensorDesc
from workers.regions import overlaps_an_input


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_registrations_are_bounded_and_hold_no_descriptor(shm_object: str) -> None:
    regions = ClientRegions(True, "oipserve-own-", limit=100)
    before = _open_descriptors()
    for index in range(100):
        await regions.register(f"r{index}", shm_object, 0, 4096)
    assert _open_descriptors() == before  # was one more per registration
    with pytest.raises(InvalidInput, match=r"100 regions registered.*--max-shm-regions"):
        await regions.register("one-more", shm_object, 0, 4096)
    await regions.unregister("r7")
    await regions.register("one-more", shm_object, 0, 4096)
    assert len(regions) == 100
    regions.close()


async def test_the_front_reads_and_writes_the_registered_object_only(shm_object: str) -> None:
    """``pread``/``pwrite`` (dynamic batching) open the object by name each time and check
    that it is still the one registered, as a worker does."""
    regions = ClientRegions(True, "oipserve-own-")
    await regions.register("r", shm_object, 0, 4096)
    use = regions.use(RegionRequest("r", 8, 16), "input 'a'")
    use.write(memoryview(b"abcdefgh"))
    got = bytearray(8)
    use.read_into(memoryview(got))
    assert bytes(got) == b"abcdefgh"
    path = "/dev/shm/" + shm_object[1:]
    os.unlink(path)
    with pytest.raises(InvalidInput, match="no longer exists"):
        use.read_into(memoryview(got))
    with open(path, "wb") as handle:  # another object under the same name
        handle.truncate(4096)
    with pytest.raises(InvalidInput, match="not the one registered"):
        use.write(memoryview(b"abcdefgh"))
    use.release()
    regions.close()


def test_out_of_descriptors_is_503_wherever_it_happens() -> None:
    for code in (errno.EMFILE, errno.ENFILE):
        exc = OSError(code, os.strerror(code))
        status, message = http_status(exc)
        assert status == 503 and "file descriptor" in message, (status, message)
        assert grpc_status(exc)[0] == "UNAVAILABLE"
    assert http_status(OSError(errno.EIO, "I/O error"))[0] == 500


async def test_registration_out_of_descriptors_is_503(
    shm_object: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = os.open

    def starved(path: str, flags: int, *args: int) -> int:
        if path.startswith("/dev/shm/"):
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", starved)
    regions = ClientRegions(True, "oipserve-own-")
    with pytest.raises(Unavailable, match="no file descriptor left") as refused:
        await regions.register("r", shm_object, 0, 8)
    assert refused.value.status == 503 and refused.value.retry_after == 1


A = ObjectRef("a", 1, 10)
A_AGAIN = ObjectRef("a-under-another-key", 1, 10)  # a hard link: the same object
B = ObjectRef("b", 1, 11)


def _input(ref: ObjectRef, offset: int, nbytes: int) -> TensorDesc:
    return TensorDesc("in", "INT32", [nbytes // 4], "", offset, nbytes, None, ref)


@pytest.mark.parametrize(
    ("output", "overlaps"),
    [
        (OutputTarget("o", A, 0, 64), True),  # the same bytes
        (OutputTarget("o", A, 32, 64), True),  # in part
        (OutputTarget("o", A, 127, 1), True),  # the last byte
        (OutputTarget("o", A_AGAIN, 100, 8), True),  # the same object, another name
        (OutputTarget("o", A, 128, 64), False),  # right after: touching only
        (OutputTarget("o", A, 0, 0), False),  # no room at all
        (OutputTarget("o", B, 0, 128), False),  # another object
    ],
)
def test_output_ranges_overlapping_an_input(output: OutputTarget, overlaps: bool) -> None:
    inputs = [_input(A, 0, 64), _input(A, 64, 64), TensorDesc("x", "INT32", [1], "seg", 0, 4)]
    assert overlaps_an_input(inputs, [output]) is overlaps
    assert overlaps_an_input([], [output]) is False
