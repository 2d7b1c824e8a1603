"""The asyncio adapter's own transports: tensors received in place,
backpressure, receive buffers lent and kept, timeouts, and closing.

What the V2 application answers is tested on every backend elsewhere
(test_app_*.py); the client's calls in test_client_calls.py."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from collections.abc import Coroutine, Iterator
from typing import Any

import h11
import numpy as np
import pytest

import binproto
from binproto.adapters._server import (
    HEAD_READ,
    InferRequest,
    KnownHeads,
    Model,
    Timeouts,
    V2Server,
    echo_model,
)
from binproto.adapters.asyncio import Client, close_server, serve, start_server
from binproto.adapters.h11 import request_for

from .models import RECORDER, Gate, server_models
from .servers import (
    Running,
    connect,
    infer_bytes,
    read_response,
    running,
    serving,
)


@pytest.fixture(scope="module")
def server(asyncio_backend: str) -> Iterator[Running]:
    yield from serving(asyncio_backend, V2Server(server_models()))


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


# -- the asyncio transports: tensors received in place, backpressure -------------------


def test_zero_copy_receive_on_the_server(server: Running) -> None:
    x = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)
    out = run(_call(server.port, "into", {"x": x}))
    assert RECORDER.result is RECORDER.destination  # the array the handler chose
    assert RECORDER.result is not None
    np.testing.assert_array_equal(RECORDER.result, x)
    assert out["copied"][0] + out["in_place"][0] == x.nbytes
    if server.backend != "asyncio-streams":
        # Only bytes read together with the request head were copied (one read).
        assert out["copied"][0] <= HEAD_READ
        assert out["in_place"][0] >= x.nbytes - HEAD_READ
    else:
        assert out["in_place"][0] == 0


async def _call(port: int, model: str, inputs: dict[str, Any]) -> dict[str, np.ndarray[Any, Any]]:
    async with Client("127.0.0.1", port) as c:
        return await c.infer(model, inputs, binary_data_output=True)


# -- adversarial peers on raw sockets ---------------------------------------------------


def _socket_buffers_max() -> int:
    """The most one loopback connection's kernel buffers may hold: Linux's
    autotuning maxima for receiving and sending (32 MiB + 4 MiB on some
    hosts), else 16 MiB."""
    try:
        with (
            open("/proc/sys/net/ipv4/tcp_rmem") as rmem,
            open("/proc/sys/net/ipv4/tcp_wmem") as wmem,
        ):
            return int(rmem.read().split()[2]) + int(wmem.read().split()[2])
    except (OSError, ValueError, IndexError):
        return 16 << 20


def test_server_reads_only_as_fast_as_the_handler_consumes(server: Running) -> None:
    # What the kernel may buffer is bounded by its maxima: a body twice that
    # (and more) shows whether the server itself read ahead.
    buffers = _socket_buffers_max()
    x = np.zeros((2 * buffers + (16 << 20)) // 4, dtype=np.float32)
    body = binproto.encode_request({"x": x})
    conn = h11.Connection(h11.CLIENT)
    head = conn.send(request_for("/v2/models/gate/infer", body))
    assert head is not None
    data = x.data.cast("B")
    Gate.event = None
    with connect(server.port) as sock:
        sock.sendall(head + body.json)
        sock.setblocking(False)
        sent = 0
        idle_rounds = 0
        # Push until the kernel refuses more for a while: the handler is not
        # reading, so neither may the server.
        while idle_rounds < 10 and sent < len(data):
            try:
                sent += sock.send(data[sent : sent + (1 << 20)])
                idle_rounds = 0
            except BlockingIOError:
                idle_rounds += 1
                time.sleep(0.05)
        # The kernel's buffers and a read or two of the server's, not the body.
        assert sent <= buffers + (8 << 20), (sent, buffers)
        while Gate.event is None:
            time.sleep(0.01)
        server.call_soon(Gate.event.set)
        sock.setblocking(True)
        sock.sendall(data[sent:])
        status, payload, _ = read_response(sock, check_closed=False)
    assert status == 200
    assert json.loads(payload)["outputs"][0]["data"] == [x.nbytes]


def test_server_timeout_closes_a_stalled_peer() -> None:
    async def main() -> bytes:
        srv = await start_server(port=0, timeout=0.2)
        port = srv.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        wire = infer_bytes({"x": np.zeros(1000, dtype=np.float32)})
        writer.write(wire[:-100])
        received = await asyncio.wait_for(reader.read(), 10)  # until the server closes
        writer.close()
        srv.close()
        await srv.wait_closed()
        return received

    received = run(main())
    assert received.startswith(b"HTTP/1.1 408 ")  # and then the server closed
    assert b"timed out" in received


def test_model_api_is_public_on_every_backend() -> None:
    from binproto.adapters import _server
    from binproto.adapters import asyncio as aio_adapter
    from binproto.adapters import trio as trio_adapter

    for name in ("V2Server", "Model", "InferRequest", "InferenceError", "StreamingResponse"):
        assert getattr(aio_adapter, name) is getattr(_server, name)
        assert getattr(trio_adapter, name) is getattr(_server, name)
        assert name in aio_adapter.__all__ and name in trio_adapter.__all__
    # The client over any ByteStream (a custom transport, a wrapper that meters).
    from binproto.adapters import _client

    assert aio_adapter.ClientCore is trio_adapter.ClientCore is _client.ClientCore
    assert "ClientCore" in aio_adapter.__all__ and "ClientCore" in trio_adapter.__all__


def test_timeouts_surface_as_the_builtin_timeout_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from binproto.adapters.asyncio import _within

    async def main() -> None:
        with pytest.raises(TimeoutError):
            await _within(asyncio.sleep(10), 0.01)
        assert await _within(asyncio.sleep(0, "done"), 1) == "done"

    run(main())

    # Before Python 3.11 asyncio's timeout error is another class, which the
    # servers' 408 handler would miss: as there, wait_for raises that class.
    class OldTimeoutError(Exception):
        pass

    async def times_out(awaitable: Any, timeout: float | None) -> Any:
        awaitable.close()
        raise OldTimeoutError

    monkeypatch.setattr(asyncio, "TimeoutError", OldTimeoutError)
    monkeypatch.setattr(asyncio, "wait_for", times_out)
    monkeypatch.delattr(asyncio, "timeout", raising=False)  # new in 3.11

    async def old() -> None:
        with pytest.raises(TimeoutError) as info:
            await _within(asyncio.sleep(10), 0.5)
        assert type(info.value) is TimeoutError and "within 0.5 s" in str(info.value)

    run(old())


async def _idle_keep_alive_connection(
    port: int,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection that has been served one request and is left open, idle."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
    assert await reader.readexactly(14) == b'{"live": true}'
    return reader, writer


@pytest.mark.parametrize("zero_copy", [True, False], ids=["zero_copy", "streams"])
def test_close_server_ends_idle_connections(zero_copy: bool) -> None:
    from binproto.adapters.asyncio import _CONNECTIONS, close_server

    async def main() -> None:
        srv = await start_server(port=0, zero_copy=zero_copy)
        tasks = _CONNECTIONS[srv]
        reader, writer = await _idle_keep_alive_connection(srv.sockets[0].getsockname()[1])
        assert len(tasks) == 1
        await asyncio.wait_for(close_server(srv), 10)
        assert not tasks  # every connection task has ended
        assert await asyncio.wait_for(reader.read(), 10) == b""  # and closed its socket
        writer.close()

    run(main())


def test_serve_ends_its_connections_when_cancelled() -> None:
    async def main() -> None:
        ports: list[int] = []
        task = asyncio.ensure_future(serve(port=0, ready=ports.append))
        while not ports:
            await asyncio.sleep(0.01)
        reader, writer = await _idle_keep_alive_connection(ports[0])
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()

    run(main())


@pytest.mark.slow
@pytest.mark.parametrize("zero_copy", [True, False], ids=["zero_copy", "streams"])
def test_server_timeout_gives_up_on_a_peer_that_stops_reading(zero_copy: bool) -> None:
    x = np.zeros(16 << 20, dtype=np.float32)  # 64 MiB back: more than socket buffers hold
    wire = infer_bytes({"x": x})
    backend = "asyncio" if zero_copy else "asyncio-streams"
    with running(backend, V2Server(server_models()), timeout=0.5) as srv:
        with connect(srv.port) as sock:
            sock.sendall(wire)
            time.sleep(3)  # read nothing for six timeouts
            received = 0
            while chunk := sock.recv(1 << 20):
                received += len(chunk)
    assert received < x.nbytes  # the server gave up and closed


# -- per-request cost: what an optimisation of the serving path must keep true ------


async def _keep_alive_round_trips(n: int, inputs: dict[str, Any]) -> list[bytes]:
    """``n`` echo requests over one keep-alive connection, one at a time; the raw answers."""
    srv = await start_server()
    port = srv.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answers = []
    try:
        for _ in range(n):
            writer.write(infer_bytes(inputs))
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(re.search(rb"\ncontent-length: (\d+)", head.lower()).group(1))  # type: ignore[union-attr]
            answers.append(head + await reader.readexactly(length))
    finally:
        writer.close()
        await close_server(srv)
    return answers


def test_a_small_response_leaves_in_one_write(monkeypatch: pytest.MonkeyPatch) -> None:
    # Head, JSON and a 4 KiB tensor gathered: one write (one send), not one per piece.
    from asyncio import selector_events

    writes: list[int] = []
    transport_class: Any = selector_events._SelectorSocketTransport  # type: ignore[attr-defined]
    original = transport_class.write

    def counting(self: Any, data: Any) -> None:
        if type(self._protocol).__name__ == "_ReceiveProtocol":
            writes.append(memoryview(data).nbytes)
        original(self, data)

    monkeypatch.setattr(transport_class, "write", counting)
    x = np.arange(1024, dtype=np.float32)
    (answer,) = asyncio.run(_keep_alive_round_trips(1, {"x": x}))
    assert len(writes) == 1 and writes[0] == len(answer)
    assert answer.endswith(x.tobytes())


def _count_made_buffers(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that gets an item for each receive buffer the server makes
    (rather than takes from those it kept)."""
    from binproto.adapters import asyncio as adapter

    made: list[int] = []
    original = adapter._ReceiveBuffers._make

    def counting(self: Any) -> bytearray:
        made.append(1)
        return original(self)

    monkeypatch.setattr(adapter._ReceiveBuffers, "_make", counting)
    return made


def test_a_request_taken_whole_leaves_its_receive_buffer_to_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Requests arriving together are each received into a buffer before any
    # is served: made for each read and freed after each request, buffers
    # come and go in batches and their pages are faulted in again each time.
    made = _count_made_buffers(monkeypatch)
    x = np.arange(4096, dtype=np.float32)  # 16 KiB: read with its head, taken whole
    answers = asyncio.run(_keep_alive_round_trips(5, {"x": x}))
    assert len(answers) == 5 and all(a.endswith(x.tobytes()) for a in answers)
    assert len(made) == 1


def test_a_small_request_leaves_its_receive_buffer_to_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A few bytes are copied out of the buffer they came in, which is kept
    # again at once. (An empty body is an error; the connection stays open.)
    request = b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
    made = _count_made_buffers(monkeypatch)

    async def main() -> list[bytes]:
        srv = await start_server()
        port = srv.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        answers = []
        try:
            for _ in range(5):
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                found = re.search(rb"\ncontent-length: (\d+)", head.lower())
                assert found is not None
                answers.append(head + await reader.readexactly(int(found.group(1))))
        finally:
            writer.close()
            await close_server(srv)
        return answers

    answers = asyncio.run(main())
    assert len(answers) == 5 and all(a.startswith(b"HTTP/1.1 400 ") for a in answers)
    assert len(made) == 1


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_body_bytes_that_came_with_the_head_outlive_other_connections_requests(
    loop: str,
) -> None:
    # A body too big to take whole came, in part, with its head: the buffer
    # it came in must not serve another connection before the handler reads
    # it (the kept buffers are overwritten with junk when given back: see
    # conftest.py). The same head each time: a kept head the third time.
    async def late(request: InferRequest) -> dict[str, Any]:
        await asyncio.sleep(0.3)  # another connection's requests come meanwhile
        return dict(await request.tensors())

    app = V2Server([Model("late", late), echo_model()], timeouts=Timeouts(keep_alive=60))
    big = np.frombuffer(np.random.default_rng(1).bytes(200_000), dtype=np.uint8)
    small = np.full(60_000, 0xEE, dtype=np.uint8)
    with running("asyncio", app, loop=loop) as served:
        port = served.port
        a = socket.create_connection(("127.0.0.1", port))
        b = socket.create_connection(("127.0.0.1", port))
        answers = []
        try:
            for _ in range(3):
                a.sendall(infer_bytes({"x": big}, target="/v2/models/late/infer"))
                time.sleep(0.1)
                for _ in range(3):
                    b.sendall(infer_bytes({"x": small}))
                    status, body, _ = read_response(b, check_closed=False)
                    assert status == 200 and body.endswith(small.tobytes())
                status, body, _ = read_response(a, check_closed=False)
                answers.append(status == 200 and body.endswith(big.tobytes()))
        finally:
            a.close()
            b.close()
    assert answers == [True] * 3


def test_arrays_a_model_keeps_are_not_overwritten_by_later_requests() -> None:
    # The receive buffer a request came in serves the next one: the arrays
    # handed to the model must not be views of it.
    kept: list[Any] = []

    async def keep(request: InferRequest) -> dict[str, Any]:
        tensors = await request.tensors()
        kept.append(tensors["x"])
        return dict(tensors)

    # (bytes: a view of any offset would be aligned, so none would be copied)
    values = [np.full(16384, i, dtype=np.uint8) for i in range(4)]

    async def main() -> list[bytes]:
        srv = await start_server(V2Server([Model("keep", keep)]))
        port = srv.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        answers = []
        try:
            for value in values:
                writer.write(infer_bytes({"x": value}, target="/v2/models/keep/infer"))
                head = await reader.readuntil(b"\r\n\r\n")
                found = re.search(rb"\ncontent-length: (\d+)", head.lower())
                assert found is not None
                answers.append(await reader.readexactly(int(found.group(1))))
        finally:
            writer.close()
            await close_server(srv)
        return answers

    answers = asyncio.run(main())
    assert all(a.endswith(v.tobytes()) for a, v in zip(answers, values, strict=True))
    assert len(kept) == len(values)
    for array, value in zip(kept, values, strict=True):
        np.testing.assert_array_equal(array, value)


class _Transport:
    """What _ReceiveProtocol asks of its transport, doing nothing."""

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False


def _protocol(most: int) -> tuple[Any, Any]:
    """A receive protocol over no socket, and the buffers it keeps (at most ``most``)."""
    from binproto.adapters.asyncio import _ReceiveBuffers, _ReceiveProtocol

    buffers = _ReceiveBuffers(most)
    protocol = _ReceiveProtocol(buffers=buffers)
    protocol.transport = _Transport()  # type: ignore[assignment]
    return protocol, buffers


def test_a_receive_buffer_is_lent_to_the_read_that_waited_and_comes_back_once() -> None:
    from binproto.adapters.asyncio import LEND_FROM

    protocol, buffers = _protocol(most=2)
    sent = bytes(range(256)) * (LEND_FROM // 256)
    assert LEND_FROM <= len(sent) <= HEAD_READ

    async def main() -> None:
        protocol._loop = asyncio.get_running_loop()
        reading = asyncio.ensure_future(protocol.receive_some(HEAD_READ, None))
        await asyncio.sleep(0)  # (waiting for bytes)
        buf = protocol.get_buffer(-1)
        assert type(buf) is bytearray and len(buf) == HEAD_READ
        buf[: len(sent)] = sent
        protocol.buffer_updated(len(sent))
        got = await reading
        assert got.obj is buf and bytes(got) == sent  # lent: not copied
        assert buffers._free == []
        protocol.recycle(memoryview(bytearray(sent)))  # not its memory
        assert buffers._free == []
        protocol.recycle(got[100:])
        assert len(buffers._free) == 1 and buffers._free[0] is buf
        protocol.recycle(got)  # (given back once)
        assert len(buffers._free) == 1
        assert protocol.get_buffer(-1) is buf

    asyncio.run(main())


@pytest.mark.parametrize("waiting", [True, False], ids=["a-few-bytes", "nobody-waiting"])
def test_bytes_that_would_wait_are_copied_out_of_their_receive_buffer(waiting: bool) -> None:
    # Lent, a kept buffer would be held whole while its bytes wait: a few
    # (the start of a slow body), or any that nobody asked for yet (a
    # pipelined request, while the one before it is served).
    from binproto.adapters.asyncio import LEND_FROM

    protocol, buffers = _protocol(most=2)
    sent = b"abcdef" if waiting else bytes(LEND_FROM)

    async def main() -> None:
        protocol._loop = asyncio.get_running_loop()
        if waiting:
            reading = asyncio.ensure_future(protocol.receive_some(HEAD_READ, None))
            await asyncio.sleep(0)
        buf = protocol.get_buffer(-1)
        buf[: len(sent)] = sent
        protocol.buffer_updated(len(sent))
        assert len(buffers._free) == 1 and buffers._free[0] is buf  # kept again at once
        got = await reading if waiting else await protocol.receive_some(HEAD_READ, None)
        assert got.obj is not buf and bytes(got) == sent

    asyncio.run(main())


def test_a_receive_buffer_that_received_nothing_is_kept_again() -> None:
    # uvloop asks for a buffer whenever a read filled the last, and may then
    # find nothing to read: that buffer goes back when the next read waits.
    protocol, buffers = _protocol(most=2)

    async def main() -> None:
        protocol._loop = asyncio.get_running_loop()
        buf = protocol.get_buffer(-1)
        assert buffers._free == []
        waiting = asyncio.ensure_future(protocol.receive_some(10, None))
        await asyncio.sleep(0)
        assert len(buffers._free) == 1 and buffers._free[0] is buf
        waiting.cancel()

    asyncio.run(main())


def test_a_server_keeps_a_bounded_number_of_receive_buffers() -> None:
    from binproto.adapters.asyncio import _ReceiveBuffers

    buffers = _ReceiveBuffers(most=2)
    taken = [buffers.take() for _ in range(3)]
    assert len({id(b) for b in taken}) == 3
    for buf in taken:
        buffers.give(buf)
    assert len(buffers._free) == 2
    assert buffers.take() is taken[1] and buffers.take() is taken[0]
    fresh = buffers.take()
    assert all(fresh is not buf for buf in taken)


def test_reading_is_not_paused_per_request(monkeypatch: pytest.MonkeyPatch) -> None:
    # Stopping and restarting reading costs two epoll_ctl calls; a keep-alive
    # client's next request should land in the read already waiting for it.
    from asyncio import selector_events

    pauses: list[int] = []
    transport_class: Any = selector_events._SelectorTransport  # type: ignore[attr-defined]
    original = transport_class.pause_reading

    def counting(self: Any) -> None:
        if type(self._protocol).__name__ == "_ReceiveProtocol":
            pauses.append(1)
        original(self)

    monkeypatch.setattr(transport_class, "pause_reading", counting)
    answers = asyncio.run(_keep_alive_round_trips(20, {"x": np.arange(16, dtype=np.int32)}))
    assert len(answers) == 20 and all(a.startswith(b"HTTP/1.1 200") for a in answers)
    assert pauses == []


def test_a_content_length_body_is_read_around_h11(monkeypatch: pytest.MonkeyPatch) -> None:
    # h11 reads each request head; turning the body into h11 Data events
    # would copy it and run h11's state machine per piece, for nothing.
    import h11

    seen: list[str] = []
    original = h11.Connection.next_event

    def recording(self: h11.Connection) -> Any:
        event = original(self)
        seen.append(type(event).__name__)
        return event

    monkeypatch.setattr(h11.Connection, "next_event", recording)
    # (No head is known: h11 reads each of them.)
    monkeypatch.setattr(KnownHeads, "get", lambda self, head: None)
    x = np.arange(1024, dtype=np.float32)
    answers = asyncio.run(_keep_alive_round_trips(3, {"x": x}))
    assert len(answers) == 3 and all(a.endswith(x.tobytes()) for a in answers)
    assert seen.count("Request") == 3
    assert "Data" not in seen and "EndOfMessage" not in seen, seen


def test_h11_is_given_only_the_head_of_a_request_sent_with_its_body(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The body bytes that come in the head's read are not put into h11's
    # buffer, only to be copied out of it again.
    import h11

    fed: list[int] = []
    original = h11.Connection.receive_data

    def counting(self: h11.Connection, data: Any) -> None:
        fed.append(len(data))
        original(self, data)

    monkeypatch.setattr(h11.Connection, "receive_data", counting)
    x = np.arange(16384, dtype=np.float32)  # 64 KiB
    answers = asyncio.run(_keep_alive_round_trips(3, {"x": x}))
    assert len(answers) == 3 and all(a.endswith(x.tobytes()) for a in answers)
    assert sum(fed) < 3 * 1024, fed  # three heads, none of the three bodies


def test_pipelined_requests_after_a_content_length_body_are_answered() -> None:
    # The bytes received past one body start the next request.
    async def main() -> list[bytes]:
        srv = await start_server()
        port = srv.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            xs = [np.full(n, n, dtype=np.int32) for n in (3, 1000, 5)]
            writer.write(b"".join(infer_bytes({"x": x}) for x in xs))
            answers = []
            for _ in xs:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(re.search(rb"\ncontent-length: (\d+)", head.lower()).group(1))  # type: ignore[union-attr]
                answers.append(await reader.readexactly(length))
            return [a[-4:] for a in answers]
        finally:
            writer.close()
            await close_server(srv)

    assert asyncio.run(main()) == [np.int32(n).tobytes() for n in (3, 1000, 5)]


def test_streams_declare_what_they_offer_beyond_a_byte_stream() -> None:
    # The optional parts of a stream are protocols of their own, looked up once per class.
    import socket as _socket

    from binproto.adapters import _server
    from binproto.adapters.asyncio import ClientStream, StreamsStream

    class Minimal:  # just a ByteStream
        timeout: float | None = None

        async def receive_some(self, max_bytes: int) -> bytes:
            return b""

        async def send_all(self, buffers: Any) -> None:
            pass

        async def aclose(self) -> None:
            pass

    a, b = _socket.socketpair()
    try:
        sock_stream = ClientStream(sock=a)
        in_place: _server.ReceivesInto = sock_stream  # checked by mypy too
        threads: _server.RunsInThreads = sock_stream
        assert in_place is threads  # type: ignore[comparison-overlap]
        assert _server.capabilities(sock_stream) == (
            (True, True, True, _server.CHUNK, True, False, True)
        )
    finally:
        a.close()
        b.close()
    assert _server.capabilities(Minimal()) == (
        (False, False, False, _server.CHUNK, False, False, False)
    )
    # The server's own stream takes back the memory of a request it is done with.
    from binproto.adapters.asyncio import BufferedStream, _ReceiveProtocol

    buffered = BufferedStream(_ReceiveProtocol())
    recycles: _server.Recycles = buffered  # checked by mypy too
    assert recycles is buffered and _server.capabilities(buffered).recycles
    assert _server.capabilities(buffered).half_closes
    assert StreamsStream.read_size > _server.CHUNK
    reader = _server.BodyReader(Minimal(), h11.Connection(h11.SERVER), 0, receive_in_place=True)
    assert reader.checkpoint is None and reader.to_thread is None and not reader.in_place


def test_a_target_urlsplit_refuses_is_answered_404() -> None:
    async def main() -> bytes:
        srv = await start_server()
        port = srv.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(b"GET //[ HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            return head
        finally:
            writer.close()
            await close_server(srv)

    assert asyncio.run(main()).startswith(b"HTTP/1.1 404 ")


def test_h11_is_asked_for_an_event_only_when_it_holds_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A fresh connection per request holds nothing until bytes are read: asking
    # it first is a call that can only say NEED_DATA.
    body = binproto.encode_request({"x": np.arange(4, dtype=np.float32)})
    wire, hl = bytes(body), body.header_length
    assert hl is not None
    # (Heads that differ: h11 reads each, none is a known head.)
    head = (
        b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x%d\r\n"
        b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
    )
    answers: list[bytes] = []

    class Requests:  # three requests, one per read, then the end
        timeout: float | None = None
        left = 3

        async def receive_some(self, max_bytes: int) -> bytes:
            if not self.left:
                return b""
            self.left -= 1
            return head % (self.left, hl, len(wire)) + wire

        async def send_all(self, buffers: Any) -> None:
            answers.append(b"".join(bytes(b) for b in buffers))

        async def aclose(self) -> None:
            pass

    events: list[Any] = []
    next_event = h11.Connection.next_event

    def counting(self: h11.Connection) -> Any:
        event = next_event(self)
        events.append(event)
        return event

    monkeypatch.setattr(h11.Connection, "next_event", counting)
    asyncio.run(V2Server([echo_model()]).serve_connection(Requests()))
    assert len(answers) == 3 and all(a.startswith(b"HTTP/1.1 200 ") for a in answers)
    assert [type(e).__name__ for e in events] == ["Request"] * 3 + ["ConnectionClosed"]
