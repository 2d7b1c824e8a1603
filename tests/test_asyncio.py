"""The asyncio adapter over real sockets on 127.0.0.1: the reference server
called by tritonclient (sync and aio) and by binproto's own client, adversarial
peers on raw sockets, and tensors received in place."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from http import HTTPStatus
from typing import Any

import h11
import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient
from tritonclient.utils import InferenceServerException

import binproto
from binproto import HeaderParsed, MessageComplete, TensorChunk, TensorComplete, TensorInfo
from binproto.adapters._server import (
    HEAD_READ,
    InferenceError,
    InferRequest,
    KnownHeads,
    Model,
    StreamingResponse,
    Timeouts,
    V2Server,
    echo_model,
)
from binproto.adapters.asyncio import Client, close_server, serve, start_server
from binproto.adapters.h11 import HTTPError, receive_events, request_for, response_for, send_message
from binproto.adapters.h11 import parser_for as parser_from_head

from .helpers import Scripted

# -- a server on a background thread ------------------------------------------


class Recorder:
    """What the ``into`` model saw: the assembler's counters and the destination."""

    def __init__(self) -> None:
        self.copied = -1
        self.in_place = -1
        self.destination: np.ndarray[Any, Any] | None = None
        self.result: np.ndarray[Any, Any] | None = None


RECORDER = Recorder()


async def _into(request: InferRequest) -> dict[str, Any]:
    """Receive the one input into an array allocated here; report the counters."""

    def destination(info: TensorInfo) -> np.ndarray[Any, Any]:
        RECORDER.destination = np.empty(info.shape, dtype=info.dtype)
        return RECORDER.destination

    tensors = await request.tensors(destination)
    asm = request.body.assembler
    assert asm is not None
    RECORDER.copied = asm.bytes_copied
    RECORDER.in_place = asm.bytes_in_place
    (RECORDER.result,) = tensors.values()
    return {"copied": np.array([asm.bytes_copied]), "in_place": np.array([asm.bytes_in_place])}


async def _events(request: InferRequest) -> dict[str, Any]:
    """Count the events of the body as they are read (the streaming handler API)."""
    counts = {"chunks": 0, "complete": 0}
    async for event in request.body:
        if type(event) is TensorChunk:
            counts["chunks"] += 1
        elif type(event) is TensorComplete:
            counts["complete"] += 1
    return {k: np.array([v], dtype=np.int64) for k, v in counts.items()}


class Ramp:
    """How far the ``ramp`` model's producer has got (elements handed to the server)."""

    produced = 0


async def _ramp(request: InferRequest) -> StreamingResponse:
    """Stream ``n`` FP32 values 0..n-1 in pieces; ``fail_at`` breaks the stream there."""
    tensors = await request.tensors()
    n = int(tensors["n"][0])
    fail_at = int(tensors["fail_at"][0]) if "fail_at" in tensors else -1
    header = {
        "model_name": "ramp",
        "outputs": [
            {
                "name": "y",
                "datatype": "FP32",
                "shape": [n],
                "parameters": {"binary_data_size": 4 * n},
            }
        ],
    }

    async def pieces() -> AsyncIterator[tuple[int, Any]]:
        step = 100_000
        for start in range(0, n, step):
            if start == fail_at:
                raise RuntimeError("the producer failed")
            await asyncio.sleep(0)
            Ramp.produced = start
            yield 0, np.arange(start, min(n, start + step), dtype=np.float32)

    return StreamingResponse(binproto.BodyWriter(header), pieces())


class Gate:
    """Holds the ``gate`` model's handler after the request header, until opened."""

    event: asyncio.Event | None = None


async def _gate(request: InferRequest) -> dict[str, Any]:
    Gate.event = asyncio.Event()
    await Gate.event.wait()
    tensors = await request.tensors()
    return {"n": np.array([tensors["x"].nbytes], dtype=np.int64)}


async def _misuse(request: InferRequest) -> dict[str, Any]:
    """Take a tensor event, then ask for assembled tensors: API misuse."""
    while type(await request.body.next_event()) is not TensorChunk:
        pass
    return await request.tensors()


class ServerThread:
    """The asyncio server running in a thread with its own event loop."""

    def __init__(
        self, zero_copy: bool, timeout: float | None = None, *, loop: str = "asyncio"
    ) -> None:
        self.zero_copy = zero_copy
        self.timeout = timeout
        self.port = 0
        self._ready = threading.Event()
        self._loop = new_loop(loop)
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    def _run(self) -> None:
        self._loop.run_until_complete(self._main())

    async def _main(self) -> None:
        app = V2Server(
            [
                echo_model(),
                Model("into", _into),
                Model("events", _events, versions=("1", "2")),
                Model("ramp", _ramp),
                Model("gate", _gate),
                Model("misuse", _misuse),
            ]
        )
        server = await start_server(
            app, "127.0.0.1", 0, zero_copy=self.zero_copy, timeout=self.timeout
        )
        self.port = server.sockets[0].getsockname()[1]
        self._stop = asyncio.Event()
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await close_server(server)

    def call_soon(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` on the server's event loop."""
        self._loop.call_soon_threadsafe(fn)

    def close(self) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


def new_loop(kind: str) -> asyncio.AbstractEventLoop:
    """A new event loop: asyncio's own, or uvloop's (skipped where it is missing)."""
    if kind == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        return loop
    return asyncio.new_event_loop()


@pytest.fixture(
    scope="module",
    params=[(True, "asyncio"), (False, "asyncio"), (True, "uvloop")],
    ids=["zero_copy", "streams", "uvloop"],
)
def server(request: pytest.FixtureRequest) -> Iterator[ServerThread]:
    zero_copy, loop = request.param
    srv = ServerThread(zero_copy=zero_copy, loop=loop)
    yield srv
    srv.close()


def run(coro: Coroutine[Any, Any, Any], loop: str = "asyncio") -> Any:
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


def assert_served(port: int) -> None:
    """A normal request on a new connection succeeds."""
    x = np.arange(1000, dtype=np.int32)
    out = run(_echo(port, {"x": x}, binary_data_output=True))
    np.testing.assert_array_equal(out["x"], x)


# -- data ------------------------------------------------------------------------

NUMERIC: list[tuple[str, np.ndarray[Any, Any]]] = [
    ("BOOL", np.array([[True, False, True], [False, False, True]])),
    ("UINT8", np.array([0, 1, 255], dtype=np.uint8)),
    ("UINT16", np.array([0, 65535], dtype=np.uint16)),
    ("UINT32", np.array([0, 2**32 - 1], dtype=np.uint32)),
    ("UINT64", np.array([0, 2**64 - 1], dtype=np.uint64)),
    ("INT8", np.array([-128, 127], dtype=np.int8)),
    ("INT16", np.array([-(2**15), 2**15 - 1], dtype=np.int16)),
    ("INT32", np.arange(-6, 6, dtype=np.int32).reshape(3, 4)),
    ("INT64", np.array([-(2**63), 2**63 - 1], dtype=np.int64)),
    ("FP32", np.array([0.5, -1.25, 3e38], dtype=np.float32)),
    ("FP64", np.array([[1e-300, -2.5]], dtype=np.float64)),
]
BINARY_ONLY: list[tuple[str, np.ndarray[Any, Any]]] = [
    ("FP16", np.array([1.5, -2.0, 65504], dtype=np.float16)),
    ("BF16", np.array([1.0, -2.5, 3.0], dtype=ml_dtypes.bfloat16)),
]
NON_UTF8 = np.array([b"\xff\xfe", b"", b"ok", b"\x00\x80"], dtype=np.object_)
UTF8 = np.array([b"hello", "h\u00e9".encode(), b""], dtype=np.object_)


def _as_bytes(arr: np.ndarray[Any, Any]) -> list[bytes]:
    return [x if isinstance(x, bytes) else str(x).encode() for x in arr.ravel()]


# -- tritonclient (sync) -----------------------------------------------------------


def _triton(port: int) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(f"127.0.0.1:{port}", connection_timeout=30)


def _triton_echo(
    port: int,
    items: list[tuple[str, str, np.ndarray[Any, Any]]],
    *,
    binary_in: bool,
    binary_out: bool,
) -> httpclient.InferResult:
    inputs = []
    for name, datatype, arr in items:
        inp = httpclient.InferInput(name, list(arr.shape), datatype)
        inp.set_data_from_numpy(arr, binary_data=binary_in or datatype in ("FP16", "BF16"))
        inputs.append(inp)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary_out) for n, _, _ in items]
    client = _triton(port)
    try:
        return client.infer("echo", inputs, outputs=outputs)
    finally:
        client.close()


@pytest.mark.parametrize("binary_in", [True, False], ids=["bin_in", "json_in"])
@pytest.mark.parametrize("binary_out", [True, False], ids=["bin_out", "json_out"])
def test_tritonclient_every_datatype(
    server: ServerThread, binary_in: bool, binary_out: bool
) -> None:
    items = [(f"t_{dt}", dt, arr) for dt, arr in NUMERIC + BINARY_ONLY]
    items.append(("t_bytes", "BYTES", UTF8))
    result = _triton_echo(server.port, items, binary_in=binary_in, binary_out=binary_out)
    for name, datatype, arr in items:
        got = result.as_numpy(name)
        if datatype == "BYTES":
            assert _as_bytes(got) == _as_bytes(arr)
        else:
            assert got.shape == arr.shape
            np.testing.assert_array_equal(got.astype(arr.dtype), arr)
        output = result.get_output(name)
        assert output["datatype"] == datatype
        binary = "binary_data_size" in output.get("parameters", {})
        assert binary == (binary_out or datatype in ("FP16", "BF16"))


def test_tritonclient_non_utf8_bytes(server: ServerThread) -> None:
    # Asked for as JSON, BYTES that are not UTF-8 still come back binary.
    for binary_out in (True, False):
        result = _triton_echo(
            server.port, [("s", "BYTES", NON_UTF8)], binary_in=True, binary_out=binary_out
        )
        assert _as_bytes(result.as_numpy("s")) == list(NON_UTF8)


@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_zero_size(server: ServerThread, binary: bool) -> None:
    items: list[tuple[str, str, np.ndarray[Any, Any]]] = [
        ("f", "FP32", np.zeros((0,), dtype=np.float32)),
        ("i", "INT64", np.zeros((2, 0), dtype=np.int64)),
        ("b", "BOOL", np.zeros((0, 3), dtype=np.bool_)),
        ("s", "BYTES", np.zeros((0,), dtype=np.object_)),
        ("h", "FP16", np.zeros((0, 2), dtype=np.float16)),
    ]
    result = _triton_echo(server.port, items, binary_in=binary, binary_out=binary)
    for name, _, arr in items:
        assert result.as_numpy(name).shape == arr.shape


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_tritonclient_compressed_request(server: ServerThread, algorithm: str) -> None:
    x = np.arange(10_000, dtype=np.int64)
    inp = httpclient.InferInput("x", list(x.shape), "INT64")
    inp.set_data_from_numpy(x)
    client = _triton(server.port)
    try:
        result = client.infer(
            "echo",
            [inp],
            outputs=[httpclient.InferRequestedOutput("x", binary_data=True)],
            request_compression_algorithm=algorithm,
            response_compression_algorithm=algorithm,  # may be ignored: identity is valid
        )
    finally:
        client.close()
    np.testing.assert_array_equal(result.as_numpy("x"), x)


def test_tritonclient_metadata_and_health(server: ServerThread) -> None:
    client = _triton(server.port)
    try:
        assert client.is_server_live()
        assert client.is_server_ready()
        assert client.is_model_ready("echo")
        meta = client.get_server_metadata()
        assert "binary_tensor_data" in meta["extensions"]
        assert client.get_model_metadata("echo")["name"] == "echo"
        assert client.get_model_metadata("events", model_version="2")["versions"] == ["1", "2"]
        with pytest.raises(InferenceServerException, match="unknown model"):
            client.get_model_metadata("nope")
    finally:
        client.close()


def test_tritonclient_errors(server: ServerThread) -> None:
    client = _triton(server.port)
    try:
        inp = httpclient.InferInput("x", [2], "FP32")
        inp.set_data_from_numpy(np.zeros(2, dtype=np.float32))
        inp._datatype = "FP8"  # no V2 datatype: the server must say so
        with pytest.raises(InferenceServerException) as info:
            client.infer("echo", [inp])
        assert info.value.status() == "400"
        assert "invalid datatype 'FP8'" in info.value.message()

        inp = httpclient.InferInput("x", [2], "FP32")
        inp.set_data_from_numpy(np.zeros(2, dtype=np.float32))
        with pytest.raises(InferenceServerException, match="unexpected inference output"):
            client.infer("echo", [inp], outputs=[httpclient.InferRequestedOutput("y")])
        with pytest.raises(InferenceServerException, match="unknown model"):
            client.infer("nope", [inp])
        # Refused before its body was read, a large request still gets the answer.
        big = httpclient.InferInput("x", [1 << 21], "FP32")
        big.set_data_from_numpy(np.zeros(1 << 21, dtype=np.float32))
        with pytest.raises(InferenceServerException, match="unknown model"):
            client.infer("nope", [big])
        # The same client goes on working after errors.
        result = client.infer("echo", [inp])
        np.testing.assert_array_equal(result.as_numpy("x"), np.zeros(2, dtype=np.float32))
    finally:
        client.close()


def test_tritonclient_aio(server: ServerThread) -> None:
    async def main() -> None:
        client = aioclient.InferenceServerClient(f"127.0.0.1:{server.port}")
        try:
            assert await client.is_server_live()
            meta = await client.get_server_metadata()
            assert "binary_tensor_data" in meta["extensions"]
            for binary in (True, False):
                inputs = []
                for dt, arr in [*NUMERIC, ("BYTES", UTF8)]:
                    inp = aioclient.InferInput(dt, list(arr.shape), dt)
                    inp.set_data_from_numpy(arr, binary_data=binary)
                    inputs.append(inp)
                inp = aioclient.InferInput("raw", list(NON_UTF8.shape), "BYTES")
                inp.set_data_from_numpy(NON_UTF8, binary_data=True)
                inputs.append(inp)
                outputs = [aioclient.InferRequestedOutput(i.name(), binary) for i in inputs]
                result = await client.infer("echo", inputs, outputs=outputs)
                for dt, arr in NUMERIC:
                    np.testing.assert_array_equal(result.as_numpy(dt).astype(arr.dtype), arr)
                assert _as_bytes(result.as_numpy("BYTES")) == _as_bytes(UTF8)
                assert _as_bytes(result.as_numpy("raw")) == list(NON_UTF8)
            bad = aioclient.InferInput("x", [1], "INT32")
            bad.set_data_from_numpy(np.zeros(1, dtype=np.int32))
            bad._datatype = "INT4"
            with pytest.raises(InferenceServerException, match="invalid datatype"):
                await client.infer("echo", [bad])
        finally:
            await client.close()

    run(main())


# -- binproto's client -------------------------------------------------------------


@pytest.mark.parametrize("client_loop", ["asyncio", "uvloop"])
def test_client_round_trip(server: ServerThread, client_loop: str) -> None:
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


def test_handler_misuse_is_a_500_and_the_server_goes_on(server: ServerThread) -> None:
    with pytest.raises(HTTPError) as info:
        run(_call(server.port, "misuse", {"x": np.zeros(10)}))
    assert info.value.status == 500
    assert "tensors() needs every tensor event" in info.value.message
    assert_served(server.port)


def test_client_streams_response_events(server: ServerThread) -> None:
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


def test_handler_gets_events_as_they_arrive(server: ServerThread) -> None:
    x = np.zeros(2 << 20, dtype=np.float32)
    out = run(_events_call(server.port, x))
    assert out["complete"][0] == 2
    assert out["chunks"][0] > 1


async def _events_call(port: int, x: np.ndarray[Any, Any]) -> dict[str, np.ndarray[Any, Any]]:
    async with Client("127.0.0.1", port) as c:
        return await c.infer("events", {"x": x, "j": [1, 2]}, model_version="2")


def test_client_receives_response_tensors_in_place(server: ServerThread) -> None:
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


def test_streaming_response(server: ServerThread) -> None:
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
    server: ServerThread, accept: str | None, request_encoding: str | None, expected: str | None
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


def test_mostly_zero_compressed_response_and_the_ratio_limit(server: ServerThread) -> None:
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


def test_server_with_compression_off_never_compresses() -> None:
    x = np.zeros(100_000, dtype=np.float32)

    async def main() -> None:
        srv = await start_server(V2Server(compress_responses=False), port=0)
        port = srv.sockets[0].getsockname()[1]
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
        srv.close()
        await srv.wait_closed()

    run(main())
    with pytest.raises(binproto.LocalProtocolError, match="compression_level"):
        V2Server(compression_level=10)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_tritonclient_compressed_response(server: ServerThread, algorithm: str) -> None:
    items = [(dt, dt, arr) for dt, arr in NUMERIC] + [("raw", "BYTES", NON_UTF8)]
    inputs = []
    for name, datatype, arr in items:
        inp = httpclient.InferInput(name, list(arr.shape), datatype)
        inp.set_data_from_numpy(arr, binary_data=True)
        inputs.append(inp)
    client = _triton(server.port)
    try:
        result = client.infer("echo", inputs, response_compression_algorithm=algorithm)
    finally:
        client.close()
    for dt, arr in NUMERIC:
        np.testing.assert_array_equal(result.as_numpy(dt), arr)
    assert _as_bytes(result.as_numpy("raw")) == list(NON_UTF8)


def test_client_reads_only_as_fast_as_the_consumer_takes_events(server: ServerThread) -> None:
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


def _one_shot_server(listener: socket.socket, count: int) -> None:
    """Answer ``count`` connections with one echo each, saying Connection: close."""
    for _ in range(count):
        sock, _ = listener.accept()
        with sock:
            conn = h11.Connection(h11.SERVER)
            parser = None
            asm = binproto.TensorAssembler()
            while parser is None or parser.state is not binproto.ParserState.DONE:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(sock.recv(65536))
                elif type(event) is h11.Request:
                    parser = parser_from_head(event)
                elif parser is not None and isinstance(event, (h11.Data, h11.EndOfMessage)):
                    for ev in receive_events(parser, event):
                        asm.feed(ev)
            assert asm.header is not None
            body = binproto.encode_response(asm.tensors, model_name="echo", request=asm.header)
            head = response_for(200, body, headers=[("Connection", "close")])
            for piece in send_message(conn, head, body):
                sock.sendall(piece)


def test_client_reconnects_after_connection_close() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    thread = threading.Thread(target=_one_shot_server, args=(listener, 2), daemon=True)
    thread.start()

    async def main() -> None:
        async with Client("127.0.0.1", port) as c:
            for i in range(2):
                x = np.arange(100_000 + i, dtype=np.int32)
                out = await c.infer("echo", {"x": x}, binary_data_output=True)
                np.testing.assert_array_equal(out["x"], x)

    try:
        run(main())
    finally:
        thread.join(10)
        listener.close()
    assert not thread.is_alive()


def _closing_get_server(listener: socket.socket, count: int) -> None:
    """Answer ``count`` connections with one GET response each, saying Connection: close."""
    for i in range(count):
        sock, _ = listener.accept()
        with sock:
            conn = h11.Connection(h11.SERVER)
            while type(event := conn.next_event()) is not h11.EndOfMessage:
                if event is h11.NEED_DATA:
                    conn.receive_data(sock.recv(65536))
            payload = json.dumps({"connection": i}).encode()
            head = h11.Response(
                status_code=200,
                headers=[("Content-Length", str(len(payload))), ("Connection", "close")],
            )
            sock.sendall(conn.send(head) + conn.send(h11.Data(data=payload)))
            sock.sendall(conn.send(h11.EndOfMessage()) or b"")


def test_get_reconnects_after_connection_close() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    thread = threading.Thread(target=_closing_get_server, args=(listener, 3), daemon=True)
    thread.start()

    async def main() -> list[Any]:
        async with Client("127.0.0.1", port) as c:
            return [json.loads((await c.get("/v2"))[1]) for _ in range(3)]

    try:
        bodies = run(main())
    finally:
        thread.join(10)
        listener.close()
    assert bodies == [{"connection": i} for i in range(3)]  # one connection each


def test_zero_copy_receive_on_the_server(server: ServerThread) -> None:
    x = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)
    out = run(_call(server.port, "into", {"x": x}))
    assert RECORDER.result is RECORDER.destination  # the array the handler chose
    assert RECORDER.result is not None
    np.testing.assert_array_equal(RECORDER.result, x)
    assert out["copied"][0] + out["in_place"][0] == x.nbytes
    if server.zero_copy:
        # Only bytes read together with the request head were copied (one read).
        assert out["copied"][0] <= HEAD_READ
        assert out["in_place"][0] >= x.nbytes - HEAD_READ
    else:
        assert out["in_place"][0] == 0


async def _call(port: int, model: str, inputs: dict[str, Any]) -> dict[str, np.ndarray[Any, Any]]:
    async with Client("127.0.0.1", port) as c:
        return await c.infer(model, inputs, binary_data_output=True)


# -- adversarial peers on raw sockets ---------------------------------------------------


def _request_bytes(
    inputs: dict[str, Any], target: str = "/v2/models/echo/infer", **options: Any
) -> bytes:
    body = binproto.encode_request(inputs, binary_data_output=True, **options)
    conn = h11.Connection(h11.CLIENT)
    return b"".join(bytes(p) for p in send_message(conn, request_for(target, body), body))


def _read_response(sock: socket.socket, check_closed: bool = True) -> tuple[int, bytes, bool]:
    """Status, body, and (when checked) whether the server then closed the connection."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
    conn.send(h11.EndOfMessage())
    status = 0
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(sock.recv(65536))
            continue
        if type(event) is h11.Response:
            status = event.status_code
        elif type(event) is h11.Data:
            body += event.data
        elif type(event) is h11.EndOfMessage:
            break
    closed = False
    if not check_closed:
        return status, bytes(body), closed
    sock.settimeout(5)
    try:
        closed = sock.recv(1) == b""
    except (TimeoutError, ConnectionError):
        closed = False
    return status, bytes(body), closed


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def test_one_byte_chunks(server: ServerThread) -> None:
    x = np.arange(20, dtype=np.int16)
    wire = _request_bytes({"x": x, "s": np.array([b"\xff"], dtype=object)})
    with _connect(server.port) as sock:
        for i in range(len(wire)):
            sock.sendall(wire[i : i + 1])
        conn = h11.Connection(h11.CLIENT)
        conn.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
        conn.send(h11.EndOfMessage())
        head = None
        while (ev := conn.next_event()) is h11.NEED_DATA or type(ev) is not h11.Response:
            conn.receive_data(sock.recv(65536))
        head = ev
        data = bytearray()
        while type(ev := conn.next_event()) is not h11.EndOfMessage:
            if ev is h11.NEED_DATA:
                conn.receive_data(sock.recv(65536))
            elif type(ev) is h11.Data:
                data += ev.data
    assert head.status_code == 200
    hl = int(dict(head.headers)[b"inference-header-content-length"])
    msg = binproto.decode_response(bytes(data), header_length=hl)
    np.testing.assert_array_equal(msg.tensors["x"], x)
    assert list(msg.tensors["s"]) == [b"\xff"]


def test_peer_stops_mid_body_and_half_closes(server: ServerThread) -> None:
    wire = _request_bytes({"x": np.zeros(10000, dtype=np.float32)})
    with _connect(server.port) as sock:
        sock.sendall(wire[: len(wire) - 5000])
        sock.shutdown(socket.SHUT_WR)
        status, body, closed = _read_response(sock)
    assert status == 400
    assert "5000" in json.loads(body)["error"]  # says how much was missing
    assert closed
    assert_served(server.port)


def test_peer_stalls_mid_body_while_others_are_served(server: ServerThread) -> None:
    wire = _request_bytes({"x": np.zeros(10000, dtype=np.float32)})
    with _connect(server.port) as stalled:
        stalled.sendall(wire[: len(wire) // 2])
        assert_served(server.port)
        stalled.close()
    assert_served(server.port)


def test_get_to_infer_keeps_the_connection(server: ServerThread) -> None:
    """A bodyless GET to the infer endpoint gets 405 and the connection serves on."""
    x = np.arange(100, dtype=np.int32)
    conn = h11.Connection(h11.CLIENT)

    def exchange(sock: socket.socket, pieces: list[Any]) -> tuple[h11.Response, bytes]:
        for piece in pieces:
            sock.sendall(piece)
        head: h11.Response | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(sock.recv(65536))
            elif type(event) is h11.Response:
                head = event
            elif type(event) is h11.Data:
                body += event.data
            elif type(event) is h11.EndOfMessage:
                assert head is not None
                return head, bytes(body)

    with _connect(server.port) as sock:
        get = request_for("/v2/models/echo/infer", None, method="GET")
        head, body = exchange(sock, [conn.send(get), conn.send(h11.EndOfMessage())])
        assert head.status_code == 405 and b"not allowed" in body
        assert (b"connection", b"close") not in list(head.headers)
        conn.start_next_cycle()  # h11 agrees: the connection goes on
        encoded = binproto.encode_request({"x": x}, binary_data_output=True)
        head, body = exchange(
            sock, send_message(conn, request_for(get.target.decode(), encoded), encoded)
        )
    assert head.status_code == 200
    hl = binproto.header_length_from(head.headers)
    np.testing.assert_array_equal(binproto.decode_response(body, header_length=hl).tensors["x"], x)


def test_peer_sends_more_than_content_length(server: ServerThread) -> None:
    x = np.arange(5, dtype=np.int32)
    wire = _request_bytes({"x": x})
    with _connect(server.port) as sock:
        sock.sendall(wire + b"\x00garbage that is no request\r\n\r\n")
        received = bytearray()
        while data := sock.recv(65536):  # until the server closes
            received += data
    # The declared body was complete and valid; what followed is not a request.
    statuses = re.findall(rb"HTTP/1.1 (\d{3}) ", bytes(received))
    assert statuses == [b"200", b"400"]
    assert_served(server.port)


def test_chunked_request_body(server: ServerThread) -> None:
    x = np.arange(3000, dtype=np.uint16)
    encoded = binproto.encode_request({"x": x}, binary_data_output=True)
    body = bytes(encoded)
    head = (
        "POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        f"Inference-Header-Content-Length: {encoded.header_length}\r\n\r\n"
    ).encode()
    wire = bytearray(head)
    for start in range(0, len(body), 777):
        piece = body[start : start + 777]
        wire += b"%x\r\n" % len(piece) + piece + b"\r\n"
    wire += b"0\r\n\r\n"
    with _connect(server.port) as sock:
        sock.sendall(wire)
        status, payload, _ = _read_response(sock, check_closed=False)
    assert status == 200
    assert payload.endswith(x.tobytes())


def _responses(data: bytes, count: int) -> list[binproto.DecodedMessage]:
    """Decode ``count`` V2 responses that follow each other in ``data``."""
    out = []
    for _ in range(count):
        conn = h11.Connection(h11.CLIENT)
        conn.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
        conn.send(h11.EndOfMessage())
        conn.receive_data(data)
        head = conn.next_event()
        assert type(head) is h11.Response and head.status_code == 200
        body = bytearray()
        while type(event := conn.next_event()) is h11.Data:
            body += event.data
        assert type(event) is h11.EndOfMessage
        hl = binproto.header_length_from(head.headers)
        out.append(binproto.decode_response(bytes(body), header_length=hl))
        data = conn.trailing_data[0]
    return out


@pytest.mark.parametrize("first_size", [10, 1 << 20])
def test_pipelined_requests(server: ServerThread, first_size: int) -> None:
    first = np.arange(first_size, dtype=np.int32)
    second = np.array([b"\xfe", b"x"], dtype=object)
    wire = _request_bytes({"a": first}) + _request_bytes({"b": second})
    with _connect(server.port) as sock:
        sock.sendall(wire)
        sock.shutdown(socket.SHUT_WR)
        received = bytearray()
        while data := sock.recv(1 << 20):
            received += data
    a, b = _responses(bytes(received), 2)
    np.testing.assert_array_equal(a.tensors["a"], first)
    assert list(b.tensors["b"]) == list(second)


def test_shared_memory_inputs_are_refused(server: ServerThread) -> None:
    payload = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": [4],
                    "datatype": "FP32",
                    "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 16},
                }
            ]
        }
    ).encode()
    head = (
        f"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode()
    with _connect(server.port) as sock:
        sock.sendall(head + payload)
        status, body, _ = _read_response(sock, check_closed=False)
    assert status == 400
    assert "shared memory is not supported" in json.loads(body)["error"]


def test_body_holds_more_than_the_header_declares(server: ServerThread) -> None:
    body = binproto.encode_request({"x": np.arange(4, dtype=np.int32)})
    extra = bytes(body) + b"\x00" * 8
    head = (
        "POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n"
        f"Content-Length: {len(extra)}\r\n"
        f"Inference-Header-Content-Length: {body.header_length}\r\n\r\n"
    ).encode()
    with _connect(server.port) as sock:
        sock.sendall(head + extra)
        status, data, _ = _read_response(sock, check_closed=False)
    assert status == 400
    assert "additional" in json.loads(data)["error"]
    assert_served(server.port)


@pytest.mark.parametrize(
    ("raw", "status", "pattern"),
    [
        (b"BLAH\r\n\r\n", 400, None),
        (
            b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n{bad}",
            400,
            "",
        ),
        (
            b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
            b"Inference-Header-Content-Length: -1\r\n\r\n{}",
            400,
            "inference header size",
        ),
        (b"GET /v2/nothing HTTP/1.1\r\nHost: x\r\n\r\n", 404, "Not Found"),
        (b"GET /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n\r\n", 405, "not allowed"),
    ],
)
def test_bad_requests(server: ServerThread, raw: bytes, status: int, pattern: str | None) -> None:
    with _connect(server.port) as sock:
        sock.sendall(raw)
        got, body, _ = _read_response(sock, check_closed=False)
    assert got == status
    if pattern is not None:
        assert re.search(pattern, json.loads(body)["error"])
    assert_served(server.port)


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


def test_server_reads_only_as_fast_as_the_handler_consumes(server: ServerThread) -> None:
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
    with _connect(server.port) as sock:
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
        status, payload, _ = _read_response(sock, check_closed=False)
    assert status == 200
    assert json.loads(payload)["outputs"][0]["data"] == [x.nbytes]


def test_expect_100_continue(server: ServerThread) -> None:
    x = np.arange(100, dtype=np.float64)
    body = binproto.encode_request({"x": x}, binary_data_output=True)
    conn = h11.Connection(h11.CLIENT)
    head = conn.send(
        request_for("/v2/models/echo/infer", body, headers=[("Expect", "100-continue")])
    )
    assert head is not None
    with _connect(server.port) as sock:
        sock.sendall(head)
        interim = sock.recv(65536)  # sent before any body byte
        assert interim.startswith(b"HTTP/1.1 100 ")
        sock.sendall(bytes(body))
        status, payload, _ = _read_response(sock, check_closed=False)
    assert status == 200
    assert payload.endswith(x.tobytes())


def test_limits_answer_413() -> None:
    async def main() -> None:
        app = V2Server(limits=binproto.Limits(max_tensor_bytes=1000))
        srv = await start_server(app, port=0)
        port = srv.sockets[0].getsockname()[1]
        async with Client("127.0.0.1", port) as c:
            with pytest.raises(HTTPError) as info:
                await c.infer("echo", {"x": np.zeros(1001, dtype=np.uint8)})
            assert info.value.status == 413
            assert "exceeds the limit of 1000 bytes" in info.value.message
            out = await c.infer("echo", {"x": np.ones(1000, dtype=np.uint8)})
            np.testing.assert_array_equal(out["x"], np.ones(1000, dtype=np.uint8))
        srv.close()
        await srv.wait_closed()

    run(main())


def test_server_timeout_closes_a_stalled_peer() -> None:
    async def main() -> bytes:
        srv = await start_server(port=0, timeout=0.2)
        port = srv.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        wire = _request_bytes({"x": np.zeros(1000, dtype=np.float32)})
        writer.write(wire[:-100])
        received = await asyncio.wait_for(reader.read(), 10)  # until the server closes
        writer.close()
        srv.close()
        await srv.wait_closed()
        return received

    received = run(main())
    assert received.startswith(b"HTTP/1.1 408 ")  # and then the server closed
    assert b"timed out" in received


# -- the reference server as a process, with a 256 MiB tensor ------------------------------


def _vm(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(key)


@pytest.fixture
def serve_process(request: pytest.FixtureRequest) -> Iterator[tuple[int, int]]:
    args = [sys.executable, "-m", "binproto", "serve", "--port", "0", *request.param]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert match, line
        yield proc.pid, int(match.group(1))
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.slow
@pytest.mark.parametrize("serve_process", [[], ["--streams"]], indirect=True, ids=["zc", "st"])
def test_256_mib_through_the_reference_server(serve_process: tuple[int, int]) -> None:
    pid, port = serve_process
    assert_served(port)  # warm up: imports, first allocations
    before = _vm(pid, "VmRSS")
    x = np.arange(64 << 20, dtype=np.float32)  # 256 MiB
    out = run(_echo(port, {"x": x}, binary_data_output=True))
    assert out["x"].dtype == np.float32
    assert np.array_equal(out["x"], x)
    peak = _vm(pid, "VmHWM")
    # The echo model holds the tensor once; everything else is O(chunk).
    assert peak - before <= x.nbytes * 1.1, (peak - before) / x.nbytes


def test_serve_command_answers_health_checks() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "binproto", "serve", "--port", "0", "--host", "127.0.0.1"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        match = re.search(r":(\d+)$", proc.stdout.readline().strip())
        assert match
        client = _triton(int(match.group(1)))
        try:
            assert client.is_server_live()
            assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
        finally:
            client.close()
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize(
    ("serve_process", "coding"),
    [([], "gzip"), (["--no-compress"], None), (["--backend", "trio", "--no-compress"], None)],
    indirect=["serve_process"],
)
def test_serve_command_compression_switch(
    serve_process: tuple[int, int], coding: str | None
) -> None:
    import http.client

    _, port = serve_process
    body = binproto.encode_request({"x": np.arange(1000, dtype=np.int32)}, binary_data_output=True)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(
            "POST",
            "/v2/models/echo/infer",
            body=bytes(body),
            headers={**dict(body.headers), "Accept-Encoding": "gzip"},
        )
        response = conn.getresponse()
        raw = response.read()
        assert response.status == 200
        assert response.getheader("Content-Encoding") == coding
        hl = binproto.header_length_from(response.getheaders())
        out = binproto.decode_response(raw, header_length=hl, content_encoding=coding)
        assert np.array_equal(out.tensors["x"], np.arange(1000, dtype=np.int32))
    finally:
        conn.close()


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


def test_content_length_beside_chunked_is_refused_and_closed(server: ServerThread) -> None:
    # Read by Content-Length, the chunk's bytes would be a second request.
    smuggled = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    chunk = b"0\r\n\r\n" + smuggled
    raw = (
        b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + chunk
    )
    with _connect(server.port) as sock:
        sock.sendall(raw)
        status, body, closed = _read_response(sock)
    assert status == 400 and closed
    assert "both Content-Length and Transfer-Encoding" in json.loads(body)["error"]
    assert_served(server.port)


@pytest.mark.parametrize("expect", [True, False], ids=["expect-100", "plain"])
def test_a_request_refused_from_its_head_is_answered_at_once(
    server: ServerThread, expect: bool
) -> None:
    # 10 GiB announced to a model that does not exist: the answer comes
    # without reading (or inviting) the body, and the connection closes.
    head = (
        "POST /v2/models/nothing/infer HTTP/1.1\r\nHost: x\r\n"
        f"Content-Length: {10 << 30}\r\n" + ("Expect: 100-continue\r\n" if expect else "") + "\r\n"
    ).encode()
    with _connect(server.port) as sock:
        sock.sendall(head + b"{")
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 404 "), first[:40]  # no 100 Continue before it
        rest = first
        while chunk := sock.recv(65536):  # then the server closes
            rest += chunk
    assert b"connection: close" in rest.lower()
    assert b"Request for unknown model: 'nothing' is not found" in rest
    assert_served(server.port)


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


@contextlib.asynccontextmanager
async def replying_server(reply: bytes) -> AsyncIterator[int]:
    """A server on a free port that answers any request head with ``reply``
    (the request's body stays unread) and closes; yields the port."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(reply)
        await writer.drain()
        writer.close()

    srv = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield srv.sockets[0].getsockname()[1]
    finally:
        srv.close()
        await srv.wait_closed()


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
    async def main() -> None:
        async with replying_server(reply) as port, Client("127.0.0.1", port) as c:
            with pytest.raises(binproto.RemoteProtocolError, match=message):
                await c.get("/v2/health/live")

    run(main())


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

    async def main() -> dict[str, Any]:
        async with replying_server(reply) as port, Client("127.0.0.1", port) as c:
            out: dict[str, Any] = await c.infer("echo", {"x": x})
            return out

    np.testing.assert_array_equal(run(main())["x"], x)


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


def test_connect_tries_each_address_in_turn() -> None:
    from binproto.adapters.asyncio import close_server, connect

    async def main() -> None:
        srv = await start_server(port=0)
        port = srv.sockets[0].getsockname()[1]
        refusing = socket.socket()  # bound, not listening: connections are refused
        refusing.bind(("127.0.0.1", 0))
        loop = asyncio.get_running_loop()
        real = loop.getaddrinfo

        async def refused_first(host: Any, port: Any, **kw: Any) -> Any:
            infos = await real(host, port, **kw)
            family, type_, proto, name, _ = infos[0]
            return [(family, type_, proto, name, refusing.getsockname()), *infos]

        loop.getaddrinfo = refused_first  # type: ignore[method-assign]
        try:
            stream = await connect("127.0.0.1", port)
            await stream.aclose()
        finally:
            del loop.getaddrinfo
            refusing.close()
            await close_server(srv)

    run(main())


def test_a_client_gone_mid_response_is_not_logged_as_a_server_fault(
    server: ServerThread, caplog: pytest.LogCaptureFixture
) -> None:
    x = np.random.default_rng(0).random(4 << 20, dtype=np.float32)  # 16 MiB back
    body = binproto.encode_request({"x": x}, binary_data_output=True)
    head = request_for("/v2/models/echo/infer", body, headers=[("Accept-Encoding", "gzip")])
    wire = b"".join(bytes(p) for p in send_message(h11.Connection(h11.CLIENT), head, body))
    caplog.set_level(logging.INFO, logger="binproto.server")
    with _connect(server.port) as sock:
        sock.sendall(wire)
        assert sock.recv(1000).startswith(b"HTTP/1.1 200 ")
        # Reset, not close: the server's next write fails.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any(
        "connection lost" in r.getMessage() for r in caplog.records
    ):
        time.sleep(0.05)
    served = [r for r in caplog.records if r.name == "binproto.server"]
    assert any(r.levelno == logging.INFO and "connection lost" in r.getMessage() for r in served)
    assert not [r for r in served if r.levelno >= logging.WARNING]
    assert_served(server.port)


@pytest.mark.parametrize("zero_copy", [True, False], ids=["zero_copy", "streams"])
def test_server_timeout_gives_up_on_a_peer_that_stops_reading(zero_copy: bool) -> None:
    x = np.zeros(16 << 20, dtype=np.float32)  # 64 MiB back: more than socket buffers hold
    wire = _request_bytes({"x": x})
    srv = ServerThread(zero_copy=zero_copy, timeout=0.5)
    try:
        with _connect(srv.port) as sock:
            sock.sendall(wire)
            time.sleep(3)  # read nothing for six timeouts
            received = 0
            while chunk := sock.recv(1 << 20):
                received += len(chunk)
    finally:
        srv.close()
    assert received < x.nbytes  # the server gave up and closed


def test_client_reports_an_answer_sent_before_its_body_was_taken() -> None:
    # The server refuses from the head and closes with the body unread: its
    # close resets the connection under the client's send.
    async def main() -> None:
        async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            payload = b'{"error": "request too large"}'
            writer.write(
                b"HTTP/1.1 413 Payload Too Large\r\nConnection: close\r\n"
                + f"Content-Length: {len(payload)}\r\n\r\n".encode()
                + payload
            )
            await writer.drain()
            await asyncio.sleep(0.2)
            writer.transport.abort()

        srv = await asyncio.start_server(refuse, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        try:
            async with Client("127.0.0.1", port, timeout=10) as c:
                with pytest.raises(HTTPError) as info:
                    await c.infer("echo", {"x": np.zeros(16 << 20, dtype=np.float32)})
        finally:
            srv.close()
            await srv.wait_closed()
        assert info.value.status == 413 and info.value.message == "request too large"

    run(main())


# -- per-request cost: what an optimisation of the serving path must keep true ------


async def _keep_alive_round_trips(n: int, inputs: dict[str, Any]) -> list[bytes]:
    """``n`` echo requests over one keep-alive connection, one at a time; the raw answers."""
    srv = await start_server()
    port = srv.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answers = []
    try:
        for _ in range(n):
            writer.write(_request_bytes(inputs))
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
    from .test_timeouts import _asyncio_server

    factory = asyncio.new_event_loop
    if loop == "uvloop":
        factory = pytest.importorskip("uvloop").new_event_loop

    async def late(request: InferRequest) -> dict[str, Any]:
        await asyncio.sleep(0.3)  # another connection's requests come meanwhile
        return dict(await request.tensors())

    app = V2Server([Model("late", late), echo_model()], timeouts=Timeouts(keep_alive=60))
    big = np.frombuffer(np.random.default_rng(1).bytes(200_000), dtype=np.uint8)
    small = np.full(60_000, 0xEE, dtype=np.uint8)
    with _asyncio_server(app, zero_copy=True, loop_factory=factory) as port:
        a = socket.create_connection(("127.0.0.1", port))
        b = socket.create_connection(("127.0.0.1", port))
        answers = []
        try:
            for _ in range(3):
                a.sendall(_request_bytes({"x": big}, target="/v2/models/late/infer"))
                time.sleep(0.1)
                for _ in range(3):
                    b.sendall(_request_bytes({"x": small}))
                    status, body, _ = _read_response(b, check_closed=False)
                    assert status == 200 and body.endswith(small.tobytes())
                status, body, _ = _read_response(a, check_closed=False)
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
                writer.write(_request_bytes({"x": value}, target="/v2/models/keep/infer"))
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
            writer.write(b"".join(_request_bytes({"x": x}) for x in xs))
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


def _answer(model: Model, wire: bytes) -> bytes:
    """What a server of ``model`` sends for the request ``wire``, over one
    connection of a scripted stream (no sockets, no threads)."""
    stream = Scripted(wire)
    asyncio.run(V2Server([model], timeouts=Timeouts(keep_alive=1)).serve_connection(stream))
    return bytes(stream.sent)


def _streaming(writer_of: Callable[[], binproto.BodyWriter]) -> Any:
    async def handler(request: InferRequest) -> StreamingResponse:
        await request.tensors()

        async def chunks() -> AsyncIterator[tuple[int, Any]]:
            yield 0, b"abcd"

        return StreamingResponse(writer_of(), chunks())

    return handler


def _response_header() -> dict[str, Any]:
    return {
        "model_name": "s",
        "outputs": [
            {"name": "y", "datatype": "UINT8", "shape": [4], "parameters": {"binary_data_size": 4}}
        ],
    }


def _started() -> binproto.BodyWriter:
    writer = binproto.BodyWriter(_response_header())
    writer.start()
    return writer


def _of_a_request() -> binproto.BodyWriter:
    header = _response_header()
    return binproto.BodyWriter({"inputs": header["outputs"]})


@pytest.mark.parametrize("writer_of", [_started, _of_a_request])
def test_a_streaming_writer_that_cannot_start_is_a_logged_500(
    writer_of: Callable[[], binproto.BodyWriter], caplog: pytest.LogCaptureFixture
) -> None:
    # Refused before the response's head goes out: the client gets a 500
    # (not a closed connection, nor a request's body as the answer), logged.
    wire = _request_bytes({"x": np.zeros(4, dtype=np.float32)}, "/v2/models/s/infer")
    with caplog.at_level(logging.ERROR, logger="binproto.server"):
        sent = _answer(Model("s", _streaming(writer_of)), wire)
    assert sent.startswith(b"HTTP/1.1 500 "), sent[:200]
    assert "error while serving /v2/models/s/infer" in caplog.text


def test_a_handlers_local_protocol_error_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def complex_output(request: InferRequest) -> dict[str, Any]:
        await request.tensors()
        return {"y": np.arange(3) + 1j}  # no V2 datatype: the encoder refuses it

    wire = _request_bytes({"x": np.zeros(4, dtype=np.float32)}, "/v2/models/c/infer")
    with caplog.at_level(logging.ERROR, logger="binproto.server"):
        sent = _answer(Model("c", complex_output), wire)
    assert sent.startswith(b"HTTP/1.1 500 "), sent[:200]
    assert "error while serving /v2/models/c/infer" in caplog.text
    assert "no V2 datatype" in caplog.text


def test_an_inference_error_takes_any_integer_status() -> None:
    assert InferenceError("gone", HTTPStatus.NOT_FOUND).status == 404
    assert type(InferenceError("gone", np.int64(410)).status) is int  # type: ignore[arg-type]


@pytest.mark.parametrize("status", [304, 204, 200, 100, 600, "404", True])
def test_an_inference_error_without_an_error_status_is_a_logged_500(
    status: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # A 304 or 204 carries no body, so the error's JSON would be read as the
    # start of the next response: refused where it is raised.
    async def not_modified(request: InferRequest) -> dict[str, Any]:
        raise InferenceError("not modified", status)

    wire = _request_bytes({"x": np.zeros(4, dtype=np.float32)}, "/v2/models/n/infer")
    with caplog.at_level(logging.ERROR, logger="binproto.server"):
        sent = _answer(Model("n", not_modified), wire * 2)
    assert sent.startswith(b"HTTP/1.1 500 "), sent[:200]
    assert sent.count(b"HTTP/1.1 500 ") == 2  # and the connection serves the next one
    assert "HTTP error status, 400-599" in caplog.text


def test_an_output_the_model_does_not_give_is_the_clients_400(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def one_output(request: InferRequest) -> dict[str, Any]:
        await request.tensors()
        return {"y": np.zeros(2, dtype=np.float32)}

    x = np.zeros(4, dtype=np.float32)
    wire = _request_bytes({"x": x}, "/v2/models/o/infer", outputs=["nope"])
    with caplog.at_level(logging.WARNING, logger="binproto.server"):
        sent = _answer(Model("o", one_output), wire)
    assert sent.startswith(b"HTTP/1.1 400 "), sent[:200]
    assert b"unexpected inference output 'nope' for model 'o'" in sent
    assert caplog.text == ""  # the client's mistake: nothing for the server's log


@pytest.mark.parametrize(
    ("target", "body"),
    [
        ("/v2/health/live", b'{"live": true}'),
        ("/v2/health/ready", b'{"ready": true}'),
        ("/v2/models/echo/ready", b'{"name": "echo", "ready": true}'),
    ],
)
def test_health_and_ready_answer_the_json_the_protocol_defines(target: str, body: bytes) -> None:
    # (KServe's clients read the field: an empty body was a JSONDecodeError there)
    sent = _answer(echo_model(), b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % target.encode())
    assert sent.startswith(b"HTTP/1.1 200 ") and sent.endswith(b"\r\n\r\n" + body)


def test_head_is_answered_on_get_routes_and_a_405_says_what_is_allowed() -> None:
    sent = _answer(echo_model(), b"HEAD /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
    assert sent.startswith(b"HTTP/1.1 200 ") and sent.endswith(b"\r\n\r\n")  # no body
    sent = _answer(
        echo_model(), b"POST /v2/models/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
    )
    assert sent.startswith(b"HTTP/1.1 405 ") and b"\r\nAllow: GET, HEAD\r\n" in sent
    sent = _answer(echo_model(), b"GET /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n\r\n")
    assert sent.startswith(b"HTTP/1.1 405 ") and b"\r\nAllow: POST\r\n" in sent


def test_a_classification_request_is_refused_not_answered_with_the_tensor() -> None:
    x = np.arange(3, dtype=np.float32)
    wire = _request_bytes(
        {"x": x}, outputs=[binproto.RequestedOutput("x", parameters={"classification": 2})]
    )
    sent = _answer(echo_model(), wire)
    assert sent.startswith(b"HTTP/1.1 400 ") and b"classification is not supported" in sent


def test_model_versions_are_a_sequence_not_a_string() -> None:
    async def nothing(request: InferRequest) -> dict[str, Any]:
        return {}

    with pytest.raises(binproto.LocalProtocolError, match="the string '12'"):
        Model("m", nothing, versions="12")
    assert Model("m", nothing, versions=["12"]).versions == ("12",)


async def _double_x(request: InferRequest) -> dict[str, Any]:
    tensors = await request.tensors()
    return {"y": np.asarray(tensors["x"]) * 2}


_ONE_INPUT = Model(
    "single",
    _double_x,
    inputs=[{"name": "x", "datatype": "FP32", "shape": [-1]}],
    outputs=[{"name": "y", "datatype": "FP32", "shape": [-1]}],
)


def _raw_request(body: bytes, *, chunked: bool = False, model: str = "single") -> bytes:
    head = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\n"
        "Inference-Header-Content-Length: 0\r\nContent-Type: application/octet-stream\r\n"
    ).encode()
    if chunked:
        return head + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


def test_a_raw_binary_request_is_the_models_one_input() -> None:
    x = np.array([1.5, 2.0, -3.0], dtype=np.float32)
    sent = _answer(_ONE_INPUT, _raw_request(x.tobytes()))
    assert sent.startswith(b"HTTP/1.1 200 "), sent[:300]
    head, _, body = sent.partition(b"\r\n\r\n")
    hl = int(re.search(rb"Inference-Header-Content-Length: (\d+)", head).group(1))  # type: ignore[union-attr]
    decoded = binproto.decode_response(body, header_length=hl)
    assert decoded.tensors["y"].tolist() == (x * 2).tolist()  # a raw request's outputs are binary


@pytest.mark.parametrize(
    ("model", "wire", "status", "message"),
    [
        (echo_model(), _raw_request(b"\0" * 8, model="echo"), 400, b"declares 0 inputs"),
        (_ONE_INPUT, _raw_request(b"\0" * 8, chunked=True), 411, b"needs Content-Length"),
        (_ONE_INPUT, _raw_request(b"\0" * 7), 400, b"expecting a multiple of 4"),
    ],
    ids=["no declared input", "no length", "not whole elements"],
)
def test_a_raw_binary_request_the_model_cannot_take_is_refused(
    model: Model, wire: bytes, status: int, message: bytes
) -> None:
    sent = _answer(model, wire)
    assert sent.startswith(b"HTTP/1.1 %d " % status), sent[:300]
    assert message in sent
