"""A small request body that arrives whole with its head is decoded whole
(``MessageBody`` over ``decode_request``): the same header, tensors, events and
faults as when the same body arrives in pieces through the parser."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import h11
import numpy as np
import pytest

import binproto
from binproto.adapters._intake import WHOLE_BODY
from binproto.adapters._server import (
    BodyReader,
    MessageBody,
    Model,
    V2Server,
    echo_model,
)
from tests.helpers import make_body, normalize

from .fakes import MemoryStream


def message(wire: bytes, header_length: int | None, *, with_head: bool) -> MessageBody:
    """The body of a request whose bytes came with its head, or come after it."""
    conn = h11.Connection(h11.SERVER)
    head = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
    conn.receive_data(head % len(wire) + (wire if with_head else b""))
    assert isinstance(conn.next_event(), h11.Request)
    stream = MemoryStream(b"" if with_head else wire, most=7, sending=False)
    claims = binproto.BodyClaims(len(wire), None, header_length)
    return MessageBody(
        "request", claims, BodyReader(stream, conn, len(wire), receive_in_place=False)
    )


def request(nbytes: int = 4096) -> tuple[bytes, int | None, dict[str, Any]]:
    inputs = {
        "x": np.arange(nbytes // 4, dtype=np.float32),
        "flags": np.array([True, False]),
        "words": np.array([b"a", b"bc"], dtype=object),
        "json": [1, 2, 3],
    }
    body = binproto.encode_request(inputs)
    return bytes(body), body.header_length, inputs


def test_a_small_body_here_whole_is_decoded_whole() -> None:
    wire, hl, inputs = request()

    async def main(with_head: bool) -> tuple[MessageBody, dict[str, Any]]:
        body = message(wire, hl, with_head=with_head)
        header = await body.read_header()
        assert [t.name for t in header.tensors] == list(inputs)
        tensors = await body.tensors()
        assert body.complete
        await body.drain()
        return body, tensors

    whole, whole_tensors = asyncio.run(main(True))
    pieces, piece_tensors = asyncio.run(main(False))
    assert whole.assembler is None  # no events, no assembler
    assert pieces.assembler is not None
    for name in inputs:
        np.testing.assert_array_equal(whole_tensors[name], piece_tensors[name])
        assert whole_tensors[name].dtype == piece_tensors[name].dtype
    assert whole_tensors["x"].flags.writeable  # memory of its own, as the assembler's
    whole_tensors["x"][0] = 7.0


def spy_parsers(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make the server note each parser it builds from now on: their kinds."""
    built: list[str] = []

    class Spy(binproto.Parser):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            built.append(args[0])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr("binproto.adapters._intake.Parser", Spy)
    return built


def test_a_body_decoded_whole_builds_no_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    built = spy_parsers(monkeypatch)
    wire, hl, _ = request()

    async def main(with_head: bool, events: bool) -> MessageBody:
        body = message(wire, hl, with_head=with_head)
        await body.read_header()
        if events:
            await _all_events(body, until_complete=False)
        else:
            await body.tensors()
        assert body.complete and not body.failed
        return body

    asyncio.run(main(with_head=True, events=False))
    assert built == []  # decoded whole, taken whole: no parser
    asyncio.run(main(with_head=True, events=True))
    assert built == ["request"]  # its events are the parser's
    asyncio.run(main(with_head=False, events=False))
    assert built == ["request", "request"]  # in pieces: through the parser


def test_a_body_over_the_bound_or_in_pieces_goes_through_the_parser() -> None:
    wire, hl, _ = request(WHOLE_BODY)
    assert len(wire) > WHOLE_BODY

    async def main() -> MessageBody:
        body = message(wire, hl, with_head=True)
        await body.read_header()
        await body.tensors()
        return body

    assert asyncio.run(main()).assembler is not None


async def _all_events(body: MessageBody, until_complete: bool) -> list[Any]:
    """Every event of ``body``: by ``async for``, or as a handler may take
    them, calling next_event() until the body is complete."""
    if not until_complete:
        return [event async for event in body]
    events = []
    while not body.complete:
        events.append(await body.next_event())
    return events


@pytest.mark.parametrize("until_complete", [False, True])
def test_events_of_a_body_decoded_whole_are_the_parsers(until_complete: bool) -> None:
    wire, hl, _ = request()

    async def main(with_head: bool) -> list[Any]:
        body = message(wire, hl, with_head=with_head)
        await body.read_header()
        events = await _all_events(body, until_complete)
        assert body.complete
        return events

    whole, pieces = asyncio.run(main(True)), asyncio.run(main(False))
    assert normalize(whole) == normalize(pieces)
    assert type(whole[-1]) is binproto.MessageComplete


def test_destinations_get_a_body_decoded_whole() -> None:
    wire, hl, inputs = request()
    into = np.zeros(1024, dtype=np.float32)

    async def main() -> dict[str, Any]:
        body = message(wire, hl, with_head=True)
        await body.read_header()
        return await body.tensors({"x": into})

    tensors = asyncio.run(main())
    assert tensors["x"] is into
    np.testing.assert_array_equal(into, inputs["x"])


TENSOR = {"name": "b", "datatype": "BOOL", "shape": [2], "parameters": {"binary_data_size": 2}}
FAULTS = {
    "bool byte": make_body({"inputs": [TENSOR]}, b"\x01\x02"),
    "short of its claim": make_body({"inputs": [TENSOR]}, b"\x01"),
    "bytes after its tensors": make_body({"inputs": [TENSOR]}, b"\x01\x00\x00"),
    "bad json": (b'{"inputs": [}', 13),
    "repeated key": (b'{"inputs":[],"inputs":[]}', 25),
    "plain json with binary": (json.dumps({"inputs": [TENSOR]}).encode() + b"\x01\x00", None),
}


@pytest.mark.parametrize("case", FAULTS)
def test_faults_of_a_body_decoded_whole_are_the_parsers(case: str) -> None:
    wire, hl = FAULTS[case]

    async def main(with_head: bool) -> tuple[str, int, int | None]:
        body = message(wire, hl, with_head=with_head)
        with pytest.raises(binproto.RemoteProtocolError) as exc:
            await body.read_header()
            await body.tensors()
        return exc.value.msg, exc.value.status_hint, exc.value.offset

    assert asyncio.run(main(True)) == asyncio.run(main(False))


def test_after_tensors_no_events_are_left_as_through_the_parser() -> None:
    wire, hl, inputs = request()

    async def main(with_head: bool) -> tuple[list[Any], list[str], str]:
        body = message(wire, hl, with_head=with_head)
        await body.read_header()
        first = await body.tensors()
        assert body.complete
        left = [event async for event in body]
        assert await body.tensors() is first  # the same arrays again
        with pytest.raises(binproto.LocalProtocolError) as exc:
            await body.next_event()
        return left, list(first), str(exc.value)

    whole, parsed = asyncio.run(main(True)), asyncio.run(main(False))
    assert whole == parsed and whole[:2] == ([], list(inputs))


def test_arrays_of_a_body_decoded_whole_are_aligned() -> None:
    # An odd-sized tensor before a float64 one: views of one buffer would be
    # misaligned; the assembler's arrays never are.
    inputs: dict[str, np.ndarray[Any, Any]] = {
        "a": np.arange(16, dtype=np.float64),
        "odd": np.arange(3, dtype=np.int8),
        "b": np.arange(4, dtype=np.float64),
    }
    encoded = binproto.encode_request(inputs, id="a")
    wire, hl = bytes(encoded), encoded.header_length

    async def main() -> dict[str, Any]:
        body = message(wire, hl, with_head=True)
        await body.read_header()
        tensors = await body.tensors()
        assert body.assembler is None  # decoded whole
        return tensors

    tensors = asyncio.run(main())
    assert tensors["a"].ctypes.data % 16 == 0  # the first tensor: aligned in place
    for name, array in inputs.items():
        assert tensors[name].flags.aligned and tensors[name].flags.writeable
        np.testing.assert_array_equal(tensors[name], array)


def test_a_64_kib_tensor_sent_at_once_is_decoded_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    # The first read of a head takes a body of WHOLE_BODY bytes with it, and a
    # 64 KiB tensor with its JSON header is within WHOLE_BODY: no parser.
    built = spy_parsers(monkeypatch)
    x = np.arange(16384, dtype=np.float32)
    body = binproto.encode_request({"x": x}, binary_data_output=True)
    head = (
        b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
    ) % (body.header_length or 0, body.content_length)
    assert body.content_length <= WHOLE_BODY
    stream = MemoryStream(head + bytes(body))
    asyncio.run(V2Server().serve_connection(stream))
    assert stream.sent.startswith(b"HTTP/1.1 200 ")
    assert x.tobytes() in stream.sent  # echoed
    assert built == []


def test_a_request_that_came_while_the_server_was_busy_is_decoded_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The second request arrives while the first one's handler runs: nobody
    # waits to read it, and the bytes kept for the next read must still hold
    # all of it with its head (a 64 KiB buffer held the head and 64 KiB).
    from binproto.adapters.asyncio import close_server, start_server

    started, release = asyncio.Event(), asyncio.Event()

    async def slow(request: Any) -> dict[str, Any]:
        tensors: dict[str, Any] = await request.tensors()
        started.set()
        await release.wait()
        return tensors

    x = np.arange(16384, dtype=np.float32)  # 64 KiB
    body = binproto.encode_request({"x": x}, binary_data_output=True)
    wire = bytes(body)

    def post(model: str) -> bytes:
        return (
            b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: x\r\n"
            b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
        ) % (model.encode(), body.header_length or 0, len(wire)) + wire

    async def main() -> tuple[bytes, list[str]]:
        server = V2Server([Model("slow", slow), echo_model()])
        srv = await start_server(server, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("slow"))
        await asyncio.wait_for(started.wait(), 10)  # the handler has the first request
        built = spy_parsers(monkeypatch)
        writer.write(post("echo"))
        await writer.drain()
        await asyncio.sleep(0.1)  # the idle loop reads it, unasked
        release.set()
        received = b""
        while received.count(x.tobytes()) < 2:
            chunk = await asyncio.wait_for(reader.read(1 << 20), 10)
            assert chunk, received[:200]
            received += chunk
        writer.close()
        await close_server(srv)
        return received, built

    received, built = asyncio.run(main())
    assert received.startswith(b"HTTP/1.1 200 ") and received.count(b"HTTP/1.1 200 ") == 2
    assert built == []  # the second request too was decoded whole
