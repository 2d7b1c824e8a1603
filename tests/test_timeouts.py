"""The servers' timeouts (keep-alive idle, request head deadline, body
inactivity, response write stall), on asyncio (both transports) and trio,
over real sockets on 127.0.0.1 with short configured timeouts."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import time
from decimal import Decimal
from typing import Any

import h11
import numpy as np
import pytest

import binproto
from binproto import LocalProtocolError
from binproto.adapters import asyncio as ba
from binproto.adapters import trio as bt
from binproto.adapters._server import Model, Timeouts, V2Server
from binproto.adapters.h11 import request_for, send_message

from .fakes import TimingOutStream, TimingOutStreamInto
from .servers import Running, connect, running, until_closed


def _served(
    backend: str, timeouts: Timeouts, **options: Any
) -> contextlib.AbstractContextManager[Running]:
    """A server with ``timeouts`` on ``backend``; ``options`` are those of :class:`Running`."""
    return running(backend, V2Server(timeouts=timeouts), **options)


def _request(x: np.ndarray[Any, Any]) -> bytes:
    body = binproto.encode_request({"x": x}, binary_data_output=True)
    conn = h11.Connection(h11.CLIENT)
    return b"".join(
        bytes(p) for p in send_message(conn, request_for("/v2/models/echo/infer", body), body)
    )


GET_LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"


def test_defaults_are_those_of_production_servers() -> None:
    assert Timeouts() == Timeouts(keep_alive=5.0, head=10.0, body=30.0, write=30.0)
    assert V2Server().timeouts == Timeouts()
    assert Timeouts.every(2) == Timeouts(2, 2, 2, 2)


# (10**400: an int no float holds, which asyncio would meet mid-request)
BAD_SECONDS = [0, -1, float("inf"), float("nan"), "5", True, np.True_, 10**400, [1], b"5",
               bytearray(b"5"), np.complex128(5 + 1j), Decimal("5")]  # fmt: skip


@pytest.mark.parametrize("bad", BAD_SECONDS)
def test_a_timeout_must_be_positive_seconds_or_none(bad: Any) -> None:
    with pytest.raises(LocalProtocolError, match="keep_alive"):
        Timeouts(keep_alive=bad)
    with pytest.raises(LocalProtocolError, match="timeouts must be"):
        V2Server(timeouts=5)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", BAD_SECONDS)
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_client_timeout_must_be_positive_seconds_or_none(backend: str, bad: Any) -> None:
    # Refused as the client is made: not a TypeError in the middle of a
    # request, nor a TimeoutError before any wait.
    client = bt.Client if backend == "trio" else ba.Client
    with pytest.raises(LocalProtocolError, match="timeout must be a positive number"):
        client("127.0.0.1", 8000, timeout=bad)
    client("127.0.0.1", 8000, timeout=None)
    client("127.0.0.1", 8000, timeout=0.5)
    # (a number of seconds, of numpy's)
    client("127.0.0.1", 8000, timeout=np.float64(5.0))  # type: ignore[arg-type, unused-ignore]
    assert Timeouts(keep_alive=np.float64(5.0)).keep_alive == 5.0  # type: ignore[arg-type, unused-ignore]


def test_an_idle_connection_is_closed_after_keep_alive(http_backend: str) -> None:
    # (1 s: time enough for this side to send its request after connecting)
    with _served(http_backend, Timeouts(keep_alive=1)) as server:
        with connect(server.port) as sock:  # never sends a byte
            start = time.monotonic()
            assert until_closed(sock) == b""
            assert time.monotonic() - start < 3
        with connect(server.port) as sock:  # idle after a response
            sock.sendall(GET_LIVE)
            start = time.monotonic()
            data = until_closed(sock)
            assert data.startswith(b"HTTP/1.1 200 ") and data.count(b"HTTP/1.1") == 1
            assert time.monotonic() - start < 3


def test_a_short_keep_alive_after_a_long_body_wait_still_closes_in_time(http_backend: str) -> None:
    # The body is waited for under its 30 s bound, then the connection idles
    # under a 0.2 s one: the earlier deadline counts (asyncio keeps one timer
    # per connection, moved only when it fires, so it must be moved sooner).
    wire = _request(np.arange(4000, dtype=np.float32))
    with running(
        http_backend, V2Server(timeouts=Timeouts(keep_alive=0.2, head=30, body=30, write=30))
    ) as server:
        with connect(server.port) as sock:
            sock.sendall(wire[:-100])
            time.sleep(0.5)  # past the keep-alive: the body's bound is the one running
            sock.sendall(wire[-100:])
            start = time.monotonic()
            data = until_closed(sock)
            assert data.startswith(b"HTTP/1.1 200 ") and data.count(b"HTTP/1.1") == 1
            assert time.monotonic() - start < 3


def test_a_dripped_head_is_cut_at_its_deadline(http_backend: str) -> None:
    # Each byte comes well within every per-read bound: only a deadline on
    # the whole head cuts it.
    head = b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: a\r\n" * 100
    with running(
        http_backend, V2Server(timeouts=Timeouts(keep_alive=1, head=0.6, body=1, write=1))
    ) as server:
        with connect(server.port) as sock:
            start = time.monotonic()
            with contextlib.suppress(ConnectionError):
                for i in range(len(head)):
                    sock.sendall(head[i : i + 1])
                    time.sleep(0.02)
                    if time.monotonic() - start > 5:
                        break
            received = until_closed(sock)
            elapsed = time.monotonic() - start
    assert received.startswith(b"HTTP/1.1 408 "), received[:200]
    assert b"Connection: close" in received and b"request head" in received
    assert elapsed < 3


def test_a_stalled_body_is_answered_408(http_backend: str) -> None:
    # The echo model's handler is waiting for the tensors when the body
    # stalls: answered after one body timeout, not a second one (the rest of
    # the body is not waited for again).
    wire = _request(np.zeros(1000, dtype=np.float32))
    with running(
        http_backend, V2Server(timeouts=Timeouts(keep_alive=5, head=5, body=0.5, write=5))
    ) as server:
        with connect(server.port) as sock:
            start = time.monotonic()  # (before the bytes: the wait cannot start earlier)
            sock.sendall(wire[:-100])
            received = until_closed(sock)
            elapsed = time.monotonic() - start
    assert received.startswith(b"HTTP/1.1 408 "), received[:200]
    assert b"timed out waiting for the body" in received and b"Connection: close" in received
    assert 0.5 <= elapsed < 0.95  # one body timeout (two take 1.0 s)


@pytest.mark.parametrize("stream_type", [TimingOutStream, TimingOutStreamInto])
def test_a_body_that_stalls_in_the_handler_is_waited_for_once(
    stream_type: type[TimingOutStream],
) -> None:
    # The handler's tensors() times out on the body; the server then answers
    # 408 at once: it does not wait for the rest of the body a second time
    # (which kept the half-read request, and the client, for two timeouts).
    wire = _request(np.zeros(1000, dtype=np.float32))
    stream = stream_type(wire[:-100])
    server = V2Server(timeouts=Timeouts(keep_alive=1, head=2, body=3, write=4))
    asyncio.run(server.serve_connection(stream))
    assert stream.waits == [3]
    assert stream.sent.startswith(b"HTTP/1.1 408 "), bytes(stream.sent[:200])
    assert b"timed out waiting for the body (no bytes from the peer within 3 s)" in stream.sent


def test_a_handlers_own_timeout_is_a_500_not_a_408(caplog: pytest.LogCaptureFixture) -> None:
    async def deadline(request: Any) -> Any:
        await request.tensors()  # the whole body is in
        raise TimeoutError("the model's own deadline")

    body = binproto.encode_request({"x": np.zeros(4, dtype=np.float32)})
    conn = h11.Connection(h11.CLIENT)
    wire = b"".join(
        bytes(p) for p in send_message(conn, request_for("/v2/models/slow/infer", body), body)
    )
    stream = TimingOutStream(wire)
    server = V2Server([Model("slow", deadline)], timeouts=Timeouts(keep_alive=1, head=2, body=3))
    asyncio.run(server.serve_connection(stream))
    assert stream.sent.startswith(b"HTTP/1.1 500 "), bytes(stream.sent[:200])
    assert b"internal error: the model's own deadline" in stream.sent
    assert "error while serving /v2/models/slow/infer" in caplog.text
    assert "TimeoutError: the model's own deadline" in caplog.text
    assert stream.waits == [1]  # then idle: the connection was kept


def test_no_head_timeout_leaves_a_begun_head_unbounded() -> None:
    # Timeouts(head=None): the rest of a head is waited for without a bound,
    # not with the keep-alive timeout left from the wait for its first bytes.
    stream = TimingOutStream(b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n")
    server = V2Server(timeouts=Timeouts(keep_alive=1, head=None, body=3, write=4))
    asyncio.run(server.serve_connection(stream))
    assert stream.waits == [None]


def test_a_slow_body_that_keeps_moving_is_read(http_backend: str) -> None:
    # 16 pieces 0.15 s apart: 2.25 s in all, well past the 1 s bound, but
    # never 1 s without progress (a margin for a machine that pauses).
    x = np.arange(4000, dtype=np.float32)
    wire = _request(x)
    step = -(-len(wire) // 16)
    with running(
        http_backend, V2Server(timeouts=Timeouts(keep_alive=5, head=5, body=1, write=5))
    ) as server:
        with connect(server.port) as sock:
            for i in range(0, len(wire), step):
                sock.sendall(wire[i : i + step])
                time.sleep(0.15)
            sock.shutdown(socket.SHUT_WR)
            received = until_closed(sock)
    assert received.startswith(b"HTTP/1.1 200 "), received[:200]
    assert x.tobytes() in received


@pytest.mark.slow
def test_a_peer_that_stops_reading_is_closed_after_the_write_stall(http_backend: str) -> None:
    x = np.zeros(16 << 20, dtype=np.float32)  # 64 MiB back: more than socket buffers hold
    with running(
        http_backend, V2Server(timeouts=Timeouts(keep_alive=5, head=5, body=5, write=0.3))
    ) as server:
        with connect(server.port) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
            sock.sendall(_request(x))
            time.sleep(2)  # read nothing for several write timeouts
            received = len(until_closed(sock))
    assert received < x.nbytes  # the server gave up and closed


def _established_at(port: int) -> int:
    """Server-side connections of ``port`` still established (Linux's socket tables)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as f:
            for line in f.read().splitlines()[1:]:
                fields = line.split()
                local_port = int(fields[1].rsplit(":", 1)[1], 16)
                count += local_port == port and fields[3] == "01"  # ESTABLISHED
    return count


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads Linux's socket table")
def test_a_peer_that_never_reads_again_is_dropped_after_the_write_stall(http_backend: str) -> None:
    # Closing gracefully would wait, without end, for the peer to take what
    # is buffered: the write timeout must end the connection all the same.
    x = np.zeros(16 << 20, dtype=np.float32)
    with running(
        http_backend, V2Server(timeouts=Timeouts(keep_alive=5, head=5, body=5, write=0.3))
    ) as server:
        with connect(server.port) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
            sock.sendall(_request(x))
            deadline = time.monotonic() + 5
            while _established_at(server.port) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _established_at(server.port) == 0  # while the peer still reads nothing


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads Linux's socket table")
def test_a_stalled_reader_is_dropped_after_one_write_timeout_not_two(http_backend: str) -> None:
    # The close after a write stall once waited the write timeout again for
    # the peer to take what was buffered: a stalled reader held on for 2x.
    write = 1.5
    x = np.zeros(16 << 20, dtype=np.float32)
    with running(
        http_backend, V2Server(timeouts=Timeouts(keep_alive=30, head=30, body=30, write=write))
    ) as server:
        with connect(server.port) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
            sock.sendall(_request(x))
            sent = time.monotonic()
            while _established_at(server.port) and time.monotonic() - sent < 4 * write:
                time.sleep(0.02)
            held = time.monotonic() - sent
    assert held < 1.6 * write, f"dropped after {held:.2f} s, the write timeout is {write} s"


def test_the_timeout_option_bounds_every_phase(http_backend: str) -> None:
    # start_server / serve(timeout=...) overrides the server's timeouts.
    with _served(http_backend, Timeouts(keep_alive=60), timeout=0.2) as server:
        with connect(server.port) as sock:
            start = time.monotonic()
            assert until_closed(sock) == b""
            assert time.monotonic() - start < 3


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_serve_command_timeout_flags(backend: str) -> None:
    import re
    import subprocess
    import sys

    command = [sys.executable, "-m", "binproto", "serve", "--port", "0", "--backend", backend]
    command += ["--keep-alive-timeout", "0.3", "--head-timeout", "0"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        match = re.search(r":(\d+)$", proc.stdout.readline().strip())
        assert match
        with connect(int(match.group(1))) as sock:
            start = time.monotonic()
            assert until_closed(sock) == b""
            assert time.monotonic() - start < 5
    finally:
        proc.terminate()
        proc.wait(10)


def test_serve_command_timeout_flags_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    from binproto.cli import build_parser

    args = build_parser().parse_args(["serve"])
    assert (args.keep_alive_timeout, args.head_timeout) == (5.0, 10.0)
    assert (args.body_timeout, args.write_timeout) == (30.0, 30.0)
    for bad in ("-1", "inf", "soon"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", "--body-timeout", bad])
    assert "--body-timeout" in capsys.readouterr().err


def test_the_docs_table_matches_the_defaults_and_flags() -> None:
    from pathlib import Path

    from binproto.cli import build_parser

    doc = Path(__file__).resolve().parent.parent / "docs" / "limits-and-errors.md"
    rows = re.findall(
        r"^\| `(\w+)` \| ([\d.]+) s \| `--([\w-]+)` \|", doc.read_text(encoding="utf-8"), re.M
    )
    assert [name for name, _, _ in rows] == ["keep_alive", "head", "body", "write"]
    args = build_parser().parse_args(["serve"])
    for name, default, flag in rows:
        assert getattr(Timeouts(), name) == float(default)
        assert getattr(args, flag.replace("-", "_")) == float(default)


def test_a_pipelined_head_that_stalls_is_cut_at_its_deadline(http_backend: str) -> None:
    # The next request's head began with the previous request's bytes: its
    # deadline runs from then, not the keep-alive wait.
    partial = b"GET /v2/health/live HTTP/1.1\r\nHost:"
    with running(
        http_backend, V2Server(timeouts=Timeouts(keep_alive=30, head=0.5, body=5, write=5))
    ) as server:
        with connect(server.port) as sock:
            start = time.monotonic()
            sock.sendall(GET_LIVE + partial)
            received = until_closed(sock)
            elapsed = time.monotonic() - start
    first, _, rest = received.partition(b"HTTP/1.1 408 ")
    assert first.startswith(b"HTTP/1.1 200 ") and b"request head" in rest, received[:400]
    assert elapsed < 5


def test_a_timeout_is_kept_as_a_float() -> None:
    # (the server adds it to the clock: a Decimal would fail there, per request)
    with pytest.raises(LocalProtocolError, match="head"):
        Timeouts(head=Decimal("5"))  # type: ignore[arg-type]
    kept = Timeouts(keep_alive=np.float32(2.5), head=3)  # type: ignore[arg-type, unused-ignore]
    assert type(kept.keep_alive) is float and kept.keep_alive == 2.5
    assert kept.head == 3
