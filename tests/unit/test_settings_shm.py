from __future__ import annotations

import asyncio
import errno
import os

import pytest

from hardware.cpus import fronts_for, usable_cpus
from oipserve.config.settings import (
    GRPC_PROCESSES_DEPRECATED,
    Settings,
    SettingsError,
    deprecation_warnings,
    load_settings,
)
from oipserve.errors import NO_SHARED_MEMORY_MESSAGE, kind_of
from oipserve.wire.messages import ErrorKind
from oipserve.wire.shm import (
    CREATE_IN_THREAD,
    BufferPool,
    Segment,
    SegmentCache,
    size_class,
    sweep,
)


def test_flags_beat_environment_beat_defaults() -> None:
    env = {
        "OIPSERVE_HTTP_PORT": "9001",
        "OIPSERVE_MODEL_REPOSITORY": "/env",
        "OIPSERVE_INSTANCES_PER_DEVICE": "3",
    }
    command, settings = load_settings(["serve", "--http-port", "0"], env)
    assert command == "serve"
    # (--http-workers' default, auto, is resolved from this machine's CPUs)
    assert settings == Settings(
        model_repository="/env",
        http_port=0,
        instances_per_device=3,
        http_workers=fronts_for(usable_cpus()),
    )


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


def test_low_load_colocation_is_off_by_default_and_on_by_flag_or_variable() -> None:
    argv = ["serve", "--model-repository", "x"]
    assert not load_settings(argv, {})[1].low_load_colocation
    assert load_settings([*argv, "--low-load-colocation", "true"], {})[1].low_load_colocation
    on = {"OIPSERVE_LOW_LOAD_COLOCATION": "true"}
    assert load_settings(argv, on)[1].low_load_colocation


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
        # --grpc-processes does nothing now, but keeps its old bounds until it goes.
        (["serve", "--model-repository", "x", "--grpc-processes", "65"], {}, "--grpc-processes"),
        (["serve", "--model-repository", "x", "--grpc-processes", "-1"], {}, "--grpc-processes"),
        (
            ["serve", "--model-repository", "x"],
            {"OIPSERVE_GRPC_PROCESSES": "65"},
            "OIPSERVE_GRPC_PROCESSES",
        ),
    ],
)
def test_bad_settings_name_the_flag(argv: list[str], env: dict[str, str], fragment: str) -> None:
    with pytest.raises(SettingsError, match=fragment):
        load_settings(argv, env)


@pytest.mark.parametrize(
    ("argv", "env", "warned"),
    [
        ([], {}, False),
        (["--grpc-processes", "auto"], {}, False),
        ([], {"OIPSERVE_GRPC_PROCESSES": "auto"}, False),
        (["--grpc-processes", "0"], {}, False),
        (["--grpc-processes", "4"], {}, True),
        ([], {"OIPSERVE_GRPC_PROCESSES": "3"}, True),
        # It used to be refused without gRPC; doing nothing, it conflicts with nothing.
        (["--grpc-processes", "2", "--allow-grpc", "false"], {}, True),
    ],
)
def test_grpc_processes_is_accepted_and_only_warns(
    argv: list[str], env: dict[str, str], warned: bool
) -> None:
    """Deprecated for one release (docs/grpc.md, "History"): accepted from the command line
    and the environment, it starts nothing; a number other than 0 is warned about at start
    (``oipserve.app.server.serve`` logs each of ``deprecation_warnings``)."""
    _, settings = load_settings(["serve", "--model-repository", "x", *argv], env)
    assert deprecation_warnings(settings) == ([GRPC_PROCESSES_DEPRECATED] if warned else [])


def test_the_grpc_processes_warning_names_what_to_use_instead() -> None:
    _, settings = load_settings(["serve", "--model-repository", "x", "--grpc-processes", "4"], {})
    (warning,) = deprecation_warnings(settings)
    assert warning == (
        "--grpc-processes is deprecated and does nothing: gRPC is served by every HTTP front; "
        "use --http-workers N to scale out"
    )


def test_help_text_marks_grpc_processes_deprecated(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        load_settings(["serve", "--help"], {})
    text = " ".join(capsys.readouterr().out.split())
    assert "--grpc-processes N|auto deprecated, does nothing" in text
    assert "default: auto; env OIPSERVE_GRPC_PROCESSES" in text


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


def test_a_segment_its_owner_never_keeps_idle_is_not_kept_mapped() -> None:
    """Past ``keep_up_to`` (the owner's idle cap) a segment is mapped for the use at hand:
    once its owner unlinks it and the last view goes, no page of it is left. A smaller
    one stays mapped for the next use."""
    prefix = f"oipserve-{os.getpid()}-once-"
    pool = BufferPool(prefix, max_idle_bytes=1 << 20)
    peer = SegmentCache(keep_up_to=1 << 20)
    try:
        small, large = pool.acquire(10), pool.acquire(2 << 20)
        assert peer.get(small.name) is peer.get(small.name)  # kept
        view = peer.get(large.name).buf
        assert peer.get(large.name) is not peer.get(large.name)  # mapped each time
        large.release()  # past the pool's cap: unlinked
        assert not os.path.exists(f"/dev/shm/{large.name}")
        del view  # the last view: unmapped (nothing of the peer's holds it)
        peer.forget(large.name)  # (the owner's word, when it comes: nothing to do)
    finally:
        peer.close()
        pool.close()


@pytest.mark.parametrize("in_thread", [False, True])
def test_a_full_dev_shm_drops_the_idle_segments_and_tries_again(
    monkeypatch: pytest.MonkeyPatch, in_thread: bool
) -> None:
    """No room in /dev/shm for a new segment: the pool's idle ones go (their names heard by
    ``on_drop``) and the segment is made again; without idle ones the error is the
    caller's, which the fronts answer 503 (``errors.kind_of``). Idle segments of every
    pool filled a container's /dev/shm, and new requests failed for good (found by
    fuzzing)."""
    prefix = f"oipserve-{os.getpid()}-full-"
    dropped: list[str] = []
    pool = BufferPool(prefix, on_drop=dropped.append)
    fallocate = os.posix_fallocate
    full = [True]

    def no_room_once(fd: int, offset: int, size: int) -> None:
        if full[0] and size > 65536:
            full[0] = False
            raise OSError(errno.ENOSPC, "No space left on device")
        fallocate(fd, offset, size)

    # (what Segment.create calls, compiled or not, looked up on ``os`` each time)
    monkeypatch.setattr(os, "posix_fallocate", no_room_once)
    size = (CREATE_IN_THREAD if in_thread else 1 << 20) + 1
    try:
        idle = pool.acquire(10)
        idle.release()
        lease = asyncio.run(pool.acquire_async(size)) if in_thread else pool.acquire(size)
        assert dropped == [idle.name] and lease.segment.size >= size
        full[0] = True
        with pytest.raises(OSError) as info:  # nothing idle left to drop
            pool.acquire(size + (1 << 22))
        lease.release()
        assert info.value.errno == errno.ENOSPC
        assert kind_of(info.value) == (ErrorKind.UNAVAILABLE, NO_SHARED_MEMORY_MESSAGE)
    finally:
        pool.close()


def test_sweep_removes_by_prefix() -> None:
    prefix = f"oipserve-{os.getpid()}-sweep-"
    Segment.create(prefix + "1", 4096).close()
    assert sweep(prefix) == [prefix + "1"]
    assert not os.path.exists(f"/dev/shm/{prefix}1")
