"""An idle connection costs the asyncio server little memory: no receive
buffer waits with each read (one is made when bytes arrive), and a wait's
timeout is a timer handle, not a task.

The receive buffers a server keeps for its next requests
(``KEPT_RECEIVE_BUFFERS``, bounded and tested in test_asyncio.py) are the
server's, not a connection's: none are kept here, so that the memory counted
is what the connections hold."""

from __future__ import annotations

import asyncio
import re
import socket
import time
import tracemalloc

import numpy as np
import pytest

import binproto
from binproto.adapters._server import ByteStream, Timeouts, V2Server
from binproto.adapters.asyncio import close_server, start_server

from .servers import connect, running

#: Measures memory or latency: no other test may run beside it.
pytestmark = pytest.mark.serial


@pytest.fixture(autouse=True)
def _no_kept_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    from binproto.adapters import asyncio as adapter

    monkeypatch.setattr(adapter, "KEPT_RECEIVE_BUFFERS", 0)


GET_LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
COUNT = 200


class _CountingServer(V2Server):
    """Counts the connections it has begun to serve (read from the test's thread)."""

    started = 0

    async def serve_connection(self, stream: ByteStream, timeouts: Timeouts | None = None) -> None:
        self.started += 1
        await super().serve_connection(stream, timeouts)


def _settle(app: _CountingServer, count: int) -> None:
    """Wait until the server serves ``count`` connections: one accepted late
    would be counted with the next batch (a slow machine takes well over 0.2 s
    to accept 200)."""
    deadline = time.monotonic() + 30
    while app.started < count:
        assert time.monotonic() < deadline, (app.started, count)
        time.sleep(0.02)
    time.sleep(0.1)  # the last one reaches its wait for a request


def _open(port: int, request: bool) -> list[socket.socket]:
    socks = []
    for _ in range(COUNT):
        sock = connect(port)
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
    app = _CountingServer(timeouts=Timeouts(keep_alive=60))
    with running("asyncio" if zero_copy else "asyncio-streams", app) as server:
        port = server.port
        warm = _open(port, request_first)  # the first connections' one-off costs
        _settle(app, COUNT)
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            socks = _open(port, request_first)
            _settle(app, 2 * COUNT)  # every connection accepted and waiting for a request
            per_connection = (tracemalloc.get_traced_memory()[0] - before) / COUNT
        finally:
            tracemalloc.stop()
        for sock in warm + socks:
            sock.close()
    # Python objects only (the kernel's socket buffers are not counted): the
    # server's, and this test's socket objects.
    assert per_connection <= bound * 1024, per_connection


def _echo_once(port: int, body: bytes, header_length: int) -> socket.socket:
    """A connection that has had one tensor echoed, read to its last byte."""
    sock = connect(port)
    head = (
        b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n"
        b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
    )
    sock.sendall(head % (header_length, len(body)) + body)
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += sock.recv(65536)
    top, _, rest = answer.partition(b"\r\n\r\n")
    assert top.startswith(b"HTTP/1.1 200 "), top
    length = int(re.search(rb"(?i)content-length: *(\d+)", top).group(1))  # type: ignore[union-attr]
    while len(rest) < length:
        rest += sock.recv(1 << 20)
    return sock


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_an_idle_connection_after_a_tensor_costs_little(loop: str) -> None:
    # uvloop asks for the next receive buffer as soon as a read fills the one
    # it had (the last bytes of a tensor, received in place), though nothing
    # more has come: that buffer must not be kept while the connection idles.
    encoded = binproto.encode_request(
        {"x": np.arange(100_000, dtype=np.float32)}, binary_data_output=True
    )
    body, hl = bytes(encoded), encoded.header_length
    assert hl is not None
    app = V2Server(timeouts=Timeouts(keep_alive=60))
    with running("asyncio", app, loop=loop) as server:
        port = server.port
        warm = [_echo_once(port, body, hl) for _ in range(5)]
        time.sleep(0.2)
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            socks = [_echo_once(port, body, hl) for _ in range(50)]
            time.sleep(0.5)  # every connection waiting for its next request
            per_connection = (tracemalloc.get_traced_memory()[0] - before) / 50
        finally:
            tracemalloc.stop()
        for sock in warm + socks:
            sock.close()
    assert per_connection <= 8 * 1024, per_connection


@pytest.mark.parametrize(
    ("case", "bound"),
    [("slow-body", 16), ("pipelined", 16), ("pipelined-20k", 40), ("slow-head-20k", 40)],
)
def test_a_connection_waiting_on_some_bytes_holds_no_whole_receive_buffer(
    case: str, bound: int
) -> None:
    # The head and the first bytes of its body in one read, the rest to come;
    # bytes of the next request while the handler is busy; the first 20 KB of
    # a long head: the bytes wait in memory of their size (bound, in KiB),
    # not in the 72 KiB buffer they came in.
    from binproto.adapters._server import InferRequest, Model

    async def slow(request: InferRequest) -> dict[str, object]:
        await asyncio.sleep(3)
        return {}

    count = 100
    app = V2Server([Model("slow", slow)], timeouts=Timeouts(keep_alive=60, body=60))
    with running("asyncio", app) as server:
        port = server.port
        socks = [connect(port) for _ in range(5)]  # the first connections' one-off costs
        for sock in socks:
            sock.sendall(GET_LIVE)
            assert sock.recv(1024).startswith(b"HTTP/1.1 200 ")
        time.sleep(0.3)
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(count):
                sock = connect(port)
                if case == "slow-body":
                    sock.sendall(
                        b"POST /v2/models/slow/infer HTTP/1.1\r\nHost: x\r\n"
                        b"Inference-Header-Content-Length: 4096\r\n"
                        b'Content-Length: 4096\r\n\r\n{"inputs":'
                    )
                elif case == "slow-head-20k":
                    sock.sendall(
                        b"POST /v2/models/slow/infer HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 20_000
                    )
                else:
                    sock.sendall(
                        b"POST /v2/models/slow/infer HTTP/1.1\r\nHost: x\r\n"
                        b'Content-Length: 13\r\n\r\n{"inputs":[]}'
                    )
                    time.sleep(0.002)
                    if case == "pipelined":
                        sock.sendall(b"G")
                    else:
                        sock.sendall(
                            b"POST /v2/models/slow/infer HTTP/1.1\r\nHost: x\r\n"
                            b"Inference-Header-Content-Length: 20\r\n"
                            b"Content-Length: 100000\r\n\r\n" + b" " * 20_000
                        )
                socks.append(sock)
            time.sleep(1.0)  # every request read as far as it goes, its handler waiting
            per_connection = (tracemalloc.get_traced_memory()[0] - before) / count
        finally:
            tracemalloc.stop()
            for sock in socks:
                sock.close()
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
            # Every connection waiting for a request: one task each (not this one).
            deadline = loop.time() + 10
            while len(asyncio.all_tasks()) - 1 < 20 and loop.time() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)  # (time for any task made per wait to show)
            return len(asyncio.all_tasks()) - 1
        finally:
            for sock in socks:
                sock.close()
            await close_server(srv)

    assert asyncio.run(main()) == 20
