"""An instance_group as it runs on a server's devices (``models.instance_groups.resolved_group``),
as Triton normalises it."""

from __future__ import annotations

import pytest

from oipserve.models.config.parse import InstanceGroup
from oipserve.models.instance_groups import place_groups, resolved_group
from oipserve.models.metadata import MetadataConflict

GPUS = ["cuda:0", "cuda:2"]


@pytest.mark.parametrize(
    ("group", "gpus", "kind", "placed"),
    [
        (InstanceGroup(kind="KIND_AUTO"), GPUS, "KIND_GPU", (0, 2)),
        (InstanceGroup(kind="KIND_AUTO"), [], "KIND_CPU", ()),
        (InstanceGroup(kind="KIND_AUTO", gpus=(2,)), GPUS, "KIND_GPU", (2,)),
        (InstanceGroup(kind="KIND_GPU"), GPUS, "KIND_GPU", (0, 2)),
        (InstanceGroup(kind="KIND_GPU", gpus=(0,)), [], "KIND_GPU", (0,)),
        (InstanceGroup(kind="KIND_CPU"), GPUS, "KIND_CPU", ()),
        (InstanceGroup(kind="KIND_MODEL"), GPUS, "KIND_MODEL", ()),  # as given: no gpus
        (InstanceGroup(kind="KIND_MODEL"), [], "KIND_MODEL", ()),
    ],
)
def test_groups_resolve_as_triton_normalises_them(
    group: InstanceGroup, gpus: list[str], kind: str, placed: tuple[int, ...]
) -> None:
    resolved = resolved_group(group, gpus)
    assert (resolved.kind, resolved.gpus, resolved.count) == (kind, placed, group.count)


def test_auto_naming_gpus_on_a_server_without_any_is_refused() -> None:
    """Triton makes such a group KIND_CPU and refuses it for naming GPUs; it ran on the CPU
    here (found by fuzzing)."""
    with pytest.raises(MetadataConflict, match=r"names GPUs \[0\]; this server runs none"):
        resolved_group(InstanceGroup(kind="KIND_AUTO", gpus=(0,)), [])
    with pytest.raises(MetadataConflict, match="asks for a GPU; this server runs none"):
        resolved_group(InstanceGroup(kind="KIND_GPU"), [])


class _Worker:
    def __init__(self, device: str) -> None:
        self.device = device


def test_a_count_past_the_devices_workers_is_capped_and_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two instances asked of one CPU worker: one, and a warning (Triton makes two; the
    cap went unsaid, and the model's requests ran one after another)."""
    workers = [_Worker("cpu")]
    chosen, _ = place_groups([InstanceGroup(kind="KIND_CPU", count=2)], workers, "m")  # type: ignore[type-var]
    assert chosen == workers
    assert (
        "model 'm': instance_group asks for 2 instances on cpu, which runs 1 worker process: "
        "1 instance (--instances-per-device 2 gives 2)"
    ) in caplog.text
    caplog.clear()
    place_groups([InstanceGroup(kind="KIND_CPU", count=1)], workers, "m")  # type: ignore[type-var]
    assert "instance_group asks" not in caplog.text


@pytest.mark.parametrize(
    ("group", "gpus", "cpu_workers", "count"),
    [
        (InstanceGroup(kind="KIND_CPU", count=0), GPUS, 4, 2),
        (InstanceGroup(kind="KIND_CPU", count=0), GPUS, 1, 1),  # no second worker for it
        (InstanceGroup(kind="KIND_AUTO", count=0), [], 2, 2),  # KIND_CPU here
        (InstanceGroup(kind="KIND_AUTO", count=0), GPUS, 2, 1),  # KIND_GPU here
        (InstanceGroup(kind="KIND_GPU", count=0), GPUS, 2, 1),
        (InstanceGroup(kind="KIND_MODEL", count=0), [], 2, 1),
        (InstanceGroup(kind="KIND_CPU", count=3), [], 1, 3),  # given: as asked
    ],
)
def test_a_group_without_count_gets_tritons_default(
    group: InstanceGroup, gpus: list[str], cpu_workers: int, count: int
) -> None:
    """Triton's SetDefaultInstanceCount: 2 for a KIND_CPU group of its ONNX Runtime backend,
    1 else; here no more on the CPU than the worker processes there (it was 1 always)."""
    assert resolved_group(group, gpus, cpu_workers).count == count


def test_a_default_count_past_the_cpu_workers_is_not_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    workers = [_Worker("cpu")]
    chosen, resolved = place_groups([InstanceGroup(kind="KIND_CPU", count=0)], workers, "m")  # type: ignore[type-var]
    assert chosen == workers and resolved[0].count == 1
    assert "instance_group asks" not in caplog.text
