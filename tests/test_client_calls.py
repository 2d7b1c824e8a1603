"""binproto's asyncio client calling the V2 application on every backend,
and scripted servers that answer it right or wrong.

The ``server`` fixture serves tests/models.py's models on each backend of
the ``backend`` matrix (conftest.py); tests/fakes.py's ScriptedServer plays
the servers that misbehave.
"""

from __future__ import annotations

import asyncio
import functools
import json
import socket
from collections.abc import Coroutine, Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http.aio as aioclient

import binproto
from binproto import HeaderParsed, MessageComplete, TensorChunk, TensorComplete
from binproto.adapters._server import V2Server
from binproto.adapters.asyncio import Client, start_server
from binproto.adapters.h11 import HTTPError

from .fakes import ScriptedServer, Step, echo_answer, ok_answer
from .models import BINARY_ONLY, NON_UTF8, NUMERIC, Ramp, server_models
from .servers import Running, new_loop, running, serving


@pytest.fixture(scope="module")
def server(backend: str) -> Iterator[Running]:
    yield from serving(backend, V2Server(server_models()))


def run(coro: Coroutine[Any, Any, Any], loop: str = "asyncio") -> Any:
    """Run ``coro`` on a new event loop of ``loop``'s kind ("asyncio" or "uvloop")."""
    if loop == "asyncio":
        return asyncio.run(coro)
    event_loop = new_loop(loop)
    try:
        return event_loop.run_until_complete(coro)
    finally:
        event_loop.close()


async def _echo(port: int, inputs: dict[str, Any], **kw: Any) -> dict[str, np.ndarray[Any, Any]]:
    async with Client("127.0.0.1", port) as c:
        return await c.infer("echo", inputs, **kw)


@pytest.mark.parametrize("client_loop", ["asyncio", "uvloop"])
def test_client_round_trip(server: Running, client_loop: str) -> None:
    # (uvloop's transports are no asyncio.Transport subclasses, and it holds a
    # protocol's receive buffer while it reports the bytes put in it.)
    inputs = {dt: arr for dt, arr in NUMERIC + BINARY_ONLY}
    inputs["bytes"] = NON_UTF8

    async def main() -> None:
        async with Client("127.0.0.1", server.port) as c:
            for kw in (
                {"binary_data_output": True},
                {"binary_data_output": False},
                {"outputs": ["INT32", "bytes"], "binary_data_output": True},
            ):
                out = await c.infer("echo", inputs, **kw)
                wanted = kw.get("outputs", list(inputs))
                assert list(out) == wanted
                for name in wanted:
                    np.testing.assert_array_equal(out[name], inputs[name])
            # JSON inputs, a requested output with binary_data, a version.
            out = await c.infer(
                "echo",
                {"a": [[1, 2], [3, 4]], "b": np.array([True])},
                outputs=[binproto.RequestedOutput("a", binary_data=True)],
                binary=False,
                model_version="1",
            )
            np.testing.assert_array_equal(out["a"], np.array([[1, 2], [3, 4]]))
            assert list(out) == ["a"]
            status, body = await c.get("/v2")
            assert status == 200 and "binary_tensor_data" in json.loads(body)["extensions"]
            with pytest.raises(HTTPError) as info:
                await c.infer("echo", {"x": np.zeros(1)}, outputs=["nope"])
            assert info.value.status == 400 and "unexpected inference output" in info.value.message
            # Still usable after an error response.
            out = await c.infer("echo", {"x": np.ones(3)})
            np.testing.assert_array_equal(out["x"], np.ones(3))

    run(main(), client_loop)


def test_client_streams_response_events(server: Running) -> None:
    x = np.arange(4 << 20, dtype=np.uint8)

    async def main() -> list[Any]:
        seen: list[Any] = []
        async with Client("127.0.0.1", server.port) as c:
            async with c.stream("echo", {"x": x}, binary_data_output=True) as response:
                assert response.status == 200
                received = bytearray()
                async for event in response:
                    seen.append(type(event))
                    if type(event) is TensorChunk:
                        received += event.data
                assert bytes(received) == x.tobytes()
                assert response.header is not None
                assert response.header.tensor("x").shape == x.shape
            # The connection is reused afterwards.
            out = await c.infer("echo", {"y": np.arange(3)})
            np.testing.assert_array_equal(out["y"], np.arange(3))
        return seen

    seen = run(main())
    assert seen[0] is HeaderParsed and seen[-1] is MessageComplete
    assert seen.count(TensorChunk) > 1  # delivered as it arrived, not at the end
    assert seen.count(TensorComplete) == 1


def test_handler_gets_events_as_they_arrive(server: Running) -> None:
    x = np.zeros(2 << 20, dtype=np.float32)
    out = run(_events_call(server.port, x))
    assert out["complete"][0] == 2
    assert out["chunks"][0] > 1


async def _events_call(port: int, x: np.ndarray[Any, Any]) -> dict[str, np.ndarray[Any, Any]]:
    async with Client("127.0.0.1", port) as c:
        return await c.infer("events", {"x": x, "j": [1, 2]}, model_version="2")


def test_client_receives_response_tensors_in_place(server: Running) -> None:
    x = np.arange(1 << 20, dtype=np.float64)
    dest = np.empty_like(x)

    async def main() -> None:
        async with Client("127.0.0.1", server.port, zero_copy=True) as c:
            async with c.stream("echo", {"x": x}, binary_data_output=True) as response:
                out = await response.tensors({"x": dest})
                asm = response.body.assembler
                assert asm is not None
                assert out["x"] is dest
                assert asm.bytes_copied + asm.bytes_in_place == x.nbytes
                assert asm.bytes_copied <= 1 << 16

    run(main())
    np.testing.assert_array_equal(dest, x)


def test_streaming_response(server: Running) -> None:
    n = 1_000_003

    async def main() -> dict[str, np.ndarray[Any, Any]]:
        async with Client("127.0.0.1", server.port) as c:
            out = await c.infer("ramp", {"n": np.array([n])})
            # A producer that fails mid-body: the server can only close.
            with pytest.raises((binproto.RemoteProtocolError, ConnectionError)):
                await c.infer("ramp", {"n": np.array([n]), "fail_at": np.array([300_000])})
            # A new connection serves the next request.
            again = await c.infer("ramp", {"n": np.array([5])})
            np.testing.assert_array_equal(again["y"], np.arange(5, dtype=np.float32))
            return out

    out = run(main())
    np.testing.assert_array_equal(out["y"], np.arange(n, dtype=np.float32))


def _coding(response: Any) -> str | None:
    """The Content-Encoding of a client's ResponseStream (None when absent)."""
    values = [v.decode() for k, v in response.http.headers if k == b"content-encoding"]
    return values[0] if values else None


@pytest.mark.parametrize(
    ("accept", "request_encoding", "expected"),
    [
        ("gzip, deflate", "gzip", "gzip"),
        ("deflate", "deflate", "deflate"),
        ("GZIP;q=0, deflate;q=0.5", None, "deflate"),
        ("br", "gzip", None),  # nothing binproto produces: sent as it is
        (None, "deflate", None),
    ],
)
def test_client_and_server_compress(
    server: Running, accept: str | None, request_encoding: str | None, expected: str | None
) -> None:
    rng = np.random.default_rng(1)
    x = rng.integers(0, 8, size=(300, 700), dtype=np.uint8)  # compresses, a little
    f = rng.standard_normal(1000).astype(np.float32)

    async def main() -> None:
        async with Client(
            "127.0.0.1", server.port, accept_encoding=accept, request_encoding=request_encoding
        ) as c:
            for _ in range(2):  # the connection serves on after each
                async with c.stream("echo", {"x": x, "f": f}, binary_data_output=True) as r:
                    assert _coding(r) == expected
                    headers = {k.decode(): v.decode() for k, v in r.http.headers}
                    assert ("content-length" in headers) == (expected is None)
                    out = await r.tensors()
                np.testing.assert_array_equal(out["x"], x)
                np.testing.assert_array_equal(out["f"], f)
            # Streamed responses and error responses are never compressed.
            async with c.stream("ramp", {"n": np.array([300_000])}) as r:
                assert _coding(r) is None
                y = (await r.tensors())["y"]
            np.testing.assert_array_equal(y, np.arange(300_000, dtype=np.float32))
            with pytest.raises(HTTPError) as info:
                await c.infer("nope", {"x": x})
            assert info.value.status == 404 and "unknown model" in info.value.message

    run(main())


def test_mostly_zero_compressed_response_and_the_ratio_limit(server: Running) -> None:
    """Zeros compress over 200 times even at level 1: the default
    ``max_decompression_ratio`` takes them; a tighter limit refuses them (413)."""
    x = np.zeros(1 << 20, dtype=np.float32)

    async def main() -> None:
        async with Client("127.0.0.1", server.port, accept_encoding="gzip") as c:
            out = await c.infer("echo", {"x": x}, binary_data_output=True)
        np.testing.assert_array_equal(out["x"], x)
        limits = binproto.Limits(max_decompression_ratio=100)
        async with Client("127.0.0.1", server.port, accept_encoding="gzip", limits=limits) as c:
            with pytest.raises(binproto.RemoteProtocolError, match="expands more than") as info:
                await c.infer("echo", {"x": x}, binary_data_output=True)
            assert info.value.status_hint == 413

    run(main())


def test_client_rejects_unknown_request_encoding() -> None:
    with pytest.raises(binproto.LocalProtocolError, match="request_encoding"):
        Client("127.0.0.1", 1, request_encoding="br")


def test_server_with_compression_off_never_compresses(backend: str) -> None:
    x = np.zeros(100_000, dtype=np.float32)

    async def main(port: int) -> None:
        async with Client("127.0.0.1", port, accept_encoding="gzip, deflate") as c:
            async with c.stream("echo", {"x": x}, binary_data_output=True) as r:
                assert _coding(r) is None
                np.testing.assert_array_equal((await r.tensors())["x"], x)
        client = aioclient.InferenceServerClient(f"127.0.0.1:{port}")
        try:  # (the aio client always accepts gzip)
            inp = aioclient.InferInput("x", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            result = await client.infer("echo", [inp], response_compression_algorithm="gzip")
            np.testing.assert_array_equal(result.as_numpy("x"), x)
        finally:
            await client.close()

    with running(backend, V2Server(compress_responses=False)) as server:
        run(main(server.port))
    with pytest.raises(binproto.LocalProtocolError, match="compression_level"):
        V2Server(compression_level=10)


def test_client_reads_only_as_fast_as_the_consumer_takes_events(server: Running) -> None:
    n = 16 << 20  # 64 MiB of FP32

    async def main() -> int:
        async with Client("127.0.0.1", server.port) as c:
            async with c.stream("ramp", {"n": np.array([n])}) as response:
                while type(await response.next_event()) is not TensorChunk:
                    pass
                await asyncio.sleep(0.5)  # the consumer stalls
                stalled_at = Ramp.produced
                tail = b""
                async for event in response:
                    if type(event) is TensorChunk:
                        tail = (tail + bytes(event.data[-4:]))[-4:]
                assert np.frombuffer(tail, dtype=np.float32)[0] == n - 1
                return stalled_at

    stalled_at = run(main())
    # Socket buffers hold a few MiB; the producer waited for the consumer.
    assert stalled_at < n // 2, stalled_at


def test_client_reconnects_after_connection_close() -> None:
    # Two connections, one echo each, then Connection: close.
    answer: list[Step] = [functools.partial(echo_answer, Connection="close"), "close"]
    fake = ScriptedServer([answer, answer])
    port = fake.port

    async def main() -> None:
        async with Client("127.0.0.1", port) as c:
            for i in range(2):
                x = np.arange(100_000 + i, dtype=np.int32)
                out = await c.infer("echo", {"x": x}, binary_data_output=True)
                np.testing.assert_array_equal(out["x"], x)

    with fake:
        run(main())
    assert fake.connections == 2


def test_get_reconnects_after_connection_close() -> None:
    script: list[list[Step]] = [
        [ok_answer(b'{"connection": %d}' % i, close=True), "close"] for i in range(3)
    ]
    fake = ScriptedServer(script)
    port = fake.port

    async def main() -> list[Any]:
        async with Client("127.0.0.1", port) as c:
            return [json.loads((await c.get("/v2"))[1]) for _ in range(3)]

    with fake:
        bodies = run(main())
    assert bodies == [{"connection": i} for i in range(3)]  # one connection each


def test_limits_answer_413(backend: str) -> None:
    async def main(port: int) -> None:
        async with Client("127.0.0.1", port) as c:
            with pytest.raises(HTTPError) as info:
                await c.infer("echo", {"x": np.zeros(1001, dtype=np.uint8)})
            assert info.value.status == 413
            assert "exceeds the limit of 1000 bytes" in info.value.message
            out = await c.infer("echo", {"x": np.ones(1000, dtype=np.uint8)})
            np.testing.assert_array_equal(out["x"], np.ones(1000, dtype=np.uint8))

    app = V2Server(limits=binproto.Limits(max_tensor_bytes=1000))
    with running(backend, app) as server:
        run(main(server.port))


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (b"", "the server closed the connection without a response"),
        (b"HELLO WORLD\r\n\r\n", "illegal status line"),
    ],
    ids=["closed", "garbage"],
)
def test_client_errors_before_the_response_head_are_binproto_errors(
    reply: bytes, message: str
) -> None:
    async def main(port: int) -> None:
        async with Client("127.0.0.1", port) as c:
            with pytest.raises(binproto.RemoteProtocolError, match=message):
                await c.get("/v2/health/live")

    with ScriptedServer([[reply, "close"]], read_body=False) as fake:
        run(main(fake.port))


def test_client_frames_a_chunked_response_by_its_chunks_despite_content_length() -> None:
    x = np.arange(4, dtype=np.float32)
    encoded = binproto.encode_response({"x": x}, model_name="echo")
    body, hl = bytes(encoded), encoded.header_length
    reply = (
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n"
        + f"Inference-Header-Content-Length: {hl}\r\n\r\n".encode()
        + f"{len(body):x}\r\n".encode()
        + body
        + b"\r\n0\r\n\r\n"
    )

    async def main(port: int) -> dict[str, Any]:
        async with Client("127.0.0.1", port) as c:
            out: dict[str, Any] = await c.infer("echo", {"x": x})
            return out

    with ScriptedServer([[reply, "close"]], read_body=False) as fake:
        np.testing.assert_array_equal(run(main(fake.port))["x"], x)


def test_connect_tries_each_address_in_turn() -> None:
    from binproto.adapters.asyncio import close_server, connect

    async def main() -> None:
        srv = await start_server(port=0)
        port = srv.sockets[0].getsockname()[1]
        refusing = socket.socket()  # bound, not listening: connections are refused
        refusing.bind(("127.0.0.1", 0))
        loop = asyncio.get_running_loop()
        real = loop.getaddrinfo

        asked: list[Any] = []

        async def refused_first(host: Any, port: Any, **kw: Any) -> Any:
            asked.append(host)
            infos = await real(host, port, **kw)
            family, type_, proto, name, _ = infos[0]
            return [(family, type_, proto, name, refusing.getsockname()), *infos]

        loop.getaddrinfo = refused_first  # type: ignore[method-assign]
        try:
            stream = await connect("127.0.0.1", port)
            await stream.aclose()
            assert asked == ["127.0.0.1"]  # (the refused address came first)
        finally:
            del loop.getaddrinfo
            refusing.close()
            await close_server(srv)

    run(main())


def test_client_reports_an_answer_sent_before_its_body_was_taken() -> None:
    # The server refuses from the head and closes with the body unread: its
    # close resets the connection under the client's send.
    refusal = ok_answer(b'{"error": "request too large"}', close=True, status="413 Too Large")

    async def main(port: int) -> None:
        async with Client("127.0.0.1", port, timeout=10) as c:
            with pytest.raises(HTTPError) as info:
                await c.infer("echo", {"x": np.zeros(16 << 20, dtype=np.float32)})
        assert info.value.status == 413 and info.value.message == "request too large"

    with ScriptedServer([[refusal, 0.2, "reset"]], read_body=False) as fake:
        run(main(fake.port))
