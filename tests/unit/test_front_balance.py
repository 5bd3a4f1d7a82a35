"""``oipserve.scaleout.balance``: the fronts' connection table, the choice of a front, and a
socket handed from one front to another with the bytes the client already sent."""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections.abc import Iterator

import pytest
import uvloop

from oipserve.scaleout.balance import Balancer, LoadTable, balance_address


@pytest.fixture
def table() -> Iterator[LoadTable]:
    made = LoadTable.create(3)
    for front in range(3):
        made.join(front)
    yield made
    made.close()


def test_a_front_keeps_a_connection_unless_it_holds_more_than_another(table: LoadTable) -> None:
    assert table.target(0) is None  # 0, 0, 0: keeping it makes 1, 0, 0
    table.opened(0)
    assert table.target(0) == 1  # 1, 0, 0: keeping it would make 2, 0, 0
    table.opened(1)
    table.opened(2)
    assert table.target(0) is None  # 1, 1, 1
    table.opened(0)
    table.opened(1, -1)
    assert table.target(0) == 1  # the least loaded
    assert table.target(2) == 1


def test_a_front_that_drains_or_died_is_no_target(table: LoadTable) -> None:
    table.opened(0, 5)
    table.leave(1)
    assert table.target(0) == 2
    table.leave(2)
    assert table.target(0) is None


def test_connections_in_flight_count_for_their_target_once(table: LoadTable) -> None:
    table.opened(0, 3)
    table.sent(0, 1)  # handed over, not adopted yet
    assert table.load(1) == 1
    table.adopted(1, 0)
    assert table.load(1) == 1  # now open there, no longer in flight
    table.sent(0, 1)
    table.sent(2, 1)
    assert table.load(1) == 3


def test_a_replacement_starts_empty_whatever_its_predecessor_was_sent(table: LoadTable) -> None:
    table.sent(0, 1, 4)
    table.opened(1, 2)
    table.leave(1)  # it died: what was sent to it is gone with it
    table.join(1)
    assert table.load(1) == 0
    assert table.taking(1)


class _Echo(asyncio.Protocol):
    """The adopting front's protocol: answers what it reads, upper-cased."""

    def __init__(self, made: list[_Echo]) -> None:
        made.append(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data.upper())  # type: ignore[attr-defined]


class _Placing(asyncio.Protocol):
    """The accepting front's protocol: places the connection first."""

    def __init__(self, balancer: Balancer, kept: list[bool]) -> None:
        self._balancer = balancer
        self._kept = kept

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._kept.append(not self._balancer.place(transport))

    def data_received(self, data: bytes) -> None:
        raise AssertionError("a handed-off connection was read here")


async def _handoff() -> None:
    loop = asyncio.get_running_loop()
    prefix = f"test-{uuid.uuid4().hex[:8]}-"
    table = LoadTable.create(2)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    here, there = Balancer(table, 0, prefix, port), Balancer(table, 1, prefix, port)
    made: list[_Echo] = []
    kept: list[bool] = []
    table.join(0)
    there.start(lambda: _Echo(made))
    server = await loop.create_server(lambda: _Placing(here, kept), sock=listener)
    try:
        table.opened(0)  # this front holds one: the next goes to the other
        client = socket.create_connection(("127.0.0.1", port))
        client.sendall(b"sent before the handoff")  # waits in the kernel's buffer
        client.setblocking(False)
        answer = await asyncio.wait_for(loop.sock_recv(client, 100), 10)
        assert answer == b"SENT BEFORE THE HANDOFF"
        assert kept == [False] and len(made) == 1
        assert (table.load(0), table.load(1)) == (1, 1)
        client.close()

        there.close()  # gone: a handoff fails, the connection stays here, counted here
        table.join(1)
        other = socket.create_connection(("127.0.0.1", port))
        while not kept[1:]:
            await asyncio.sleep(0.01)
        assert kept == [False, True]
        assert (table.load(0), table.load(1)) == (2, 0)
        other.close()
    finally:
        server.close()
        here.close()
        table.close()


def test_a_socket_handed_over_keeps_what_the_client_sent_and_a_failed_one_stays() -> None:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_handoff())


async def _stranger() -> None:
    prefix = f"test-{uuid.uuid4().hex[:8]}-"
    table = LoadTable.create(2)
    there = Balancer(table, 1, prefix, 1)
    made: list[_Echo] = []
    there.start(lambda: _Echo(made))
    read, write = os.pipe()
    sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        socket.socket.sendmsg(
            sender,
            [b"\0"],
            [(socket.SOL_SOCKET, socket.SCM_RIGHTS, read.to_bytes(4, "little"))],
            0,
            balance_address(prefix, 1),
        )
        os.close(read)
        await asyncio.sleep(0.05)
        with pytest.raises(BrokenPipeError):  # its copy was closed: no reader is left
            os.write(write, b"x")
        assert made == [] and table.load(1) == 0
    finally:
        sender.close()
        os.close(write)
        there.close()
        table.close()


def test_what_is_not_a_connection_on_the_port_is_closed_not_adopted() -> None:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_stranger())
