"""Small requests that would become huge: each is refused before the objects
it would make exist, and heavy work runs off the event loop.

The amplification family: a compressed body of BYTES elements, a compressed
header of millions of tiny JSON values, a binary input echoed as JSON. Each
is answered 413 by every backend (V2App under uvicorn too), at once and in
bounded memory; the work
that stays (a big header, a big JSON answer) runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import binproto
from binproto.adapters._server import V2Server

from .fakes import ThreadedStream
from .helpers import claiming_header, gzip_then_zeros
from .servers import ALL_BACKENDS, Running, serving

pytest.importorskip("trio")


@pytest.fixture
def server(backend: str) -> Iterator[Running]:
    yield from serving(backend, V2Server())


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class PeakMemory:
    """The highest resident size of this process while the block runs."""

    def __init__(self) -> None:
        self.peak = self.start = 0
        self._done = threading.Event()

    def __enter__(self) -> PeakMemory:
        self.peak = self.start = _rss()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._done.wait(0.01):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    @property
    def rise(self) -> int:
        return self.peak - self.start


def _exchange(port: int, request: bytes) -> tuple[int, bytes, float]:
    """Send ``request`` whole; the status, body and seconds to the answer."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        answer = b""
        while b"\r\n\r\n" not in answer:
            data = sock.recv(1 << 16)
            assert data, answer
            answer += data
        head, _, body = answer.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        while len(body) < length:
            data = sock.recv(1 << 20)
            assert data
            body += data
    return int(head.split()[1]), body, time.monotonic() - start


def _post(body: bytes, headers: dict[str, Any]) -> bytes:
    head = "POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in {**headers, "Content-Length": len(body)}.items())
    return head.encode() + b"\r\n" + body


def test_a_gzip_body_of_forty_million_bytes_elements_is_413_at_once(server: Running) -> None:
    elements = 40_000_000
    header = claiming_header("BYTES", elements, 4 * elements, "s")
    body = gzip_then_zeros(header, 4 * elements)
    assert len(body) < 200_000
    request = _post(
        body, {"Content-Encoding": "gzip", "Inference-Header-Content-Length": len(header)}
    )
    with PeakMemory() as memory:
        status, answer, seconds = _exchange(server.port, request)
    assert status == 413, answer
    assert b"max_bytes_elements" in answer
    assert seconds < 5
    assert memory.rise < 256 << 20


def test_a_gzip_header_of_millions_of_tiny_values_is_413_at_once(server: Running) -> None:
    tensor = {"name": "x", "datatype": "INT32", "shape": [1], "data": [0]}
    text = json.dumps({"inputs": [tensor]})
    # 7 M empty objects in the tensor's parameters: 14 MB of JSON, 40 KB gzip.
    junk = '"parameters":{"junk":[' + ",".join(["{}"] * 7_000_000) + "]},"
    raw = (text[: text.index('"name"')] + junk + text[text.index('"name"') :]).encode()
    body = gzip.compress(raw, 9)
    assert len(body) < 100_000
    with PeakMemory() as memory:
        status, answer, seconds = _exchange(
            server.port,
            _post(body, {"Content-Encoding": "gzip", "Content-Type": "application/json"}),
        )
    assert status == 413, answer
    assert b"max_json_values" in answer
    assert seconds < 5
    assert memory.rise < 256 << 20


def test_a_binary_input_echoed_past_the_json_output_limit_is_413(server: Running) -> None:
    # 4 M BOOL elements: 4 MB sent, 24 MB of JSON text to write back.
    encoded = binproto.encode_request({"x": np.zeros(4 << 20, np.bool_)})
    status, answer, _ = _exchange(server.port, _post(bytes(encoded), dict(encoded.headers)))
    assert status == 413, answer
    assert b"max_json_output_elements" in answer and b"binary_data_output" in answer
    # Asked for binary outputs, the same request is answered.
    encoded = binproto.encode_request({"x": np.zeros(4 << 20, np.bool_)}, binary_data_output=True)
    status, answer, _ = _exchange(server.port, _post(bytes(encoded), dict(encoded.headers)))
    assert status == 200


def test_error_answers_of_the_new_limits_are_the_same_on_every_backend() -> None:
    elements = 3 << 20
    header = claiming_header("BYTES", elements, 4 * elements, "s")
    request = _post(
        gzip_then_zeros(header, 4 * elements),
        {"Content-Encoding": "gzip", "Inference-Header-Content-Length": len(header)},
    )
    answers = set()
    for backend in ALL_BACKENDS:
        running = Running(backend, V2Server())
        try:
            answers.add(_exchange(running.port, request)[:2])
        finally:
            running.close()
    assert len(answers) == 1
    assert next(iter(answers))[0] == 413


# -- work off the event loop ----------------------------------------------------------------


def _serve_one(request: bytes) -> ThreadedStream:
    stream = ThreadedStream(
        request + b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    asyncio.run(V2Server(compress_responses=False).serve_connection(stream))
    assert stream.sent.startswith(b"HTTP/1.1 200 "), bytes(stream.sent[:300])
    assert stream.sent.count(b"HTTP/1.1 200 ") == 2  # the health check after it too
    return stream


def _json_request(values: int) -> bytes:
    x = {"name": "x", "datatype": "INT32", "shape": [values], "data": list(range(values))}
    return json.dumps({"inputs": [x]}).encode()


def _chunked(body: bytes, size: int = 1 << 16) -> bytes:
    out = bytearray()
    for i in range(0, len(body), size):
        piece = body[i : i + size]
        out += b"%x\r\n" % len(piece) + piece + b"\r\n"
    return bytes(out + b"0\r\n\r\n")


def test_a_gzip_json_header_is_inflated_and_parsed_in_a_worker_thread() -> None:
    raw = _json_request(200_000)
    body = gzip.compress(raw)
    stream = _serve_one(_post(body, {"Content-Encoding": "gzip"}))
    assert "next_event" in stream.threaded


def test_a_small_gzip_header_with_its_length_stays_on_the_loop() -> None:
    encoded = binproto.encode_request({"x": np.arange(4, dtype=np.float32)})
    body = b"".join(binproto.compress_buffers(encoded.buffers, "gzip"))
    headers = {"Content-Encoding": "gzip", "Inference-Header-Content-Length": encoded.header_length}
    stream = _serve_one(_post(body, headers))
    assert stream.threaded == []


def test_a_chunked_json_header_is_parsed_in_a_worker_thread() -> None:
    raw = _json_request(300_000)  # ~2.2 MB: past THREAD_HEADER
    head = (
        b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        b"Content-Type: application/json\r\n\r\n"
    )
    stream = _serve_one(head + _chunked(raw))
    assert "next_event" in stream.threaded


def test_a_big_json_answer_is_encoded_in_a_worker_thread() -> None:
    encoded = binproto.encode_request({"x": np.arange(1 << 17, dtype=np.float32)})
    stream = _serve_one(_post(bytes(encoded), dict(encoded.headers)))
    assert "_encode_response" in stream.threaded
    # A binary answer, or a small JSON one, is not worth the thread.
    for inputs, binary in (
        ({"x": np.arange(1 << 17, dtype=np.float32)}, True),
        ({"x": [1.0]}, None),
    ):
        encoded = binproto.encode_request(inputs, binary_data_output=binary)
        stream = _serve_one(_post(bytes(encoded), dict(encoded.headers)))
        assert "_encode_response" not in stream.threaded


# -- the ASGI path ---------------------------------------------------------------------------


def _scope(headers: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": "/v2/models/echo/infer",
        "headers": [(k.lower().encode(), str(v).encode()) for k, v in headers.items()],
    }


async def _read(body: bytes, headers: dict[str, Any]) -> binproto.DecodedMessage:
    from binproto.adapters.asgi import read_request

    pieces = [body[i : i + (1 << 16)] for i in range(0, len(body), 1 << 16)]

    async def receive() -> dict[str, Any]:
        piece = pieces.pop(0)
        return {"type": "http.request", "body": piece, "more_body": bool(pieces)}

    return await read_request(_scope({**headers, "Content-Length": len(body)}), receive)


def test_asgi_read_request_refuses_the_bytes_bomb_at_its_header() -> None:
    elements = 40_000_000
    header = claiming_header("BYTES", elements, 4 * elements, "s")
    body = gzip_then_zeros(header, 4 * elements)
    headers = {"Content-Encoding": "gzip", "Inference-Header-Content-Length": len(header)}
    with pytest.raises(binproto.RemoteProtocolError, match="max_bytes_elements") as info:
        asyncio.run(_read(body, headers))
    assert info.value.status_hint == 413


def test_asgi_read_request_parses_a_gzip_json_header_in_a_worker_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    threaded: list[str] = []
    original = asyncio.to_thread

    async def recording(fn: Callable[..., Any], *args: Any) -> Any:
        threaded.append(fn.__name__)
        return await original(fn, *args)

    monkeypatch.setattr(asyncio, "to_thread", recording)
    raw = _json_request(200_000)
    decoded = asyncio.run(_read(gzip.compress(raw), {"Content-Encoding": "gzip"}))
    np.testing.assert_array_equal(decoded.tensors["x"], np.arange(200_000, dtype=np.int32))
    assert threaded and set(threaded) == {"next_event"}  # (MessageBody's parser steps)
    # A small binary request stays on the loop.
    threaded.clear()
    encoded = binproto.encode_request({"x": np.arange(4, dtype=np.float32)})
    asyncio.run(_read(bytes(encoded), dict(encoded.headers)))
    assert threaded == []
