"""An idle connection costs the asyncio server little memory: no receive
buffer waits with each read (one is made when bytes arrive), and a wait's
timeout is a timer handle, not a task."""

from __future__ import annotations

import asyncio
import socket
import time
import tracemalloc

import pytest

from binproto.adapters._server import Timeouts, V2Server
from binproto.adapters.asyncio import close_server, start_server
from tests.test_timeouts import _asyncio_server, _connect

GET_LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
COUNT = 200


def _open(port: int, request: bool) -> list[socket.socket]:
    socks = []
    for _ in range(COUNT):
        sock = _connect(port)
        if request:
            sock.sendall(GET_LIVE)
            assert sock.recv(1024).startswith(b"HTTP/1.1 200 ")
        socks.append(sock)
    return socks


# The default transport is held to 8 KiB; asyncio's streams (``zero_copy=False``)
# bring their own reader, writer and protocol objects, about 2 KiB more.
@pytest.mark.parametrize("request_first", [False, True], ids=["new", "after-a-request"])
@pytest.mark.parametrize(
    ("zero_copy", "bound"), [(True, 8), (False, 10)], ids=["zero_copy", "streams"]
)
def test_an_idle_connection_costs_little(zero_copy: bool, bound: int, request_first: bool) -> None:
    # The default timeouts: the keep-alive wait holds a timer handle, no task.
    app = V2Server(timeouts=Timeouts(keep_alive=60))
    with _asyncio_server(app, zero_copy=zero_copy) as port:
        warm = _open(port, request_first)  # the first connections' one-off costs
        time.sleep(0.2)
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            socks = _open(port, request_first)
            time.sleep(0.5)  # every connection accepted and waiting for a request
            per_connection = (tracemalloc.get_traced_memory()[0] - before) / COUNT
        finally:
            tracemalloc.stop()
        for sock in warm + socks:
            sock.close()
    # Python objects only (the kernel's socket buffers are not counted): the
    # server's, and this test's socket objects.
    assert per_connection <= bound * 1024, per_connection


@pytest.mark.parametrize("zero_copy", [True, False], ids=["zero_copy", "streams"])
def test_an_idle_connection_waits_in_its_one_task(zero_copy: bool) -> None:
    # With the default timeouts every wait is bounded: by a timer handle, not
    # by a task made per wait (asyncio.wait_for's, before Python 3.12).
    async def main() -> int:
        srv = await start_server(V2Server(), "127.0.0.1", 0, zero_copy=zero_copy)
        port = srv.sockets[0].getsockname()[1]
        loop = asyncio.get_running_loop()
        socks = []
        try:
            for _ in range(20):
                sock = socket.socket()
                sock.setblocking(False)
                socks.append(sock)
                await loop.sock_connect(sock, ("127.0.0.1", port))
            await asyncio.sleep(0.3)  # every connection waiting for a request
            return len(asyncio.all_tasks()) - 1  # not this one
        finally:
            for sock in socks:
                sock.close()
            await close_server(srv)

    assert asyncio.run(main()) == 20
