"""The trio adapter over loopback: binproto's trio client against the trio
server, a 64 MiB tensor, backpressure, trio streams and sockets, and
``python -m binproto serve --backend trio``. (tritonclient and raw-socket
peers call every backend: test_app_tritonclient.py, test_app_wire.py.)"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import pathlib
import socket
import struct
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing
import tritonclient.http as triton_http

import binproto
from binproto import HeaderParsed, MessageComplete, TensorChunk, TensorComplete
from binproto.adapters import trio as bt
from binproto.adapters._server import (
    HEAD_READ,
    InferRequest,
    Model,
    V2Server,
)
from binproto.adapters.h11 import HTTPError
from tests.fakes import ScriptedServer, Step, ok_answer
from tests.helpers import bytes_tensor
from tests.interop.samples import DATATYPES, sample, utf8_bytes
from tests.models import binary_expected, same, server_models
from tests.servers import infer_bytes

MiB = 1 << 20
Array = np.ndarray[Any, Any]


# -- models and servers -------------------------------------------------------------


def app() -> V2Server:
    """A server of the models server tests call (tests/models.py)."""
    return V2Server(models=server_models())


def run_trio(
    test: Callable[[int], Awaitable[None]], *, zero_copy: bool = True, timeout: float = 30
) -> None:
    """Run ``test(port)`` under trio.run, against a trio server on a free port."""

    async def main() -> None:
        with trio.fail_after(timeout):
            async with trio.open_nursery() as nursery:
                port = await nursery.start(functools.partial(bt.serve, app(), zero_copy=zero_copy))
                await test(port)
                nursery.cancel_scope.cancel()

    trio.run(main)


# -- binproto's trio client against the trio server -----------------------------------


@pytest.mark.parametrize("datatype", DATATYPES)
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_round_trip_every_datatype(datatype: str, binary: bool) -> None:
    arr = sample(datatype) if binary or datatype != "BYTES" else utf8_bytes()
    arr = arr.reshape(2, 2)

    async def test(port: int) -> None:
        async with bt.Client("127.0.0.1", port) as c:
            async with c.stream(
                "echo", {"x": arr}, binary=binary, binary_data_output=binary, id="r1"
            ) as response:
                got = await response.tensors()
                header = response.header
            assert header is not None and header.id == "r1"
            assert same(got["x"], arr), (got["x"], arr)
            info = header.tensor("x")
            assert info.datatype == datatype
            assert (info.binary_size is not None) == binary_expected(datatype, binary)

    run_trio(test)


def test_every_datatype_in_one_request_both_backends_of_receive() -> None:
    arrays = {dt: sample(dt) for dt in DATATYPES}

    async def test(port: int) -> None:
        for zero_copy in (True, False):
            async with bt.Client("127.0.0.1", port, zero_copy=zero_copy) as c:
                got = await c.infer("echo", arrays, binary_data_output=True)
                assert list(got) == list(arrays)
                for name, arr in arrays.items():
                    assert same(got[name], arr), name

    run_trio(test)
    run_trio(test, zero_copy=False)


def test_bytes_not_utf8_come_back_binary_even_when_json_is_asked() -> None:
    arr = np.array([b"\xff\xfe\x00", b"", b"\x80abc", "é".encode()], dtype=np.object_)

    async def test(port: int) -> None:
        async with bt.Client("127.0.0.1", port) as c:
            async with c.stream("echo", {"s": arr}, binary_data_output=False) as response:
                got = await response.tensors()
                assert response.header is not None
                assert response.header.tensor("s").binary_size == len(bytes_tensor(list(arr)))
            assert same(got["s"], arr)
            with pytest.raises(binproto.LocalProtocolError, match="not valid UTF-8"):
                await c.infer("echo", {"s": arr}, binary=False)

    run_trio(test)


def test_zero_size_tensors() -> None:
    arrays: dict[str, Array] = {
        "f": np.zeros((0,), dtype=np.float32),
        "i": np.zeros((2, 0, 3), dtype=np.int8),
        "s": np.array([], dtype=np.object_),
        "b": np.zeros((0, 4), dtype=np.bool_),
    }

    async def test(port: int) -> None:
        async with bt.Client("127.0.0.1", port) as c:
            for binary in (True, False):
                got = await c.infer("echo", arrays, binary=binary, binary_data_output=binary)
                for name, arr in arrays.items():
                    assert same(got[name], arr), (name, binary)

    run_trio(test)


def test_streaming_events_in_body_order() -> None:
    a = np.arange(300_000, dtype=np.float32)
    b = np.array([b"x" * 1000, b"\x00\xff"], dtype=np.object_)

    async def test(port: int) -> None:
        async with bt.Client("127.0.0.1", port) as c:
            async with c.stream("echo", {"a": a, "b": b}, binary_data_output=True) as response:
                assert response.status == 200
                events = [event async for event in response]
            # The connection is reused after a fully read response.
            again = await c.infer("echo", {"a": a[:5]})
            assert same(again["a"], a[:5])
        assert type(events[0]) is HeaderParsed
        assert type(events[-1]) is MessageComplete
        pieces: dict[int, bytearray] = {0: bytearray(), 1: bytearray()}
        completed = []
        for event in events[1:-1]:
            if type(event) is TensorChunk:
                assert event.offset == len(pieces[event.index])
                pieces[event.index] += event.data
            else:
                assert type(event) is TensorComplete
                completed.append(event.name)
        assert completed == ["a", "b"]
        assert bytes(pieces[0]) == a.tobytes()
        assert bytes(pieces[1]) == bytes_tensor(list(b))
        # A 1.2 MB tensor read as it arrives, not in one piece.
        assert sum(type(e) is TensorChunk and e.index == 0 for e in events) > 1

    run_trio(test)


@pytest.mark.parametrize("zero_copy", [True, False], ids=["recv_into", "receive_some"])
def test_tensor_bytes_received_in_place(zero_copy: bool) -> None:
    x = np.arange(MiB // 4, dtype=np.float32)

    async def test(port: int) -> None:
        async with bt.Client("127.0.0.1", port, zero_copy=zero_copy) as c:
            async with c.stream("probe", {"x": x}, binary_data_output=True) as response:
                got = await response.tensors()
                client_asm = response.body.assembler
        assert same(got["x"], x)
        assert client_asm is not None
        # Some bytes arrive with the head (one read); the rest in place.
        server_in_place = int(got["in_place"][0])
        if zero_copy:
            assert x.nbytes - HEAD_READ <= server_in_place <= x.nbytes
            # The response holds the 8-byte "in_place" output too.
            assert x.nbytes - 65536 <= client_asm.bytes_in_place <= x.nbytes + 8
        else:
            assert server_in_place == 0 and client_asm.bytes_in_place == 0

    run_trio(test, zero_copy=zero_copy)


def test_errors_are_v2_error_responses_and_the_client_keeps_working() -> None:
    x = np.ones(3, dtype=np.float32)

    async def test(port: int) -> None:
        async with bt.Client("127.0.0.1", port) as c:
            with pytest.raises(HTTPError) as info:
                await c.infer("nope", {"x": x})
            assert info.value.status == 404 and "unknown model: 'nope'" in info.value.message
            with pytest.raises(HTTPError) as info:
                await c.infer("echo", {"x": x}, model_version="9")
            assert info.value.status == 404 and "version 9" in info.value.message
            with pytest.raises(HTTPError) as info:
                await c.infer("echo", {"x": x}, outputs=["y"])
            assert info.value.status == 400
            assert "unexpected inference output 'y'" in info.value.message
            with pytest.raises(HTTPError) as info:
                await c.infer("fail", {"x": x})
            assert (info.value.status, info.value.message) == (422, "the model refuses this input")
            with pytest.raises(HTTPError) as info:
                await c.infer("boom", {"x": x})
            assert info.value.status == 500 and "kaput" in info.value.message
            status, body = await c.get("/v2/nowhere")
            assert status == 404 and json.loads(body) == {"error": "Not Found"}
            assert same((await c.infer("echo", {"x": x}))["x"], x)
        async with bt.Client("127.0.0.1", port) as c:
            # A bodyless GET to the infer endpoint: 405, and the connection serves on.
            status, body = await c.get("/v2/models/echo/infer")
            assert status == 405 and "not allowed" in json.loads(body)["error"]
            (conn,) = c._idle
            assert same((await c.infer("echo", {"x": x}))["x"], x)
            assert c._idle == [conn]

    run_trio(test)


def test_health_and_metadata() -> None:
    async def test(port: int) -> None:
        async with bt.Client("127.0.0.1", port) as c:
            assert (await c.get("/v2/health/live"))[0] == 200
            assert (await c.get("/v2/health/ready"))[0] == 200
            assert (await c.get("/v2/models/echo/ready"))[0] == 200
            assert (await c.get("/v2/models/nope/ready"))[0] == 404
            status, body = await c.get("/v2")
            assert status == 200 and "binary_tensor_data" in json.loads(body)["extensions"]
            status, body = await c.get("/v2/models/echo")
            assert status == 200 and json.loads(body)["name"] == "echo"

    run_trio(test)


def test_a_stalled_client_times_out_and_others_are_served() -> None:
    async def test(port: int) -> None:
        stalled = await trio.open_tcp_stream("127.0.0.1", port)
        await stalled.send_all(b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n")
        async with bt.Client("127.0.0.1", port) as c:
            assert same((await c.infer("echo", {"x": np.ones(2)}))["x"], np.ones(2))
        # The server gives up on the half-sent head after its timeout: 408, closed.
        received = bytearray()
        with trio.fail_after(10):
            while data := await stalled.receive_some(65536):
                received += data
        assert received.startswith(b"HTTP/1.1 408 "), received[:100]
        await stalled.aclose()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(functools.partial(bt.serve, app(), timeout=0.5))
            await test(port)
            nursery.cancel_scope.cancel()

    trio.run(main)


@pytest.mark.slow
def test_64mib_tensor_through_the_trio_server_and_client() -> None:
    x = np.arange(16 * MiB, dtype=np.float32)  # 64 MiB; every value distinct
    x[::4096] = -x[::4096]

    async def test(port: int) -> None:
        async with bt.Client("127.0.0.1", port) as c:
            async with c.stream("probe", {"x": x}, binary_data_output=True) as response:
                got = await response.tensors()
                asm = response.body.assembler
        assert got["x"].shape == x.shape and got["x"].dtype == np.float32
        assert np.array_equal(got["x"], x)
        assert asm is not None and asm.bytes_in_place >= x.nbytes - 65536
        assert int(got["in_place"][0]) >= x.nbytes - HEAD_READ  # (one read with the head)

    run_trio(test, timeout=60)


# -- the example server ---------------------------------------------------------------


def load_example() -> Any:
    """examples/trio_server.py as a module."""
    path = pathlib.Path(__file__).resolve().parent.parent / "examples" / "trio_server.py"
    spec = importlib.util.spec_from_file_location("trio_server_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_sum_server() -> None:
    example = load_example()
    outputs = trio.run(example.demo)
    assert same(outputs["sum"], np.array([0.5, 1.5, 2.5, 3.5], dtype=np.float32))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            served = await nursery.start(bt.serve, example.make_server())
            async with bt.Client("127.0.0.1", served) as c:
                got = await c.infer(
                    "sum",
                    {"a": np.array([1, 2], dtype=np.int8), "b": np.array([0.25, 1], np.float64)},
                    binary=False,
                )
                assert same(got["sum"], np.array([1.25, 3.0]))
                with pytest.raises(HTTPError, match="same shape") as info:
                    await c.infer("sum", {"a": np.ones(2), "b": np.ones(3)})
                assert info.value.status == 400
                with pytest.raises(HTTPError, match="BYTES"):
                    await c.infer("sum", {"s": np.array([b"x"], dtype=np.object_)})
            nursery.cancel_scope.cancel()

    trio.run(main)


# -- backpressure and other trio streams ----------------------------------------------


class Counting:
    """A ByteStream that counts the bytes it has received from ``inner``."""

    received = 0  # shared by every instance: one connection per test
    timeout: float | None = None  # the server sets it; unused here

    def __init__(self, inner: bt.TrioStream) -> None:
        self.inner = inner

    async def receive_some(self, max_bytes: int) -> bytes:
        data = await self.inner.receive_some(max_bytes)
        Counting.received += len(data)
        return data

    async def send_all(self, buffers: Sequence[Any]) -> None:
        await self.inner.send_all(buffers)

    async def aclose(self) -> None:
        await self.inner.aclose()


class CountingInto(Counting):
    """A Counting stream with ``receive_into`` (over a TrioSocketStream)."""

    inner: bt.TrioSocketStream

    async def receive_into(self, view: memoryview) -> int:
        n = await self.inner.receive_into(view)
        Counting.received += n
        return n


@pytest.mark.parametrize("zero_copy", [True, False], ids=["recv_into", "receive_some"])
def test_the_server_reads_only_as_fast_as_the_handler_takes_events(zero_copy: bool) -> None:
    x = np.arange(2 * MiB, dtype=np.float32)  # 8 MiB: far more than the socket buffers
    ahead: list[int] = []

    async def consume(request: InferRequest) -> Any:
        start = Counting.received
        async for event in request.body:
            if type(event) is TensorChunk:
                consumed = event.offset + len(event.data)
                ahead.append(Counting.received - start - consumed)
                await trio.sleep(0)  # a consumer slower than the socket
        return {"n": np.array([len(ahead)], dtype=np.int64)}

    server = V2Server(models=[Model("consume", consume)])

    async def handler(stream: trio.SocketStream) -> None:
        inner = bt.wrap(stream, zero_copy=zero_copy)
        if isinstance(inner, bt.TrioSocketStream):
            await server.serve_connection(CountingInto(inner))
        else:
            await server.serve_connection(Counting(inner))

    async def main() -> None:
        Counting.received = 0
        async with trio.open_nursery() as nursery:
            [listener] = await nursery.start(
                functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1")
            )
            served = listener.socket.getsockname()[1]
            async with bt.Client("127.0.0.1", served) as c:
                got = await c.infer("consume", {"x": x})
            nursery.cancel_scope.cancel()
        assert int(got["n"][0]) == len(ahead) > 100

    trio.run(main)
    # Never more than one read (64 KiB) ahead of what the handler has taken.
    assert max(ahead) <= 65536


def test_any_trio_stream_in_memory() -> None:
    x = np.arange(100_000, dtype=np.int16)
    s = np.array([b"\xff", b"ok"], dtype=np.object_)

    async def main() -> None:
        client_side, server_side = trio.testing.lockstep_stream_pair()
        assert type(bt.wrap(server_side)) is bt.TrioStream  # no socket: no recv_into
        async with trio.open_nursery() as nursery:
            nursery.start_soon(V2Server().serve_connection, bt.wrap(server_side))

            async def open_stream() -> bt.TrioStream:
                return bt.wrap(client_side)

            async with bt.ClientCore(open_stream, host="memory") as c:
                got = await c.infer("echo", {"x": x, "s": s}, binary_data_output=True)
                again = await c.infer("echo", {"x": x[:3]}, binary=False)
            assert same(got["x"], x) and same(got["s"], s) and same(again["x"], x[:3])

    trio.run(main)


# -- compression -----------------------------------------------------------------------


def _coding(response: Any) -> str | None:
    """The Content-Encoding of a client's ResponseStream (None when absent)."""
    values = [v.decode() for k, v in response.http.headers if k == b"content-encoding"]
    return values[0] if values else None


@pytest.mark.parametrize(
    ("accept", "request_encoding", "expected"),
    [
        ("gzip, deflate", None, "gzip"),
        ("deflate", "gzip", "deflate"),
        ("gzip;q=0, deflate", "deflate", "deflate"),
        ("br", None, None),  # nothing binproto produces: sent as it is
        (None, "gzip", None),
    ],
)
@pytest.mark.parametrize("zero_copy", [True, False], ids=["recv_into", "receive_some"])
def test_client_and_server_compress(
    accept: str | None, request_encoding: str | None, expected: str | None, zero_copy: bool
) -> None:
    x = np.arange(50_000, dtype=np.int32).reshape(500, 100)
    s = np.array([b"\xff\x00", b"", b"abc"], dtype=np.object_)

    async def test(port: int) -> None:
        async with bt.Client(
            "127.0.0.1",
            port,
            zero_copy=zero_copy,
            accept_encoding=accept,
            request_encoding=request_encoding,
        ) as c:
            for _ in range(2):  # the connection serves on after each
                async with c.stream("echo", {"x": x, "s": s}, binary_data_output=True) as r:
                    assert _coding(r) == expected
                    headers = {k.decode(): v.decode() for k, v in r.http.headers}
                    if expected is None:
                        assert "content-length" in headers
                    else:
                        assert headers["vary"] == "Accept-Encoding"
                        assert headers["transfer-encoding"] == "chunked"
                        assert "content-length" not in headers
                    out = await r.tensors()
                assert same(out["x"], x) and same(out["s"], s)
            # Error responses are never compressed.
            with pytest.raises(HTTPError) as info:
                await c.infer("nope", {"x": x})
            assert info.value.status == 404 and "unknown model" in info.value.message

    run_trio(test, zero_copy=zero_copy)


def test_server_with_compression_off_never_compresses() -> None:
    x = np.zeros(100_000, dtype=np.float32)

    async def test(port: int) -> None:
        async with bt.Client("127.0.0.1", port, accept_encoding="gzip, deflate") as c:
            async with c.stream("echo", {"x": x}, binary_data_output=True) as r:
                assert _coding(r) is None
                assert same((await r.tensors())["x"], x)
        sync = triton_http.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            inp = triton_http.InferInput("x", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            result = await trio.to_thread.run_sync(
                functools.partial(sync.infer, "echo", [inp], response_compression_algorithm="gzip")
            )
            assert same(result.as_numpy("x"), x)
        finally:
            sync.close()

    async def main() -> None:
        server = V2Server(compress_responses=False)
        async with trio.open_nursery() as nursery:
            port = await nursery.start(functools.partial(bt.serve, server))
            await test(port)
            nursery.cancel_scope.cancel()

    trio.run(main)


# -- the client after a server's Connection: close --------------------------------------


def test_get_reconnects_after_connection_close() -> None:
    script: list[list[Step]] = [
        [ok_answer(b'{"connection": %d}' % i, close=True), "close"] for i in range(3)
    ]
    fake = ScriptedServer(script)
    port = fake.port
    bodies: list[Any] = []

    async def main() -> None:
        async with bt.Client("127.0.0.1", port) as c:
            for _ in range(3):
                bodies.append(json.loads((await c.get("/v2"))[1]))

    with fake:
        trio.run(main)
    assert bodies == [{"connection": i} for i in range(3)]  # one connection each


# -- timeouts ------------------------------------------------------------------------------


def test_a_peer_stalled_mid_body_gets_408() -> None:
    """A stream timeout is a TimeoutError, answered with 408 as on asyncio (not 500)."""
    x = np.zeros(1000, dtype=np.float32)
    wire = infer_bytes({"x": x})

    async def main() -> bytes:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(functools.partial(bt.serve, app(), timeout=0.3))
            stalled = await trio.open_tcp_stream("127.0.0.1", port)
            await stalled.send_all(wire[:-100])
            received = bytearray()
            with trio.fail_after(10):
                while data := await stalled.receive_some(65536):  # until the server closes
                    received += data
            await stalled.aclose()
            nursery.cancel_scope.cancel()
        return bytes(received)

    received = trio.run(main)
    assert received.startswith(b"HTTP/1.1 408 "), received[:100]
    assert b"timed out" in received


def test_stream_timeout_is_a_timeout_error() -> None:
    async def main() -> None:
        left, right = trio.testing.memory_stream_pair()
        stream = bt.wrap(left, timeout=0.05)
        with pytest.raises(TimeoutError):
            await stream.receive_some(10)
        await right.send_all(b"ok")
        assert await stream.receive_some(10) == b"ok"  # the stream still works
        no_bound = bt.wrap(left)
        with trio.move_on_after(0.1) as scope:
            await no_bound.receive_some(10)
        assert scope.cancelled_caught  # no timeout: waits until cancelled

    trio.run(main)


def test_small_buffers_leave_in_one_send_and_big_ones_unjoined() -> None:
    sent: list[Any] = []

    class Recording(trio.abc.SendStream):
        async def send_all(self, data: Any) -> None:
            sent.append(data)

        async def wait_send_all_might_not_block(self) -> None:
            pass

        async def aclose(self) -> None:
            pass

    big = np.arange(1 << 16, dtype=np.uint8)
    stream = bt.TrioStream(trio.StapledStream(Recording(), trio.testing.MemoryReceiveStream()))
    trio.run(stream.send_all, [b"head", b"json", memoryview(b"tensor"), big, b"tail"])
    assert [bytes(s) for s in sent[:1]] == [b"headjsontensor"]
    assert len(sent) == 3 and np.shares_memory(np.frombuffer(sent[1], np.uint8), big)
    assert bytes(sent[2]) == b"tail"


def test_tcp_connections_use_the_socket_not_trio_stream_layer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # trio.SocketStream adds a context manager (and a conflict check) to every
    # receive and send: the server and client call the socket itself.
    async def refused(*args: Any) -> None:
        raise AssertionError("trio.SocketStream's own receive_some/send_all was called")

    monkeypatch.setattr(trio.SocketStream, "send_all", refused)
    monkeypatch.setattr(trio.SocketStream, "receive_some", refused)
    x = np.arange(1024, dtype=np.float32)

    async def test(port: int) -> None:
        async with bt.Client("127.0.0.1", port) as client:
            for _ in range(3):  # keep-alive: heads read with receive_some
                out = await client.infer("echo", {"x": x}, binary_data_output=True)
                assert same(out["x"], x)

    run_trio(test)


def test_socket_stream_refuses_a_zero_byte_receive_and_reports_a_closed_socket() -> None:
    # b"" would read as the end of the stream; trio.SocketStream raises too.
    async def main() -> None:
        a, b = trio.socket.socketpair()
        stream = bt.TrioSocketStream(trio.SocketStream(a), timeout=5)
        with pytest.raises(ValueError):
            await stream.receive_some(0)
        await b.send(b"x")
        assert await stream.receive_some(10) == b"x"
        a.close()
        with pytest.raises(trio.ClosedResourceError):
            await stream.receive_some(10)
        with pytest.raises(trio.ClosedResourceError):
            await stream.send_all([b"y"])
        b.close()

    trio.run(main)


@pytest.mark.skipif(os.name != "posix", reason="trio's own socket calls elsewhere: all bounded")
def test_socket_calls_that_cannot_wait_need_no_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    # A cancel scope per call is a share of each small request's cost: a
    # receive with bytes waiting, or a send the socket takes whole, cannot
    # wait, so it is made without one. Calls that may wait keep their bound.
    bounded: list[int] = []
    plain_bounded = bt.TrioStream._bounded

    async def counting(self: bt.TrioStream, op: Any) -> Any:
        bounded.append(1)
        return await plain_bounded(self, op)

    monkeypatch.setattr(bt.TrioStream, "_bounded", counting)

    async def main() -> None:
        a, b = trio.socket.socketpair()
        stream = bt.TrioSocketStream(trio.SocketStream(a), timeout=0.2)
        await b.send(b"hello")
        await trio.sleep(0.01)
        assert await stream.receive_some(3) == b"hel"
        view = memoryview(bytearray(8))
        assert await stream.receive_into(view) == 2 and bytes(view[:2]) == b"lo"
        await stream.send_all([b"small", b" answer"])
        assert await b.recv(100) == b"small answer"
        assert bounded == []
        # Nothing to read: the wait is bounded.
        with pytest.raises(TimeoutError):
            await stream.receive_some(10)
        with pytest.raises(TimeoutError):
            await stream.receive_into(view)
        assert len(bounded) == 2
        # More than the socket takes at once, to a peer that reads nothing:
        # what is left after the first send is bounded too.
        with pytest.raises(TimeoutError):
            await stream.send_all([np.zeros(16 << 20, dtype=np.uint8)])
        assert len(bounded) == 3
        a.close()
        b.close()

    trio.run(main)


def test_a_send_taken_in_part_arrives_whole_and_in_order() -> None:
    data = np.random.default_rng(1).integers(0, 256, size=8 << 20, dtype=np.uint8)

    async def main() -> None:
        a, b = trio.socket.socketpair()
        stream = bt.TrioSocketStream(trio.SocketStream(a), timeout=5)
        got = bytearray()

        async def read_all() -> None:
            while len(got) < data.nbytes + 4:
                chunk = await b.recv(1 << 16)
                assert chunk
                got.extend(chunk)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_all)
            await stream.send_all([b"head", data])
        assert bytes(got[:4]) == b"head" and got[4:] == data.tobytes()
        a.close()
        b.close()

    trio.run(main)


async def _tcp_pair() -> tuple[trio.socket.SocketType, trio.SocketStream, trio.socket.SocketType]:
    """A listener, a TCP stream connected to it, and the accepted socket."""
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen()
    client = await trio.open_tcp_stream("127.0.0.1", listener.getsockname()[1])
    peer, _ = await listener.accept()
    return listener, client, peer


@pytest.mark.parametrize("call", ["receive_some", "receive_into", "send_all"])
def test_a_reset_connection_is_a_connection_reset_error(call: str) -> None:
    # Whether the call is made at once or waits, a broken connection reads as
    # asyncio says it (the server and client catch ConnectionError).
    async def main() -> None:
        listener, client, peer = await _tcp_pair()
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        peer.close()  # a reset, not a close
        await trio.sleep(0.05)
        stream = bt.TrioSocketStream(client, timeout=5)
        with pytest.raises(ConnectionResetError):
            if call == "receive_some":
                await stream.receive_some(10)
            elif call == "receive_into":
                await stream.receive_into(memoryview(bytearray(4)))
            else:
                for _ in range(3):  # a first send may still be taken
                    await stream.send_all([b"x" * 1024])
                    await trio.sleep(0.05)
        await client.aclose()
        listener.close()

    trio.run(main)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_TIMESTAMPING is Linux's")
def test_a_socket_with_only_an_error_queue_to_read_still_times_out() -> None:
    # Transmit timestamps queue up on the socket's error queue (poll says
    # POLLERR) while no byte is there to read: the receive waits, and its
    # wait is bounded.
    timestamping = getattr(socket, "SO_TIMESTAMPING", 37)

    async def main() -> None:
        listener, client, peer = await _tcp_pair()
        # TX_SOFTWARE | SOFTWARE | OPT_ID | OPT_TSONLY
        flags = (1 << 1) | (1 << 4) | (1 << 7) | (1 << 11)
        client.socket.setsockopt(socket.SOL_SOCKET, timestamping, flags)
        stream = bt.TrioSocketStream(client, timeout=0.3)
        await stream.send_all([b"ping"])
        await trio.sleep(0.05)
        with trio.fail_after(3):
            with pytest.raises(TimeoutError):
                await stream.receive_some(10)
        peer.close()
        await client.aclose()
        listener.close()

    trio.run(main)
