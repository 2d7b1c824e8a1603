"""The asyncio client's connection (``ClientStream``): bytes that come while
no read waits, reads cancelled or timed out, sends the server takes slowly
or not at all, and a request cancelled while its answer is awaited."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import binproto
from binproto.adapters._server import Timeouts
from binproto.adapters.asyncio import (
    HIGH_WATER,
    RECEIVE_BUFFER,
    Client,
    ClientStream,
    InferRequest,
    Model,
    V2Server,
    close_server,
    connect,
    echo_model,
    start_server,
)
from binproto.adapters.h11 import PIECE

from .fakes import tls_contexts

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def _run(main: Callable[[], Awaitable[Any]], loop_kind: str = "asyncio") -> Any:
    """``main()`` in a new event loop: asyncio's own, or uvloop's."""
    if loop_kind == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    else:
        loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


@asynccontextmanager
async def _raw_server(handler: Handler) -> AsyncIterator[int]:
    """A server running ``handler`` for each connection; yields its port.

    Its handlers still running at the end are cancelled and awaited: a task
    left pending when the loop closes is logged when it is collected, which
    may be during another test (one that checks asyncio logs nothing)."""
    tasks: set[asyncio.Task[None]] = set()

    async def tracked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        await handler(reader, writer)

    server = await asyncio.start_server(tracked, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@asynccontextmanager
async def _connected(handler: Handler, timeout: float | None = 10) -> AsyncIterator[ClientStream]:
    """A client stream to a raw server running ``handler``; closed at the end."""
    async with _raw_server(handler) as port:
        stream = await connect("127.0.0.1", port, timeout=timeout)
        assert isinstance(stream, ClientStream)
        try:
            yield stream
        finally:
            await stream.aclose()


PATTERN = (np.arange(3 << 20) * 7 % 251).astype(np.uint8)  # 3 MiB, no period of 2**k


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_bytes_that_come_while_no_read_waits_are_kept_in_order(loop_kind: str) -> None:
    # The server sends 3 MiB at once. The connection keeps one buffer's
    # worth and pauses reading; reads of both kinds then get every byte in order.
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(PATTERN.tobytes())
        await writer.drain()
        writer.close()

    async def main() -> None:
        async with _connected(handler) as stream:
            while not stream.is_readable() or stream._end - stream._start < RECEIVE_BUFFER:
                await asyncio.sleep(0.01)  # (until the buffer is full)
            assert stream._reading_paused
            assert len(stream._buf) == RECEIVE_BUFFER  # held to one buffer
            got = np.zeros_like(PATTERN)
            at, turn = 0, 0
            while at < len(got):
                if turn % 2:
                    data = await stream.receive_some(1000)
                    got[at : at + len(data)] = np.frombuffer(data, np.uint8)
                    n = len(data)
                else:
                    n = await stream.receive_into(got.data[at : at + 300_000])
                assert n, f"the stream ended after {at} bytes"
                at, turn = at + n, turn + 1
            assert np.array_equal(got, PATTERN)
            assert await stream.receive_some(10) == b""
            assert await stream.receive_into(memoryview(bytearray(10))) == 0

    _run(main, loop_kind)


@pytest.mark.parametrize("when", ["later", "at once"])
def test_a_cancelled_receive_puts_no_later_bytes_in_its_buffer(when: str) -> None:
    # "later": the bytes come once the read has let go of its buffer.
    # "at once": they come after the read was cancelled but before its
    # task ran again (the loop's own calls, made here by hand at that moment).
    go = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await go.wait()
        writer.write(b"abc")
        await writer.drain()
        await reader.read()  # (until the client closes)

    async def main() -> None:
        async with _connected(handler) as stream:
            target = np.zeros(8, np.uint8)
            task = asyncio.create_task(stream.receive_into(target.data))
            await asyncio.sleep(0.05)
            task.cancel()  # (its waiter is cancelled now; its task runs later)
            if when == "at once":
                buffer = stream.get_buffer(-1)
                buffer[:3] = b"abc"
                stream.buffer_updated(3)
            with pytest.raises(asyncio.CancelledError):
                await task
            if when == "later":
                go.set()
            assert await stream.receive_some(10) == b"abc"
            assert not target.any()

    _run(main)


def test_a_silent_server_times_a_receive_out_each_time() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()

    async def main() -> None:
        async with _connected(handler, timeout=0.2) as stream:
            for _ in range(2):  # (the connection's one timer is armed again)
                with pytest.raises(TimeoutError, match=r"no bytes from the peer within 0\.2 s"):
                    await stream.receive_some(10)
            stream.timeout = None
            assert not stream.is_readable()

    _run(main)


def test_a_send_the_server_does_not_take_times_out_holding_little() -> None:
    # The server never reads: the kernel's buffers fill, then the transport's,
    # up to a piece past its high-water mark, and the send times out.
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(30)

    async def main() -> None:
        held = [0]
        async with _connected(handler, timeout=0.3) as stream:
            assert stream.transport is not None
            big = np.ones(64 << 20, np.uint8)
            send = asyncio.create_task(stream.send_all([b"head", big]))
            while not send.done():
                held.append(stream.transport.get_write_buffer_size())
                await asyncio.sleep(0.01)
            with pytest.raises(TimeoutError, match="no room to write from the peer"):
                await send
            assert stream.is_readable()  # (aborted: not to be used again)
        assert 0 < max(held) <= HIGH_WATER + PIECE

    _run(main)


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_a_send_of_small_and_big_buffers_arrives_whole_and_in_order(loop_kind: str) -> None:
    big = (np.arange(6 << 20, dtype=np.uint32) * 2654435761).astype(np.uint32)  # 24 MiB
    parts: list[Any] = [b"head ", big, b" middle ", PATTERN.data, b" end"]
    expected = b"".join(bytes(memoryview(p).cast("B")) for p in parts)
    received: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(0.1)  # (the client's send fills the kernel's buffers first)
        received.append(await reader.readexactly(len(expected)))
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    async def main() -> None:
        async with _connected(handler) as stream:
            await stream.send_all(parts)
            assert await stream.receive_some(10) == b"ok"

    _run(main, loop_kind)
    assert received == [expected]


class _Counting(V2Server):
    """A server counting the connections it serves."""

    connections = 0

    async def serve_connection(self, stream: Any, timeouts: Timeouts | None = None) -> None:
        self.connections += 1
        await super().serve_connection(stream, timeouts)


def test_a_request_cancelled_while_its_answer_is_awaited_gives_its_connection_back() -> None:
    # With one connection allowed, a request cancelled while the model runs
    # must not keep the connection: it is closed (half-way through an
    # exchange), and the next request opens another.
    started = asyncio.Event()

    async def slow(request: InferRequest) -> Any:
        started.set()
        await asyncio.sleep(30)
        return await request.tensors()

    server = _Counting(models=[Model("slow", slow), echo_model()])
    x = np.arange(6, dtype=np.float32)

    async def main() -> None:
        srv = await start_server(server, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        try:
            async with Client("127.0.0.1", port, timeout=10, max_connections=1) as c:
                task = asyncio.create_task(c.infer("slow", {"x": x}))
                await asyncio.wait_for(started.wait(), 10)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                assert c.open_connections == 0
                out = await asyncio.wait_for(c.infer("echo", {"x": x}), 10)
                assert np.array_equal(out["x"], x)
                assert c.open_connections == 1
        finally:
            await close_server(srv)

    _run(main)
    assert server.connections == 2


def _anonymous_memory() -> int:
    """This process's resident anonymous memory, in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise KeyError("RssAnon")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc")
def test_a_big_echo_between_memory_maps_holds_little_memory(tmp_path: Path) -> None:
    # 256 MiB from a memory-mapped file to another, through `binproto serve`
    # in its own process: sent from the map and received into the other,
    # the client's anonymous memory grows by at most a few transport pieces.
    n = (256 << 20) // 4
    x = np.memmap(tmp_path / "in.bin", np.float32, mode="w+", shape=(n,))
    x[::1024] = np.arange(n // 1024, dtype=np.float32)
    out = np.memmap(tmp_path / "out.bin", np.float32, mode="w+", shape=(n,))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "binproto", "serve", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.005):
            peak[0] = max(peak[0], _anonymous_memory())

    async def main(url: str) -> None:
        async with Client(url, timeout=60) as c:
            await c.infer("echo", {"x": x}, destinations={"x": out})

    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("binproto: serving V2 on "), line
        before = _anonymous_memory()
        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            _run(lambda: main(line.split(" on ", 1)[1].strip()))
        finally:
            done.set()
            sampler.join()
    finally:
        proc.terminate()
        proc.wait(10)
    assert np.array_equal(out[::1024], x[::1024]) and not out[1:1024].any()
    assert peak[0] - before < 64 << 20


def test_over_tls_tensors_are_received_in_place_and_a_close_is_quiet(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The server answers 4 MiB and closes: the answer is received through
    # TLS into the destination array, and the close draws no warning.
    server_ctx, client_ctx = tls_contexts(tmp_path)
    x = np.arange(1 << 20, dtype=np.float32)
    body = binproto.encode_response({"x": x}, model_name="m")
    head = (
        f"HTTP/1.1 200 OK\r\nContent-Length: {len(bytes(body))}\r\n"
        f"Inference-Header-Content-Length: {body.header_length}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()

    handled = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await reader.readuntil(b"\r\n\r\n")
            length = int(request.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            writer.write(head + bytes(body))
            await writer.drain()
            writer.close()
        except ConnectionError:
            pass  # (the client may close first: the server's side is not under test)
        finally:
            handled.set()

    async def main() -> None:
        server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=server_ctx)
        port = server.sockets[0].getsockname()[1]
        try:
            async with Client(f"https://127.0.0.1:{port}", ssl=client_ctx, timeout=10) as c:
                out = np.zeros_like(x)
                got = await c.infer("m", {"x": x[:4]}, destinations={"x": out})
                assert got["x"] is out
                assert np.array_equal(out, x)
                await asyncio.sleep(0.1)  # (the server's close arrives)
                assert c.open_connections == 0
            # The test's own server task ends before the loop does: a task
            # still pending then would be logged, and not by the client.
            await asyncio.wait_for(handled.wait(), 10)
        finally:
            server.close()

    gc.collect()  # (what earlier tests left is collected, and logged, before)
    with caplog.at_level(logging.WARNING, logger="asyncio"):
        _run(main)
    assert not [r for r in caplog.records if r.name == "asyncio"]
