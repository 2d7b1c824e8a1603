"""The V2 application over raw sockets on every backend: peers that send
one byte at a time, stop or stall mid-body, pipeline, send chunked or
malformed bodies, or leave mid-response.

The ``server`` fixture serves tests/models.py's models on each backend of
the ``backend`` matrix (conftest.py). Where uvicorn's own HTTP/1.1 loop
answers (framing, not the application), its param is skipped with the
reason.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import h11
import numpy as np
import pytest

import binproto
from binproto.adapters._server import V2Server
from binproto.adapters.asyncio import Client
from binproto.adapters.h11 import HTTPError, request_for, send_message

from .helpers import make_body
from .models import same, server_models
from .servers import (
    Running,
    assert_served,
    connect,
    infer_bytes,
    read_response,
    serving,
    until_closed,
)

Array = np.ndarray[Any, Any]


@pytest.fixture(scope="module")
def server(backend: str) -> Iterator[Running]:
    yield from serving(backend, V2Server(server_models()))


@pytest.fixture(scope="module")
def port(server: Running) -> int:
    return server.port


def binproto_http_only(server: Running, why: str) -> None:
    """Skip on uvicorn, whose own HTTP/1.1 loop answers ``why``."""
    if server.backend == "uvicorn":
        pytest.skip(f"uvicorn's HTTP/1.1 loop, not binproto's: {why}")


async def _call(port: int, model: str, inputs: dict[str, Any]) -> dict[str, Array]:
    async with Client("127.0.0.1", port) as c:
        return await c.infer(model, inputs, binary_data_output=True)


def test_handler_misuse_is_a_500_and_the_server_goes_on(server: Running) -> None:
    with pytest.raises(HTTPError) as info:
        asyncio.run(_call(server.port, "misuse", {"x": np.zeros(10)}))
    assert info.value.status == 500
    assert "tensors() needs every tensor event" in info.value.message
    assert_served(server.port)


def test_one_byte_chunks(server: Running) -> None:
    x = np.arange(20, dtype=np.int16)
    wire = infer_bytes({"x": x, "s": np.array([b"\xff"], dtype=object)})
    with connect(server.port) as sock:
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


def test_peer_stops_mid_body_and_half_closes(server: Running) -> None:
    binproto_http_only(server, "a half-close mid-body ends the connection unanswered")
    wire = infer_bytes({"x": np.zeros(10000, dtype=np.float32)})
    with connect(server.port) as sock:
        sock.sendall(wire[: len(wire) - 5000])
        sock.shutdown(socket.SHUT_WR)
        status, body, closed = read_response(sock)
    assert status == 400
    assert "5000" in json.loads(body)["error"]  # says how much was missing
    assert closed
    assert_served(server.port)


def test_peer_stalls_mid_body_while_others_are_served(server: Running) -> None:
    wire = infer_bytes({"x": np.zeros(10000, dtype=np.float32)})
    with connect(server.port) as stalled:
        stalled.sendall(wire[: len(wire) // 2])
        assert_served(server.port)
        stalled.close()
    assert_served(server.port)


def test_get_to_infer_keeps_the_connection(server: Running) -> None:
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

    with connect(server.port) as sock:
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


def test_chunked_request_body(server: Running) -> None:
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
    with connect(server.port) as sock:
        sock.sendall(wire)
        status, payload, _ = read_response(sock, check_closed=False)
    assert status == 200
    assert payload.endswith(x.tobytes())


def responses_of(data: bytes, count: int) -> list[binproto.DecodedMessage]:
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
def test_pipelined_requests(server: Running, first_size: int) -> None:
    first = np.arange(first_size, dtype=np.int32)
    second = np.array([b"\xfe", b"x"], dtype=object)
    wire = infer_bytes({"a": first}) + infer_bytes({"b": second})
    with connect(server.port) as sock:
        sock.sendall(wire)
        sock.shutdown(socket.SHUT_WR)
        received = bytearray()
        while data := sock.recv(1 << 20):
            received += data
    a, b = responses_of(bytes(received), 2)
    np.testing.assert_array_equal(a.tensors["a"], first)
    assert list(b.tensors["b"]) == list(second)


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
def test_bad_requests(server: Running, raw: bytes, status: int, pattern: str | None) -> None:
    with connect(server.port) as sock:
        sock.sendall(raw)
        got, body, _ = read_response(sock, check_closed=False)
    assert got == status
    if pattern is not None:
        assert re.search(pattern, json.loads(body)["error"])
    assert_served(server.port)


def test_expect_100_continue(server: Running) -> None:
    x = np.arange(100, dtype=np.float64)
    body = binproto.encode_request({"x": x}, binary_data_output=True)
    conn = h11.Connection(h11.CLIENT)
    head = conn.send(
        request_for("/v2/models/echo/infer", body, headers=[("Expect", "100-continue")])
    )
    assert head is not None
    with connect(server.port) as sock:
        sock.sendall(head)
        interim = sock.recv(65536)  # sent before any body byte
        assert interim.startswith(b"HTTP/1.1 100 ")
        sock.sendall(bytes(body))
        status, payload, _ = read_response(sock, check_closed=False)
    assert status == 200
    assert payload.endswith(x.tobytes())


def test_content_length_beside_chunked_is_refused_and_closed(server: Running) -> None:
    binproto_http_only(server, "its parser refuses the head with a text body")
    # Read by Content-Length, the chunk's bytes would be a second request.
    smuggled = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    chunk = b"0\r\n\r\n" + smuggled
    raw = (
        b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + chunk
    )
    with connect(server.port) as sock:
        sock.sendall(raw)
        status, body, closed = read_response(sock)
    assert status == 400 and closed
    assert "both Content-Length and Transfer-Encoding" in json.loads(body)["error"]
    assert_served(server.port)


@pytest.mark.parametrize("expect", [True, False], ids=["expect-100", "plain"])
def test_a_request_refused_from_its_head_is_answered_at_once(server: Running, expect: bool) -> None:
    binproto_http_only(server, "it reads the unread body itself and keeps the connection")
    # 10 GiB announced to a model that does not exist: the answer comes
    # without reading (or inviting) the body, and the connection closes.
    head = (
        "POST /v2/models/nothing/infer HTTP/1.1\r\nHost: x\r\n"
        f"Content-Length: {10 << 30}\r\n" + ("Expect: 100-continue\r\n" if expect else "") + "\r\n"
    ).encode()
    with connect(server.port) as sock:
        sock.sendall(head + b"{")
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 404 "), first[:40]  # no 100 Continue before it
        rest = first
        while chunk := sock.recv(65536):  # then the server closes
            rest += chunk
    assert b"connection: close" in rest.lower()
    assert b"Request for unknown model: 'nothing' is not found" in rest
    assert_served(server.port)


def test_a_client_gone_mid_response_is_not_logged_as_a_server_fault(
    server: Running, caplog: pytest.LogCaptureFixture
) -> None:
    binproto_http_only(server, "the log is uvicorn's, not binproto.server's")
    x = np.random.default_rng(0).random(4 << 20, dtype=np.float32)  # 16 MiB back
    body = binproto.encode_request({"x": x}, binary_data_output=True)
    head = request_for("/v2/models/echo/infer", body, headers=[("Accept-Encoding", "gzip")])
    wire = b"".join(bytes(p) for p in send_message(h11.Connection(h11.CLIENT), head, body))
    caplog.set_level(logging.INFO, logger="binproto.server")
    with connect(server.port) as sock:
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


def request_bytes(body: bytes, headers: dict[str, str], *, close: bool = True) -> bytes:
    """A raw infer request for the echo model (``Connection: close`` unless not ``close``)."""
    lines = ["POST /v2/models/echo/infer HTTP/1.1", "Host: test"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def valid_request(*, close: bool = True) -> tuple[bytes, Array]:
    x = np.arange(6, dtype=np.int32)
    body = binproto.encode_request({"x": x}, binary_data_output=True)
    return request_bytes(bytes(body), dict(body.headers), close=close), x


def framed_responses(data: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """The Content-Length framed responses in ``data``: (status, headers, body)."""
    out = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        assert sep, data
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
        n = int(headers["content-length"])
        out.append((int(status_line.split()[1]), headers, rest[:n]))
        data = rest[n:]
    return out


def check_echo(data: bytes, x: Array) -> None:
    [(status, headers, body)] = framed_responses(data)
    assert status == 200
    length = binproto.header_length_from(list(headers.items()), content_length=len(body))
    decoded = binproto.decode_response(body, header_length=length)
    assert same(decoded.tensors["x"], x)


def test_a_body_cut_short_is_a_400_saying_connection_close(server: Running, port: int) -> None:
    binproto_http_only(server, "a half-close mid-body ends the connection unanswered")
    data, _ = valid_request()
    with connect(port) as sock:
        sock.sendall(data[: len(data) - 10])
        sock.shutdown(socket.SHUT_WR)
        answer = until_closed(sock)
    # The server answers before closing: the body ended early.
    [(status, headers, body)] = framed_responses(answer)
    assert status == 400 and "missing" in json.loads(body)["error"]
    assert headers["connection"] == "close"
    assert_served(port)


def test_peer_sending_more_than_its_content_length(server: Running, port: int) -> None:
    binproto_http_only(server, "its parser refuses the junk with a text body")
    data, x = valid_request(close=False)
    with connect(port) as sock:
        sock.sendall(data + b"GARBAGE THAT IS NOT HTTP\r\n\r\n")
        answer = until_closed(sock)
    # The declared request is answered; what follows is not HTTP: 400, then close.
    first, *rest = framed_responses(answer)
    assert first[0] == 200
    length = binproto.header_length_from(list(first[1].items()), content_length=len(first[2]))
    assert same(binproto.decode_response(first[2], header_length=length).tensors["x"], x)
    assert [r[0] for r in rest] == [400]
    assert "illegal request line" in json.loads(rest[0][2])["error"]
    assert_served(port)


def test_body_with_more_bytes_than_its_tensors_declare(port: int) -> None:
    header = {
        "inputs": [
            {"name": "x", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 8}}
        ]
    }
    body, hl = make_body(header, b"\0" * 8, b"extra")
    headers = {"Inference-Header-Content-Length": str(hl), "Content-Length": str(len(body))}
    with connect(port) as sock:
        sock.sendall(request_bytes(body, headers))
        [(status, _, payload)] = framed_responses(until_closed(sock))
    assert status == 400 and "additional input data" in json.loads(payload)["error"]
    assert_served(port)


@pytest.mark.parametrize(
    ("body", "headers", "status", "message"),
    [
        (b"{not json", {}, 400, ""),
        (b"{}", {"Inference-Header-Content-Length": "10"}, 400, ""),
        (b"{}", {"Content-Encoding": "br"}, 415, "br"),
    ],
)
def test_malformed_bodies_get_v2_errors(
    port: int, body: bytes, headers: dict[str, str], status: int, message: str
) -> None:
    with connect(port) as sock:
        sock.sendall(request_bytes(body, {**headers, "Content-Length": str(len(body))}))
        [(got, _, payload)] = framed_responses(until_closed(sock))
    assert got == status
    assert message in json.loads(payload)["error"]


def test_short_binary_tensor_gets_the_size_in_the_error(port: int) -> None:
    header = {
        "inputs": [
            {"name": "x", "shape": [4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}
        ]
    }
    body, hl = make_body(header, b"\0" * 12)
    headers = {"Inference-Header-Content-Length": str(hl), "Content-Length": str(len(body))}
    with connect(port) as sock:
        sock.sendall(request_bytes(body, headers))
        [(status, _, payload)] = framed_responses(until_closed(sock))
    assert status == 400 and "16 bytes of binary data" in json.loads(payload)["error"]


def test_compressed_response_to_an_http_1_0_peer_ends_with_the_connection(
    server: Running, port: int
) -> None:
    binproto_http_only(server, "it frames HTTP/1.0 answers its own way")
    x = np.arange(1000, dtype=np.int32)
    body = binproto.encode_request({"x": x}, binary_data_output=True)
    head = ["POST /v2/models/echo/infer HTTP/1.0", "Accept-Encoding: gzip"]
    head += [f"{k}: {v}" for k, v in body.headers]
    with connect(port) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + bytes(body))
        data = until_closed(sock)  # the body ends when the server closes
    head_bytes, _, payload = data.partition(b"\r\n\r\n")
    lines = head_bytes.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
    assert lines[0].split()[1] == "200"
    assert headers["content-encoding"] == "gzip"
    assert "content-length" not in headers and "transfer-encoding" not in headers
    hl = int(headers["inference-header-content-length"])
    decoded = binproto.decode_response(payload, header_length=hl, content_encoding="gzip")
    assert same(decoded.tensors["x"], x)
