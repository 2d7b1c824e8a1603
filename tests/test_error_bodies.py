"""Error responses quote the peer as text, never as Python reprs, and at most
1 KiB of it."""

from __future__ import annotations

import json

import pytest

import binproto
from binproto._http import MAX_ERROR_BODY, MAX_ERROR_TEXT, error_text
from binproto.adapters import asgi
from binproto.adapters._server import V2Server
from binproto.adapters.h11 import error_response

from .servers import connect, running, until_closed


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            "illegal request line: bytearray(b'GET /\\xff x')",
            "illegal request line: 'GET /\\\\xff x'",
        ),
        ("""footer: b"it's" (expected b'\\r\\n')""", """footer: "it's" (expected '\\r\\n')"""),
        ("no bytes here", "no bytes here"),
    ],
)
def test_bytes_reprs_become_text(message: str, expected: str) -> None:
    assert error_text(message) == expected


def test_the_peers_text_is_cut_at_1_kib_and_the_offset_kept() -> None:
    exc = binproto.RemoteProtocolError("illegal header line: " + repr(b"a" * 60000), offset=7)
    text = error_text(exc)
    assert text.count("a") <= MAX_ERROR_TEXT and len(text) < MAX_ERROR_TEXT + 100
    assert "b'" not in text and text.endswith("(at byte 7)")
    for payload in (error_response(exc)[1], bytes(asgi.error_response(exc).buffers[0])):
        error = json.loads(payload)["error"]
        assert len(payload) <= MAX_ERROR_BODY and error.endswith("(at byte 7)")
        assert error.startswith("illegal header line: 'aaa") and "b'" not in error


@pytest.mark.parametrize(
    "head",
    [
        b"GET /v2 HTTP/1.1\r\nHost: x\r\nBad Header: " + b"v" * 60000 + b"\r\n\r\n",
        b"GET /" + b"\xff" * 2000 + b" HTTP/1.1 junk\r\nHost: x\r\n\r\n",
    ],
    ids=["header-line", "request-line"],
)
def test_a_refused_head_is_quoted_as_text_and_cut(http_backend: str, head: bytes) -> None:
    with running(http_backend, V2Server()) as server, connect(server.port) as sock:
        sock.sendall(head)
        received = until_closed(sock)
    assert received.startswith(b"HTTP/1.1 400 "), received[:200]
    error = json.loads(received.partition(b"\r\n\r\n")[2])["error"]
    assert "bytearray(" not in error and "b'" not in error
    assert len(error) <= MAX_ERROR_TEXT + 100


NON_ASCII = [
    "é" * 2000,  # 2 bytes in UTF-8, 6 as a JSON escape
    "😀" * 2000,  # 4 bytes, 12 as a JSON escape pair
    "\x01" * 2000,  # a control character: escaped in any JSON
    "\udc80" * 2000,  # a lone surrogate (what invalid UTF-8 decodes to with surrogateescape)
    "a" * 1000 + "😀" * 10,
]


@pytest.mark.parametrize("name", NON_ASCII, ids=["latin", "astral", "control", "surrogate", "edge"])
def test_an_error_body_is_at_most_1024_bytes_as_sent(name: str) -> None:
    exc = binproto.RemoteProtocolError(f"Request for unknown model: '{name}'", offset=12345)
    for payload in (error_response(exc)[1], bytes(asgi.error_response(exc).buffers[0])):
        assert len(payload) <= MAX_ERROR_BODY
        error = json.loads(payload)["error"]
        assert error.startswith("Request for unknown model: '")
        assert error.endswith(f"(cut to fit {MAX_ERROR_BODY} bytes) (at byte 12345)")
        # Cut no shorter than it must be: one more character would not fit.
        assert len(payload) > MAX_ERROR_BODY - 40


def test_a_short_message_is_sent_whole_as_utf8() -> None:
    payload = error_response(binproto.RemoteProtocolError("unknown model 'é😀'", offset=3))[1]
    assert payload == '{"error": "unknown model \'é😀\' (at byte 3)"}'.encode()


def test_invalid_utf8_in_a_tensor_name_is_answered_within_1024_bytes() -> None:
    name = b"\xff\xfe" * 1500
    header = b'{"inputs": [{"name": "' + name + b'", "datatype": "FP32", "shape": [0]}]}'
    with pytest.raises(binproto.RemoteProtocolError) as info:
        binproto.decode_request(header, header_length=len(header))
    for payload in (
        error_response(info.value)[1],
        bytes(asgi.error_response(info.value).buffers[0]),
    ):
        assert len(payload) <= MAX_ERROR_BODY
        json.loads(payload)


def _request(target: str, body: bytes) -> bytes:
    head = f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
    head += "Connection: close\r\n\r\n"
    return head.encode() + body


@pytest.mark.parametrize("name", ["é" * 2000, "😀" * 2000], ids=["latin", "astral"])
@pytest.mark.parametrize("where", ["request-line", "json-header"])
def test_a_server_answers_a_long_non_ascii_name_within_1024_bytes(
    http_backend: str, name: str, where: str
) -> None:
    if where == "request-line":  # (h11 refuses a target that is not ASCII)
        request = _request(f"/v2/models/{name}/infer", b"{}")
    else:
        tensor = {"name": name, "datatype": "FP32", "shape": [1], "data": [1.0]}
        body = json.dumps({"inputs": [tensor, tensor]}, ensure_ascii=False).encode()
        request = _request("/v2/models/echo/infer", body)
    with running(http_backend, V2Server()) as server, connect(server.port) as sock:
        sock.sendall(request)
        received = until_closed(sock)
    assert received.startswith(b"HTTP/1.1 400 "), received[:200]
    payload = received.partition(b"\r\n\r\n")[2]
    assert len(payload) <= MAX_ERROR_BODY
    assert name[:10] in json.loads(payload)["error"]
