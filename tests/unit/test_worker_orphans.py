"""A worker never outlives its front (issue #35, row 2): ``workers.heartbeat``, on real
processes. The whole server is in tests/e2e/test_worker_supervision.py."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.server import ROOT, wait_for
from workers.heartbeat import EXIT_ORPHANED, ORPHAN_GRACE

#: A worker stand-in: dies with its parent, then waits.
ARMED = """
import sys, time
from workers.heartbeat import die_with_front
die_with_front(int(sys.argv[1]))
print("armed", flush=True)
time.sleep(120)
"""

#: A front stand-in: starts ARMED and waits to be killed.
FRONT = f"""
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", {ARMED!r}, str(os.getpid())])
print(child.pid, flush=True)
time.sleep(120)
"""

#: A worker stand-in answering heartbeats on fd argv[1]; its main thread sleeps, or spins
#: with SIGTERM ignored (a main thread that never gets to drain).
BEATING = """
import signal, socket, sys, time
from workers.heartbeat import start_heartbeat
start_heartbeat(socket.socket(fileno=int(sys.argv[1])))
if sys.argv[2] == "spin":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("beating", flush=True)
while sys.argv[2] == "spin":
    pass
time.sleep(120)
"""


def python(code: str, *args: str, **kwargs: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        **kwargs,  # type: ignore[call-overload]
    )


def running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_worker_whose_front_is_already_gone_exits_at_once() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait(30)
    child = python(ARMED, str(gone.pid))  # a front that died before the worker ran
    assert child.wait(30) == EXIT_ORPHANED
    assert child.stdout is not None and child.stdout.read() == ""
    child.stdout.close()


def test_a_worker_dies_with_its_front() -> None:
    front = python(FRONT)
    assert front.stdout is not None
    worker = int(front.stdout.readline())
    try:
        assert front.stdout.readline().strip() == "armed"
        front.kill()
        front.wait(10)
        assert wait_for(lambda: not running(worker), 5)
    finally:
        front.kill()
        if running(worker):
            os.kill(worker, signal.SIGKILL)
        front.stdout.close()


@pytest.mark.parametrize(
    ("main_thread", "status", "within"),
    [("sleep", -signal.SIGTERM, 5.0), ("spin", EXIT_ORPHANED, ORPHAN_GRACE + 10.0)],
)
def test_a_worker_whose_heartbeat_socket_closes_exits(
    main_thread: str, status: int, within: float
) -> None:
    ours, theirs = socket.socketpair()
    worker = python(BEATING, str(theirs.fileno()), main_thread, pass_fds=(theirs.fileno(),))
    theirs.close()
    try:
        assert worker.stdout is not None and worker.stdout.readline().strip() == "beating"
        ours.sendall(b".")
        assert ours.recv(8) == b"."  # it answers while its front is there
        started = time.monotonic()
        ours.close()
        assert worker.wait(within) == status
        assert time.monotonic() - started < within
    finally:
        ours.close()
        worker.kill()
        worker.wait(10)
        if worker.stdout is not None:
            worker.stdout.close()
