"""The servers under failing and oversized peers: every refusal is answered
when it still can be, and a failed request's memory is released at once. Run
against both backends (asyncio, zero-copy and streams; trio) over loopback.
(Timeouts: tests/test_timeouts.py.)"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import binproto
from binproto.adapters import _server
from binproto.adapters._reader import ChunkLines
from binproto.adapters._server import Timeouts, V2Server

trio = pytest.importorskip("trio")

from binproto.adapters import asyncio as ba  # noqa: E402

from .fakes import ThreadedStream  # noqa: E402
from .servers import Running, connect, read_all, serving  # noqa: E402

SHORT = Timeouts(keep_alive=0.3, head=0.6, body=0.3, write=0.3)


@pytest.fixture
def short(http_backend: str) -> Iterator[Running]:
    yield from serving(http_backend, V2Server(timeouts=SHORT))


# -- listening -----------------------------------------------------------------------------


def test_asyncio_listens_with_a_backlog_of_2048(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    real = asyncio.base_events.BaseEventLoop.create_server

    async def spy(self: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("backlog", 100))
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(asyncio.base_events.BaseEventLoop, "create_server", spy)

    async def main() -> None:
        for zero_copy in (True, False):
            srv = await ba.start_server(port=0, zero_copy=zero_copy)
            await ba.close_server(srv)

    asyncio.run(main())
    assert seen == [2048, 2048]


# -- requests refused from their head ------------------------------------------------------


@pytest.mark.parametrize("length", [2**53, 10**20 - 1, 10**20, 10**25])
def test_an_absurd_content_length_is_answered(short: Running, length: int) -> None:
    with connect(short.port) as sock:
        sock.sendall(
            b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n"
            + f"Content-Length: {length}\r\n\r\n".encode()
        )
        received = read_all(sock)
    # Over 20 digits h11 refuses the head itself (400) before binproto sees it.
    status = b"413" if length < 10**20 else b"400"
    assert received.startswith(b"HTTP/1.1 " + status), received[:100]
    assert b"Connection: close" in received


def test_a_head_over_64_kib_is_refused(short: Running) -> None:
    def head_of(size: int) -> bytes:
        start = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Pad: "
        return start + b"a" * (size - len(start) - 4) + b"\r\n\r\n"

    with connect(short.port) as sock:
        sock.sendall(head_of(64 * 1024))
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
    with connect(short.port) as sock:
        sock.sendall(head_of(64 * 1024 + 1))  # read whole, so answered, not reset
        received = read_all(sock)
    assert received.startswith(b"HTTP/1.1 431 "), received[:100]


# -- claims ----------------------------------------------------------------------------------


def _claiming(size: int) -> bytes:
    """The head and JSON header of a request for a ``size``-byte tensor."""
    header = bytes(binproto.encode_request({"x": np.zeros(1, np.uint8)}).buffers[0])
    header = header.replace(b'"shape":[1]', f'"shape":[{size}]'.encode())
    header = header.replace(b'"binary_data_size":1', f'"binary_data_size":{size}'.encode())
    head = (
        "POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\n"
        f"Content-Length: {len(header) + size}\r\n\r\n"
    ).encode()
    return head + header


def test_a_tensor_claim_bigger_than_memory_is_refused_at_once(http_backend: str) -> None:
    # Within the limits (32 GiB a tensor) but more than this machine's memory:
    # 413 as soon as the allocation fails, and the claimed body is not read.
    patient = Timeouts(keep_alive=10, head=10, body=10, write=10)
    for running in serving(http_backend, V2Server(timeouts=patient)):
        with connect(running.port) as sock:
            # Zero-copy servers allocate the tensor before its first byte is
            # read; through streams, on the first bytes: send some, then wait
            # (as a client may) for an early answer.
            first = b"\0" * 1024 if http_backend == "asyncio-streams" else b""
            sock.sendall(_claiming(30 << 30) + first)
            start = time.monotonic()
            received = read_all(sock)
            elapsed = time.monotonic() - start
    assert received.startswith(b"HTTP/1.1 413 "), received[:200]
    assert elapsed < 5  # not after waiting for body bytes
    assert b"Connection: close" in received


def _bad_chunk() -> bytes:
    """A chunked request whose JSON header comes whole, then a malformed chunk size."""
    header = bytes(binproto.encode_request({"x": np.zeros(1, np.uint8)}).buffers[0])
    head = (
        "POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode()
    return head + b"%x\r\n" % len(header) + header + b"\r\nzz\r\n"


@pytest.mark.parametrize("how", ["plain", "expect-100", "head-too-big", "bad-chunk"])
def test_a_client_that_reads_only_once_it_has_sent_all_gets_the_refusal(
    http_backend: str, how: str
) -> None:
    # 300 MiB past a 1 MiB limit: answered 413 at once, without reading the
    # body (over the 256 MiB the server drops to keep a connection). Closed
    # at once, the connection would be reset under the client's sending
    # (ECONNRESET); kept half-open while it sends, it reads the answer. The
    # same for a client that says Expect: 100-continue and sends its body at
    # once, for a head refused whole (431) with a body after it, and for a
    # fault h11 finds in a chunked body (a malformed chunk size, 400).
    size = 300 << 20
    app = V2Server(limits=binproto.Limits(max_body_bytes=1 << 20))
    head = _claiming(size)
    if how == "expect-100":
        head = head.replace(b"Host: x\r\n", b"Host: x\r\nExpect: 100-continue\r\n")
    elif how == "head-too-big":
        head = head.replace(b"Host: x\r\n", b"Host: x\r\nX-Pad: " + b"p" * 70_000 + b"\r\n")
    elif how == "bad-chunk":
        head = _bad_chunk()
    for running in serving(http_backend, app):
        with connect(running.port) as sock:
            sock.sendall(head)
            sock.sendall(bytes(size))
            received = read_all(sock)
    status = {"head-too-big": b"431", "bad-chunk": b"400"}.get(how, b"413")
    assert received.startswith(b"HTTP/1.1 " + status), received[:200]
    assert b"Connection: close" in received


def test_a_refused_client_that_sends_nothing_more_is_not_waited_for(
    http_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_server, "LINGER_IDLE", 0.3)
    app = V2Server(limits=binproto.Limits(max_body_bytes=1 << 20))
    for running in serving(http_backend, app):
        with connect(running.port) as sock:
            sock.sendall(_claiming(300 << 20))
            assert read_all(sock).startswith(b"HTTP/1.1 413 ")  # (then our side's end)
            time.sleep(1.0)
            # The server closed after 0.3 s of nothing: what we send now is reset.
            with pytest.raises(OSError):
                for _ in range(20):
                    sock.sendall(b"\0" * 1024)
                    time.sleep(0.05)


def test_a_refused_body_is_drained_for_a_bounded_time(
    http_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_server, "LINGER", 0.5)
    app = V2Server(limits=binproto.Limits(max_body_bytes=1 << 20))
    for running in serving(http_backend, app):
        with connect(running.port) as sock:
            sock.sendall(_claiming(1 << 40))
            start = time.monotonic()
            # A client that sends on and on, and reads nothing.
            with pytest.raises(OSError):
                while time.monotonic() - start < 10:
                    sock.sendall(bytes(1 << 16))
            elapsed = time.monotonic() - start
    assert 0.4 < elapsed < 5, elapsed


# -- big JSON headers ------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["events", "tensors"])
@pytest.mark.parametrize("json_only", [False, True], ids=["binary", "json"])
@pytest.mark.parametrize("size", [64 << 10, 2 << 20], ids=["small", "big"])
def test_a_big_json_header_is_parsed_in_a_worker_thread(
    how: str, json_only: bool, size: int
) -> None:
    import h11

    from binproto.adapters._server import THREAD_HEADER, BodyReader, MessageBody

    values = np.arange(size // 8, dtype=np.int32)  # about 8 JSON bytes a value
    inputs: dict[str, Any] = {"big": values}
    if not json_only:  # and a binary tensor after the header
        inputs["x"] = np.arange(4, dtype=np.float32)
    body = binproto.encode_request(inputs, binary=set(inputs) - {"big"})
    wire = bytes(body)
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\n"
        + f"Content-Length: {len(wire)}\r\n\r\n".encode()
    )
    assert isinstance(conn.next_event(), h11.Request)
    stream = ThreadedStream(wire, most=1 << 16, sending=False)

    async def main() -> dict[str, Any]:
        claims = binproto.BodyClaims(len(wire), None, body.header_length)
        reader = BodyReader(stream, conn, len(wire), receive_in_place=False)
        message = MessageBody("request", claims, reader)
        assert not message.header_in_thread
        if how == "tensors":
            got = await message.tensors()
        else:
            assembler = binproto.TensorAssembler()
            async for event in message:
                assembler.feed(event)
            got = assembler.tensors
        assert message.header_in_thread == (size >= THREAD_HEADER)
        return got

    got = asyncio.run(main())
    np.testing.assert_array_equal(got["big"], values)
    header_length = body.header_length if body.header_length is not None else len(wire)
    assert (header_length >= THREAD_HEADER) == (size >= THREAD_HEADER)
    assert stream.threaded == (["next_event"] if size >= THREAD_HEADER else [])


# -- gzip bombs ------------------------------------------------------------------------------


def _gzip_request(claim: int, actual: int) -> bytes:
    import zlib

    # (Binary outputs: an echo of millions of elements as JSON is refused.)
    header = binproto.encode_request(
        {"x": np.zeros(1, dtype=np.uint8)}, binary_data_output=True
    ).buffers[0]
    header = bytes(header).replace(b'"shape":[1]', f'"shape":[{claim}]'.encode())
    header = header.replace(b'"binary_data_size":1', f'"binary_data_size":{claim}'.encode())
    comp = zlib.compressobj(1, zlib.DEFLATED, 31)
    pieces = [comp.compress(header)]
    zeros = bytes(1 << 20)
    for _ in range(actual >> 20):
        pieces.append(comp.compress(zeros))
    pieces.append(comp.flush())
    body = b"".join(pieces)
    head = (
        "POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


def test_a_gzip_bomb_is_refused_by_its_trailer_before_it_is_inflated(http_backend: str) -> None:
    # Claims 32 MiB of tensor, expands to 128 MiB: the trailer says so.
    wire = _gzip_request(32 << 20, 128 << 20)
    for running in serving(http_backend, V2Server(timeouts=SHORT)):
        with connect(running.port) as sock:
            sock.sendall(wire)
            answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert b"by its trailer" in answer and b"not the 33554" in answer


def test_an_honest_gzip_body_passes_the_trailer_check(http_backend: str) -> None:
    wire = _gzip_request(8 << 20, 8 << 20)
    for running in serving(http_backend, V2Server(timeouts=SHORT)):
        with connect(running.port) as sock:
            sock.sendall(wire)
            answer = b""
            while b"\r\n\r\n" not in answer:
                answer += sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]


def _gzip_body(claim: int, actual: int) -> tuple[bytes, int]:
    """A gzip request body claiming ``claim`` tensor bytes that expands to ``actual``."""
    wire = _gzip_request(claim, actual)
    head, _, body = wire.partition(b"\r\n\r\n")
    hl = int(head.lower().split(b"inference-header-content-length: ")[1].split(b"\r\n")[0])
    return body, hl


def test_the_asgi_adapter_refuses_a_gzip_bomb_by_its_trailer() -> None:
    # In many messages, as a server delivers a body: read ahead, then checked whole.
    from binproto.adapters import asgi

    body, hl = _gzip_body(48 << 20, 64 << 20)
    scope = {
        "type": "http",
        "headers": [
            (b"content-encoding", b"gzip"),
            (b"inference-header-content-length", str(hl).encode()),
            (b"content-length", str(len(body)).encode()),
        ],
    }
    messages = [
        {"type": "http.request", "body": body[i : i + 4096], "more_body": i + 4096 < len(body)}
        for i in range(0, len(body), 4096)
    ]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    started = time.monotonic()
    with pytest.raises(binproto.RemoteProtocolError, match="by its trailer"):
        asyncio.run(asgi.read_request(scope, receive))
    assert time.monotonic() - started < 5


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_a_big_json_echo_peaks_under_12x_its_request() -> None:
    # Short FP32 values, the hardest case: each is a Python float of 32 bytes
    # once parsed, and written back as a double it would take three times the
    # text. 20x the request before (the answer's whole list and text, the
    # text copied to send it); now the answer is written and sent in pieces.
    import json
    import subprocess
    import sys

    # ~2.5 MB of JSON: 500,000 values, within the default max_json_values.
    values = np.round(np.random.default_rng(0).random(500_000), 2)
    x = {"name": "x", "datatype": "FP32", "shape": [values.size], "data": values.tolist()}
    wire = json.dumps({"inputs": [x]}).encode()
    del values, x
    proc = subprocess.Popen(
        [sys.executable, "-m", "binproto", "serve", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )

    def memory(key: str) -> int:
        for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1]) * 1024
        raise AssertionError(key)

    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().rsplit(":", 1)[1])
        idle = memory("VmRSS")
        with connect(port) as sock:
            sock.settimeout(120)  # (the server parses 12 MB of JSON before answering)
            sock.sendall(
                b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nContent-Type:"
                b" application/json\r\nContent-Length: %d\r\n\r\n" % len(wire) + wire
            )
            answer = b""
            while b"\r\n\r\n" not in answer:
                answer += sock.recv(1 << 20)
            head, _, got = answer.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            while len(got) < length:
                got += sock.recv(1 << 20)
        assert head.startswith(b"HTTP/1.1 200 ")
        peak = memory("VmHWM") - idle
    finally:
        proc.terminate()
        proc.wait(10)
    assert json.loads(got)["outputs"][0]["data"][:3] == json.loads(wire)["inputs"][0]["data"][:3]
    # 12 bytes a request byte, beside a fixed 8 MiB (the worker thread that
    # parses it, buffers), which a smaller request makes count for more.
    assert peak <= 12 * len(wire) + (8 << 20), peak / len(wire)


def test_a_chunked_claim_past_the_limits_is_answered_at_once(http_backend: str) -> None:
    # Known from the JSON header: answered 413 without waiting for the rest
    # of the body (before, at the 30 s body timeout), then the lingering close.
    app = V2Server(limits=binproto.Limits(max_body_bytes=1 << 20))
    header = bytes(binproto.encode_request({"x": np.zeros(1, np.uint8)}).buffers[0])
    size = 2 << 20
    header = header.replace(b'"shape":[1]', f'"shape":[{size}]'.encode())
    header = header.replace(b'"binary_data_size":1', f'"binary_data_size":{size}'.encode())
    head = (
        "POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode()
    for running in serving(http_backend, app):
        with connect(running.port) as sock:
            sock.sendall(head + b"%x\r\n" % len(header) + header + b"\r\n")
            sock.settimeout(10)  # (the body timeout is 30 s)
            received = read_all(sock)  # the answer, then the server's end of sending
            sock.sendall(bytes(1 << 16))  # the linger drains what comes yet
    assert received.startswith(b"HTTP/1.1 413 "), received[:200]
    assert b"Connection: close" in received
    assert b"over the limit of 1048576 bytes" in received, received


# -- chunk lines and framing ---------------------------------------------------------------


def _chunked_with_extension(length: int) -> bytes:
    """A chunked echo request whose one chunk's line (size, extension, CRLF)
    is ``length`` bytes long."""
    body = binproto.encode_request({"x": np.arange(4, dtype=np.uint8)})
    data = bytes(body)
    size = b"%x" % len(data)
    line = size + b";e=" + b"v" * (length - len(size) - 5) + b"\r\n"
    assert len(line) == length
    head = (
        "POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        f"Inference-Header-Content-Length: {dict(body.headers)[binproto.HEADER_LENGTH_NAME]}\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode()
    return head + line + data + b"\r\n0\r\n\r\n"


@pytest.mark.parametrize("split", [False, True], ids=["one-send", "line-split"])
@pytest.mark.parametrize(
    ("length", "status"),
    [(_server.MAX_CHUNK_LINE, b"200"), (_server.MAX_CHUNK_LINE + 1, b"431"), (100_000, b"431")],
)
def test_a_long_chunk_line_is_refused_however_it_arrives(
    http_backend: str, length: int, status: bytes, split: bool
) -> None:
    # h11 alone refused a long line only when more than 64 KiB of it waited
    # unfinished between two reads: 100 KB sent at once was refused, the same
    # bytes sent in two pieces served.
    request = _chunked_with_extension(length)
    at = request.index(b";e=") + 10
    for running in serving(http_backend, V2Server()):
        with connect(running.port) as sock:
            if split:
                sock.sendall(request[:at])
                time.sleep(0.1)  # (two reads of the line)
                sock.sendall(request[at:])
            else:
                sock.sendall(request)
            received = read_all(sock)
    assert received.startswith(b"HTTP/1.1 " + status), received[:200]


def test_chunk_lines_are_measured_the_same_in_every_chunking() -> None:
    # Data full of line feeds, many chunks, a line at the bound and one past it.
    data = b"\n" * 3000
    ok = b"".join(b"%x\r\n" % n + data[:n] + b"\r\n" for n in (1, 17, 3000, 5)) + b"0\r\n\r\n"
    at_bound = b"5;" + b"e" * (_server.MAX_CHUNK_LINE - 4) + b"\r\n" + b"\n" * 5 + b"\r\n"
    past = b"5;" + b"e" * (_server.MAX_CHUNK_LINE - 3) + b"\r\n"
    for body, refused in ((ok, False), (at_bound + ok, False), (ok[:-5] + past, True)):
        for step in (1, 7, 4096, len(body)):
            lines = ChunkLines()
            try:
                for i in range(0, len(body), step):
                    lines.feed(memoryview(body)[i : i + step])
            except binproto.RemoteProtocolError as exc:
                assert refused and exc.status_hint == 431, (step, exc)
            else:
                assert not refused, step


@pytest.mark.parametrize("how", ["infer", "get"])
def test_http_1_0_with_transfer_encoding_is_refused_and_closed(http_backend: str, how: str) -> None:
    # RFC 9112, section 6.1: the framing is faulty; answer 400, then close.
    # (Before, a well-formed chunked body was taken and answered 200.)
    if how == "infer":
        request = _chunked_with_extension(100).replace(b" HTTP/1.1\r\n", b" HTTP/1.0\r\n", 1)
    else:
        request = b"GET /v2/health/live HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    request += b"GET /v2/health/live HTTP/1.0\r\n\r\n"  # (never answered: closed)
    for running in serving(http_backend, V2Server()):
        with connect(running.port) as sock:
            sock.sendall(request)
            received = read_all(sock)
    assert received.startswith(b"HTTP/1.1 400 "), received[:200]
    assert received.count(b"HTTP/1.1 ") == 1 and b"Connection: close" in received
    assert b"HTTP/1.0 request may not carry Transfer-Encoding" in received
