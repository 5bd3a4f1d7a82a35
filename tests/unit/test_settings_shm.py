from __future__ import annotations

import os

import pytest

from oipserve.settings import Settings, SettingsError, load_settings
from oipserve.wire.shm import BufferPool, Segment, SegmentCache, size_class, sweep


def test_flags_beat_environment_beat_defaults() -> None:
    # `--grpc-processes auto` (the default) is 0, Settings' own default.
    env = {
        "OIPSERVE_HTTP_PORT": "9001",
        "OIPSERVE_MODEL_REPOSITORY": "/env",
        "OIPSERVE_INSTANCES_PER_DEVICE": "3",
    }
    command, settings = load_settings(["serve", "--http-port", "0"], env)
    assert command == "serve"
    assert settings == Settings(model_repository="/env", http_port=0, instances_per_device=3)


@pytest.mark.parametrize(
    ("field", "variable", "default"),
    [("busy_poll_us", "OIPSERVE_BUSY_POLL_US", 400),
     ("worker_busy_poll_us", "OIPSERVE_WORKER_BUSY_POLL_US", 250)],
)  # fmt: skip
def test_busy_polling_is_on_by_default_and_off_with_zero(
    field: str, variable: str, default: int
) -> None:
    _, settings = load_settings(["serve", "--model-repository", "x"], {})
    assert getattr(settings, field) == default
    _, settings = load_settings(["serve", "--model-repository", "x"], {variable: "0"})
    assert getattr(settings, field) == 0


@pytest.mark.parametrize(
    ("argv", "env", "fragment"),
    [
        (["serve"], {}, "--model-repository is required"),
        (["serve", "--model-repository", "x", "--http-port", "70000"], {}, "--http-port"),
        (
            ["serve", "--model-repository", "x"],
            {"OIPSERVE_MAX_REQUEST_BYTES": "lots"},
            "OIPSERVE_MAX_REQUEST_BYTES",
        ),
        (
            ["serve", "--model-repository", "x", "--instances-per-device", "0"],
            {},
            "--instances-per-device",
        ),
        (["serve", "--model-repository", "x", "--busy-poll-us", "-1"], {}, "--busy-poll-us"),
        (
            ["serve", "--model-repository", "x", "--worker-busy-poll-us", "100001"],
            {},
            "--worker-busy-poll-us",
        ),
    ],
)
def test_bad_settings_name_the_flag(argv: list[str], env: dict[str, str], fragment: str) -> None:
    with pytest.raises(SettingsError, match=fragment):
        load_settings(argv, env)


def test_size_classes_waste_under_a_quarter() -> None:
    assert size_class(1) == 64 * 1024
    for n in (65537, 100_000, 1 << 20, (1 << 20) + 1, 64 * (1 << 20) + 300):
        assert n <= size_class(n) < n * 1.25 + 1


def test_pool_reuses_and_cleans_up() -> None:
    prefix = f"oipserve-{os.getpid()}-unit-"
    dropped: list[str] = []
    pool = BufferPool(prefix, max_idle_bytes=150_000, on_drop=dropped.append)
    try:
        a = pool.acquire(10)
        a.buf[:3] = b"abc"
        name = a.name
        a.release()
        b = pool.acquire(100)
        assert b.name == name  # reused, same size class
        other = SegmentCache()
        assert bytes(other.get(name).buf[:3]) == b"abc"  # another mapping sees the bytes
        other.close()
        c = pool.acquire(100)
        d = pool.acquire(100)
        for lease in (b, c, d):
            lease.release()
        assert len(dropped) == 1  # the third idle 64 KiB segment exceeds 150 kB
        assert not os.path.exists(f"/dev/shm/{dropped[0]}")
    finally:
        pool.close()
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]


def test_sweep_removes_by_prefix() -> None:
    prefix = f"oipserve-{os.getpid()}-sweep-"
    Segment.create(prefix + "1", 4096).close()
    assert sweep(prefix) == [prefix + "1"]
    assert not os.path.exists(f"/dev/shm/{prefix}1")
