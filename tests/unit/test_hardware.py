"""Tests for hardware discovery, the fake inventory, and device matching/placement rules."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import msgspec
import psutil
import pytest

from hardware import (
    CpuInfo,
    FakeInventory,
    GpuInfo,
    Inventory,
    InventoryError,
    SystemInventory,
    count_matching,
    cuda_provider_options,
    make_inventory_source,
    parse_devices,
    resolve_device,
    system,
    to_json,
)
from hardware import fake as fake_module

H100 = "NVIDIA H100 80GB HBM3"
GIB = 1024**3

CPU = CpuInfo(
    model_name="Test CPU",
    physical_cores=8,
    logical_cores=16,
    memory_total=64 * GIB,
    memory_available=60 * GIB,
    usable_cores=16,
)


def gpu(index: int, name: str = H100, free: int = 70 * GIB) -> GpuInfo:
    return GpuInfo(
        index=index,
        name=name,
        uuid=f"GPU-{index}",
        memory_total=80 * GIB,
        memory_free=free,
        utilization=0,
        driver_version="550.54.15",
        cuda_version="12.4",
    )


TWO_GPUS = Inventory(cpu=CPU, gpus=(gpu(0, free=10 * GIB), gpu(1, free=50 * GIB)))
NO_GPUS = Inventory(cpu=CPU, gpu_note="NVML unavailable: test")


def write(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data))
    return path


def two_gpu_file(tmp_path: Path, free0: int = 60 * GIB, free1: int = 30 * GIB) -> Path:
    return write(
        tmp_path / "inventory.json",
        {
            "cpu": {"model_name": "Fake EPYC", "logical_cores": 64},
            "gpus": [
                {
                    "name": H100,
                    "uuid": "GPU-aaaa",
                    "memory_total": 80 * GIB,
                    "memory_free": free0,
                    "utilization": 7,
                    "driver_version": "550.54.15",
                    "cuda_version": "12.4",
                },
                {"name": "NVIDIA L40S", "memory_total": 48 * GIB, "memory_free": free1},
            ],
        },
    )


# --- real machine -------------------------------------------------------------------------


def _nvml_device_count() -> int | None:
    """What NVML itself says, or None where it cannot start (this CPU-only box)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError, OSError):
        return None
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


def test_system_inventory_reads_this_machine_without_raising() -> None:
    inv = SystemInventory().read()
    assert inv.cpu.model_name
    assert inv.cpu.logical_cores == psutil.cpu_count(logical=True)
    assert 0 < inv.cpu.physical_cores <= inv.cpu.logical_cores
    assert 0 < inv.cpu.memory_available <= inv.cpu.memory_total
    count = _nvml_device_count()
    if count is None:
        assert inv.gpus == ()
        assert inv.gpu_note.startswith("NVML unavailable:")
        assert inv.device_ids == ("cpu",)
        assert parse_devices(inv, "auto") == ("cpu",)
    else:
        assert len(inv.gpus) == count


def test_system_inventory_reports_missing_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    inv = SystemInventory().read()
    assert inv.gpus == ()
    assert inv.gpu_note.startswith("pynvml not importable")


def test_cpu_model_name_from_proc_cpuinfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Xeon Gold 6338 CPU @ 2.00GHz\n")
    monkeypatch.setattr(system, "_CPUINFO", cpuinfo)
    assert system.read_cpu().model_name == "Xeon Gold 6338 CPU @ 2.00GHz"


def test_cpu_model_name_falls_back_to_platform(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nCPU part\t: 0xd0c\n")  # ARM: no "model name"
    monkeypatch.setattr(system, "_CPUINFO", cpuinfo)
    monkeypatch.setattr(system.platform, "processor", lambda: "Neoverse-N1")
    assert system.read_cpu().model_name == "Neoverse-N1"
    monkeypatch.setattr(system, "_CPUINFO", tmp_path / "missing")
    assert system.read_cpu().model_name == "Neoverse-N1"


def test_physical_cores_unknown_falls_back_to_logical(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(system.psutil, "cpu_count", lambda logical=True: 12 if logical else None)
    cpu = system.read_cpu()
    assert (cpu.physical_cores, cpu.logical_cores) == (12, 12)


@pytest.mark.parametrize(
    ("raw", "text"), [(12040, "12.4"), (11080, "11.8"), (12000, "12.0"), (12090, "12.9")]
)
def test_format_cuda_version(raw: int, text: str) -> None:
    assert system.format_cuda_version(raw) == text


# --- NVML path, with a stand-in pynvml module ------------------------------------------------


class FakeNvml(types.ModuleType):
    """Just enough of pynvml to drive SystemInventory; counts init/shutdown to catch leaks."""

    class NVMLError(Exception):
        pass

    def __init__(
        self,
        fail_init: bool = False,
        fail_memory: bool = False,
        init_error: BaseException | None = None,
        name_error: BaseException | None = None,
    ) -> None:
        super().__init__("pynvml")
        self.fail_init = fail_init
        self.fail_memory = fail_memory
        #: Raised by nvmlInit / nvmlDeviceGetName instead of answering, when given.
        self.init_error = init_error
        self.name_error = name_error
        self.inits = 0
        self.shutdowns = 0

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        if self.fail_init:
            raise self.NVMLError("Driver Not Loaded")
        if self.init_error is not None:
            raise self.init_error
        self.inits += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:  # noqa: N802
        return 12040

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        return index

    def nvmlDeviceGetName(self, handle: int) -> str | bytes:  # noqa: N802
        if self.name_error is not None:
            raise self.name_error
        return H100 if handle == 0 else b"NVIDIA A100-SXM4-40GB"  # old pynvml gave bytes

    def nvmlDeviceGetUUID(self, handle: int) -> str:  # noqa: N802
        return f"GPU-real-{handle}"

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> types.SimpleNamespace:  # noqa: N802
        if self.fail_memory:
            raise self.NVMLError("GPU is lost")
        return types.SimpleNamespace(total=80 * GIB, free=(handle + 1) * GIB, used=0)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> types.SimpleNamespace:  # noqa: N802
        if handle == 1:
            raise self.NVMLError("Not Supported")  # e.g. a MIG-enabled GPU
        return types.SimpleNamespace(gpu=42, memory=3)


def test_system_inventory_reads_gpus_from_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    inv = SystemInventory().read()
    assert inv.gpu_note == ""
    assert inv.gpus == (
        GpuInfo(0, H100, "GPU-real-0", 80 * GIB, 1 * GIB, 42, "550.54.15", "12.4"),
        GpuInfo(
            1, "NVIDIA A100-SXM4-40GB", "GPU-real-1", 80 * GIB, 2 * GIB, None, "550.54.15", "12.4"
        ),
    )
    assert inv.device_ids == ("cpu", "cuda:0", "cuda:1")
    SystemInventory().read()
    assert nvml.inits == nvml.shutdowns == 2


def test_nvml_init_failure_means_no_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml(fail_init=True)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    inv = SystemInventory().read()
    assert inv.gpus == ()
    assert inv.gpu_note == "NVML unavailable: Driver Not Loaded"
    assert nvml.shutdowns == 0


def test_nvml_query_failure_means_no_gpus_and_still_shuts_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nvml = FakeNvml(fail_memory=True)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    inv = SystemInventory().read()
    assert inv.gpus == ()
    assert inv.gpu_note == "NVML query failed: GPU is lost"
    assert nvml.inits == nvml.shutdowns == 1


def test_broken_nvml_library_means_no_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml(init_error=OSError("libnvidia-ml.so.1: undefined symbol"))
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    inv = SystemInventory().read()
    assert inv.gpus == ()
    assert inv.gpu_note == "NVML unavailable: libnvidia-ml.so.1: undefined symbol"


def test_bug_in_gpu_discovery_is_not_hidden_as_no_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only NVML's own errors mean "no GPUs"; a programming error must reach the log."""
    nvml = FakeNvml(name_error=TypeError("unexpected argument"))
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with pytest.raises(TypeError, match="unexpected argument"):
        SystemInventory().read()
    assert nvml.inits == nvml.shutdowns == 1


# --- fake inventory ---------------------------------------------------------------------------


def test_fake_inventory_two_gpus_with_defaults(tmp_path: Path) -> None:
    path = two_gpu_file(tmp_path)
    inv = FakeInventory(path).read()
    assert inv.gpus[0] == GpuInfo(0, H100, "GPU-aaaa", 80 * GIB, 60 * GIB, 7, "550.54.15", "12.4")
    assert inv.gpus[1] == GpuInfo(
        1, "NVIDIA L40S", "GPU-fake-1", 48 * GIB, 30 * GIB, 0, "fake", "fake"
    )
    assert inv.device_ids == ("cpu", "cuda:0", "cuda:1")
    assert str(path) in inv.gpu_note
    # CPU: overrides kept, the rest from the real machine.
    assert (inv.cpu.model_name, inv.cpu.logical_cores) == ("Fake EPYC", 64)
    real = system.read_cpu()
    assert inv.cpu.physical_cores == real.physical_cores
    assert inv.cpu.memory_total == real.memory_total


def test_fake_inventory_minimal_gpu_defaults(tmp_path: Path) -> None:
    path = write(tmp_path / "inv.json", {"gpus": [{}, {"memory_free": 40 * GIB}]})
    first, second = FakeInventory(path).read().gpus
    assert first == GpuInfo(
        0, "NVIDIA Fake GPU", "GPU-fake-0", 16 * GIB, 16 * GIB, 0, "fake", "fake"
    )
    assert (second.memory_total, second.memory_free) == (40 * GIB, 40 * GIB)


def test_fake_inventory_explicit_indices_are_sorted(tmp_path: Path) -> None:
    path = write(tmp_path / "inv.json", {"gpus": [{"index": 3}, {"index": 1}]})
    inv = FakeInventory(path).read()
    assert inv.device_ids == ("cpu", "cuda:1", "cuda:3")
    assert count_matching(inv, "cuda:3") == 1
    assert count_matching(inv, "cuda:0") == 0


def test_fake_inventory_full_cpu_does_not_read_the_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom() -> CpuInfo:
        raise AssertionError("real CPU read although every field was given")

    monkeypatch.setattr(fake_module, "read_cpu", boom)
    path = write(tmp_path / "inv.json", {"cpu": msgspec.to_builtins(CPU)})
    assert FakeInventory(path).read() == Inventory(
        cpu=CPU, gpu_note=f"fake inventory from {path}", simulate_gpu_sessions=True
    )


@pytest.mark.parametrize(
    ("gpu_sessions", "simulated"), [(None, True), ("simulated", True), ("real", False)]
)
def test_fake_inventory_gpu_sessions(
    tmp_path: Path, gpu_sessions: str | None, simulated: bool
) -> None:
    content: dict[str, Any] = {"gpus": [{}]}
    if gpu_sessions is not None:
        content["gpu_sessions"] = gpu_sessions
    inv = FakeInventory(write(tmp_path / "inv.json", content)).read()
    assert inv.simulate_gpu_sessions is simulated


def test_fake_inventory_empty_object_is_cpu_only(tmp_path: Path) -> None:
    inv = FakeInventory(write(tmp_path / "inv.json", {})).read()
    assert inv.gpus == ()
    assert inv.cpu.logical_cores == psutil.cpu_count(logical=True)


def test_fake_inventory_is_reread_and_auto_follows_free_memory(tmp_path: Path) -> None:
    source = make_inventory_source(str(two_gpu_file(tmp_path, free0=60 * GIB, free1=20 * GIB)))
    assert isinstance(source, FakeInventory)
    assert resolve_device(source.read(), "auto") == "cuda:0"
    two_gpu_file(tmp_path, free0=5 * GIB, free1=20 * GIB)
    inv = source.read()
    assert inv.gpus[0].memory_free == 5 * GIB
    assert resolve_device(inv, "auto") == "cuda:1"
    assert resolve_device(inv, "gpu") == "cuda:1"


def test_make_inventory_source_without_path_is_the_system() -> None:
    assert isinstance(make_inventory_source(None), SystemInventory)
    assert isinstance(make_inventory_source(""), SystemInventory)


@pytest.mark.parametrize(
    ("content", "fragments"),
    [
        ("{not json", ["not valid JSON"]),
        ("", ["not valid JSON"]),
        ("[]", ["Expected `object`, got `array`"]),
        (
            '{"gpus": [{}, {"memory_free": "lots"}]}',
            ["`$.gpus[1].memory_free`", "Expected `int", "got `str`"],
        ),
        ('{"gpus": [{"memory_total": -1}]}', ["`$.gpus[0].memory_total`", ">= 0"]),
        ('{"gpus": [{"utilization": 101}]}', ["`$.gpus[0].utilization`", "<= 100"]),
        ('{"gpus": [{"name": 5}]}', ["`$.gpus[0].name`", "Expected `str", "got `int`"]),
        ('{"gpus": [{"memory_fre": 1}]}', ["unknown field `memory_fre`"]),
        ('{"gpus": {"name": "x"}}', ["`$.gpus`", "`array`"]),
        ('{"cpu": {"logical_cores": 0}}', ["`$.cpu.logical_cores`", ">= 1"]),
        (
            '{"cpu": {"physical_cores": true}}',
            ["`$.cpu.physical_cores`", "Expected `int", "got `bool`"],
        ),
        ('{"gpu": []}', ["unknown field `gpu`"]),
        ('{"gpu_sessions": "cuda"}', ["`$.gpu_sessions`", "Invalid enum value 'cuda'"]),
        (
            '{"gpus": [{"memory_total": 10, "memory_free": 11}]}',
            ["gpus[0].memory_free (11) exceeds memory_total (10)"],
        ),
        ('{"gpus": [{}, {"index": 0}]}', ["gpus[1].index 0 is used by another GPU"]),
    ],
)
def test_fake_inventory_rejects_bad_files(
    tmp_path: Path, content: str, fragments: list[str]
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(InventoryError) as info:
        FakeInventory(path).read()
    message = str(info.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message


def test_fake_inventory_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.json"
    with pytest.raises(InventoryError, match="cannot read fake inventory .*absent.json"):
        FakeInventory(path).read()


def test_inventory_error_is_a_value_error() -> None:
    assert issubclass(InventoryError, ValueError)


def test_inventory_is_frozen() -> None:
    with pytest.raises(AttributeError):
        TWO_GPUS.gpus = ()  # type: ignore[misc]


# --- count_matching -----------------------------------------------------------------------


MIXED = Inventory(cpu=CPU, gpus=(gpu(0), gpu(1), gpu(2, name="NVIDIA L4"), gpu(3, name="Tesla T4")))


@pytest.mark.parametrize(
    ("name", "count"),
    [
        ("cpu", 16),
        (" CPU ", 16),
        ("gpu", 4),
        ("cuda", 4),
        ("GPU", 4),
        ("cuda:0", 1),
        ("cuda:3", 1),
        ("CUDA:2", 1),
        ("cuda:4", 0),
        ("cuda:x", 0),
        ("NVIDIA H100 80GB HBM3", 2),
        ("nvidia h100 80gb hbm3", 2),
        ("  h100 80gb hbm3 ", 2),
        ("L4", 1),
        ("nvidia l4", 1),
        ("tesla t4", 1),
        ("T4", 0),  # only a leading "NVIDIA " may be dropped
        ("H100", 0),  # prefixes do not match
        ("NVIDIA", 0),
        ("rocm", 0),
        ("DPUCADF8H", 0),
        ("", 0),
        ("   ", 0),
    ],
)
def test_count_matching(name: str, count: int) -> None:
    assert count_matching(MIXED, name) == count


def test_count_matching_without_gpus() -> None:
    assert [count_matching(NO_GPUS, n) for n in ("gpu", "cuda", "cuda:0", H100)] == [0, 0, 0, 0]
    assert count_matching(NO_GPUS, "cpu") == 16


# --- parse_devices ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "devices"),
    [
        ("auto", ("cuda:0", "cuda:1")),
        (" AUTO ", ("cuda:0", "cuda:1")),
        ("cpu", ("cpu",)),
        ("cuda:0", ("cuda:0",)),
        ("cuda:1,cuda:0", ("cuda:1", "cuda:0")),
        ("cpu, cuda:0", ("cpu", "cuda:0")),
        ("CUDA:1", ("cuda:1",)),
    ],
)
def test_parse_devices(spec: str, devices: tuple[str, ...]) -> None:
    assert parse_devices(TWO_GPUS, spec) == devices


def test_parse_devices_auto_without_gpus_is_cpu() -> None:
    assert parse_devices(NO_GPUS, "auto") == ("cpu",)


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("cuda:7", "device 'cuda:7' in --devices 'cuda:7' does not exist"),
        ("cpu,cuda:2", "device 'cuda:2'"),
        ("cuda:0,cuda:0", "device 'cuda:0' is listed twice"),
        ("cuda:1,cuda:01", "device 'cuda:1' is listed twice"),
        ("cpu,cpu", "device 'cpu' is listed twice"),
        ("cuda:0,", "empty device"),
        (",cpu", "empty device"),
        ("", "empty device"),
        ("tpu", "unknown device 'tpu'"),
        ("gpu", "unknown device 'gpu'"),
        ("cuda:-1", "unknown device 'cuda:-1'"),
        ("auto,cpu", "'auto' cannot be combined"),
    ],
)
def test_parse_devices_errors(spec: str, fragment: str) -> None:
    with pytest.raises(InventoryError) as info:
        parse_devices(TWO_GPUS, spec)
    assert fragment in str(info.value)


def test_parse_devices_error_lists_what_exists() -> None:
    with pytest.raises(InventoryError, match=r"available: cpu, cuda:0, cuda:1\)"):
        parse_devices(TWO_GPUS, "cuda:7")
    with pytest.raises(InventoryError, match=r"'cuda:0'.*available: cpu\)"):
        parse_devices(NO_GPUS, "cuda:0")


# --- resolve_device -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "device"),
    [
        ("cpu", "cpu"),
        ("cuda:0", "cuda:0"),
        (" CUDA:1 ", "cuda:1"),
        ("gpu", "cuda:1"),  # cuda:1 has 50 GiB free, cuda:0 10 GiB
        ("cuda", "cuda:1"),
        ("auto", "cuda:1"),
    ],
)
def test_resolve_device(spec: str, device: str) -> None:
    assert resolve_device(TWO_GPUS, spec) == device


def test_resolve_device_tie_goes_to_lowest_index() -> None:
    inv = Inventory(cpu=CPU, gpus=(gpu(0, free=GIB), gpu(1, free=9 * GIB), gpu(2, free=9 * GIB)))
    assert resolve_device(inv, "auto") == "cuda:1"


def test_resolve_device_without_gpus() -> None:
    assert resolve_device(NO_GPUS, "auto") == "cpu"
    assert resolve_device(NO_GPUS, "cpu") == "cpu"
    for spec in ("gpu", "cuda"):
        with pytest.raises(InventoryError, match="needs a GPU .* none: NVML unavailable: test"):
            resolve_device(NO_GPUS, spec)
    with pytest.raises(InventoryError, match=r"'cuda:0' .* does not exist .*available: cpu\)"):
        resolve_device(NO_GPUS, "cuda:0")


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("cuda:7", "'cuda:7' in device request 'cuda:7' does not exist"),
        ("", "unknown device ''"),
        ("npu", "unknown device 'npu'"),
        ("cpu,cuda:0", "unknown device 'cpu,cuda:0'"),
    ],
)
def test_resolve_device_errors(spec: str, fragment: str) -> None:
    with pytest.raises(InventoryError) as info:
        resolve_device(TWO_GPUS, spec)
    assert fragment in str(info.value)


# --- to_json ------------------------------------------------------------------------------


def test_to_json_keys_devices_by_id() -> None:
    data = to_json(TWO_GPUS)
    assert json.loads(json.dumps(data)) == data
    assert list(data["devices"]) == ["cpu", "cuda:0", "cuda:1"]
    assert data["devices"]["cpu"] == {"id": "cpu", "kind": "cpu", **msgspec.to_builtins(CPU)}
    assert data["devices"]["cuda:1"] == {
        "id": "cuda:1",
        "kind": "gpu",
        "index": 1,
        "name": H100,
        "uuid": "GPU-1",
        "memory_total": 80 * GIB,
        "memory_free": 50 * GIB,
        "utilization": 0,
        "driver_version": "550.54.15",
        "cuda_version": "12.4",
    }
    assert data["gpu_note"] == ""
    assert to_json(NO_GPUS)["gpu_note"] == "NVML unavailable: test"
    assert list(to_json(NO_GPUS)["devices"]) == ["cpu"]


# --- cuda_provider_options -------------------------------------------------------------------


def test_cuda_provider_options_device_only() -> None:
    assert cuda_provider_options(1, {}) == {"device_id": "1"}
    assert cuda_provider_options(0, {"max_batch_size": "8"}) == {"device_id": "0"}


def test_cuda_provider_options_all_settings() -> None:
    settings = {
        "gpu_mem_limit": " 2147483648 ",
        "arena_extend_strategy": "kSameAsRequested",
        "cudnn_conv_algo_search": "HEURISTIC",
        "do_copy_in_default_stream": "False",
        "unrelated": "ignored",
    }
    assert cuda_provider_options(3, settings) == {
        "device_id": "3",
        "gpu_mem_limit": "2147483648",
        "arena_extend_strategy": "kSameAsRequested",
        "cudnn_conv_algo_search": "HEURISTIC",
        "do_copy_in_default_stream": "0",
    }
    assert cuda_provider_options(0, {"arena_extend_strategy": "kNextPowerOfTwo"}) == {
        "device_id": "0",
        "arena_extend_strategy": "kNextPowerOfTwo",
    }
    assert (
        cuda_provider_options(0, {"do_copy_in_default_stream": "true"})["do_copy_in_default_stream"]
        == "1"
    )
    # Triton's onnxruntime backend numbers them (its README's example: "0"); they were
    # refused, so a Triton repository's GPU model did not load (found by fuzzing).
    triton = {"cudnn_conv_algo_search": "0", "arena_extend_strategy": "1"}
    assert cuda_provider_options(0, triton) == {
        "device_id": "0",
        "cudnn_conv_algo_search": "EXHAUSTIVE",
        "arena_extend_strategy": "kSameAsRequested",
    }
    assert cuda_provider_options(0, {"cudnn_conv_algo_search": "2"})["cudnn_conv_algo_search"] == (
        "DEFAULT"
    )


@pytest.mark.parametrize(
    ("index", "settings", "fragment"),
    [
        (-1, {}, "GPU index must be >= 0"),
        (0, {"gpu_mem_limit": "0"}, "gpu_mem_limit must be a positive number of bytes"),
        (0, {"gpu_mem_limit": "-5"}, "gpu_mem_limit"),
        (0, {"gpu_mem_limit": "2GB"}, "'2GB'"),
        (0, {"gpu_mem_limit": "1e9"}, "'1e9'"),
        (0, {"gpu_mem_limit": "²"}, "gpu_mem_limit"),
        (0, {"gpu_mem_limit": str(2**64)}, "gpu_mem_limit"),
        (0, {"arena_extend_strategy": "knextpoweroftwo"}, "arena_extend_strategy must be one of"),
        (0, {"arena_extend_strategy": "kSameAsRequested,"}, "kNextPowerOfTwo, kSameAsRequested"),
        (0, {"cudnn_conv_algo_search": "fast"}, "cudnn_conv_algo_search must be one of"),
        (0, {"cudnn_conv_algo_search": "3"}, "Triton's number for one: 0 (EXHAUSTIVE)"),
        (0, {"arena_extend_strategy": "-1"}, "1 (kSameAsRequested); got '-1'"),
        (0, {"do_copy_in_default_stream": "yes"}, "do_copy_in_default_stream must be 1, 0"),
    ],
)
def test_cuda_provider_options_errors(index: int, settings: dict[str, str], fragment: str) -> None:
    with pytest.raises(InventoryError) as info:
        cuda_provider_options(index, settings)
    assert fragment in str(info.value)
