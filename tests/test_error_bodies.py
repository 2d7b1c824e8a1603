"""Error responses quote the peer as text, never as Python reprs, and at most
1 KiB of it."""

from __future__ import annotations

import json

import pytest

import binproto
from binproto._http import MAX_ERROR_TEXT, error_text
from binproto.adapters import asgi
from binproto.adapters.h11 import error_response
from tests.test_timeouts import BACKENDS, _connect, _until_closed, serving


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
        assert json.loads(payload)["error"] == text


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "head",
    [
        b"GET /v2 HTTP/1.1\r\nHost: x\r\nBad Header: " + b"v" * 60000 + b"\r\n\r\n",
        b"GET /" + b"\xff" * 2000 + b" HTTP/1.1 junk\r\nHost: x\r\n\r\n",
    ],
    ids=["header-line", "request-line"],
)
def test_a_refused_head_is_quoted_as_text_and_cut(backend: str, head: bytes) -> None:
    with serving(backend) as port, _connect(port) as sock:
        sock.sendall(head)
        received = _until_closed(sock)
    assert received.startswith(b"HTTP/1.1 400 "), received[:200]
    error = json.loads(received.partition(b"\r\n\r\n")[2])["error"]
    assert "bytearray(" not in error and "b'" not in error
    assert len(error) <= MAX_ERROR_TEXT + 100
