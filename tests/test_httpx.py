"""The httpx adapter: binproto's sync and async clients against the FastAPI example
under uvicorn, and against in-process transports for framing and encodings."""

from __future__ import annotations

import asyncio
import errno
import gzip
import json
import threading
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import numpy as np
import pytest

import binproto
from binproto import RequestedOutput
from binproto.adapters import httpx as bphttpx
from tests.example_server import Server, run_example_server
from tests.fakes import ScriptedServer
from tests.helpers import arrays_equal

MiB = 1 << 20


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with run_example_server() as srv:
        yield srv


def sample(datatype: str) -> np.ndarray[Any, Any]:
    if datatype == "BYTES":
        return np.array([b"abc", b"", b"\xff\xfe not utf-8"], dtype=np.object_)
    if datatype == "BOOL":
        return np.array([[True, False, True]])
    dtype = binproto.DATATYPES[datatype].dtype
    return (np.arange(6) * 3 - 5).astype(dtype).reshape(3, 2)


DATATYPES = ["BOOL", "UINT8", "INT8", "UINT32", "INT64", "FP16", "FP32", "FP64", "BYTES"]


@pytest.mark.parametrize("datatype", DATATYPES)
def test_infer_binary_round_trip(server: Server, datatype: str) -> None:
    arr = sample(datatype)
    with httpx.Client(base_url=server.url) as client:
        result = bphttpx.infer(client, "echo", {"x": arr}, id="req-1")
    assert arrays_equal(result.tensors["x"], arr)
    assert result.header.kind == "response"
    assert result.header.model_name == "echo" and result.header.id == "req-1"
    assert result.header.tensor("x").datatype == datatype
    assert result.header.tensor("x").binary_size is not None


def test_infer_json_inputs_and_outputs(server: Server) -> None:
    inputs: dict[str, np.ndarray[Any, Any]] = {
        "i": np.array([[1, -2], [3, 4]], dtype=np.int32),
        "f": np.array([0.5, -1.5], dtype=np.float64),
        "s": np.array([b"text", b""], dtype=np.object_),
        "b": np.array([True, False]),
    }
    outputs = [RequestedOutput(name, binary_data=False) for name in inputs]
    with httpx.Client(base_url=server.url) as client:
        result = bphttpx.infer(client, "echo", inputs, binary=False, outputs=outputs)
    for name, arr in inputs.items():
        assert arrays_equal(result.tensors[name], arr), name
        assert result.header.tensor(name).binary_size is None
        assert result.header.tensor(name).data is not None


def test_infer_mixed_policy_and_version_path(server: Server) -> None:
    inputs: dict[str, np.ndarray[Any, Any]] = {
        "a": np.arange(4, dtype=np.float32),
        "b": np.arange(3, dtype=np.int16),
    }
    with httpx.Client(base_url=server.url) as client:
        result = bphttpx.infer(
            client,
            "echo",
            inputs,
            model_version="1",
            binary={"a"},
            outputs=[RequestedOutput("b", binary_data=True), RequestedOutput("a")],
            binary_data_output=False,
        )
    # The listed outputs, in the request's order; "a" has no binary_data and the
    # request asks for JSON outputs.
    assert [t.name for t in result.header.tensors] == ["b", "a"]
    assert result.header.tensor("a").binary_size is None
    assert result.header.tensor("b").binary_size == 6
    assert arrays_equal(result.tensors["a"], inputs["a"])
    assert arrays_equal(result.tensors["b"], inputs["b"])
    assert result.header.model_version == "1"


def test_zero_size_and_many_tensors(server: Server) -> None:
    inputs = {
        "empty": np.zeros((0, 5), dtype=np.float32),
        "empty_bytes": np.array([], dtype=np.object_),
        **{f"t{i}": sample(dt) for i, dt in enumerate(DATATYPES)},
    }
    with httpx.Client(base_url=server.url) as client:
        result = bphttpx.infer(client, "echo", inputs)
    for name, arr in inputs.items():
        assert arrays_equal(result.tensors[name], arr), name


def test_ainfer_round_trip(server: Server) -> None:
    inputs = {dt: sample(dt) for dt in DATATYPES}

    async def go() -> binproto.DecodedMessage:
        async with httpx.AsyncClient(base_url=server.url) as client:
            return await bphttpx.ainfer(client, "echo", inputs)

    result = asyncio.run(go())
    for name, arr in inputs.items():
        assert arrays_equal(result.tensors[name], arr), name


def merged(events: list[binproto.Event]) -> dict[str, bytes]:
    """Each tensor's bytes from its chunks (checking they come in order)."""
    out: dict[str, bytearray] = {}
    for ev in events:
        if type(ev) is binproto.TensorChunk:
            buf = out.setdefault(ev.name, bytearray())
            assert ev.offset == len(buf)
            buf += ev.data
    return {k: bytes(v) for k, v in out.items()}


def test_stream_infer_events(server: Server) -> None:
    arr = np.arange(300_000, dtype=np.float32)  # several network reads
    with httpx.Client(base_url=server.url) as client:
        with bphttpx.stream_infer(client, "echo", {"x": arr}) as stream:
            events = []
            for ev in stream:
                if type(ev) is binproto.TensorChunk:
                    ev = binproto.TensorChunk(
                        index=ev.index,
                        name=ev.name,
                        offset=ev.offset,
                        data=memoryview(bytes(ev.data)),
                    )
                events.append(ev)
    assert type(events[0]) is binproto.HeaderParsed
    assert type(events[-1]) is binproto.MessageComplete
    assert type(events[-2]) is binproto.TensorComplete
    chunks = [ev for ev in events if type(ev) is binproto.TensorChunk]
    assert len(chunks) > 1  # it came incrementally
    assert merged(events)["x"] == arr.tobytes()


def test_astream_infer_events(server: Server) -> None:
    arr = np.arange(300_000, dtype=np.int32)

    async def go() -> tuple[list[type], bytes]:
        kinds: list[type] = []
        data = bytearray()
        async with httpx.AsyncClient(base_url=server.url) as client:
            async with bphttpx.astream_infer(client, "echo", {"x": arr}) as stream:
                async for ev in stream:
                    kinds.append(type(ev))
                    if type(ev) is binproto.TensorChunk:
                        assert ev.offset == len(data)
                        data += ev.data
        return kinds, bytes(data)

    kinds, data = asyncio.run(go())
    assert kinds[0] is binproto.HeaderParsed and kinds[-1] is binproto.MessageComplete
    assert kinds.count(binproto.TensorChunk) > 1
    assert data == arr.tobytes()


def test_streamed_response_from_a_body_writer(server: Server) -> None:
    n = 3_000_000  # 12 MB, produced by the server a MiB at a time
    with httpx.Client(base_url=server.url) as client:
        with bphttpx.stream_infer(client, "ramp", {"n": np.array([n])}) as stream:
            got = np.empty(n, dtype=np.float32)
            view = got.view(np.uint8)
            chunks = 0
            for ev in stream:
                if type(ev) is binproto.TensorChunk:
                    view[ev.offset : ev.offset + len(ev.data)] = np.frombuffer(ev.data, np.uint8)
                    chunks += 1
    assert chunks > 1
    assert np.array_equal(got, np.arange(n, dtype=np.float32))


def test_server_errors_raise_http_error(server: Server) -> None:
    x = {"x": np.ones(2, dtype=np.float32)}
    with httpx.Client(base_url=server.url) as client:
        with pytest.raises(bphttpx.HTTPError) as info:
            bphttpx.infer(client, "nope", x)
        assert info.value.status == 404
        assert "unknown model" in info.value.message
        with pytest.raises(bphttpx.HTTPError) as info:
            bphttpx.infer(client, "echo", x, outputs=[RequestedOutput("y")])
        assert info.value.status == 400
        assert "unexpected inference output 'y'" in info.value.message

    async def go() -> bphttpx.HTTPError:
        async with httpx.AsyncClient(base_url=server.url) as client:
            with pytest.raises(bphttpx.HTTPError) as ainfo:
                await bphttpx.ainfer(client, "nope", x)
        return ainfo.value

    assert asyncio.run(go()).status == 404


# -- framing, without a server ----------------------------------------------------------


def test_request_content_is_unjoined_views() -> None:
    arr = np.arange(3 * MiB // 4 + 1, dtype=np.float32)
    body = binproto.encode_request({"x": arr})
    pieces = list(bphttpx.request_content(body, chunk_size=MiB))
    assert [len(p) for p in pieces] == [len(body.json), MiB, MiB, MiB, 4]
    for piece in pieces[1:]:
        assert isinstance(piece, memoryview)
        assert np.shares_memory(np.frombuffer(piece, dtype=np.uint8), arr)
    assert b"".join(pieces) == bytes(body)


class EchoTransport(httpx.BaseTransport, httpx.AsyncBaseTransport):
    """Answers each request with its tensors echoed, optionally compressed with
    ``encoding`` or cut ``cut`` bytes short; records the request pieces as they
    came from the client (httpx's own mock transport would join them first)."""

    def __init__(self, *, encoding: str | None = None, cut: int = 0) -> None:
        self.encoding = encoding
        self.cut = cut
        self.pieces: list[Any] = []
        self.headers = httpx.Headers()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.SyncByteStream)
        return self._answer(request, list(request.stream))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.AsyncByteStream)
        return self._answer(request, [p async for p in request.stream])

    def _answer(self, request: httpx.Request, pieces: list[Any]) -> httpx.Response:
        self.pieces = pieces
        self.headers = request.headers
        data = b"".join(bytes(p) for p in pieces)
        hl = int(request.headers["inference-header-content-length"])
        decoded = binproto.decode_request(data, header_length=hl)
        body = binproto.encode_response(decoded.tensors, model_name="m", request=decoded.header)
        raw = bytes(body)
        headers = [(k, v) for k, v in body.headers if k.lower() != "content-length"]
        if self.encoding == "gzip":
            raw = gzip.compress(raw)
        elif self.encoding == "deflate":
            raw = zlib.compress(raw)
        elif self.encoding is not None:
            raw = raw[::-1]  # stands for an encoding binproto does not know
        if self.encoding is not None:
            headers.append(("Content-Encoding", self.encoding))
        raw = raw[: len(raw) - self.cut]
        headers.append(("Content-Length", str(len(raw))))
        return httpx.Response(200, headers=headers, stream=Pieces(raw))


class Pieces(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A response body that arrives in small pieces (sync or async)."""

    def __init__(self, data: bytes, size: int = 1000) -> None:
        self.data = data
        self.size = size

    def __iter__(self) -> Iterator[bytes]:
        for i in range(0, len(self.data), self.size):
            yield self.data[i : i + self.size]

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self:
            yield piece


def test_request_is_streamed_with_content_length() -> None:
    arr = np.arange(2 * MiB // 4, dtype=np.float32)
    transport = EchoTransport()
    with httpx.Client(base_url="http://test", transport=transport) as client:
        result = bphttpx.infer(client, "echo", {"x": arr}, chunk_size=MiB)
    assert arrays_equal(result.tensors["x"], arr)
    headers = transport.headers
    assert "transfer-encoding" not in headers
    body = binproto.encode_request({"x": arr}, binary_data_output=True)
    assert headers["content-length"] == str(body.content_length)
    assert headers["inference-header-content-length"] == str(body.header_length)
    # The tensor went out as views of the caller's array, never joined.
    tensor_pieces = transport.pieces[1:]
    assert len(tensor_pieces) == 2
    for piece in tensor_pieces:
        assert np.shares_memory(np.frombuffer(piece, dtype=np.uint8), arr)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compressed_response_is_decoded_by_binproto(encoding: str) -> None:
    inputs = {"x": np.arange(50_000, dtype=np.float64), "s": sample("BYTES")}
    transport = EchoTransport(encoding=encoding)
    accept = {"Accept-Encoding": bphttpx.ACCEPT_ENCODING}
    with httpx.Client(base_url="http://test", transport=transport) as client:
        result = bphttpx.infer(client, "echo", inputs, headers=accept)
    assert transport.headers["accept-encoding"] == "gzip, deflate"
    for name, arr in inputs.items():
        assert arrays_equal(result.tensors[name], arr), name

    async def go() -> binproto.DecodedMessage:
        async with httpx.AsyncClient(base_url="http://test", transport=transport) as client:
            return await bphttpx.ainfer(client, "echo", inputs, headers=accept)

    result = asyncio.run(go())
    for name, arr in inputs.items():
        assert arrays_equal(result.tensors[name], arr), name


def test_compression_is_asked_for_only_on_request() -> None:
    transport = EchoTransport()
    with httpx.Client(base_url="http://test", transport=transport) as client:
        bphttpx.infer(client, "echo", {"x": np.ones(3, dtype=np.float32)})
    assert transport.headers["accept-encoding"] == "identity"


def test_unsupported_response_encoding() -> None:
    transport = EchoTransport(encoding="br")
    with httpx.Client(base_url="http://test", transport=transport) as client:
        with pytest.raises(binproto.RemoteProtocolError) as info:
            bphttpx.infer(client, "echo", {"x": np.ones(3, dtype=np.float32)})
    assert info.value.status_hint == 415


def test_truncated_response_is_an_error() -> None:
    transport = EchoTransport(cut=5)
    with httpx.Client(base_url="http://test", transport=transport) as client:
        with pytest.raises(binproto.RemoteProtocolError) as info:
            bphttpx.infer(client, "echo", {"x": np.ones(30, dtype=np.float32)})
    assert "header announces" in str(info.value)


def test_error_body_that_is_not_v2_json() -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(502, content=b"bad gateway"))
    with httpx.Client(base_url="http://test", transport=transport) as client:
        with pytest.raises(bphttpx.HTTPError) as info:
            bphttpx.infer(client, "echo", {"x": np.ones(3, dtype=np.float32)})
    assert info.value.status == 502 and info.value.message == "bad gateway"


def test_infer_path_quotes_names() -> None:
    assert bphttpx.infer_path("a/b c") == "/v2/models/a%2Fb%20c/infer"
    assert bphttpx.infer_path("m", "2") == "/v2/models/m/versions/2/infer"


def test_encoded_body_with_options_is_refused() -> None:
    body = binproto.encode_request({"x": np.ones(1, dtype=np.float32)})
    with httpx.Client(base_url="http://test", transport=EchoTransport()) as client:
        with pytest.raises(binproto.LocalProtocolError, match="binary"):
            bphttpx.infer(client, "echo", body, binary=False)
        result = bphttpx.infer(client, "echo", body)
    assert result.tensors["x"].tolist() == [1.0]


@pytest.mark.parametrize("chunk_size", [0, -1, 2.5, None, True])
def test_a_chunk_size_that_is_not_a_positive_int_is_refused(chunk_size: Any) -> None:
    # Refused before anything is sent: not range()'s ValueError or TypeError,
    # nor (for a negative size) an empty body under its Content-Length.
    body = binproto.encode_request({"x": np.ones(3, dtype=np.float32)})
    transport = EchoTransport()
    with pytest.raises(binproto.LocalProtocolError, match="chunk_size"):
        bphttpx.request_content(body, chunk_size)
    with pytest.raises(binproto.LocalProtocolError, match="chunk_size"):
        bphttpx.arequest_content(body, chunk_size)
    with httpx.Client(base_url="http://test", transport=transport) as client:
        with pytest.raises(binproto.LocalProtocolError, match="chunk_size"):
            bphttpx.infer(client, "echo", body, chunk_size=chunk_size)

    async def go() -> None:
        async with httpx.AsyncClient(base_url="http://test", transport=transport) as client:
            with pytest.raises(binproto.LocalProtocolError, match="chunk_size"):
                await bphttpx.ainfer(client, "echo", body, chunk_size=chunk_size)

    asyncio.run(go())
    assert not transport.headers  # no request went out


def test_a_response_whose_body_was_read_already_is_refused() -> None:
    # Not httpx's StreamConsumed / StreamClosed: the caller passed a response
    # with no body left to parse.
    body = binproto.encode_request({"x": np.ones(3, dtype=np.float32)})
    content, headers = bytes(body), bphttpx.request_headers(body)
    path = bphttpx.infer_path("echo")
    refused = pytest.raises(binproto.LocalProtocolError, match="read already")
    with httpx.Client(base_url="http://test", transport=EchoTransport()) as client:
        response = client.post(path, content=content, headers=headers)
        with refused:
            bphttpx.read_response(response)
        with client.stream("POST", path, content=content, headers=headers) as response:
            assert bphttpx.read_response(response).tensors["x"].tolist() == [1.0] * 3
            with refused:  # read through
                bphttpx.read_response(response)
        with client.stream("POST", path, content=content, headers=headers) as response:
            pass
        with refused:  # closed
            bphttpx.read_response(response)

    async def go() -> None:
        async with httpx.AsyncClient(base_url="http://test", transport=EchoTransport()) as client:
            response = await client.post(path, content=content, headers=headers)
            with refused:
                await bphttpx.aread_response(response)

    asyncio.run(go())


# -- against a real socket, where httpx enforces the framing --------------------------


@contextmanager
def canned_server(response: bytes, *, reset: bool = False) -> Iterator[str]:
    """A server on 127.0.0.1 that reads one request, writes ``response`` as it
    is and closes the connection (``reset``: with a TCP reset); yields its URL."""
    with ScriptedServer([[response, "reset" if reset else "close"]]) as fake:
        yield f"http://127.0.0.1:{fake.port}"


def infer_from(
    response: bytes, mode: str, before: Callable[[], None] = lambda: None, *, reset: bool = False
) -> binproto.DecodedMessage:
    """``infer`` (mode "sync") or ``ainfer`` (mode "async") against ``response``
    (then a reset, with ``reset``); ``before`` is called once the client is made."""
    inputs = {"x": np.ones(3, dtype=np.float32)}
    with canned_server(response, reset=reset) as url:
        if mode == "sync":
            with httpx.Client(base_url=url) as client:
                before()
                return bphttpx.infer(client, "echo", inputs)

        async def go() -> binproto.DecodedMessage:
            async with httpx.AsyncClient(base_url=url) as client:
                before()
                return await bphttpx.ainfer(client, "echo", inputs)

        # Not asyncio.run: on leaving, Python 3.11's takes the repr of its task
        # with the task's exception (4 MiB for a 1 MiB error message of NULs).
        loop = asyncio.new_event_loop()
        try:
            return loop.run_until_complete(go())
        finally:
            loop.close()


def v2_response(array: np.ndarray[Any, Any]) -> tuple[bytes, bytes]:
    """A V2 response with ``array`` as its binary output: head fields, body."""
    body = binproto.encode_response({"x": array}, model_name="echo")
    fields = b"".join(
        f"{k}: {v}\r\n".encode() for k, v in body.headers if k.lower() != "content-length"
    )
    return fields, bytes(body)


MODES = ["sync", "async"]


@pytest.mark.parametrize("mode", MODES)
def test_a_body_cut_short_by_the_server_is_a_protocol_error(mode: str) -> None:
    fields, body = v2_response(np.arange(1000, dtype=np.float32))
    sent = body[:-100]
    head = b"HTTP/1.1 200 OK\r\n" + fields + f"Content-Length: {len(body)}\r\n\r\n".encode()
    with pytest.raises(binproto.RemoteProtocolError) as info:
        infer_from(head + sent, mode)
    assert isinstance(info.value.__cause__, httpx.RemoteProtocolError)
    assert "peer closed connection" in str(info.value)
    assert info.value.offset == len(sent)


@pytest.mark.parametrize("mode", MODES)
def test_a_body_cut_short_by_a_reset_is_a_protocol_error(mode: str) -> None:
    fields, body = v2_response(np.arange(1000, dtype=np.float32))
    head = b"HTTP/1.1 200 OK\r\n" + fields + f"Content-Length: {len(body)}\r\n\r\n".encode()
    with pytest.raises(binproto.RemoteProtocolError) as info:
        infer_from(head + body[:-100], mode, reset=True)
    assert isinstance(info.value.__cause__, httpx.ReadError)
    assert "the response body could not be read" in str(info.value)


@pytest.mark.parametrize("mode", MODES)
def test_an_error_body_cut_short_by_a_reset_still_gives_the_status(mode: str) -> None:
    with pytest.raises(bphttpx.HTTPError) as info:
        infer_from(error_reply("500 Oops", b'{"error": "out of memory"}')[:-10], mode, reset=True)
    assert info.value.status == 500
    assert "the error body could not be read" in info.value.message
    assert isinstance(info.value.__cause__, binproto.RemoteProtocolError)


BROKEN_HEADS = {
    "garbage": b"garbage\r\n\r\n",
    "closed-in-head": b"HTTP/1.1 200 OK\r\nContent-Le",
    "switching-protocols": b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: foo\r\n"
    b"Connection: Upgrade\r\n\r\n",
    "transfer-encoding-gzip": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
    "conflicting-lengths": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("head", list(BROKEN_HEADS.values()), ids=list(BROKEN_HEADS))
def test_a_broken_response_head_is_a_protocol_error(mode: str, head: bytes) -> None:
    # binproto's error, as the asyncio and trio clients raise: not httpx's.
    with pytest.raises(binproto.RemoteProtocolError, match="response head") as info:
        infer_from(head, mode)
    assert isinstance(info.value.__cause__, httpx.RemoteProtocolError)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("head", [b"", b"HTTP/1.1 200 OK\r\nContent-Le"], ids=["none", "part"])
def test_a_response_head_cut_by_a_reset_is_a_protocol_error(mode: str, head: bytes) -> None:
    with pytest.raises(binproto.RemoteProtocolError, match="response head") as info:
        infer_from(head, mode, reset=True)
    assert isinstance(info.value.__cause__, httpx.ReadError)


def test_an_error_response_read_or_closed_before_still_gives_its_status() -> None:
    body = binproto.encode_request({"x": np.ones(3, dtype=np.float32)})
    content, headers = bytes(body), bphttpx.request_headers(body)
    reply = error_reply("500 Oops", b'{"error": "out of memory"}')
    with canned_server(reply) as url, httpx.Client(base_url=url) as client:
        with client.stream("POST", "/v2/models/m/infer", content=content, headers=headers) as r:
            with pytest.raises(bphttpx.HTTPError, match="out of memory"):
                bphttpx.read_response(r)
            with pytest.raises(bphttpx.HTTPError, match="read or closed before") as info:
                bphttpx.read_response(r)  # (its body taken by the first call)
            assert info.value.status == 500
    with canned_server(reply) as url, httpx.Client(base_url=url) as client:
        with client.stream("POST", "/v2/models/m/infer", content=content, headers=headers) as r:
            pass  # closed unread
        with pytest.raises(bphttpx.HTTPError, match="read or closed before"):
            bphttpx.read_response(r)


def test_a_client_closed_while_its_response_is_read_is_the_callers_error() -> None:
    # Another task closes the client: httpx says ReadError, the peer did nothing.
    fields, body = v2_response(np.arange(1000, dtype=np.float32))
    head = b"HTTP/1.1 200 OK\r\n" + fields + f"Content-Length: {len(body)}\r\n\r\n".encode()
    inputs = {"x": np.ones(3, dtype=np.float32)}

    async def go(url: str) -> None:
        async with httpx.AsyncClient(base_url=url) as client:
            with pytest.raises(binproto.LocalProtocolError, match="closed while"):
                async with bphttpx.astream_infer(client, "echo", inputs) as events:
                    await client.aclose()
                    async for _ in events:
                        pass

    with canned_server(head + body[:200]) as url:
        asyncio.run(go(url))


def test_a_broken_response_head_is_a_protocol_error_when_streamed() -> None:
    inputs = {"x": np.ones(3, dtype=np.float32)}
    with canned_server(BROKEN_HEADS["garbage"]) as url, httpx.Client(base_url=url) as client:
        with pytest.raises(binproto.RemoteProtocolError, match="response head"):
            with bphttpx.stream_infer(client, "echo", inputs):
                pass

    async def go() -> None:
        async with httpx.AsyncClient(base_url=url) as client:
            with pytest.raises(binproto.RemoteProtocolError, match="response head"):
                async with bphttpx.astream_infer(client, "echo", inputs):
                    pass

    with canned_server(BROKEN_HEADS["garbage"]) as url:
        asyncio.run(go())


@pytest.mark.parametrize("mode", MODES)
def test_bad_chunk_framing_is_a_protocol_error(mode: str) -> None:
    fields, body = v2_response(np.arange(1000, dtype=np.float32))
    part = body[:3000]
    head = b"HTTP/1.1 200 OK\r\n" + fields + b"Transfer-Encoding: chunked\r\n\r\n"
    chunks = f"{len(part):x}\r\n".encode() + part + b"\r\nnot a chunk size\r\n"
    with pytest.raises(binproto.RemoteProtocolError) as info:
        infer_from(head + chunks, mode)
    assert isinstance(info.value.__cause__, httpx.RemoteProtocolError)
    assert "illegal chunk header" in str(info.value)
    assert info.value.offset == len(part)


def error_reply(status: str, body: bytes, encoding: str | None = None) -> bytes:
    coding = f"Content-Encoding: {encoding}\r\n" if encoding else ""
    head = f"HTTP/1.1 {status}\r\n{coding}Content-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


@pytest.mark.parametrize("mode", MODES)
def test_a_gzip_bomb_error_body_is_read_in_bounded_memory(mode: str) -> None:
    squeeze = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(MiB)
    bomb = b"".join(squeeze.compress(zeros) for _ in range(100)) + squeeze.flush()
    reply = error_reply("500 Internal Server Error", bomb, "gzip")
    baseline = 0

    def measure_from_here() -> None:  # not counting the client's own setup
        nonlocal baseline
        baseline = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()

    tracemalloc.start()
    try:
        with pytest.raises(bphttpx.HTTPError) as info:
            infer_from(reply, mode, measure_from_here)
        peak = tracemalloc.get_traced_memory()[1] - baseline
    finally:
        tracemalloc.stop()
    assert info.value.status == 500
    assert info.value.message == "\0" * bphttpx.MAX_ERROR_BODY
    assert peak < 8 * MiB, peak / MiB


def test_an_error_body_that_decodes_to_little_is_read_no_further_than_the_bound() -> None:
    # Empty stored deflate blocks, without end: 1 MiB of them as sent is
    # where reading stops, though they decode to nothing.
    pulled = 0

    def endless() -> Iterator[bytes]:
        nonlocal pulled
        yield b"\x78\x01"  # a zlib header
        while pulled < 64 * MiB:  # (a bound for the test's sake)
            piece = b"\x00\x00\x00\xff\xff" * 13_107  # 64 KiB of empty blocks
            pulled += len(piece)
            yield piece

    def reply(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, headers={"Content-Encoding": "deflate"}, content=endless())

    transport = httpx.MockTransport(reply)
    with httpx.Client(base_url="http://test", transport=transport) as client:
        with pytest.raises(bphttpx.HTTPError) as info:
            bphttpx.infer(client, "echo", {"x": np.ones(3, dtype=np.float32)})
    assert info.value.status == 500
    assert pulled <= bphttpx.MAX_ERROR_BODY + 64 * 1024


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("encoding", ["gzip", "deflate", "x-gzip"])
def test_a_compressed_v2_error_body_gives_its_message(mode: str, encoding: str) -> None:
    payload = json.dumps({"error": "unknown model 'echo'"}).encode()
    body = zlib.compress(payload) if encoding == "deflate" else gzip.compress(payload)
    with pytest.raises(bphttpx.HTTPError) as info:
        infer_from(error_reply("404 Not Found", body, encoding), mode)
    assert info.value.status == 404
    assert info.value.message == "unknown model 'echo'"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("reply", "said"),
    [
        (
            error_reply("500 Oops", b"\x1f\x8b not gzip at all", "gzip"),
            "the error body could not be decoded: invalid gzip data",
        ),
        (
            error_reply("500 Oops", b'{"error": "out of memory"}')[:-10],
            '{"error": "out o (the error body could not be read: peer closed connection',
        ),
        # binproto does not decode br: its bytes are all the message can be.
        (error_reply("500 Oops", b"\x1f\x8b not gzip at all", "br"), "not gzip at all"),
    ],
    ids=["bad-gzip", "cut-short", "brotli-kept-raw"],
)
def test_an_error_body_that_cannot_be_read_still_gives_the_status(
    mode: str, reply: bytes, said: str
) -> None:
    with pytest.raises(bphttpx.HTTPError) as info:
        infer_from(reply, mode)
    assert info.value.status == 500
    assert said in info.value.message
    if "could not be" in said:
        assert isinstance(info.value.__cause__, binproto.RemoteProtocolError)


# -- 256 MiB back to the client, bounded memory ------------------------------------------


@pytest.mark.slow
def test_256mib_response_client_memory_bounded(server: Server) -> None:
    payload = 256 * MiB
    arr = np.full(payload // 4, 0.5, dtype=np.float32)
    arr[::4096] = np.arange(arr[::4096].size, dtype=np.float32)
    with httpx.Client(base_url=server.url, timeout=120) as client:
        tracemalloc.start()
        try:
            result = bphttpx.infer(client, "echo", {"x": arr})
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert np.array_equal(result.tensors["x"], arr)
    # The request is sent from the caller's array and the response lands in one
    # new array: one payload, plus pieces of a MiB.
    assert peak <= 1.1 * payload, peak / payload


@pytest.mark.parametrize(
    "name", ["Content-Length", "content-length", "Transfer-Encoding", "Content-Encoding",
             "inference-header-content-length"],
)  # fmt: skip
def test_a_framing_header_given_by_the_caller_is_refused(name: str) -> None:
    body = binproto.encode_request({"x": np.ones(3, dtype=np.float32)})
    with pytest.raises(binproto.LocalProtocolError, match="comes from the body"):
        bphttpx.request_headers(body, {name: "5"})
    with httpx.Client(base_url="http://test", transport=EchoTransport()) as client:
        with pytest.raises(binproto.LocalProtocolError, match="comes from the body"):
            bphttpx.infer(client, "echo", {"x": np.ones(3, dtype=np.float32)}, headers={name: "5"})


def test_a_callers_header_replaces_one_of_the_same_name_in_any_case() -> None:
    body = binproto.encode_request({"x": np.ones(3, dtype=np.float32)})
    out = bphttpx.request_headers(body, {"accept-encoding": "gzip", "X-Trace": "1"})
    assert [k for k in out if k.lower() == "accept-encoding"] == ["accept-encoding"]
    assert out["accept-encoding"] == "gzip" and out["X-Trace"] == "1"
    assert out["Content-Length"] == str(body.content_length)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("reset", [True, False], ids=["reset", "closed"])
def test_a_fault_met_while_the_caller_handles_another_error_is_still_the_peers(
    mode: str, reset: bool
) -> None:
    # The error the caller was handling (an EBADF of its own) is the context
    # of httpx's, not its cause: a reset, or a close with no answer (which
    # httpcore raises with no cause), is the peer's.
    try:
        raise OSError(errno.EBADF, "the caller's own")
    except OSError:
        with pytest.raises(binproto.RemoteProtocolError, match="response head"):
            infer_from(b"", mode, reset=reset)


def test_a_cyclic_chain_of_causes_is_walked_once() -> None:
    # Two of httpx's own errors, each the other's cause (re-raising a kept
    # exception makes such loops): the walk follows httpx's errors only.
    read_error = httpx.ReadError("reset")
    protocol = httpx.RemoteProtocolError("cut")
    read_error.__cause__ = protocol
    protocol.__cause__ = read_error
    # (in a thread: a walk that loops fails here instead of hanging the suite)
    said: list[bool] = []
    walk = threading.Thread(target=lambda: said.append(bphttpx._closed_here(read_error)))
    walk.daemon = True
    walk.start()
    walk.join(10)
    assert said == [False]
