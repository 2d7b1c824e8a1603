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


# -- V2App under uvicorn ----------------------------------------------------------------
#
# uvicorn reads the HTTP itself (its h11 or httptools implementation), so
# its heads and framing differ from binproto's servers (a Date and Server
# header, its own chunk sizes): the answers are compared as statuses and
# bodies, de-chunked and inflated. Where uvicorn's HTTP layer answers a case
# itself, or not at all, the statuses it gives are listed here, with why;
# every other case must give what binproto's servers give.

#: The cases uvicorn answers otherwise: case id -> (statuses, why), per implementation.
_BOTH: dict[str, tuple[str, str]] = {
    # uvicorn refuses a malformed head itself, with a text/plain body.
    "two-lengths-differ": ("400", "uvicorn's own 400 (text)"),
    "space-before-colon": ("400", "uvicorn's own 400 (text)"),
    "transfer-encoding-identity": ("400", "uvicorn's 400 (text), not a 501"),
    "content-length-plus": ("400", "uvicorn's own 400 (text)"),
    "tls-hello": ("400", "uvicorn's own 400 (text)"),
    # uvicorn answers 100 Continue on the first receive, even with the body sent.
    "expect-100-body-sent": ("100 200", "uvicorn sends 100 Continue first"),
    # uvicorn sets no bound of its own on a head's size.
    "head-over-64k": ("200", "no 64 KiB bound on heads"),
    # The client left before the end of its body: the app gets http.disconnect
    # and uvicorn sends nothing after it.
    "body-cut-short": ("", "closed without an answer"),
    # uvicorn refuses a malformed chunk line itself; it bounds no chunk line
    # (the app never sees them).
    "chunk-size-malformed": ("400", "uvicorn's own 400 (text)"),
    "chunk-extension-over-16k": ("200", "no bound on chunk lines"),
    # uvicorn answers a body-less POST, then closes on the bytes after it.
    "post-without-length": ("400", "one 400, then the connection is closed"),
}
UVICORN_DIFFERS: dict[str, dict[str, tuple[str, str]]] = {
    "h11": {**_BOTH, "no-host": ("400", "uvicorn's own 400 (text)")},
    "httptools": {
        **_BOTH,
        "both-framings": ("400", "llhttp refuses both framings itself (text)"),
        "two-lengths-same": ("400", "llhttp refuses a repeated Content-Length"),
        "lower-case-method": ("400", "llhttp refuses a method not in capitals"),
        "no-host": ("200", "llhttp does not require Host"),
        "bare-lf": ("400", "llhttp refuses bare LF line ends"),
        "post-without-length": ("400", "llhttp refuses the bytes after it (text)"),
    },
}


def _responses(data: bytes) -> list[tuple[int, bytes]]:
    """Each response in ``data``: its status and its body, de-chunked and
    inflated (1xx responses have no body)."""
    out = []
    while data:
        head, _, data = data.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        fields = dict(
            (k.strip().lower(), v.strip()) for k, _, v in (x.partition(b":") for x in lines[1:])
        )
        body = b""
        if 200 <= status and b"content-length" in fields:
            n = int(fields[b"content-length"])
            body, data = data[:n], data[n:]
        elif fields.get(b"transfer-encoding") == b"chunked":
            while True:
                size, _, data = data.partition(b"\r\n")
                n = int(size.split(b";")[0], 16)
                body, data = body + data[:n], data[n + 2 :]
                if not n:
                    break
        elif status >= 200:
            body, data = data, b""
        if fields.get(b"content-encoding") == b"gzip":
            body = gzip.decompress(body)
        out.append((status, body))
    return out


def _implementations() -> list[str]:
    found = ["h11"]
    try:
        import httptools  # noqa: F401
    except ImportError:  # (uvicorn without its "standard" extra)
        pass
    else:
        found.append("httptools")
    return found


@pytest.fixture(scope="module", params=_implementations())
def uvicorn_port(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    pytest.importorskip("uvicorn")
    from tests.servers import Running

    from .binproto_servers import identity_app

    running = Running("uvicorn", identity_app([MODEL]), http=str(request.param))
    try:
        yield str(request.param), running.port
    finally:
        running.close()


@pytest.mark.parametrize(("case", "data"), [c[:2] for c in CASES], ids=[c[0] for c in CASES])
def test_v2app_under_uvicorn_answers_as_binproto_does(
    ports: dict[str, int], uvicorn_port: tuple[str, int], case: str, data: bytes
) -> None:
    implementation, port = uvicorn_port
    ours = _responses(exchange(ports["asyncio"], data))
    theirs = _responses(exchange(port, data))
    statuses = " ".join(str(s) for s, _ in theirs)
    differs = UVICORN_DIFFERS[implementation].get(case)
    if differs is not None:
        assert statuses == differs[0], (differs[1], theirs)
        return
    assert theirs == ours
