"""The load bounds as pure functions, and names given back by failed loads."""

from __future__ import annotations

import pytest

from hardware import Inventory
from hardware.inventory import CpuInfo, GpuInfo
from oipserve.config.settings import load_settings
from oipserve.errors import InvalidInput
from oipserve.management import EndpointNames, LoadLimits, param_key
from oipserve.management.load_limits import check_instances, check_numbers

CPU = CpuInfo("test", 4, 8, 64 * 2**30, 32 * 2**30, usable_cores=8)
GPU = GpuInfo(0, "gpu", "GPU-0", 16 * 2**30, 16 * 2**30, 0, "fake", "fake")


def test_flags_and_environment_become_the_limits() -> None:
    argv = ["serve", "--model-repository", "r", "--max-threads-per-session", "4"]
    env = {"OIPSERVE_LOAD_TIMEOUT": "2.5", "OIPSERVE_MAX_INSTANCES_PER_ENDPOINT": "3"}
    limits = LoadLimits.from_settings(load_settings(argv, env)[1])
    # (mode none, the default, locks the repository API)
    assert limits == LoadLimits(3, 4, 65536, 2.5, repository_control=False)
    explicit = load_settings([*argv, "--model-control-mode", "explicit"], env)[1]
    assert LoadLimits.from_settings(explicit).repository_control


@pytest.mark.parametrize(
    ("params", "device", "message"),
    [
        ({"intra_op_threads": 9}, "cpu", "intra_op_threads 9 is more than this node's 8 logical"),
        ({"inter_op_threads": 5}, "cpu", "inter_op_threads 5 is more than --max-threads-per"),
        ({"batch_size": 101}, "cpu", "batch_size 101 is more than --max-endpoint-batch-size 100"),
    ],
)
def test_numbers_past_a_bound_name_it(params: dict, device: str, message: str) -> None:
    limits = LoadLimits(max_threads_per_session=4, max_endpoint_batch_size=100)
    with pytest.raises(InvalidInput, match=message):
        check_numbers(params, device, Inventory(CPU), {}, limits)
    check_numbers({"intra_op_threads": 4, "batch_size": 100}, device, Inventory(CPU), {}, limits)


def test_gpu_mem_limit_is_bounded_by_the_device_or_the_node() -> None:
    limits = LoadLimits()
    big = {"gpu_mem_limit": str(17 * 2**30)}
    with pytest.raises(InvalidInput, match="the memory of cuda:0"):
        check_numbers({}, "cuda:0", Inventory(CPU, (GPU,)), big, limits)
    with pytest.raises(InvalidInput, match="largest GPU cuda:0"):
        check_numbers({}, "cpu", Inventory(CPU, (GPU,)), big, limits)
    check_numbers({}, "cpu", Inventory(CPU), big, limits)  # below the node's 64 GiB
    with pytest.raises(InvalidInput, match="this node's memory"):
        check_numbers({}, "cpu", Inventory(CPU), {"gpu_mem_limit": str(2**40)}, limits)


def test_instances_on_the_cpu_are_bounded_by_cores_on_a_gpu_by_the_flag() -> None:
    limits = LoadLimits(max_instances_per_endpoint=10)
    with pytest.raises(InvalidInput, match="instances 9 is more than this node's 8"):
        check_instances(9, "cpu", Inventory(CPU), limits)
    check_instances(9, "cuda:0", Inventory(CPU, (GPU,)), limits)
    check_instances(9, "cpu", None, limits)  # echo: no process, only the flag
    with pytest.raises(InvalidInput, match="--max-instances-per-endpoint 10"):
        check_instances(11, "cuda:0", Inventory(CPU, (GPU,)), limits)


def test_a_released_name_is_handed_out_again() -> None:
    names = EndpointNames()
    a, b, c = (param_key("w", {"n": i}) for i in range(3))
    assert names.add("w", a) == "w"
    assert names.add("w", b) == "w-0"
    names.release("w", "w-0")  # the load of b failed
    assert names.add("w", c) == "w-0"
    assert names.add("w", b) == "w-1"
    names.release("w", "w-0")  # not the latest: the counter stays
    assert names.next_name("w") == "w-2"
    names.release("w", "w-1")
    names.release("w", "w")  # every endpoint gone: naming starts over
    assert names.next_name("w") == "w"
