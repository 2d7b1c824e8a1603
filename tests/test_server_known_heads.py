"""The server reads a repeated request head with h11 twice (``KnownHeads``):
the same answers as when h11 reads every head, and heads whose reading h11
must see through (100-continue, chunked bodies, protocol switches,
pipelined or split heads, big heads) are read by h11 each time."""

from __future__ import annotations

import asyncio
import itertools
import re
from typing import Any

import h11
import numpy as np
import pytest

import binproto
from binproto import HeaderFields
from binproto._http import SEEN_PER_KEPT
from binproto.adapters._server import (
    REMEMBERED_HEAD_BYTES,
    REMEMBERED_HEADS,
    KnownHeads,
    V2Server,
    echo_model,
)
from binproto.adapters.h11 import fields_of

from .fakes import MemoryStream, MemoryStreamInto


def head_for(body: binproto.EncodedBody) -> bytes:
    """The head of an echo request carrying ``body``."""
    return (
        b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n"
        b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
    ) % (body.header_length or 0, body.content_length)


BODY = binproto.encode_request({"x": np.arange(16, dtype=np.float32)}, binary_data_output=True)
WIRE = bytes(BODY)
HEAD = head_for(BODY)
REQUEST = HEAD + WIRE
HL = BODY.header_length or 0


def serve(reads: list[bytes], server: V2Server | None = None) -> tuple[bytes, int]:
    """What the server wrote for ``reads`` on one connection, and how many
    request heads h11 read."""
    heads = [0]
    original = h11.Connection.next_event

    def counting(self: h11.Connection) -> Any:
        event = original(self)
        if type(event) is h11.Request:
            heads[0] += 1
        return event

    stream = MemoryStream(*reads, whole=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(h11.Connection, "next_event", counting)
        asyncio.run((server or V2Server([echo_model()])).serve_connection(stream))
    return bytes(stream.sent), heads[0]


def answers(written: bytes) -> list[bytes]:
    """The final responses in ``written`` (interim 100s dropped), each whole."""
    out = []
    rest = written
    while rest:
        top, _, rest = rest.partition(b"\r\n\r\n")
        if top.startswith(b"HTTP/1.1 100 "):
            continue
        found = re.search(rb"(?im)^content-length: *(\d+)", top)
        assert found is not None, top
        length = int(found.group(1))
        out.append(top + b"\r\n\r\n" + rest[:length])
        rest = rest[length:]
    return out


def test_a_repeated_head_is_read_twice_and_answered_the_same() -> None:
    # The first reading notes the head, the second keeps what h11 read.
    written, heads = serve([REQUEST] * 4)
    got = answers(written)
    assert heads == 2
    assert (
        len(got) == 4
        and got[0].startswith(b"HTTP/1.1 200 ")
        and got[0].endswith(np.arange(16, dtype=np.float32).tobytes())
    )
    assert got[1] == got[2] == got[3] == got[0]  # byte for byte


def test_heads_are_known_across_connections() -> None:
    server = V2Server([echo_model()])
    first, heads = serve([REQUEST], server)
    assert heads == 1
    second, heads = serve([REQUEST], server)
    assert heads == 1 and second == first
    third, heads = serve([REQUEST], server)
    assert heads == 0 and third == first


def test_a_different_body_length_is_a_different_head() -> None:
    other = binproto.encode_request({"x": np.arange(8, dtype=np.float32)})
    request = head_for(other) + bytes(other)
    written, heads = serve([REQUEST, request] * 3)
    got = answers(written)
    assert heads == 4 and len(got) == 6
    assert got[4] == got[2] == got[0] and got[5] == got[3] == got[1] and got[0] != got[1]


def _with(*lines: bytes) -> bytes:
    """HEAD with header lines added before its end."""
    return HEAD[:-2] + b"".join(line + b"\r\n" for line in lines) + b"\r\n"


def _chunked(body: bytes) -> bytes:
    head = (
        b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        b"Inference-Header-Content-Length: %d\r\n\r\n"
    ) % (BODY.header_length or 0)
    return head + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)


@pytest.mark.parametrize(
    "reads",
    [
        # 100-continue: each request waits for its own interim answer.
        [_with(b"Expect: 100-continue"), WIRE] * 2,
        # A chunked body is read through h11.
        [_chunked(WIRE)] * 2,
        # A protocol switch is asked (and declined: the request is answered).
        [_with(b"Upgrade: h2c") + WIRE] * 2,
        # Heads too big to keep: in bytes, in header lines.
        [_with(b"X-Pad: " + b"a" * 1024) + WIRE] * 2,
        [_with(*(b"X-%d: 1" % i for i in range(40))) + WIRE] * 2,
        # A head that comes in two reads.
        [HEAD[:20], HEAD[20:] + WIRE] * 2,
        # CONNECT asks for a tunnel (refused: no such route).
        [b"CONNECT x:1 HTTP/1.1\r\nHost: x:1\r\nContent-Length: 2\r\n\r\n{}"] * 2,
        # Credentials are not kept.
        [_with(b"Authorization: Bearer secret") + WIRE] * 2,
        [_with(b"Proxy-Authorization: Basic eDp5") + WIRE] * 2,
        [_with(b"Cookie: session=secret") + WIRE] * 2,
    ],
    ids=[
        "100-continue",
        "chunked",
        "upgrade",
        "big",
        "many-lines",
        "split",
        "connect",
        "authorization",
        "proxy-authorization",
        "cookie",
    ],
)
def test_heads_h11_must_see_are_read_each_time(reads: list[bytes]) -> None:
    written, heads = serve(reads)
    got = answers(written)
    assert heads == 2
    assert len(got) == 2 and got[1] == got[0]
    if not reads[0].startswith(b"CONNECT"):
        assert got[0].startswith(b"HTTP/1.1 200 ")
        assert got[0].endswith(np.arange(16, dtype=np.float32).tobytes())
    if b"Expect" in reads[0]:
        assert written.count(b"HTTP/1.1 100 \r\n\r\n") == 2  # (h11 sends no reason phrase)


def test_a_pipelined_head_is_read_by_h11() -> None:
    # The head is known after two readings; then it comes twice in one read:
    # the second behind the first request, held by the connection before it
    # is looked at, is read by h11.
    written, heads = serve([REQUEST, REQUEST, REQUEST * 2])
    got = answers(written)
    assert heads == 3 and len(got) == 4 and got[0] == got[1] == got[2] == got[3]


def test_a_closing_head_is_answered_and_closed_each_time() -> None:
    server = V2Server([echo_model()])
    closing = _with(b"Connection: close") + WIRE
    for expected_heads in (1, 1, 0):  # read by h11 twice, then known
        # The request after it on the same connection is never read.
        written, heads = serve([closing, REQUEST], server)
        got = answers(written)
        assert heads == expected_heads
        assert len(got) == 1 and b"connection: close" in got[0].lower()


def test_a_refused_head_is_refused_each_time() -> None:
    # Only heads h11 read into a request are kept: a bad one is never known.
    server = V2Server([echo_model()])
    bad = HEAD.replace(b"Content-Length: ", b"Content-Length: x")
    for _ in range(2):
        written, heads = serve([bad + WIRE], server)
        assert written.startswith(b"HTTP/1.1 400 ") and heads == 0


@pytest.mark.parametrize(
    ("size", "reads"), [(REMEMBERED_HEAD_BYTES, 2), (REMEMBERED_HEAD_BYTES + 1, 3)]
)
def test_heads_up_to_the_size_bound_are_known(size: int, reads: int) -> None:
    head = _with(b"X-Pad: ")
    head = _with(b"X-Pad: " + b"a" * (size - len(head)))
    assert len(head) == size
    written, heads = serve([head + WIRE] * 3)
    got = answers(written)
    assert heads == reads and len(got) == 3 and got[0] == got[1] == got[2]


def _read(head: bytes) -> tuple[h11.Request, HeaderFields]:
    """What h11 reads from ``head``, and its fields."""
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(head)
    request = conn.next_event()
    assert type(request) is h11.Request
    return request, fields_of(request)


def test_known_heads_are_bounded() -> None:
    known = KnownHeads()
    request, fields = _read(HEAD)
    for i in range(REMEMBERED_HEADS):
        for _reading in range(2):  # noted, then kept
            known.remember(b"%d" % i, request, fields)
    assert known.get(b"0") == known.get(b"%d" % (REMEMBERED_HEADS - 1)) == (request, fields)
    for _reading in range(2):
        known.remember(b"one more", request, fields)  # full: the others are forgotten
    assert known.get(b"0") is None and known.get(b"one more") == (request, fields)
    # A request without Content-Length is never kept.
    get = _read(b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n")
    for _reading in range(2):
        known.remember(b"get", *get)
    assert known.get(b"get") is None


def test_a_head_read_once_is_only_noted() -> None:
    # Heads that do not come again (a body length new each time) keep no
    # request: their hashes are noted, a bounded number of them.
    known = KnownHeads()
    request, fields = _read(HEAD)
    for i in range(SEEN_PER_KEPT * REMEMBERED_HEADS):
        known.remember(b"%d" % i, request, fields)
    assert known.get(b"0") is None and known.get(b"7") is None
    known.remember(b"0", request, fields)  # noted before: kept
    assert known.get(b"0") == (request, fields)
    known.remember(b"new", request, fields)  # the notes were full: forgotten
    known.remember(b"1", request, fields)  # noted, no longer: noted again
    assert known.get(b"1") is None


def _run(server: V2Server, reads: list[bytes], kind: str) -> tuple[bytes, list[bytes]]:
    """What ``server`` wrote for ``reads`` on one connection, and what it left
    unread. The streams never wait: the coroutine runs with no event loop."""
    stream = (MemoryStreamInto if kind == "into" else MemoryStream)(
        *reads, mutable=kind == "bytearray"
    )
    coroutine = server.serve_connection(stream)
    with pytest.raises(StopIteration):
        coroutine.send(None)
    return bytes(stream.sent), stream.reads


def test_a_known_head_is_served_as_h11_would_serve_it() -> None:
    # The same reads to a server that knows no head and to one that knows
    # the head already: the same answers, and the same bytes left unread.
    lines = {
        "plain": b"",
        "closing": b"Connection: close\r\n",
        "gzip": b"Accept-Encoding: gzip\r\n",
        "obs-fold": b"X-A: a\r\n b\r\n",
        "doubled": b"Content-Length: %d\r\n",
    }
    bodies = {"ok": WIRE, "bad": b"x" * len(WIRE), "short": WIRE[:-3], "empty": b""}
    behind = [b"", b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n", b"junk\r\n\r\n"]
    targets = [b"/v2/models/echo/infer", b"/v2/models/nope/infer", b"/v2"]
    cases = hits = 0
    for method, target, version, extra, eol, body_kind, after, kind, split in itertools.product(
        [b"POST", b"GET", b"HEAD"], targets, [b"HTTP/1.1", b"HTTP/1.0"], lines.values(),
        [b"\r\n", b"\n"], bodies, behind, ["bytes", "bytearray", "into"], [False, True],
    ):  # fmt: skip
        body = bodies[body_kind]
        length = len(body) if body_kind != "short" else len(WIRE)
        head = (
            b"%s %s %s\r\nHost: x\r\nInference-Header-Content-Length: %d\r\n"
            b"Content-Length: %d\r\n%s\r\n"
        ) % (method, target, version, HL, length, extra.replace(b"%d", b"%d" % length))
        head = head.replace(b"\r\n", eol)
        if body_kind == "short":
            reads = [head + body]  # then the end
        elif split:
            reads = [head + body[:5], body[5:] + after]
        else:
            reads = [head + body + after]
        unknowing = V2Server([echo_model()])
        unknowing._heads = _Forgetful()
        expected = _run(unknowing, reads, kind)
        knowing = V2Server([echo_model()])
        for _reading in range(2):  # h11 reads the head twice; it is known if it qualifies
            _run(knowing, reads, kind)
        known = knowing._heads.get(head) is not None
        assert _run(knowing, reads, kind) == expected, (reads, kind)
        cases += 1
        hits += known
        # Every head with a Content-Length (here, all) is kept.
        assert known, head
    assert cases == hits == 3 * 3 * 2 * 5 * 2 * 4 * 3 * 3 * 2


class _Forgetful(KnownHeads):
    """Knows no head: h11 reads each one."""

    def get(self, head: bytes) -> tuple[h11.Request, HeaderFields] | None:
        return None


def test_a_server_may_remember_no_head() -> None:
    server = V2Server([echo_model()], remembered_heads=0)
    written, heads = serve([REQUEST] * 3, server)
    got = answers(written)
    assert heads == 3 and len(got) == 3 and got[0] == got[1] == got[2]


def test_a_server_remembers_as_many_heads_as_it_is_told() -> None:
    # Two heads taking turns: with room for one, each forgets the other.
    other = binproto.encode_request({"x": np.arange(8, dtype=np.float32)})
    request = head_for(other) + bytes(other)
    for room, reads in ((1, 6), (2, 4)):
        server = V2Server([echo_model()], remembered_heads=room)
        _written, heads = serve([REQUEST, request] * 3, server)
        assert heads == reads


@pytest.mark.parametrize("bad", [-1, 1.5, "64", True, None])
def test_remembered_heads_must_be_a_count(bad: Any) -> None:
    with pytest.raises(binproto.LocalProtocolError, match="remembered_heads"):
        V2Server(remembered_heads=bad)


def test_a_connection_h11_read_nothing_from_serves_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # A known head leaves the connection's h11 state as it was made: no fresh
    # one for the next request. A head h11 read needs a fresh one.
    made = [0]
    original = h11.Connection.__init__

    def counting(self: h11.Connection, *args: Any, **kwargs: Any) -> None:
        made[0] += 1
        original(self, *args, **kwargs)

    monkeypatch.setattr(h11.Connection, "__init__", counting)
    other = binproto.encode_request({"x": np.arange(8, dtype=np.float32)})
    written, heads = serve([REQUEST] * 5 + [head_for(other) + bytes(other)])
    assert heads == 3 and len(answers(written)) == 6
    # One at the start; one after each of the first two (read by h11); none
    # after the next three (known); one after the last (read by h11), before
    # the end is read.
    assert made[0] == 4
