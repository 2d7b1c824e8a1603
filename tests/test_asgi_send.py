"""The ASGI adapter's sending helpers: encoded responses in bounded body
messages, compressed piece by piece, streamed from a BodyWriter, and
error responses with the status hint."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

import binproto
from binproto.adapters import asgi
from tests.fakes import AsgiRecorder

MiB = 1 << 20


# -- sending --------------------------------------------------------------------------


async def _no_receive() -> dict[str, Any]:  # pragma: no cover - never called
    raise AssertionError("a response does not read the request")


def test_encoded_response_sends_big_buffers_unjoined_and_gathers_small_ones() -> None:
    a = np.arange(20000, dtype=np.float32)  # 80 KB: its own message, never copied
    b = np.arange(10, dtype=np.int64)
    body = binproto.encode_response({"a": a, "b": b}, model_name="m")
    rec = AsgiRecorder()
    response = asgi.EncodedResponse(body, headers={"x-extra": "1"})
    asyncio.run(response({"type": "http"}, _no_receive, rec))
    assert rec.messages[0]["type"] == "http.response.start"
    assert rec.messages[0]["status"] == 200
    headers = rec.headers
    assert headers["content-length"] == str(body.content_length)
    assert headers["inference-header-content-length"] == str(body.header_length)
    assert headers["content-type"] == "application/octet-stream"
    assert headers["x-extra"] == "1"
    bodies = rec.bodies
    # The JSON header, the big tensor, then the small one ending the body:
    # each message costs the server a write, so no empty last message.
    assert [len(b) for b in bodies] == [body.header_length, a.nbytes, b.nbytes]
    assert all(m["more_body"] for m in rec.messages[1:-1])
    assert rec.messages[-1]["more_body"] is False
    # The big tensor's message is the array's own memory.
    assert np.shares_memory(np.frombuffer(bodies[1], dtype=np.uint8), a)
    assert rec.body() == bytes(body)
    decoded = binproto.decode_response(rec.body(), header_length=body.header_length)
    assert decoded.tensors["a"].tolist() == a.tolist()


def test_a_small_response_is_one_body_message() -> None:
    body = binproto.encode_response({"x": np.arange(1024, dtype=np.float32)}, model_name="m")
    rec = AsgiRecorder()
    asyncio.run(asgi.EncodedResponse(body)({"type": "http"}, _no_receive, rec))
    assert len(rec.bodies) == 1 and rec.messages[-1]["more_body"] is False
    assert rec.body() == bytes(body)


def test_a_small_response_is_cut_by_a_smaller_chunk_size() -> None:
    body = binproto.encode_response({"x": np.arange(1024, dtype=np.float32)}, model_name="m")
    rec = AsgiRecorder()
    asyncio.run(asgi.EncodedResponse(body, chunk_size=1000)({"type": "http"}, _no_receive, rec))
    assert [len(b) for b in rec.bodies] == [1000] * 4 + [body.content_length - 4000]
    assert rec.body() == bytes(body)


def test_a_small_response_takes_the_bytes_of_any_buffer_and_refuses_objects() -> None:
    # A hand-made body: its buffers are read as bytes, as a big body's are.
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    buffers: list[Any] = [b"{}", x, x.data]
    made = binproto.EncodedBody(b"{}", buffers, 2, 2 + 2 * x.nbytes)
    rec = AsgiRecorder()
    asyncio.run(asgi.EncodedResponse(made)({"type": "http"}, _no_receive, rec))
    assert rec.bodies == [b"{}" + x.tobytes() * 2]
    # A body whose length says small while its buffers are not: sent as any other.
    big = np.zeros(300_000, dtype=np.uint8)
    lying = binproto.EncodedBody(b"{}", [b"{}", big.data], 2, 10)
    rec = AsgiRecorder()
    asyncio.run(asgi.EncodedResponse(lying, chunk_size=100_000)({"type": "http"}, _no_receive, rec))
    assert [len(b) for b in rec.bodies] == [2, 100_000, 100_000, 100_000]
    pointers = np.array([object()], dtype=object)
    objects: list[Any] = [pointers, pointers.data]  # an array, then a memoryview of it
    for buffer in objects:
        bad = binproto.EncodedBody(b"{}", [b"{}", buffer], 2, 2 + pointers.nbytes)
        with pytest.raises(binproto.LocalProtocolError, match="Python objects"):
            asyncio.run(asgi.EncodedResponse(bad)({"type": "http"}, _no_receive, AsgiRecorder()))


def test_large_buffer_is_sent_as_bounded_views() -> None:
    a = np.arange(3 * MiB // 4 + 5, dtype=np.float32)
    body = binproto.encode_response({"a": a}, model_name="m")
    rec = AsgiRecorder()
    asyncio.run(asgi.EncodedResponse(body, chunk_size=MiB)({"type": "http"}, _no_receive, rec))
    sizes = [len(b) for b in rec.bodies]
    assert sizes[1:] == [MiB, MiB, MiB, 20]  # the last ends the body
    for piece in rec.bodies[1:]:
        assert np.shares_memory(np.frombuffer(piece, dtype=np.uint8), a)
    assert rec.body() == bytes(body)


def test_a_small_chunk_size_bounds_every_message_and_joins_no_big_buffer() -> None:
    # Cut below the 64 KiB a run of small buffers is joined to: the big
    # buffer's views must not be joined again into copies of its memory.
    a = np.arange(50_000, dtype=np.float32)
    body = binproto.encode_response({"a": a}, model_name="m")
    rec = AsgiRecorder()
    asyncio.run(asgi.EncodedResponse(body, chunk_size=1000)({"type": "http"}, _no_receive, rec))
    assert rec.body() == bytes(body)
    assert max(len(b) for b in rec.bodies) == 1000
    tensor = [b for b in rec.bodies if np.shares_memory(np.frombuffer(b, dtype=np.uint8), a)]
    assert sum(len(b) for b in tensor) == a.nbytes


@pytest.mark.parametrize("json_only", [False, True])
def test_encoded_response_starts_with_the_bodys_headers_lower_cased_then_the_callers(
    json_only: bool,
) -> None:
    body = binproto.encode_response(
        {"a": np.arange(3, dtype=np.float32)}, model_name="m", binary=not json_only
    )
    rec = AsgiRecorder()
    response = asgi.EncodedResponse(body, 201, headers=[("X-Extra", "1"), (b"x-raw", b"2")])
    asyncio.run(response({"type": "http"}, _no_receive, rec))
    start = rec.messages[0]
    assert start["status"] == 201
    framing = [(k.lower().encode(), v.encode()) for k, v in body.headers]
    assert start["headers"] == [*framing, (b"x-extra", b"1"), (b"x-raw", b"2")]
    assert all(name == name.lower() for name, _ in start["headers"])  # as ASGI asks
    assert rec.body() == bytes(body)


@pytest.mark.parametrize(
    "headers",
    [
        None,
        5,
        "ab",
        [("x",)],
        [("x-euro", "€")],
        [("x-split", "1\r\nSet-Cookie: a=b")],
        [(b"x-nul", b"a\x00b")],
        [("bad name", "1")],
        [("", "1")],
        [(b"x:y", b"1")],
    ],
)
def test_response_headers_a_server_could_not_send_as_they_are_are_the_callers_error(
    headers: Any,
) -> None:
    body = binproto.encode_response({"a": np.arange(3, dtype=np.float32)}, model_name="m")
    with pytest.raises(binproto.LocalProtocolError, match="header"):
        asgi.EncodedResponse(body, headers=headers)
    with pytest.raises(binproto.LocalProtocolError, match="header"):
        asgi.BufferResponse(body.buffers, headers=headers)


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "GZIP"])
def test_encoded_response_compresses_piece_by_piece(encoding: str) -> None:
    rng = np.random.default_rng(2)
    a = rng.integers(0, 4, size=3 * MiB, dtype=np.uint8)
    body = binproto.encode_response({"a": a}, model_name="m")
    rec = AsgiRecorder()
    response = asgi.EncodedResponse(body, headers={"x-extra": "1"}, encoding=encoding)
    asyncio.run(response({"type": "http"}, _no_receive, rec))
    coding = encoding.lower()
    headers = rec.headers
    assert "content-length" not in headers
    assert headers["content-encoding"] == coding
    assert headers["vary"] == "Accept-Encoding"
    assert headers["inference-header-content-length"] == str(body.header_length)
    assert headers["x-extra"] == "1"
    # Sent as it is produced: several pieces, each smaller than the body.
    sizes = [len(b) for b in rec.bodies[:-1]]
    assert len(sizes) > 1 and max(sizes) < a.nbytes // 2
    assert rec.messages[-1]["more_body"] is False
    decoded = binproto.decode_response(
        rec.body(), header_length=body.header_length, content_encoding=coding
    )
    np.testing.assert_array_equal(decoded.tensors["a"], a)


@pytest.mark.parametrize("encoding", [None, "identity"])
def test_encoded_response_without_encoding_is_unchanged(encoding: str | None) -> None:
    body = binproto.encode_response({"a": np.arange(5, dtype=np.int16)}, model_name="m")
    rec = AsgiRecorder()
    asyncio.run(asgi.EncodedResponse(body, encoding=encoding)({"type": "http"}, _no_receive, rec))
    assert rec.headers["content-length"] == str(body.content_length)
    assert "content-encoding" not in rec.headers
    assert rec.body() == bytes(body)


def test_encoded_response_rejects_unknown_encodings() -> None:
    body = binproto.encode_response({"a": np.arange(5, dtype=np.int16)}, model_name="m")
    with pytest.raises(binproto.LocalProtocolError, match="encoding"):
        asgi.EncodedResponse(body, encoding="br")


def stream_header(n: int) -> dict[str, Any]:
    return {
        "model_name": "m",
        "outputs": [
            {
                "name": "a",
                "datatype": "FP32",
                "shape": [n],
                "parameters": {"binary_data_size": 4 * n},
            },
            {"name": "j", "datatype": "INT32", "shape": [2], "data": [1, 2]},
            {"name": "b", "datatype": "UINT8", "shape": [3], "parameters": {"binary_data_size": 3}},
        ],
    }


def test_writer_response_streams_what_is_produced() -> None:
    n = 1000
    parts = [np.arange(i, i + 250, dtype=np.float32) for i in range(0, n, 250)]
    tail = np.array([7, 8, 9], dtype=np.uint8)

    async def produce() -> AsyncIterator[tuple[int | str, Any]]:
        for part in parts:
            yield 0, part
        yield "b", tail

    writer = binproto.BodyWriter(stream_header(n))
    rec = AsgiRecorder()
    asyncio.run(asgi.WriterResponse(writer, produce())({"type": "http"}, _no_receive, rec))
    assert rec.headers["content-length"] == str(writer.content_length)
    assert rec.headers["inference-header-content-length"] == str(writer.header_length)
    for part, piece in zip(parts, rec.bodies[1:5], strict=True):
        assert np.shares_memory(np.frombuffer(piece, dtype=np.uint8), part)
    decoded = binproto.decode_response(rec.body(), header_length=writer.header_length)
    assert decoded.tensors["a"].tolist() == np.arange(n, dtype=np.float32).tolist()
    assert decoded.tensors["j"].tolist() == [1, 2]
    assert decoded.tensors["b"].tolist() == [7, 8, 9]
    assert rec.messages[-1]["more_body"] is False


def test_writer_response_with_a_sync_iterable() -> None:
    writer = binproto.BodyWriter(stream_header(2))
    pieces = [(0, np.array([1.0, 2.0], dtype=np.float32)), (2, b"xyz")]
    rec = AsgiRecorder()
    asyncio.run(asgi.WriterResponse(writer, pieces)({"type": "http"}, _no_receive, rec))
    decoded = binproto.decode_response(rec.body(), header_length=writer.header_length)
    assert bytes(decoded.tensors["b"]) == b"xyz"


@pytest.mark.parametrize(
    ("pieces", "fault"),
    [
        ([(0, np.zeros(2, dtype=np.float32))], "cannot end: output 'b' has 0"),  # "b" never sent
        ([(0, np.zeros(3, dtype=np.float32))], "exceed the 8 left"),  # more than "a" declared
    ],
)
def test_writer_response_producer_faults(pieces: list[tuple[int, Any]], fault: str) -> None:
    writer = binproto.BodyWriter(stream_header(2))
    rec = AsgiRecorder()
    with pytest.raises(binproto.LocalProtocolError, match=fault):
        asyncio.run(asgi.WriterResponse(writer, pieces)({"type": "http"}, _no_receive, rec))
    # The body was begun, then cut short, never completed: the client cannot mistake it.
    assert rec.messages[0]["type"] == "http.response.start" and len(rec.messages) >= 2
    assert all(m.get("more_body", True) for m in rec.messages[1:])
    assert len(rec.body()) < writer.content_length


@pytest.mark.parametrize(
    ("started", "fault"),
    [(False, "needs a BodyWriter of a response header"), (True, "start\\(\\) was already called")],
)
def test_a_writer_that_cannot_start_is_refused_before_the_response(
    started: bool, fault: str
) -> None:
    # A request's header, or a writer already started: refused before
    # http.response.start, so the server can still answer 500.
    if started:
        writer = binproto.BodyWriter(stream_header(2))
        writer.start()
    else:
        tensor: dict[str, Any] = {"name": "x", "datatype": "UINT8", "shape": [1]}
        tensor["parameters"] = {"binary_data_size": 1}
        writer = binproto.BodyWriter({"inputs": [tensor]})
    rec = AsgiRecorder()
    with pytest.raises(binproto.LocalProtocolError, match=fault):
        asyncio.run(asgi.WriterResponse(writer, [])({"type": "http"}, _no_receive, rec))
    assert rec.messages == []


def test_a_chunk_size_of_any_integer_type_is_taken() -> None:
    body = binproto.encode_response({"y": np.zeros(4, dtype=np.float32)}, model_name="m")
    size: Any = np.int64(8)  # (what a computation in numpy hands over)
    assert asgi.EncodedResponse(body, chunk_size=size).chunk_size == 8


@pytest.mark.parametrize("size", [0, -1, 1.5, "8", True])
def test_a_chunk_size_that_is_no_positive_int_is_refused(size: Any) -> None:
    body = binproto.encode_response({"y": np.zeros(4, dtype=np.float32)}, model_name="m")
    writer = binproto.BodyWriter(stream_header(2))
    for make in (
        lambda: asgi.EncodedResponse(body, chunk_size=size),
        lambda: asgi.BufferResponse(body.buffers, headers=body.headers, chunk_size=size),
        lambda: asgi.WriterResponse(writer, [], chunk_size=size),
    ):
        with pytest.raises(binproto.LocalProtocolError, match="chunk_size"):
            make()
    rec = AsgiRecorder()
    send = asgi.send_buffers(rec, body.buffers, headers=body.headers, chunk_size=size)
    with pytest.raises(binproto.LocalProtocolError, match="chunk_size"):
        asyncio.run(send)
    assert rec.messages == []


@pytest.mark.parametrize("level", [10, -2, "x"])
def test_a_bad_compression_level_is_refused_before_the_response(level: Any) -> None:
    body = binproto.encode_response({"y": np.zeros(4, dtype=np.float32)}, model_name="m")
    with pytest.raises(binproto.LocalProtocolError, match="compression level"):
        asgi.EncodedResponse(body, encoding="gzip", compression_level=level)


def test_error_response_uses_the_status_hint() -> None:
    rec = AsgiRecorder()
    err = binproto.RemoteProtocolError("too big", status_hint=413, offset=3)
    asyncio.run(asgi.error_response(err)({"type": "http"}, _no_receive, rec))
    assert rec.messages[0]["status"] == 413
    assert json.loads(rec.body()) == {"error": "too big (at byte 3)"}
    assert rec.headers["content-type"] == "application/json"
    assert rec.headers["content-length"] == str(len(rec.body()))
    rec = AsgiRecorder()
    asyncio.run(asgi.error_response("nope", 404)({"type": "http"}, _no_receive, rec))
    assert rec.messages[0]["status"] == 404
    assert json.loads(rec.body()) == {"error": "nope"}


def test_works_without_starlette() -> None:
    """The adapter needs only the raw ASGI callables: run it with Starlette hidden."""
    script = """
import asyncio, sys
sys.modules["starlette"] = None  # any import of it now fails
import numpy as np
import binproto
from binproto.adapters import asgi
body = binproto.encode_request({"x": np.arange(5, dtype=np.int16)})
scope = {"type": "http", "headers": [(k.lower().encode(), v.encode()) for k, v in body.headers]}
data = bytes(body)
messages = [{"type": "http.request", "body": data[:9], "more_body": True},
            {"type": "http.request", "body": data[9:], "more_body": False}]
async def receive():
    return messages.pop(0)
sent = []
async def send(message):
    sent.append(message)
async def app():
    msg = await asgi.read_request(scope, receive)
    reply = binproto.encode_response(msg.tensors, model_name="m")
    await asgi.EncodedResponse(reply)(scope, receive, send)
asyncio.run(app())
assert asgi.BufferResponse.__mro__[1] is object
out = b"".join(bytes(m["body"]) for m in sent[1:])
hl = int(dict(sent[0]["headers"])[b"inference-header-content-length"])
print(binproto.decode_response(out, header_length=hl).tensors["x"].tolist())
"""
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[0, 1, 2, 3, 4]"
    assert asgi.BufferResponse.__mro__[1].__module__.startswith("starlette")


def test_fastapi_can_return_the_responses() -> None:
    from starlette.responses import Response

    body = binproto.encode_response({"a": np.zeros(2, dtype=np.float32)}, model_name="m")
    assert isinstance(asgi.EncodedResponse(body), Response)
    assert isinstance(asgi.error_response("x"), Response)
