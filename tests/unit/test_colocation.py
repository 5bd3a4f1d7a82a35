"""When a worker runs on its front's CPU (``workers.colocation``) and its front follows
(``oipserve.runtime.colocation``): the policies, with the affinity calls faked; and
``cpu_of`` on this process."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from oipserve.runtime.colocation import FrontAffinity
from workers.colocation import (
    ENTER_TURNS,
    IDLE_UNPIN,
    LOOK_TURNS,
    MAX_RUN_NS,
    Colocation,
    cpu_of,
)

ROOT = Path(__file__).resolve().parents[2]
FRONT = 4242
OTHER_FRONT = 4343


class Affinity:
    """The fakes: where each front runs, and every pinning asked for."""

    def __init__(self) -> None:
        self.fronts = {FRONT: 1, OTHER_FRONT: 0}
        self.pinned: list[set[int]] = []
        #: CPUs other processes of the server are pinned to.
        self.taken: set[int] = set()

    def colocation(self, enabled: bool = True, spread: set[int] | None = None) -> Colocation:
        return Colocation(
            enabled,
            {0, 1} if spread is None else spread,
            self.pinned.append,
            self.fronts.get,
            lambda: self.taken,
        )


def light(colocation: Colocation, turns: int, front: int = FRONT) -> None:
    for _ in range(turns):
        colocation.turn(front, 1, True)


def test_a_run_of_light_turns_pins_the_worker_to_its_fronts_cpu() -> None:
    fake = Affinity()
    colocation = fake.colocation()
    light(colocation, ENTER_TURNS - 1)
    assert colocation.pinned_to is None and not fake.pinned
    light(colocation, 1)
    assert colocation.pinned_to == 1 and fake.pinned == [{1}]


def test_two_requests_in_a_turn_give_back_every_cpu_at_once() -> None:
    fake = Affinity()
    colocation = fake.colocation()
    light(colocation, ENTER_TURNS)
    colocation.turn(FRONT, 2, True)
    assert colocation.pinned_to is None and fake.pinned == [{1}, {0, 1}]
    light(colocation, ENTER_TURNS - 1)  # the count starts again
    assert colocation.pinned_to is None


def test_a_request_sent_while_its_front_had_others_in_flight_is_not_light_load() -> None:
    fake = Affinity()
    colocation = fake.colocation()
    for _ in range(ENTER_TURNS * 2):
        colocation.turn(FRONT, 1, False)
    assert colocation.pinned_to is None and not fake.pinned


def test_requests_from_another_front_end_the_colocation() -> None:
    fake = Affinity()
    colocation = fake.colocation()
    light(colocation, ENTER_TURNS)
    light(colocation, 1, OTHER_FRONT)
    assert colocation.pinned_to is None and fake.pinned == [{1}, {0, 1}]
    colocation.turn(0, 2, True)  # a turn with both fronts' requests
    light(colocation, ENTER_TURNS, OTHER_FRONT)
    assert colocation.pinned_to == 0


def test_long_model_runs_keep_every_cpu() -> None:
    fake = Affinity()
    colocation = fake.colocation()
    for _ in range(40):
        colocation.ran(MAX_RUN_NS * 3)
    light(colocation, ENTER_TURNS * 2)
    assert colocation.pinned_to is None and not fake.pinned
    light(colocation, 1)
    colocation.typical_run = 0.0
    light(colocation, ENTER_TURNS)
    assert colocation.pinned_to == 1


def test_the_worker_follows_its_front_when_the_front_moves() -> None:
    fake = Affinity()
    colocation = fake.colocation()
    light(colocation, ENTER_TURNS)
    fake.fronts[FRONT] = 0
    light(colocation, LOOK_TURNS)
    assert colocation.pinned_to == 0 and fake.pinned == [{1}, {0}]


def test_nothing_is_pinned_when_off_on_one_cpu_or_to_a_cpu_not_ours() -> None:
    fake = Affinity()
    for colocation in (fake.colocation(enabled=False), fake.colocation(spread={1})):
        light(colocation, ENTER_TURNS * 2)
        assert colocation.pinned_to is None
    fake.fronts[FRONT] = 7  # the front runs where this worker may not
    colocation = fake.colocation()
    light(colocation, ENTER_TURNS * 2)
    assert colocation.pinned_to is None and not fake.pinned


def test_a_pinned_worker_left_idle_gives_back_every_cpu_and_counts_again() -> None:
    """Its client went away, or its requests go to another instance: a pinned worker sleeps
    at most IDLE_UNPIN, then takes back its CPUs; pinning again takes a whole run of
    light turns (not the next look, LOOK_TURNS on)."""
    fake = Affinity()
    colocation = fake.colocation()
    assert colocation.sleep_limit() is None  # not pinned: it sleeps until a request
    light(colocation, ENTER_TURNS)
    assert colocation.pinned_to == 1 and colocation.sleep_limit() == IDLE_UNPIN
    colocation.idled()
    assert colocation.pinned_to is None and fake.pinned == [{1}, {0, 1}]
    assert colocation.sleep_limit() is None
    light(colocation, ENTER_TURNS - 1)
    assert colocation.pinned_to is None
    light(colocation, 1)
    assert colocation.pinned_to == 1


def test_turns_without_an_infer_change_nothing() -> None:
    fake = Affinity()
    colocation = fake.colocation()
    light(colocation, ENTER_TURNS - 1)
    colocation.turn(0, 0, False)  # a Release, a heartbeat
    light(colocation, 1)
    assert colocation.pinned_to == 1


def test_cpu_of_reads_where_a_process_runs() -> None:
    assert cpu_of(os.getpid()) in os.sched_getaffinity(0)
    assert cpu_of(2**22 + 1) is None  # past pid_max: no such process


def test_a_cpu_another_pair_is_pinned_to_is_left_alone_until_it_is_free() -> None:
    fake = Affinity()
    fake.taken = {1}  # another worker (or its front) is pinned where our front runs
    colocation = fake.colocation()
    light(colocation, ENTER_TURNS + LOOK_TURNS - 1)
    assert colocation.pinned_to is None and not fake.pinned
    fake.taken = set()
    light(colocation, 1)  # looked at again only every LOOK_TURNS
    assert colocation.pinned_to == 1 and fake.pinned == [{1}]


def test_pinned_siblings_are_the_cpus_of_our_parents_other_children_but_fronts() -> None:
    """This test process stands for the primary front: one child pinned to a CPU, one not,
    and a third child asking. A pinned child that is one of the asking worker's fronts is
    left out: a front stays pinned after its client left, until its next reply."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two usable CPUs")
    sleepers = [subprocess.Popen(["sleep", "30"]) for _ in range(2)]
    try:
        os.sched_setaffinity(sleepers[0].pid, {cpus[-1]})
        ask = "from workers.colocation import pinned_siblings; print(sorted(pinned_siblings(())))"
        asked = subprocess.run(
            [sys.executable, "-c", ask], capture_output=True, text=True, cwd=ROOT
        )
        assert asked.stdout.strip() == str([cpus[-1]]), asked.stderr
        ask = ask.replace("pinned_siblings(())", f"pinned_siblings({{{sleepers[0].pid}}})")
        asked = subprocess.run(
            [sys.executable, "-c", ask], capture_output=True, text=True, cwd=ROOT
        )
        assert asked.stdout.strip() == "[]", asked.stderr
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()


def test_the_front_follows_its_worker_and_comes_back() -> None:
    pinned: list[set[int]] = []
    affinity = FrontAffinity({0, 1}, pinned.append)
    affinity.follow(-1)  # not pinned, and no worker pinned: nothing to do
    affinity.follow(1)
    affinity.follow(1)  # every reply says so: one system call for all
    assert affinity.pinned_to == 1 and pinned == [{1}]
    affinity.follow(-1)
    assert affinity.pinned_to is None and pinned == [{1}, {0, 1}]
    affinity.follow(5)  # a CPU this front may not use: stays spread
    assert affinity.pinned_to is None and pinned == [{1}, {0, 1}]


def test_a_front_that_cannot_pin_stays_as_it_is() -> None:
    def refuse(cpus: set[int]) -> None:
        raise OSError(22, "Invalid argument")

    affinity = FrontAffinity({0, 1}, refuse)
    affinity.follow(1)
    assert affinity.pinned_to is None


@pytest.mark.parametrize("cpu", [0, 1])
def test_the_front_pins_only_its_own_thread_to_a_real_cpu(cpu: int) -> None:
    """The real call, on a thread of this test (restored after)."""
    result: list[set[int]] = []

    def run() -> None:
        affinity = FrontAffinity()
        if cpu not in affinity.spread:
            result.append(set())
            return
        affinity.follow(cpu)
        result.append(set(os.sched_getaffinity(0)))
        affinity.follow(-1)
        result.append(set(os.sched_getaffinity(0)))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if result == [set()]:
        pytest.skip(f"CPU {cpu} is not usable here")
    assert result[0] == {cpu} and result[1] == set(os.sched_getaffinity(0))
