"""binproto's own servers answer alike at the HTTP level too.

Raw requests, byte for byte (framing, methods, routes, versions, content
codings, malformed heads, pipelining), go to the reference server on every
backend (asyncio and trio, each receiving in place and through streams); the
client then ends its side, so every server answers and closes. Every backend
gives the same answers (statuses and bodies), none a 5xx, and each case its
expected statuses. Needs no Triton (docs/interop.md lists how Triton answers
the same requests).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import re
import socket
import struct
from collections.abc import Iterator

import pytest

from .binproto_servers import running_identity_server

BACKENDS = ("asyncio", "asyncio-streams", "trio", "trio-streams")
MODEL = "identity_fp32"
HEADER = json.dumps(
    {
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "FP32",
                "shape": [2],
                "parameters": {"binary_data_size": 8},
            }
        ]
    },
    separators=(",", ":"),
).encode()
BODY = HEADER + struct.pack("<2f", 1.5, -2.0)
INFER = f"/v2/models/{MODEL}/infer"


def request(
    path: str = INFER,
    method: str = "POST",
    body: bytes | None = BODY,
    headers: tuple[tuple[str, str], ...] = (),
    version: str = "HTTP/1.1",
    length: bool = True,
    host: bool = True,
) -> bytes:
    fields = [("Host", "x")] if host else []
    if length and body is not None:
        fields.append(("Content-Length", str(len(body))))
    fields.append(("Inference-Header-Content-Length", str(len(HEADER))))
    fields += headers
    head = f"{method} {path} {version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields)
    return head.encode() + b"\r\n" + (body or b"")


def chunked(body: bytes, *sizes: int, extension: bytes = b"", trailer: bytes = b"") -> bytes:
    out, at = b"", 0
    for size in (*sizes, len(body) - sum(sizes)):
        out += b"%x%s\r\n" % (size, extension) + body[at : at + size] + b"\r\n"
        at += size
    return out + b"0\r\n" + trailer + b"\r\n"


TE = (("Transfer-Encoding", "chunked"),)

# A JSON header claiming 256 GiB of tensor bytes, past every default limit.
CLAIM = HEADER.replace(b'"shape":[2]', b'"shape":[68719476736]').replace(
    b'"binary_data_size":8', b'"binary_data_size":274877906944'
)


def get(path: str) -> bytes:
    return request(path, "GET", None)


#: (id, the bytes sent, the statuses expected in order).
CASES: list[tuple[str, bytes, str]] = [
    ("valid", request(), "200"),
    ("chunked", request(body=chunked(BODY, 10, 50), length=False, headers=TE), "200"),
    (
        "chunk-extension",
        request(body=chunked(BODY, 10, extension=b";a=b"), length=False, headers=TE),
        "200",
    ),
    (
        "chunk-trailer",
        request(body=chunked(BODY, 10, trailer=b"X-T: 1\r\n"), length=False, headers=TE),
        "200",
    ),
    ("both-framings", request(body=chunked(BODY, 10), headers=TE), "400"),
    ("two-lengths-differ", request(headers=(("Content-Length", "5"),)), "400"),
    ("two-lengths-same", request(headers=(("Content-Length", str(len(BODY))),)), "200"),
    ("expect-100-body-sent", request(headers=(("Expect", "100-continue"),)), "200"),
    ("http-1.0", request(version="HTTP/1.0", host=False), "200"),
    ("pipelined", request() + request(), "200 200"),
    ("close-then-more", request(headers=(("Connection", "close"),)) + request(), "200"),
    ("get-infer", get(INFER), "405"),
    ("put-infer", request(method="PUT"), "405"),
    ("head-ready", request("/v2/health/ready", "HEAD", None), "200"),
    ("ready", get("/v2/health/ready"), "200"),
    ("live", get("/v2/health/live"), "200"),
    ("server-metadata", get("/v2"), "200"),
    ("model-metadata", get(f"/v2/models/{MODEL}"), "200"),
    ("model-version-1", get(f"/v2/models/{MODEL}/versions/1"), "200"),
    ("model-version-2", get(f"/v2/models/{MODEL}/versions/2"), "404"),
    ("unknown-model", get("/v2/models/nope"), "404"),
    ("unknown-path", get("/foo"), "404"),
    ("infer-version-1", request(f"/v2/models/{MODEL}/versions/1/infer"), "200"),
    ("infer-version-abc", request(f"/v2/models/{MODEL}/versions/abc/infer"), "404"),
    ("infer-percent-encoded", request("/v2/models/identity%5Ffp32/infer"), "200"),
    ("infer-query", request(INFER + "?x=1"), "200"),
    ("infer-absolute-form", request("http://x" + INFER), "200"),
    ("infer-unknown-model", request("/v2/models/nope/infer"), "404"),
    # (No length: an empty body; its bytes are then a malformed next request.)
    ("post-without-length", request(length=False), "400 400"),
    ("lower-case-method", request(method="post"), "405"),
    ("no-host", request(host=False), "400"),
    ("space-before-colon", request().replace(b"Host: x", b"Host : x"), "400"),
    ("bare-lf", request().replace(b"\r\n", b"\n"), "200"),
    ("head-over-64k", request(headers=(("X-Big", "a" * 65536),)), "431"),
    ("500-headers", request(headers=tuple((f"X-{i}", "a") for i in range(500))), "200"),
    (
        "gzip",
        request(body=gzip.compress(BODY), headers=(("Content-Encoding", "gzip"),)),
        "200",
    ),
    ("brotli", request(headers=(("Content-Encoding", "br"),)), "415"),
    ("accept-gzip", request(headers=(("Accept-Encoding", "gzip"),)), "200"),
    ("transfer-encoding-identity", request(headers=(("Transfer-Encoding", "identity"),)), "501"),
    ("content-length-plus", request(length=False, headers=(("Content-Length", "+1"),)), "400"),
    ("tls-hello", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(40), "400"),
    ("body-cut-short", request()[:-4], "400"),
    # Faults in a chunked body's framing; a line past MAX_CHUNK_LINE (16 KiB).
    ("chunk-size-malformed", request(body=b"zz\r\n" + BODY, length=False, headers=TE), "400"),
    (
        "chunk-extension-over-16k",
        request(body=chunked(BODY, 10, extension=b";a=" + b"b" * 17000), length=False, headers=TE),
        "431",
    ),
    # A claim past the limits in a chunked body's header: 413 without its body.
    (
        "chunked-claim-over-limits",
        request(body=b"%x\r\n" % len(CLAIM) + CLAIM + b"\r\n", length=False, headers=TE).replace(
            b"Length: %d" % len(HEADER), b"Length: %d" % len(CLAIM)
        ),
        "413",
    ),
    # RFC 9112, 6.1: HTTP/1.0 with Transfer-Encoding is refused, then closed.
    (
        "http-1.0-chunked",
        request(version="HTTP/1.0", host=False, body=chunked(BODY, 10), length=False, headers=TE)
        + request(),
        "400",
    ),
]


@pytest.fixture(scope="module")
def ports() -> Iterator[dict[str, int]]:
    pytest.importorskip("trio")
    with contextlib.ExitStack() as stack:
        yield {b: stack.enter_context(running_identity_server([MODEL], b)) for b in BACKENDS}


def exchange(port: int, data: bytes) -> bytes:
    """Send ``data``, end our side, and read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        received = b""
        while piece := sock.recv(65536):
            received += piece
    return received


@pytest.mark.parametrize(("data", "statuses"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_backend_answers_alike(ports: dict[str, int], data: bytes, statuses: str) -> None:
    answers = {backend: exchange(port, data) for backend, port in ports.items()}
    found = {
        b: " ".join(re.findall(r"HTTP/1\.1 (\d{3})", a.decode("latin-1")))
        for b, a in answers.items()
    }
    assert set(found.values()) == {statuses}, found
    assert len(set(answers.values())) == 1, answers  # byte for byte
