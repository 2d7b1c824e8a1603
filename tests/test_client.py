"""The V2 client core (binproto/adapters/_client.py) against canned responses from a
socket server: framing by close, error bodies, paths, and what a failed
response leaves behind. Run through the asyncio client, both transports."""

from __future__ import annotations

import asyncio
import gc
import gzip
import os
import resource
import weakref
import zlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest
import trio

import binproto
from binproto import LocalProtocolError, RemoteProtocolError
from binproto.adapters import trio as bt
from binproto.adapters._server import Timeouts, V2Server
from binproto.adapters.asyncio import Client, close_server, start_server
from binproto.adapters.h11 import HTTPError, error_message

from .fakes import ScriptedServer, Step
from .servers import serving_here


def _response(outputs: dict[str, Any]) -> tuple[bytes, int]:
    """An encoded V2 response body and its JSON header's length."""
    body = binproto.encode_response(outputs, model_name="m")
    assert body.header_length is not None
    return bytes(body), body.header_length


@asynccontextmanager
async def _canned(
    answer: Callable[[bytes], bytes], *, reset: bool = False
) -> AsyncIterator[tuple[int, list[bytes]]]:
    """A server that reads a request, writes ``answer(request head)`` and
    closes (``reset``: with a TCP reset, a zero linger time), on each
    connection; yields its port and the heads it read."""
    steps: list[Step] = [lambda head, _: answer(head), "reset" if reset else "close"]
    with ScriptedServer(otherwise=steps) as fake:
        yield fake.port, fake.heads


def _run(main: Callable[[], Any]) -> Any:
    return asyncio.run(main())


X = np.arange(6, dtype=np.float32)


def _error_for(answer: bytes, **client: Any) -> HTTPError:
    """The error a Client raises for an inference request answered ``answer``."""

    async def main() -> HTTPError:
        async with _canned(lambda _: answer) as (port, _):
            async with Client("127.0.0.1", port, **client) as c:
                with pytest.raises(HTTPError) as info:
                    await c.infer("m", {"x": X})
        return info.value

    error: HTTPError = _run(main)
    return error


@pytest.mark.parametrize("zero_copy", [True, False])
def test_a_response_framed_by_the_close_is_read(zero_copy: bool) -> None:
    # No Content-Length and no chunks: the body ends where the server closes.
    body, hl = _response({"y": X})
    head = b"HTTP/1.1 200 OK\r\nInference-Header-Content-Length: %d\r\n\r\n" % hl

    async def main() -> None:
        async with _canned(lambda _: head + body) as (port, heads):
            async with Client("127.0.0.1", port, zero_copy=zero_copy) as c:
                for _ in range(2):  # the second on a new connection
                    out = await c.infer("m", {"x": X})
                    assert np.array_equal(out["y"], X)
        assert len(heads) == 2

    _run(main)


@pytest.mark.parametrize("zero_copy", [True, False])
def test_an_error_framed_by_the_close_keeps_its_message(zero_copy: bool) -> None:
    answer = b'HTTP/1.1 500 Oops\r\n\r\n{"error": "the model failed"}'

    async def main() -> None:
        async with _canned(lambda _: answer) as (port, heads):
            async with Client("127.0.0.1", port, zero_copy=zero_copy) as c:
                for _ in range(2):  # the second on a new connection
                    with pytest.raises(HTTPError) as info:
                        await c.infer("m", {"x": X})
                    assert info.value.status == 500 and info.value.message == "the model failed"
        assert len(heads) == 2

    _run(main)


@pytest.mark.parametrize("zero_copy", [True, False])
def test_a_body_cut_short_before_the_close_is_still_refused(zero_copy: bool) -> None:
    body, hl = _response({"y": X})
    head = b"HTTP/1.1 200 OK\r\nInference-Header-Content-Length: %d\r\n" % hl
    chunked = head + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n" % len(body) + body[:-3]

    async def main() -> None:
        async with _canned(lambda _: chunked) as (port, _):
            async with Client("127.0.0.1", port, zero_copy=zero_copy) as c:
                with pytest.raises(RemoteProtocolError, match="closed the connection"):
                    await c.infer("m", {"x": X})

    _run(main)


def test_a_deeply_nested_error_body_is_an_http_error() -> None:
    nested = b"[" * 100_000
    assert error_message(500, nested).message == nested.decode()
    answer = b"HTTP/1.1 500 Oops\r\nContent-Length: %d\r\n\r\n" % len(nested) + nested
    assert _error_for(answer).status == 500


@pytest.mark.parametrize(
    ("model", "version", "target"),
    [
        ("m/versions/7", None, b"/v2/models/m%2Fversions%2F7/infer"),
        ("a b", "1 2", b"/v2/models/a%20b/versions/1%202/infer"),
        ("caf\u00e9", None, b"/v2/models/caf%C3%A9/infer"),
        ("m?x=1#f", None, b"/v2/models/m%3Fx%3D1%23f/infer"),
    ],
)
def test_model_names_and_versions_are_quoted(
    model: str, version: str | None, target: bytes
) -> None:
    body, hl = _response({"y": X})
    answer = (
        b"HTTP/1.1 200 OK\r\nInference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
        % (hl, len(body))
        + body
    )

    async def main() -> None:
        async with _canned(lambda _: answer) as (port, heads):
            async with Client("127.0.0.1", port) as c:
                await c.infer(model, {"x": X}, model_version=version)
        assert heads[0].startswith(b"POST " + target + b" HTTP/1.1\r\n")

    _run(main)


def test_a_path_h11_cannot_send_is_a_local_protocol_error() -> None:
    async def main() -> None:
        async with Client("127.0.0.1", 9) as c:  # refused before any connection
            with pytest.raises(LocalProtocolError, match="cannot send GET"):
                await c.get("/v2/models/a b")

    _run(main)


@pytest.mark.parametrize("zero_copy", [True, False])
def test_a_failed_response_lets_go_of_its_arrays_at_once(zero_copy: bool) -> None:
    # The server closes 10 bytes short of an 8 MiB output: once the caller
    # drops the error, the output's memory is free, without the collector.
    big = np.zeros(2 << 20, dtype=np.int32)
    body, hl = _response({"y": big})
    head = b"HTTP/1.1 200 OK\r\nInference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
    answer = head % (hl, len(body)) + body[:-10]
    made: list[weakref.ref[np.ndarray[Any, Any]]] = []

    def destination(info: binproto.TensorInfo) -> np.ndarray[Any, Any]:
        array = np.empty(info.shape, dtype=info.dtype)
        made.append(weakref.ref(array))
        return array

    async def main() -> None:
        async with _canned(lambda _: answer) as (port, _):
            async with Client("127.0.0.1", port, zero_copy=zero_copy) as c:
                try:
                    await c.infer("m", {"x": X}, destinations=destination)
                except RemoteProtocolError as exc:
                    assert "closed the connection" in str(exc)
                else:
                    raise AssertionError("a body cut short was taken")

    gc.disable()
    try:
        _run(main)
        assert len(made) == 1 and made[0]() is None
    finally:
        gc.enable()


@pytest.mark.parametrize("size", [6, 100_000])  # decoded whole, and through the parser
def test_tensors_twice_gives_the_same_arrays(size: int) -> None:
    body, hl = _response({"y": np.arange(size, dtype=np.float32)})
    head = b"HTTP/1.1 200 OK\r\nInference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"

    async def main() -> None:
        async with _canned(lambda _: head % (hl, len(body)) + body) as (port, _):
            async with Client("127.0.0.1", port) as c:
                async with c.stream("m", {"x": X}) as response:
                    first = await response.tensors()
                    assert await response.tensors() is first
                    with pytest.raises(LocalProtocolError, match="destinations come too late"):
                        await response.tensors({"y": np.empty(size, np.float32)})
        assert first["y"].shape == (size,)

    _run(main)


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_a_compressed_error_body_is_decoded(coding: str) -> None:
    text = b'{"error": "model m is overloaded"}'
    data = gzip.compress(text) if coding == "gzip" else zlib.compress(text)
    head = b"HTTP/1.1 503 Busy\r\nContent-Encoding: %s\r\nContent-Length: %d\r\n\r\n"
    error = _error_for(head % (coding.encode(), len(data)) + data, accept_encoding="gzip, deflate")
    assert error.status == 503 and error.message == "model m is overloaded"


def test_an_error_body_that_would_expand_past_its_bound_is_not_decoded() -> None:
    bomb = gzip.compress(b"0" * (64 << 20))  # 64 MiB of zeros in ~64 KiB
    head = b"HTTP/1.1 500 Oops\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n"
    error = _error_for(head % len(bomb) + bomb)
    assert error.status == 500
    assert error.message.startswith("the error body could not be decoded")


def test_a_failed_response_still_refuses_later_calls() -> None:
    # A BOOL byte of 2: the parser fails; the response's arrays are let go of,
    # and asking the response again is refused as before, not an OSError.
    body = bytearray(bytes(binproto.encode_response({"y": np.ones(100_000, bool)}, model_name="m")))
    body[-1] = 2
    hl = len(body) - 100_000
    head = b"HTTP/1.1 200 OK\r\nInference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
    answer = head % (hl, len(body)) + bytes(body)

    async def main() -> None:
        async with _canned(lambda _: answer) as (port, _):
            async with Client("127.0.0.1", port) as c:
                with pytest.raises(RemoteProtocolError, match="invalid BOOL value 2"):
                    async with c.stream("m", {"x": X}) as response:
                        await response.tensors()
                assert response.body.failed
                with pytest.raises(LocalProtocolError, match="ERROR state"):
                    await response.tensors()
                with pytest.raises(LocalProtocolError, match="ERROR state"):
                    await response.next_event()

    _run(main)


class _Counting(V2Server):
    """The echo server, counting the connections it serves."""

    connections = 0

    async def serve_connection(self, stream: Any, timeouts: Timeouts | None = None) -> None:
        self.connections += 1
        await super().serve_connection(stream, timeouts)


def _idle_closing() -> _Counting:
    return _Counting(timeouts=Timeouts(keep_alive=0.2, head=5, body=5, write=5))


@pytest.mark.parametrize("zero_copy", [True, False])
def test_a_connection_the_server_closed_while_idle_is_not_used_again(zero_copy: bool) -> None:
    # The server's keep-alive timeout closes the connection between two
    # requests: the second goes on a new connection instead of failing.
    server = _idle_closing()

    async def main() -> None:
        srv = await start_server(server, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        try:
            async with Client("127.0.0.1", port, zero_copy=zero_copy) as c:
                for i in range(2):
                    await asyncio.sleep(0.5 * i)
                    out = await c.infer("echo", {"x": X})
                    assert np.array_equal(out["x"], X)
        finally:
            await close_server(srv)

    _run(main)
    assert server.connections == 2


@pytest.mark.parametrize("zero_copy", [True, False])
def test_a_connection_the_trio_server_closed_while_idle_is_not_used_again(zero_copy: bool) -> None:
    server = _idle_closing()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(bt.serve, server, "127.0.0.1", 0)
            async with bt.Client("127.0.0.1", port, zero_copy=zero_copy) as c:
                for i in range(2):
                    await trio.sleep(0.5 * i)
                    out = await c.infer("echo", {"x": X})
                    assert np.array_equal(out["x"], X)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert server.connections == 2


def test_a_kept_connection_is_used_again_whatever_its_descriptor() -> None:
    # Descriptors past 1023, which select() refuses: the probe does not.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"at most {hard} open files here")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    server = _Counting()
    try:

        async def main() -> None:
            srv = await start_server(server, "127.0.0.1", 0)
            port = srv.sockets[0].getsockname()[1]
            try:
                async with Client("127.0.0.1", port) as c:
                    for _ in range(3):
                        assert np.array_equal((await c.infer("echo", {"x": X}))["x"], X)
                    assert c._idle[0].stream._sock.fileno() > 1023  # type: ignore[attr-defined]
            finally:
                await close_server(srv)

        _run(main)
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert server.connections == 1


@pytest.mark.parametrize("zero_copy", [True, False])
@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("size", [6, 100_000])  # decoded whole, and through the parser
def test_bytes_the_server_sent_unasked_are_not_taken_for_the_next_answer(
    size: int, chunked: bool, zero_copy: bool
) -> None:
    # A stray second response right behind the first, on a connection that
    # stays open: the next request goes on a new connection (the socket says
    # bytes are waiting) instead of taking the stray one for its answer.
    body, hl = _response({"y": np.arange(size, dtype=np.float32)})
    head = b"HTTP/1.1 200 OK\r\nInference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
    good = head % (hl, len(body)) + body
    if chunked:  # through h11, which would keep the stray bytes for the next cycle
        good = (
            b"HTTP/1.1 200 OK\r\nInference-Header-Content-Length: %d\r\n" % hl
            + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        )
    stray, stray_hl = _response({"y": np.full(size, 7, dtype=np.float32)})
    bad = head % (stray_hl, len(stray)) + stray
    # The first answer comes with the stray one behind it; then good ones.
    fake = ScriptedServer([good + bad], otherwise=good)

    async def main() -> None:
        async with Client("127.0.0.1", fake.port, zero_copy=zero_copy) as c:
            for _ in range(2):
                out = await c.infer("m", {"x": X})
                assert np.array_equal(out["y"], np.arange(size, dtype=np.float32))
                await asyncio.sleep(0.1)  # (the stray bytes arrive)

    with fake:
        _run(main)
    assert fake.connections == 2


@pytest.mark.parametrize("zero_copy", [True, False])
@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_a_request_while_another_is_in_flight_waits_for_the_one_connection(
    zero_copy: bool, warm: bool
) -> None:
    # With one connection allowed, a second task's request waits for it:
    # both are answered, on the one connection.
    server = _Counting()

    async def main() -> None:
        async with (
            serving_here(server) as port,
            Client("127.0.0.1", port, zero_copy=zero_copy, timeout=10, max_connections=1) as c,
        ):
            if warm:
                await c.infer("echo", {"x": X})
            first = asyncio.create_task(c.infer("echo", {"x": X}))
            await asyncio.sleep(0)  # (it is waiting for the connection or the answer)
            assert np.array_equal((await c.infer("echo", {"x": X + 1}))["x"], X + 1)
            assert (await c.get("/v2"))[0] == 200
            assert np.array_equal((await first)["x"], X)

    _run(main)
    assert server.connections == 1


def test_a_request_while_a_response_is_streamed_takes_another_connection() -> None:
    server = _Counting()

    async def main() -> None:
        async with serving_here(server) as port, Client("127.0.0.1", port, timeout=10) as c:
            async with c.stream("echo", {"x": X}) as response:
                assert (await c.get("/v2"))[0] == 200
                assert np.array_equal((await response.tensors())["x"], X)
            assert c.open_connections == 2
            assert (await c.get("/v2"))[0] == 200
            with pytest.raises(RuntimeError, match="left early"):
                async with c.stream("echo", {"x": X}):
                    raise RuntimeError("left early")
            assert c.open_connections == 1  # (the one left early is closed)
            assert (await c.get("/v2"))[0] == 200

    _run(main)
    assert server.connections == 2


def test_a_cancelled_request_lets_the_next_one_through() -> None:
    async def main() -> None:
        async with serving_here(V2Server()) as port, Client("127.0.0.1", port, timeout=10) as c:
            task = asyncio.create_task(c.infer("echo", {"x": X}))
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert np.array_equal((await c.infer("echo", {"x": X}))["x"], X)

    _run(main)


@pytest.mark.parametrize("zero_copy", [True, False])
@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_a_trio_request_while_another_is_in_flight_waits_for_the_one_connection(
    zero_copy: bool, warm: bool
) -> None:
    server = _Counting()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(bt.serve, server, "127.0.0.1", 0)
            async with bt.Client(
                "127.0.0.1", port, zero_copy=zero_copy, timeout=10, max_connections=1
            ) as c:
                if warm:
                    await c.infer("echo", {"x": X})
                outcomes: list[Any] = []

                async def request(x: np.ndarray[Any, Any]) -> None:
                    outcomes.append((await c.infer("echo", {"x": x}))["x"])

                async with trio.open_nursery() as requests:
                    requests.start_soon(request, X)
                    requests.start_soon(request, X + 1)
                assert sorted(float(o[0]) for o in outcomes) == [0.0, 1.0]
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert server.connections == 1


@pytest.mark.parametrize("zero_copy", [True, False])
@pytest.mark.parametrize("cut", ["too long", "cut short"])
def test_an_error_body_not_read_whole_keeps_its_status(zero_copy: bool, cut: str) -> None:
    # As the httpx adapter reports it: the status, what was read, and why the
    # rest is missing; the connection is not reused.
    if cut == "too long":
        body = b"x" * (2 << 20)
        answer = b"HTTP/1.1 500 Oops\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        why = "longer than 1048576 bytes"
    else:
        answer = b"HTTP/1.1 400 Bad\r\nContent-Length: 100\r\n\r\nbad input"
        why = "could not be read"
    error = _error_for(answer, zero_copy=zero_copy)
    assert error.status == (500 if cut == "too long" else 400)
    assert why in error.message and "could not be read" in error.message
    assert error.message.startswith("xxxx" if cut == "too long" else "bad input")


def _slow_server() -> V2Server:
    """An echo model that answers after half a second."""
    from binproto.adapters._server import Model

    async def slow(request: Any) -> Any:
        tensors = await request.tensors()
        await asyncio.sleep(0.5)
        return tensors

    return V2Server(models=[Model("slow", slow)])


@pytest.mark.parametrize("zero_copy", [True, False])
def test_a_client_closed_by_another_task_ends_its_request_as_the_callers_error(
    zero_copy: bool,
) -> None:
    # The request ends at once (it waited forever for a socket closed under
    # it), blames no server, and the client, like any other, serves again.
    async def main() -> None:
        async with serving_here(_slow_server()) as port:
            c = Client("127.0.0.1", port, zero_copy=zero_copy, timeout=None)
            first = asyncio.create_task(c.infer("slow", {"x": X}))
            await asyncio.sleep(0.1)  # (its request sent, its answer awaited)
            await c.aclose()
            done, _ = await asyncio.wait({first}, timeout=0.3)  # (the answer comes at 0.5 s)
            assert done, "the request went on waiting on the closed connection"
            with pytest.raises(LocalProtocolError, match="closed while this request"):
                await first
            async with Client("127.0.0.1", port, timeout=10) as other:
                assert (await other.get("/v2"))[0] == 200
            assert (await c.get("/v2"))[0] == 200
            await c.aclose()

    _run(main)


def test_a_trio_client_closed_by_another_task_ends_its_request_as_the_callers_error() -> None:
    async def main() -> None:
        srv = await start_server(_slow_server(), "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        outcome: list[BaseException] = []

        def run_trio() -> None:
            async def trio_main() -> None:
                c = bt.Client("127.0.0.1", port, timeout=None)

                async def request() -> None:
                    try:
                        await c.infer("slow", {"x": X})
                    except BaseException as exc:  # (kept to check below)
                        outcome.append(exc)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(request)
                    await trio.sleep(0.1)
                    await c.aclose()
                    with trio.fail_after(0.3):  # (the answer comes at 0.5 s)
                        while not outcome:
                            await trio.sleep(0.01)
                assert (await c.get("/v2"))[0] == 200
                await c.aclose()

            trio.run(trio_main)

        await asyncio.to_thread(run_trio)
        await close_server(srv)
        assert isinstance(outcome[0], LocalProtocolError), outcome

    _run(main)


@pytest.mark.parametrize("zero_copy", [True, False])
def test_an_error_body_cut_by_a_reset_keeps_its_status(zero_copy: bool) -> None:
    # Was a stray BufferError (zero copy: a view of the receive buffer kept by
    # the swallowed reset's traceback) or a bare ConnectionResetError.
    answer = b"HTTP/1.1 503 Busy\r\nContent-Length: 100\r\n\r\nmodel overloaded"

    async def main() -> None:
        async with _canned(lambda _: answer, reset=True) as (port, _):
            async with Client("127.0.0.1", port, zero_copy=zero_copy, timeout=10) as c:
                with pytest.raises(HTTPError) as info:
                    await c.infer("m", {"x": X})
        assert info.value.status == 503 and "model overloaded" in info.value.message

    _run(main)


@pytest.mark.parametrize("zero_copy", [True, False])
def test_a_reset_before_any_answer_is_a_protocol_error(zero_copy: bool) -> None:
    async def main() -> None:
        async with _canned(lambda _: b"", reset=True) as (port, _):
            async with Client("127.0.0.1", port, zero_copy=zero_copy, timeout=10) as c:
                # (a stray BufferError before; the server reads the whole
                # request before it resets, so the reset meets a receive)
                with pytest.raises(RemoteProtocolError):
                    await c.infer("m", {"x": X})

    _run(main)


@pytest.mark.parametrize("zero_copy", [True, False])
def test_a_client_closed_while_its_request_connects_closes_what_it_opened(
    zero_copy: bool,
) -> None:
    async def main() -> None:
        async with serving_here(V2Server()) as port:
            c = Client("127.0.0.1", port, zero_copy=zero_copy, timeout=10)
            closed: list[Any] = []
            open_stream = c._open_stream

            async def opening() -> Any:
                stream = await open_stream()
                aclose = stream.aclose

                async def closing() -> None:
                    closed.append(stream)
                    await aclose()

                stream.aclose = closing  # type: ignore[method-assign]
                return stream

            c._open_stream = opening
            first = asyncio.create_task(c.get("/v2"))
            await asyncio.sleep(0)  # (it is opening the connection)
            await c.aclose()
            with pytest.raises(LocalProtocolError, match="closed while this request"):
                await first
            assert len(closed) == 1 and c.open_connections == 0  # closed, not kept past aclose()
            assert (await c.get("/v2"))[0] == 200
            await c.aclose()

    _run(main)


def test_the_callers_own_exception_in_a_stream_block_is_kept_when_the_client_is_closed() -> None:
    async def main() -> None:
        async with serving_here(V2Server()) as port:
            c = Client("127.0.0.1", port, timeout=10)
            with pytest.raises(FileNotFoundError):
                async with c.stream("echo", {"x": X}):
                    await c.aclose()  # (as another task might)
                    open("/nonexistent/dir/out.npy", "rb")

    _run(main)


@pytest.mark.parametrize("zero_copy", [True, False])
def test_a_response_body_cut_by_a_reset_is_a_protocol_error(zero_copy: bool) -> None:
    # (zero_copy=False: a bare ConnectionResetError before)
    body, hl = _response({"y": X})
    head = b"HTTP/1.1 200 OK\r\nInference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"

    async def main() -> None:
        answer = head % (hl, len(body)) + body[:-8]
        async with _canned(lambda _: answer, reset=True) as (port, _):
            async with Client("127.0.0.1", port, zero_copy=zero_copy, timeout=10) as c:
                with pytest.raises(RemoteProtocolError, match="missing"):
                    await c.infer("m", {"x": X})

    _run(main)
