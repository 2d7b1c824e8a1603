"""The h11 adapter: parsers from HTTP heads, bodies through h11 without joins,
the V2 error body, the route table, and the blocking zero-copy receive."""

from __future__ import annotations

import gzip
import json
import socket
import threading
from typing import Any

import h11
import numpy as np
import pytest

import binproto
from binproto import (
    NEED_DATA,
    HeaderParsed,
    MessageComplete,
    Parser,
    RemoteProtocolError,
    TensorAssembler,
)
from binproto.adapters._app import _remembered_route, _route_of, route
from binproto.adapters.h11 import (
    PIECE,
    ResponseFramer,
    error_message,
    error_response,
    feed,
    infer_path,
    parser_for,
    receive_body_into,
    receive_events,
    request_for,
    response_for,
    send_body,
    send_compressed,
    send_data,
    send_message,
)


def _inputs() -> dict[str, Any]:
    return {
        "x": np.arange(12, dtype=np.float32).reshape(3, 4),
        "s": np.array([b"a", b"\xff\x00", b""], dtype=object),
        "b": np.array([True, False]),
    }


def _server_side(wire: bytes, chunk: int) -> tuple[h11.Request, list[Any]]:
    """Run ``wire`` through an h11 server connection ``chunk`` bytes at a time."""
    conn = h11.Connection(h11.SERVER)
    events: list[Any] = []
    for i in range(0, len(wire), chunk):
        conn.receive_data(wire[i : i + chunk])
        while (ev := conn.next_event()) is not h11.NEED_DATA:
            events.append(ev)
    head = events[0]
    assert isinstance(head, h11.Request)
    return head, events[1:]


def _encode_request_wire(body: binproto.EncodedBody) -> list[Any]:
    conn = h11.Connection(h11.CLIENT)
    return send_message(conn, request_for("/v2/models/m/infer", body), body)


@pytest.mark.parametrize("chunk", [1, 7, 1 << 20])
def test_request_through_h11_in_any_chunking(chunk: int) -> None:
    inputs = _inputs()
    body = binproto.encode_request(inputs)
    wire = b"".join(bytes(p) for p in _encode_request_wire(body))
    head, events = _server_side(wire, chunk)
    parser = parser_for(head)
    assert parser.kind == "request"
    assert parser.header_length == body.header_length
    assert parser.content_length == body.content_length
    asm = TensorAssembler()
    for ev in events:
        for out in receive_events(parser, ev):
            asm.feed(out)
    assert parser.state is binproto.ParserState.DONE
    assert set(asm.tensors) == set(inputs)
    for name, arr in inputs.items():
        np.testing.assert_array_equal(asm.tensors[name], arr)


def test_response_head_gives_a_response_parser() -> None:
    out = {"y": np.arange(3, dtype=np.int64)}
    body = binproto.encode_response(out, model_name="m")
    head = response_for(200, body)
    parser = parser_for(head)
    assert parser.kind == "response"
    parser.receive_data(bytes(body))
    events = list(parser.events())
    assert type(events[-1]) is MessageComplete
    assert type(events[0]) is HeaderParsed and events[0].header.model_name == "m"


def test_plain_json_body_has_no_header_length() -> None:
    body = binproto.encode_request({"x": [1, 2, 3]}, binary=False)
    head = request_for("/v2/models/m/infer", body)
    parser = parser_for(head)
    assert parser.header_length is None
    parser.receive_data(bytes(body))
    assert type(list(parser.events())[-1]) is MessageComplete


def test_bad_header_length_is_a_remote_error() -> None:
    head = h11.Request(
        method="POST",
        target="/",
        headers=[
            ("Host", "x"),
            ("Content-Length", "10"),
            ("Inference-Header-Content-Length", "11"),
        ],
    )
    with pytest.raises(RemoteProtocolError) as info:
        parser_for(head)
    assert info.value.status_hint == 400


def test_gzip_body_is_parsed_when_the_core_supports_it() -> None:
    if not hasattr(binproto, "content_encoding_from"):
        pytest.skip("this build of the core has no content encodings")
    inputs = {"x": np.arange(100, dtype=np.int32)}
    body = binproto.encode_request(inputs)
    packed = gzip.compress(bytes(body))
    head = h11.Request(
        method="POST",
        target="/v2/models/m/infer",
        headers=[
            ("Host", "x"),
            ("Content-Length", str(len(packed))),
            ("Content-Encoding", "gzip"),
            ("Inference-Header-Content-Length", str(body.header_length)),
        ],
    )
    parser = parser_for(head)
    asm = TensorAssembler()
    for i in range(0, len(packed), 9):
        for ev in receive_events(parser, h11.Data(data=packed[i : i + 9])):
            asm.feed(ev)
    for ev in receive_events(parser, h11.EndOfMessage()):
        asm.feed(ev)
    assert parser.state is binproto.ParserState.DONE
    np.testing.assert_array_equal(asm.tensors["x"], inputs["x"])


def test_unknown_content_encoding_is_415() -> None:
    head = h11.Request(
        method="POST",
        target="/",
        headers=[("Host", "x"), ("Content-Length", "3"), ("Content-Encoding", "br")],
    )
    with pytest.raises(RemoteProtocolError) as info:
        parser = parser_for(head)
        parser.receive_data(b"abc")
        parser.next_event()
    assert info.value.status_hint == 415


def test_send_body_passes_tensor_memory_through() -> None:
    x = np.arange(3 * PIECE // 4 + 5, dtype=np.float32)  # more than 2 pieces
    body = binproto.encode_request({"x": x})
    conn = h11.Connection(h11.CLIENT)
    conn.send(request_for("/", body))
    pieces = send_body(conn, body)
    assert pieces[0] == body.json
    tensor_pieces = pieces[1:]
    assert len(tensor_pieces) == -(-x.nbytes // PIECE)
    for p in tensor_pieces:
        assert isinstance(p, memoryview)
        assert np.shares_memory(np.frombuffer(p, dtype=np.uint8), x)
    assert b"".join(bytes(p) for p in pieces) == bytes(body)
    assert conn.our_state is h11.DONE


def test_send_data_with_chunked_framing() -> None:
    conn = h11.Connection(h11.CLIENT)
    conn.send(
        h11.Request(
            method="POST", target="/", headers=[("Host", "x"), ("Transfer-Encoding", "chunked")]
        )
    )
    data = np.arange(10, dtype=np.uint8)
    pieces = send_data(conn, data)
    assert [bytes(p) for p in pieces] == [b"a\r\n", data.tobytes(), b"\r\n"]
    assert np.shares_memory(np.frombuffer(pieces[1], dtype=np.uint8), data)


def test_error_response_is_the_v2_error_body() -> None:
    exc = RemoteProtocolError("too big", status_hint=413, offset=5)
    head, payload = error_response(exc)
    assert head.status_code == 413
    assert json.loads(payload) == {"error": "too big (at byte 5)"}
    assert (b"content-length", str(len(payload)).encode()) in head.headers
    head, payload = error_response("nope", 404)
    assert head.status_code == 404 and json.loads(payload) == {"error": "nope"}
    err = error_message(400, payload)
    assert (err.status, err.message) == (400, "nope")
    assert error_message(502, b"<html>").message == "<html>"


@pytest.mark.parametrize(
    ("method", "target", "expected"),
    [
        ("GET", "/v2", ("server", None, None)),
        ("GET", "/v2/", ("server", None, None)),
        ("GET", "/v2/health/live", ("live", None, None)),
        ("GET", "/v2/health/ready", ("ready", None, None)),
        ("GET", "/v2/models/echo", ("model", "echo", None)),
        ("GET", "/v2/models/echo/versions/3", ("model", "echo", "3")),
        ("GET", "/v2/models/echo/ready", ("model_ready", "echo", None)),
        ("POST", "/v2/models/echo/infer", ("infer", "echo", None)),
        ("POST", "/v2/models/echo/versions/2/infer?x=1", ("infer", "echo", "2")),
        ("POST", "/v2/models/a%20b/infer", ("infer", "a b", None)),
        ("GET", "/v2/models", ("not_found", None, None)),
        ("GET", "/v2/models/echo/bogus", ("not_found", None, None)),
        ("GET", "/v1/models/echo", ("not_found", None, None)),
        ("GET", "//[", ("not_found", None, None)),  # urlsplit refuses it
    ],
)
def test_route(method: str, target: str, expected: tuple[str, str | None, str | None]) -> None:
    r = route(method, target)
    assert (r.kind, r.model, r.version) == expected
    assert _route_of(target) == r


def test_routes_of_short_targets_only_are_remembered() -> None:
    # A peer picks targets: what the server keeps of them stays small.
    short = "/v2/models/remembered/infer"
    first = _route_of(short)
    assert _route_of(short) is first
    kept = _remembered_route.cache_info().currsize
    long = "/v2/models/" + "x" * 10_000 + "/infer"
    assert _route_of(long).model == "x" * 10_000
    assert _remembered_route.cache_info().currsize == kept


def test_receive_body_into_receives_tensors_in_place() -> None:
    x = (np.arange(1 << 18, dtype=np.float64) * 0.5).reshape(512, -1)
    y = np.array([b"\x00\xfe", b"ok"], dtype=object)
    body = binproto.encode_request({"x": x, "y": y})
    wire = _encode_request_wire(body)
    a, b = socket.socketpair()
    try:

        def send() -> None:
            for piece in wire:
                a.sendall(piece)

        sender = threading.Thread(target=send)
        sender.start()
        conn = h11.Connection(h11.SERVER)
        while (head := conn.next_event()) is h11.NEED_DATA:
            conn.receive_data(b.recv(100))  # leaves some body inside h11
        assert isinstance(head, h11.Request)
        parser = parser_for(head)
        dest = np.empty_like(x)
        asm = TensorAssembler({"x": dest})
        receive_body_into(b, conn, parser, asm)
        sender.join()
    finally:
        a.close()
        b.close()
    assert parser.state is binproto.ParserState.DONE
    assert asm.tensors["x"] is dest
    np.testing.assert_array_equal(dest, x)
    np.testing.assert_array_equal(asm.tensors["y"], y)
    # Everything past what h11 had buffered went straight into ``dest``.
    assert asm.bytes_in_place > x.nbytes - 1000
    assert asm.bytes_copied + asm.bytes_in_place == x.nbytes + len(body.buffers[2])


def test_receive_body_into_reports_a_peer_that_closes_early() -> None:
    body = binproto.encode_request({"x": np.zeros(1000, dtype=np.int32)})
    wire = b"".join(bytes(p) for p in _encode_request_wire(body))
    a, b = socket.socketpair()
    try:
        a.sendall(wire[:-100])
        a.shutdown(socket.SHUT_WR)
        conn = h11.Connection(h11.SERVER)
        while (head := conn.next_event()) is h11.NEED_DATA:
            conn.receive_data(b.recv(65536))
        assert isinstance(head, h11.Request)
        parser = parser_for(head)
        with pytest.raises(RemoteProtocolError):
            receive_body_into(b, conn, parser, TensorAssembler())
    finally:
        a.close()
        b.close()
    with pytest.raises(binproto.LocalProtocolError):
        parser.next_event()  # the parser is in its ERROR state


def test_feed_end_of_message_ends_the_body() -> None:
    body = binproto.encode_request({"x": np.arange(4, dtype=np.uint8)})
    parser = binproto.Parser("request", header_length=body.header_length)
    feed(parser, h11.Data(data=bytes(body)))
    events = [ev for ev in iter(parser.next_event, NEED_DATA) if type(ev) is not MessageComplete]
    feed(parser, h11.EndOfMessage())
    assert type(parser.next_event()) is MessageComplete
    assert events


# -- compressed bodies ------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
@pytest.mark.parametrize("chunk", [1, 7, 1 << 20])
def test_compressed_request_through_h11(encoding: str, chunk: int) -> None:
    inputs = _inputs()
    body = binproto.encode_request(inputs)
    conn = h11.Connection(h11.CLIENT)
    head = request_for("/v2/models/m/infer", body, encoding=encoding)
    headers = {k.decode(): v.decode() for k, v in head.headers}
    assert headers["content-encoding"] == encoding
    assert headers["transfer-encoding"] == "chunked"
    assert "content-length" not in headers
    wire = bytearray(conn.send(head) or b"")
    for batch in send_compressed(conn, body, encoding):
        wire += b"".join(bytes(p) for p in batch)
    assert conn.our_state is h11.DONE
    head_in, events = _server_side(bytes(wire), chunk)
    parser = parser_for(head_in)
    assert parser.content_encoding == encoding
    assert parser.header_length == body.header_length
    asm = TensorAssembler()
    for ev in events:
        for out in receive_events(parser, ev):
            asm.feed(out)
    assert parser.state is binproto.ParserState.DONE
    for name, arr in inputs.items():
        np.testing.assert_array_equal(asm.tensors[name], arr)


def test_send_compressed_yields_bounded_batches() -> None:
    """Each batch holds one compressed piece: the body is never compressed whole."""
    x = np.random.default_rng(0).integers(0, 4, size=5 * PIECE, dtype=np.uint8)
    body = binproto.encode_response({"x": x}, model_name="m")
    server = h11.Connection(h11.SERVER)
    server.receive_data(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n")
    assert type(server.next_event()) is h11.Request
    assert type(server.next_event()) is h11.EndOfMessage
    head = response_for(200, body, encoding="gzip")
    assert b"content-length" not in [k for k, _ in head.headers]
    first = server.send(head)
    assert first is not None and b"transfer-encoding: chunked" in first.lower()
    batches = [b"".join(bytes(p) for p in batch) for batch in send_compressed(server, body, "gzip")]
    assert len(batches) > 2
    assert max(len(b) for b in batches) < 2 * PIECE
    client = h11.Connection(h11.CLIENT)
    client.send(
        h11.Request(method="POST", target="/", headers=[("Host", "a"), ("Content-Length", "0")])
    )
    client.send(h11.EndOfMessage())
    client.receive_data(first + b"".join(batches))
    response = client.next_event()
    assert isinstance(response, h11.Response)
    parser = parser_for(response)
    asm = TensorAssembler()
    while (ev := client.next_event()) is not h11.NEED_DATA:
        if isinstance(ev, (h11.Data, h11.EndOfMessage)):
            for out in receive_events(parser, ev):
                asm.feed(out)
        if type(ev) is h11.EndOfMessage:
            break
    np.testing.assert_array_equal(asm.tensors["x"], x)


@pytest.mark.parametrize(
    "tail", [b"5\r\nab", b"ZZ\r\n"], ids=["closed-mid-chunk", "bad-chunk-header"]
)
def test_receive_body_into_reports_bad_chunked_framing_as_binproto_errors(tail: bytes) -> None:
    body = binproto.encode_request({"x": np.zeros(4, dtype=np.int32)})
    head = (
        "POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        f"Inference-Header-Content-Length: {body.header_length}\r\n\r\n"
    ).encode()
    a, b = socket.socketpair()
    try:
        a.sendall(head + tail)
        a.shutdown(socket.SHUT_WR)
        conn = h11.Connection(h11.SERVER)
        while (event := conn.next_event()) is h11.NEED_DATA:
            conn.receive_data(b.recv(65536))
        assert isinstance(event, h11.Request)
        with pytest.raises(RemoteProtocolError) as info:
            receive_body_into(b, conn, parser_for(event), TensorAssembler())
        assert info.value.offset == 0  # where the body stopped: within its header
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("chunk_size", [0, -1, True, 1.5, "64"])
def test_receive_body_into_refuses_a_chunk_size_that_is_no_positive_int(chunk_size: Any) -> None:
    # recv(0) returns b"", which h11 would take for the peer closing.
    a, b = socket.socketpair()
    try:
        conn = h11.Connection(h11.SERVER)
        parser = Parser("request", header_length=None)
        with pytest.raises(binproto.LocalProtocolError, match="chunk_size"):
            receive_body_into(b, conn, parser, TensorAssembler(), chunk_size=chunk_size)
    finally:
        a.close()
        b.close()


def test_receive_body_into_before_the_head_was_taken_is_misuse() -> None:
    body = binproto.encode_request({"x": np.zeros(4, dtype=np.int32)})
    wire = b"".join(bytes(p) for p in _encode_request_wire(body))
    a, b = socket.socketpair()
    try:
        conn = h11.Connection(h11.SERVER)
        conn.receive_data(wire)  # the head is still in conn
        parser = Parser("request", header_length=body.header_length)
        with pytest.raises(binproto.LocalProtocolError, match="after the message head"):
            receive_body_into(b, conn, parser, TensorAssembler())
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize(("name", "version"), [(5, None), ("m", 1), (b"m", None)])
def test_infer_path_refuses_names_that_are_no_strings(name: Any, version: Any) -> None:
    with pytest.raises(binproto.LocalProtocolError, match="model name and version"):
        infer_path(name, version)


# -- ResponseFramer: a server's responses framed as h11 frames them --------------

_HEADS = {
    "1.1": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    "1.0": b"GET / HTTP/1.0\r\n\r\n",
    "close": b"GET / HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, Close\r\n\r\n",
    "close after a tab": b"GET / HTTP/1.1\r\nHost: x\r\nConnection: foo,\tclose\r\n\r\n",
}
_RESPONSES = {
    "content-length": [
        h11.Response(status_code=200, headers=[("Content-Length", "5"), ("Content-Type", "x")]),
        h11.Data(data=b"hello"),
        h11.EndOfMessage(),
    ],
    "no length": [
        h11.Response(status_code=200, headers=[("Content-Encoding", "gzip")]),
        h11.Data(data=b"hello"),
        h11.Data(data=memoryview(b"!")),  # type: ignore[arg-type]
        h11.EndOfMessage(),
    ],
    "closing": [
        h11.Response(status_code=400, headers=[("Content-Length", "2"), ("Connection", "close")]),
        h11.Data(data=b"no"),
        h11.EndOfMessage(),
    ],
    # Never a body, so no framing headers.
    "no content": [h11.Response(status_code=204, headers=[]), h11.EndOfMessage()],
    "not modified": [h11.Response(status_code=304, headers=[("ETag", "x")]), h11.EndOfMessage()],
    # Transfer-Encoding beats Content-Length, which is dropped.
    "both framings": [
        h11.Response(
            status_code=200, headers=[("Content-Length", "2"), ("Transfer-Encoding", "chunked")]
        ),
        h11.Data(data=b"hi"),
        h11.EndOfMessage(),
    ],
    # The server closes: its own header, where it put it.
    "closing first": [
        h11.Response(status_code=200, headers=[("Connection", "Upgrade, close"), ("X", "y")]),
        h11.Data(data=b"hi"),
        h11.EndOfMessage(),
    ],
    # Said by the server to a client that closes: one Connection: close.
    "keep-alive said": [
        h11.Response(
            status_code=200, headers=[("Connection", "Keep-Alive"), ("Content-Length", "2")]
        ),
        h11.Data(data=b"hi"),
        h11.EndOfMessage(),
    ],
}


def _served(head: bytes) -> tuple[h11.Connection, h11.Request]:
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(head)
    request = conn.next_event()
    assert isinstance(request, h11.Request)
    return conn, request


@pytest.mark.parametrize("response", _RESPONSES)
@pytest.mark.parametrize("request_head", _HEADS)
def test_response_framer_writes_what_h11_writes(request_head: str, response: str) -> None:
    conn, request = _served(_HEADS[request_head])
    framer = ResponseFramer(request)
    ours: list[bytes] = []
    theirs: list[bytes] = []
    for event in _RESPONSES[response]:
        ours.extend(bytes(p) for p in framer.send_with_data_passthrough(event) or [])
        theirs.extend(bytes(p) for p in conn.send_with_data_passthrough(event) or [])
    assert b"".join(ours) == b"".join(theirs)
    assert framer.our_state is conn.our_state
    assert framer.reusable is (conn.our_state is h11.DONE)


def test_response_framer_refuses_what_h11_refuses() -> None:
    _, request = _served(_HEADS["1.1"])
    framer = ResponseFramer(request)
    with pytest.raises(h11.LocalProtocolError):
        framer.send(h11.Data(data=b"x"))  # no head yet
    framer.send(h11.Response(status_code=200, headers=[("Content-Length", "1")]))
    with pytest.raises(h11.LocalProtocolError, match="Too much data"):
        framer.send(h11.Data(data=b"xy"))
    with pytest.raises(h11.LocalProtocolError, match="Too little data"):
        framer.send(h11.EndOfMessage())


def test_response_framer_answers_head_without_a_body() -> None:
    # (h11 itself raises here: it counts the body against Content-Length 0.)
    _, request = _served(b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n")
    framer = ResponseFramer(request)
    out = b"".join(
        bytes(p)
        for e in _RESPONSES["content-length"]
        for p in framer.send_with_data_passthrough(e) or []
    )
    assert out == b"HTTP/1.1 200 \r\nContent-Length: 5\r\nContent-Type: x\r\n\r\n"
    assert framer.reusable


def test_a_refused_head_is_answered_and_closed() -> None:
    framer = ResponseFramer(None)
    head = framer.send(h11.Response(status_code=400, headers=[("Content-Length", "0")]))
    framer.send(h11.EndOfMessage())
    assert head is not None and head.endswith(b"Connection: close\r\n\r\n")
    assert not framer.reusable


@pytest.mark.parametrize("request_head", _HEADS)
def test_a_whole_response_is_framed_as_h11_frames_its_events(request_head: str) -> None:
    # send_response makes no h11 events; the bytes and the state must not differ.
    big = np.arange(PIECE // 4 + 7, dtype=np.float32)  # more than one piece
    for tensors in ({"y": np.arange(4, dtype=np.int32)}, {"y": big}, {"s": [b"a", b"bc"]}):
        body = binproto.encode_response(tensors, model_name="m")
        conn, request = _served(_HEADS[request_head])
        framer = ResponseFramer(request)
        ours = framer.send_response(200, body, headers=[("X-Extra", "1")])
        theirs = send_message(conn, response_for(200, body, headers=[("X-Extra", "1")]), body)
        assert b"".join(bytes(p) for p in ours) == b"".join(bytes(p) for p in theirs)
        assert [len(p) for p in ours if len(p)] == [len(p) for p in theirs if len(p)]
        assert framer.our_state is conn.our_state
        with pytest.raises(h11.LocalProtocolError):
            framer.send_response(200, body)  # one response per request


def test_a_big_json_answer_goes_out_as_views_of_its_text() -> None:
    # A JSON answer may be hundreds of MB: never copied, and cut into pieces
    # so that a transport keeps at most a piece of it besides.
    body = binproto.encode_response(
        {"y": np.arange(PIECE // 3, dtype=np.int64)}, model_name="m", binary=False
    )
    assert len(body.json) > 2 * PIECE
    _, request = _served(_HEADS["1.1"])
    pieces = ResponseFramer(request).send_response(200, body)[1:]
    assert all(len(p) <= PIECE for p in pieces) and b"".join(pieces) == body.json
    text = np.frombuffer(body.json, dtype=np.uint8)
    assert all(np.shares_memory(np.frombuffer(p, dtype=np.uint8), text) for p in pieces)
