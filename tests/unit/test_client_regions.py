"""Clients' shared-memory regions: key and range checks, the registry, the worker's mappings."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from oipserve.errors import AlreadyExists, Forbidden, InvalidInput, NotFound
from oipserve.request.client_regions import (
    ClientRegions,
    RegionRequest,
    object_name,
    region_parameters,
)
from oipserve.wire.messages import (
    ErrorKind,
    Failed,
    Infer,
    InferDone,
    ObjectRef,
    OutputTarget,
    TensorDesc,
)
from tests.support.worker_replies import only_reply
from workers.regions import RegionCache, RegionError
from workers.runtime import ModelSession
from workers.worker import Worker

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("key", ["/abc", "abc", "/a.b-c_1", "/x.y"])
def test_good_keys(key: str) -> None:
    assert object_name(key) == key.lstrip("/")


@pytest.mark.parametrize(
    "key", ["", "/", "//abc", "/a/b", "a/b", "..", "/..", "/a..b", ".", "a\0b"]
)
def test_bad_keys(key: str) -> None:
    with pytest.raises(InvalidInput, match="not a POSIX shared-memory name"):
        object_name(key)


def test_region_parameters() -> None:
    assert region_parameters("input 'a'", None) is None
    assert region_parameters("input 'a'", {"binary_data_size": 4}) is None
    got = region_parameters(
        "x", {"shared_memory_region": "r", "shared_memory_byte_size": 8, "shared_memory_offset": 4}
    )
    assert got is not None and (got.region, got.byte_size, got.offset) == ("r", 8, 4)
    for params, match in (
        ({"shared_memory_region": "r"}, "both"),
        ({"shared_memory_byte_size": 8}, "both"),
        ({"shared_memory_region": 3, "shared_memory_byte_size": 8}, "region name"),
        ({"shared_memory_region": "r", "shared_memory_byte_size": -1}, "non-negative"),
        ({"shared_memory_region": "r", "shared_memory_byte_size": True}, "non-negative"),
        (
            {
                "shared_memory_region": "r",
                "shared_memory_byte_size": 8,
                "shared_memory_offset": 1.5,
            },
            "non-negative",
        ),
    ):
        with pytest.raises(InvalidInput, match=match):
            region_parameters("input 'a'", params)


async def test_registry_checks(shm_object: str) -> None:
    with pytest.raises(Forbidden, match="--allow-client-shm"):
        await ClientRegions(False, "oipserve-own-").register("r", shm_object, 0, 8)
    regions = ClientRegions(True, "oipserve-own-")
    with pytest.raises(InvalidInput, match="past the end"):
        await regions.register("r", shm_object, 4000, 100)
    with pytest.raises(InvalidInput, match="'/nothing-here-at-all'"):
        await regions.register("r", "/nothing-here-at-all", 0, 8)
    await regions.register("r", shm_object, 96, 1000)
    with pytest.raises(AlreadyExists):
        await regions.register("r", shm_object, 0, 8)
    assert regions.status(None) == [
        {"name": "r", "key": shm_object, "offset": 96, "byte_size": 1000}
    ]
    with pytest.raises(NotFound):
        regions.status("other")
    use = regions.use(RegionRequest("r", 100, 900), "input 'a'")
    assert (use.offset, use.nbytes, use.relative) == (996, 100, 900)
    with pytest.raises(InvalidInput, match="Invalid offset"):
        regions.use(RegionRequest("r", 101, 900), "input 'a'")
    with pytest.raises(InvalidInput, match="Unable to find"):
        regions.use(RegionRequest("q", 1, 0), "input 'a'")
    use.release()
    regions.close()


async def test_own_segments_are_refused(shm_object: str) -> None:
    own = ClientRegions(True, shm_object[1:12])  # the object's name starts with this prefix
    with pytest.raises(InvalidInput, match="own segments"):
        await own.register("r", shm_object, 0, 8)


def test_unregister_of_a_region_in_use_is_deferred(shm_object: str) -> None:
    """Triton's rule (2.53 on): the call returns at once; the region stays listed, usable
    and its name taken until the last request that uses it ends, then it is dropped."""

    async def scenario() -> None:
        regions = ClientRegions(True, "oipserve-own-")
        closed: list[ObjectRef] = []
        regions.on_closed = closed.extend
        await regions.register("r", shm_object, 0, 64)
        first = regions.use(RegionRequest("r", 8, 0), "input 'a'")
        # At once: nothing awaited (before, the call waited for the requests: a timeout).
        assert await asyncio.wait_for(regions.unregister("r"), 5) == ["r"]
        assert [entry["name"] for entry in regions.status(None)] == ["r"]
        with pytest.raises(AlreadyExists, match="shared memory region 'r' already in manager"):
            await regions.register("r", shm_object, 0, 64)
        second = regions.use(RegionRequest("r", 8, 8), "input 'b'")  # still usable (Triton)
        assert await regions.unregister("r") == ["r"]  # again: still deferred, harmless
        first.release()
        first.release()  # twice is harmless
        assert regions.status("r") and closed == []  # the second request still uses it
        waiter = asyncio.ensure_future(regions.idle(["r", "never-there"]))
        await asyncio.sleep(0.01)
        assert not waiter.done()
        second.release()  # the last use: dropped now, before the response is written
        assert regions.status(None) == [] and len(closed) == 1
        await asyncio.wait_for(waiter, 5)
        with pytest.raises(NotFound, match="Unable to find system shared memory region: 'r'"):
            regions.status("r")
        with pytest.raises(InvalidInput, match="Unable to find shared memory region: 'r'"):
            regions.use(RegionRequest("r", 8, 0), "input 'a'")
        await regions.register("r", shm_object, 0, 64)  # the name is free again
        assert await regions.unregister("never-there") == []

    asyncio.run(scenario())


def test_unregister_all_drops_idle_regions_and_defers_the_rest(shm_object: str) -> None:
    async def scenario() -> None:
        regions = ClientRegions(True, "oipserve-own-")
        closed: list[ObjectRef] = []
        regions.on_closed = closed.extend
        for name in ("idle-1", "busy", "idle-2"):
            await regions.register(name, shm_object, 0, 64)
        use = regions.use(RegionRequest("busy", 8, 0), "output 'y'")
        assert await asyncio.wait_for(regions.unregister(None), 5) == ["busy"]
        assert [entry["name"] for entry in regions.status(None)] == ["busy"]
        assert len(closed) == 2  # the idle ones, unmapped in one message
        use.release()
        assert regions.status(None) == [] and len(closed) == 3

    asyncio.run(scenario())


def _ref(key: str) -> ObjectRef:
    info = os.stat("/dev/shm/" + key[1:])
    return ObjectRef(key[1:], info.st_dev, info.st_ino)


def test_region_cache_checks_size_at_each_use_and_is_bounded(shm_object: str) -> None:
    cache = RegionCache(limit=1)
    ref = _ref(shm_object)
    view = cache.view(ref, 0, 4096)
    view[:4] = b"abcd"
    del view
    os.truncate("/dev/shm/" + shm_object[1:], 1024)
    with pytest.raises(RegionError, match="truncated"):
        cache.view(ref, 0, 4096)
    assert bytes(cache.view(ref, 0, 4)) == b"abcd"
    other = ObjectRef(ref.name, ref.dev, ref.ino + 1)
    with pytest.raises(RegionError, match="not the one registered"):
        cache.view(other, 0, 4)
    assert len(cache) == 1
    cache.forget([ref])
    assert len(cache) == 0
    os.unlink("/dev/shm/" + shm_object[1:])
    with pytest.raises(RegionError, match="no longer exists"):
        cache.view(ref, 0, 4)
    cache.close()


def test_worker_reads_in_place_and_onnxruntime_writes_into_the_region(shm_object: str) -> None:
    """Model ``simple`` with inputs and outputs in one client object: no worker segment."""
    ours, theirs = socket.socketpair()
    worker = Worker(theirs, f"oipserve-unit-w{os.getpid()}-")
    try:
        session = _SpiedSession(str(ROOT / "model-repository/simple/1/model.onnx"), 1, [])
        worker.sessions["simple/1"] = session
        ref = _ref(shm_object)
        path = "/dev/shm/" + shm_object[1:]
        with open(path, "r+b") as handle:
            handle.write(np.arange(16, dtype=np.int32).tobytes())
            handle.write(np.full(16, 2, dtype=np.int32).tobytes())
        inputs = [
            TensorDesc("INPUT0", "INT32", [1, 16], "", 0, 64, None, ref),
            TensorDesc("INPUT1", "INT32", [1, 16], "", 64, 64, None, ref),
        ]
        targets = [
            OutputTarget("OUTPUT0", ref, 128, 64, [1, 16]),
            OutputTarget("OUTPUT1", ref, 192, 64, [1, 16]),
        ]
        worker.handle(Infer(1, "simple/1", inputs, ["OUTPUT0", "OUTPUT1"], targets), worker.starter)
        reply = only_reply(worker)
        assert isinstance(reply, InferDone), reply
        assert reply.segment == "" and worker.starter.outputs.leased_count == 0
        assert [(d.name, d.offset, d.nbytes, d.region) for d in reply.outputs] == [
            ("OUTPUT0", 128, 64, ref),
            ("OUTPUT1", 192, 64, ref),
        ]
        data = np.fromfile(path, dtype=np.int32)
        assert (data[32:48] == np.arange(16) + 2).all()
        assert (data[48:64] == np.arange(16) - 2).all()
        # The arrays ONNX Runtime read and wrote were the region itself.
        assert session.calls == ["run_into"]
        pointers = session.pointers
        assert pointers["OUTPUT0"] - pointers["INPUT0"] == 128
        assert pointers["INPUT1"] - pointers["INPUT0"] == 64
    finally:
        worker.close()
        ours.close()
        theirs.close()


class _SpiedSession(ModelSession):
    """A session that counts how each run wrote its outputs (a subclass: the compiled
    ``ModelSession`` takes no method set on an instance)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.calls: list[str] = []
        #: Addresses of the arrays ONNX Runtime read and wrote in the last ``run_into``.
        self.pointers: dict[str, int] = {}

    def run_into(self, names: list[str], feeds: dict, outputs: dict) -> None:
        self.calls.append("run_into")
        self.pointers = {k: v.ctypes.data for k, v in {**feeds, **outputs}.items()}
        super().run_into(names, feeds, outputs)

    def run(self, names: list[str], feeds: dict) -> list[object]:
        self.calls.append("run")
        return super().run(names, feeds)


class _Spied:
    """A worker with one model loaded, counting how each run wrote its outputs."""

    def __init__(self, model: Path, key: str) -> None:
        self.ours, theirs = socket.socketpair()
        self.worker = Worker(theirs, f"oipserve-unit-w{os.getpid()}-")
        self.session = _SpiedSession(str(model), 1, [])
        self.worker.sessions[key] = self.session
        self.key = key
        self.calls = self.session.calls

    @property
    def pointers(self) -> dict[str, int]:
        """Addresses of the arrays ONNX Runtime read and wrote in the last ``run_into``."""
        return self.session.pointers

    def infer(self, inputs: list[TensorDesc], targets: list[OutputTarget]) -> object:
        self.calls.clear()
        names = [t.name for t in targets]
        self.worker.handle(Infer(1, self.key, inputs, names, targets), self.worker.starter)
        return only_reply(self.worker)

    def close(self) -> None:
        self.worker.close()
        self.ours.close()


def test_outputs_of_named_dynamic_dims_are_written_by_onnxruntime_into_the_region(
    shm_object: str,
) -> None:
    """identity_fp32 declares INPUT0 and OUTPUT0 as [batch, n]: the output's shape is
    the input's, known before the run, so ONNX Runtime writes it into the client's
    region itself (no ``run``, no buffer of its own, no segment of the worker's)."""
    ref = _ref(shm_object)
    path = "/dev/shm/" + shm_object[1:]
    data = np.random.default_rng(3).random((3, 100), dtype=np.float32)
    with open(path, "r+b") as handle:
        handle.write(data.tobytes())
    spied = _Spied(ROOT / "model-repository/identity_fp32/1/model.onnx", "identity_fp32/1")
    try:
        inputs = [TensorDesc("INPUT0", "FP32", [3, 100], "", 0, 1200, None, ref)]
        reply = spied.infer(inputs, [OutputTarget("OUTPUT0", ref, 1280, 1300, None)])
        assert isinstance(reply, InferDone), reply
        assert spied.calls == ["run_into"]
        assert spied.pointers["OUTPUT0"] - spied.pointers["INPUT0"] == 1280
        assert reply.segment == "" and spied.worker.starter.outputs.leased_count == 0
        (desc,) = reply.outputs
        assert (desc.shape, desc.offset, desc.nbytes, desc.region) == ([3, 100], 1280, 1200, ref)
        got = np.fromfile(path, dtype=np.float32, count=300, offset=1280).reshape(3, 100)
        assert (got == data).all()
        # A region too small for that shape is refused before the model runs.
        reply = spied.infer(inputs, [OutputTarget("OUTPUT0", ref, 1280, 1196, None)])
        assert isinstance(reply, Failed) and reply.kind == ErrorKind.INVALID_INPUT
        assert "needs 1200 bytes" in reply.message and "the model ran" not in reply.message
        assert spied.calls == []
    finally:
        spied.close()


def test_outputs_whose_dims_do_not_resolve_are_copied_into_the_region(shm_object: str) -> None:
    """reshape's OUTPUT0 is [rows, cols], names no input has: ONNX Runtime allocates the
    output and the worker copies it into the region after the run."""
    ref = _ref(shm_object)
    path = "/dev/shm/" + shm_object[1:]
    with open(path, "r+b") as handle:
        handle.write(np.arange(8, dtype=np.float32).tobytes())
        handle.write(np.array([2, 4], dtype=np.int64).tobytes())
    spied = _Spied(ROOT / "model-repository/reshape/1/model.onnx", "reshape/1")
    try:
        inputs = [
            TensorDesc("DATA", "FP32", [8], "", 0, 32, None, ref),
            TensorDesc("SHAPE", "INT64", [2], "", 32, 16, None, ref),
        ]
        reply = spied.infer(inputs, [OutputTarget("OUTPUT0", ref, 64, 64, None)])
        assert isinstance(reply, InferDone), reply
        assert spied.calls == ["run"]
        assert reply.segment == "" and spied.worker.starter.outputs.leased_count == 0
        (desc,) = reply.outputs
        assert (desc.shape, desc.offset, desc.nbytes) == ([2, 4], 64, 32)
        got = np.fromfile(path, dtype=np.float32, count=8, offset=64)
        assert (got == np.arange(8)).all()
    finally:
        spied.close()


def test_a_graph_whose_dim_names_do_not_hold_falls_back_to_the_copy(
    shm_object: str, tmp_path: Path
) -> None:
    """Y = Concat(X, X) declared [n] like X: bound to [n], ONNX Runtime refuses to write
    the [2n] it makes; the worker runs again the ordinary way, and copies from then on."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n"])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["n"])
    graph = helper.make_graph(
        [helper.make_node("Concat", ["X", "X"], ["Y"], axis=0)], "g", [x], [y]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, tmp_path / "model.onnx")
    ref = _ref(shm_object)
    path = "/dev/shm/" + shm_object[1:]
    with open(path, "r+b") as handle:
        handle.write(np.arange(4, dtype=np.float32).tobytes())
    spied = _Spied(tmp_path / "model.onnx", "concat/1")
    try:
        inputs = [TensorDesc("X", "FP32", [4], "", 0, 16, None, ref)]
        targets = [OutputTarget("Y", ref, 64, 64, None)]
        for calls in (["run_into", "run"], ["run"]):
            with open(path, "r+b") as handle:
                handle.seek(64)
                handle.write(bytes(64))
            reply = spied.infer(inputs, targets)
            assert isinstance(reply, InferDone), reply
            assert spied.calls == calls
            assert reply.outputs[0].shape == [8]
            got = np.fromfile(path, dtype=np.float32, count=8, offset=64)
            assert (got == np.tile(np.arange(4), 2)).all()
            assert not spied.session.dim_names_hold
    finally:
        spied.close()


def test_output_shapes_from_dim_names() -> None:
    simple = ModelSession(str(ROOT / "model-repository/simple/1/model.onnx"), 1, [])
    two = np.zeros((2, 16), dtype=np.int32)
    three = np.zeros((3, 16), dtype=np.int32)
    names = ["OUTPUT0", "OUTPUT1"]
    assert simple.output_shapes(names, {"INPUT0": two, "INPUT1": two}) == {
        "OUTPUT0": [2, 16],
        "OUTPUT1": [2, 16],
    }
    # Two sizes for one name ("batch"): unknown.
    assert simple.output_shapes(names, {"INPUT0": two, "INPUT1": three}) is None
    image = ModelSession(str(ROOT / "model-repository/image_nhwc_u8/1/model.onnx"), 1, [])
    pixels = np.zeros((2, 224, 224, 3), dtype=np.uint8)
    assert image.output_shapes(["mean", "pixels"], {"image": pixels}) == {
        "mean": [2, 3],
        "pixels": [2, 224, 224, 3],
    }
    reshape = ModelSession(str(ROOT / "model-repository/reshape/1/model.onnx"), 1, [])
    feeds = {"DATA": np.zeros(8, np.float32), "SHAPE": np.array([2, 4])}
    assert reshape.output_shapes(["OUTPUT0"], feeds) is None
