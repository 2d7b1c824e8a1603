"""The server-wide bound on request body bytes in flight
(``V2Server(max_body_bytes_in_flight=...)``): a request that would pass it
while others hold bytes is refused before its body is read (answered 503
once what it sends is dropped); one alone is always taken; every claim is
given back when its request ends, however it ends. On both backends
(asyncio, zero-copy and streams; trio) over loopback."""

from __future__ import annotations

import gzip
import json
import re
import socket
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest

import binproto
from binproto import LocalProtocolError
from binproto.adapters._server import Timeouts, V2Server
from binproto.cli import build_parser

from .servers import Running, connect, read_all, request_bytes, serving

KiB = 1024
BUDGET = 1024 * KiB
# Two of these together pass the budget; one fits.
HELD = np.arange(150_000, dtype=np.float32)  # 600,000 bytes
OTHER = np.arange(120_000, dtype=np.float32)  # 480,000 bytes
TIMEOUTS = Timeouts(keep_alive=2.0, head=2.0, body=2.0, write=2.0)


@pytest.fixture
def app() -> V2Server:
    return V2Server(timeouts=TIMEOUTS, max_body_bytes_in_flight=BUDGET)


@pytest.fixture
def running(http_backend: str, app: V2Server) -> Iterator[Running]:
    yield from serving(http_backend, app)


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 5
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def response(sock: socket.socket) -> bytes:
    """One whole response on a kept connection (Content-Length framed)."""
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(65536)
        assert piece, data
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        piece = sock.recv(65536)
        assert piece
        body += piece
    return head + b"\r\n\r\n" + body


class Holder:
    """A request that has claimed its bytes: its head and part of its body sent."""

    def __init__(self, running: Running, app: V2Server) -> None:
        self.wire = request_bytes({"x": HELD, "y": np.zeros(1, np.uint8)})
        self.sock = connect(running.port)
        self.sock.sendall(self.wire[: len(self.wire) // 2])
        wait_for(lambda: app.body_bytes_in_flight >= HELD.nbytes, "the claim")

    def finish(self) -> bytes:
        self.sock.sendall(self.wire[len(self.wire) // 2 :])
        answer = response(self.sock)
        self.sock.close()
        return answer


def test_a_request_past_the_budget_is_refused_with_503_and_served_later(
    running: Running, app: V2Server
) -> None:
    holder = Holder(running, app)
    with connect(running.port) as sock:
        sock.sendall(request_bytes({"x": OTHER}))
        # (Its body was read and dropped: the connection stays.)
        refused = response(sock)
    assert status_of(refused) == 503, refused[:300]
    assert b"\r\nRetry-After: 1\r\n" in refused
    assert b"the server is busy" in refused and str(BUDGET).encode() in refused
    # The holder is served as if nothing happened, and gives its bytes back.
    answer = holder.finish()
    assert status_of(answer) == 200, answer[:300]
    decoded = binproto.decode_response(answer.partition(b"\r\n\r\n")[2], header_length=None)
    np.testing.assert_array_equal(decoded.tensors["x"], HELD)
    wait_for(lambda: app.body_bytes_in_flight == 0, "the release")
    # Now the refused request fits.
    with connect(running.port) as sock:
        sock.sendall(request_bytes({"x": OTHER}))
        assert status_of(response(sock)) == 200


def test_a_request_within_the_budget_is_served_beside_another(
    running: Running, app: V2Server
) -> None:
    holder = Holder(running, app)
    small = np.arange(1000, dtype=np.float32)
    with connect(running.port) as sock:
        sock.sendall(request_bytes({"x": small}))
        assert status_of(response(sock)) == 200
    assert status_of(holder.finish()) == 200


def test_a_client_waiting_for_100_continue_is_refused_without_sending_its_body(
    running: Running, app: V2Server
) -> None:
    holder = Holder(running, app)
    wire = request_bytes({"x": OTHER})
    head = wire[: wire.index(b"\r\n\r\n")] + b"\r\nExpect: 100-continue\r\n\r\n"
    with connect(running.port) as sock:
        sock.sendall(head)
        answer = read_all(sock)
    assert answer.startswith(b"HTTP/1.1 503 "), answer[:300]
    assert b" 100 " not in answer.split(b"\r\n", 1)[0]
    assert b"Connection: close" in answer
    assert status_of(holder.finish()) == 200


def test_one_request_alone_is_taken_whatever_its_size(http_backend: str) -> None:
    app = V2Server(timeouts=TIMEOUTS, max_body_bytes_in_flight=KiB)
    for server in serving(http_backend, app):
        with connect(server.port) as sock:
            sock.sendall(request_bytes({"x": HELD}))
            assert status_of(response(sock)) == 200
        wait_for(lambda: app.body_bytes_in_flight == 0, "the release")


@pytest.mark.parametrize("how", ["bad-body", "peer-gone", "stalled"])
def test_a_failed_request_gives_its_claim_back(running: Running, app: V2Server, how: str) -> None:
    # BOOL bytes: the last one a 2, a 400 once it is read.
    wire = request_bytes({"x": np.ones(HELD.nbytes, np.bool_)})
    with connect(running.port) as sock:
        sock.sendall(wire[: len(wire) // 2])
        wait_for(lambda: app.body_bytes_in_flight >= HELD.nbytes, "the claim")
        if how == "peer-gone":
            sock.close()
        else:
            if how == "bad-body":
                sock.sendall(wire[len(wire) // 2 : -1] + b"\2")
            answer = read_all(sock)  # (stalled: the 2 s body timeout's 408)
            assert status_of(answer) == (400 if how == "bad-body" else 408), answer[:300]
    wait_for(lambda: app.body_bytes_in_flight == 0, "the release")


def test_a_chunked_body_refused_for_its_header_is_answered_beside_another(
    running: Running, app: V2Server
) -> None:
    # Its rest, read to be dropped after the 400, is no longer counted: a
    # claim refused there would leave the client with no answer.
    holder = Holder(running, app)
    head = b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n"
    head += b"Inference-Header-Content-Length: 10\r\n"
    with connect(running.port) as sock:
        sock.sendall(_chunked(head, b"not json!!" + bytes(500 * KiB), piece=10))
        answer = response(sock)
    assert status_of(answer) == 400, answer[:300]
    assert b"JSON" in answer
    assert status_of(holder.finish()) == 200
    wait_for(lambda: app.body_bytes_in_flight == 0, "the release")


def test_a_gzip_body_claims_its_json_header_at_its_head(running: Running, app: V2Server) -> None:
    holder = Holder(running, app)
    header = json.dumps({"inputs": [], "pad": "x" * 600_000}).encode()
    head = _gzip_head(len(header), len(gzip.compress(header)), "Expect: 100-continue\r\n")
    with connect(running.port) as sock:
        sock.sendall(head)  # the body is not inflated, nor even sent
        answer = read_all(sock)
    assert answer.startswith(b"HTTP/1.1 503 "), answer[:300]
    assert f"this one's {len(header)} would pass".encode() in answer
    assert status_of(holder.finish()) == 200


def _gzip_head(header_length: int, length: int, more: str = "") -> bytes:
    return (
        "POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\n"
        f"Inference-Header-Content-Length: {header_length}\r\n"
        f"Content-Length: {length}\r\n{more}\r\n"
    ).encode()


def _chunked(head: bytes, body: bytes, piece: int = 64 * KiB) -> bytes:
    out = [head + b"Transfer-Encoding: chunked\r\n\r\n"]
    for i in range(0, len(body), piece):
        chunk = body[i : i + piece]
        out.append(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
    return b"".join(out) + b"0\r\n\r\n"


def test_a_chunked_json_body_is_refused_as_its_bytes_pass_the_budget(
    running: Running, app: V2Server
) -> None:
    holder = Holder(running, app)
    text = json.dumps(
        {"inputs": [{"name": "x", "datatype": "INT32", "shape": [300_000], "data": [7] * 300_000}]}
    ).encode()
    assert len(text) > BUDGET - HELD.nbytes
    head = b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n"
    with connect(running.port) as sock:
        sock.sendall(_chunked(head, text))
        # (The rest of the body is read and dropped: the connection stays.)
        answer = response(sock)
    assert status_of(answer) == 503, answer[:300]
    # Refused at the piece that passed the budget, not once the JSON was whole.
    (claimed,) = re.findall(rb"this one's (\d+) would pass", answer)
    assert BUDGET - HELD.nbytes < int(claimed) < len(text)
    assert status_of(holder.finish()) == 200
    wait_for(lambda: app.body_bytes_in_flight == 0, "the release")


def test_a_chunked_binary_body_is_refused_by_what_its_header_announces(
    running: Running, app: V2Server
) -> None:
    holder = Holder(running, app)
    body = binproto.encode_request({"x": OTHER})
    head = b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n"
    head += f"Inference-Header-Content-Length: {body.header_length}\r\n".encode()
    with connect(running.port) as sock:
        sock.sendall(_chunked(head, bytes(body)))
        answer = response(sock)
    assert status_of(answer) == 503, answer[:300]
    assert f"this one's {len(bytes(body))}".encode() in answer
    assert status_of(holder.finish()) == 200


def test_a_gzip_body_claims_what_it_expands_to(running: Running, app: V2Server) -> None:
    holder = Holder(running, app)
    body = binproto.encode_request({"x": np.zeros(120_000, np.float32)})
    packed = gzip.compress(bytes(body))
    assert len(packed) < 4 * KiB  # (its Content-Length alone would fit)
    assert body.header_length is not None
    with connect(running.port) as sock:
        sock.sendall(_gzip_head(body.header_length, len(packed)) + packed)
        answer = response(sock)
    assert status_of(answer) == 503, answer[:300]
    assert f"this one's {len(bytes(body))} would pass".encode() in answer
    assert status_of(holder.finish()) == 200


def test_requests_for_no_model_claim_nothing(running: Running, app: V2Server) -> None:
    holder = Holder(running, app)
    wire = request_bytes({"x": OTHER}).replace(b"/models/echo/", b"/models/nope/")
    with connect(running.port) as sock:
        sock.sendall(wire)
        assert status_of(response(sock)) == 404
    assert status_of(holder.finish()) == 200


@pytest.mark.parametrize("most", [-1, 1.5, True, "1GiB"])
def test_a_budget_is_a_byte_count(most: object) -> None:
    with pytest.raises(LocalProtocolError, match="max_body_bytes_in_flight"):
        V2Server(max_body_bytes_in_flight=most)  # type: ignore[arg-type]


def test_without_a_budget_nothing_is_counted_nor_refused(http_backend: str) -> None:
    # The default: the two requests the budget above refuses together are served.
    app = V2Server(timeouts=TIMEOUTS)
    for running in serving(http_backend, app):
        wire = request_bytes({"x": HELD})
        with connect(running.port) as held:
            held.sendall(wire[: len(wire) // 2])
            time.sleep(0.1)
            with connect(running.port) as sock:
                sock.sendall(request_bytes({"x": OTHER}))
                assert status_of(response(sock)) == 200
            assert app.body_bytes_in_flight == 0
            held.sendall(wire[len(wire) // 2 :])
            assert status_of(response(held)) == 200


def test_binproto_serve_takes_the_budget_as_a_size() -> None:
    args = build_parser().parse_args(["serve", "--max-body-bytes-in-flight", "4GiB"])
    assert args.max_body_bytes_in_flight == 4 << 30
    assert build_parser().parse_args(["serve"]).max_body_bytes_in_flight is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--max-body-bytes-in-flight", "lots"])
