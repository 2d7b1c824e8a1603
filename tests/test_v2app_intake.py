"""V2App's body timeout: a body that stops coming is answered 408, in
process (a scripted ``receive``) and under a real uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import socket
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import binproto
from binproto import LocalProtocolError
from binproto.adapters import _asgi_reader
from binproto.adapters.asgi import Message, V2App
from tests.servers import request_bytes


def _request(n: int = 1000) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """The headers and body of an echo request of ``n`` FP32 elements."""
    body = binproto.encode_request({"input0": np.arange(n, dtype=np.float32)})
    headers = [(k.lower().encode(), v.encode()) for k, v in body.headers]
    return headers, bytes(body)


def _scope(headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {
        "type": "http",
        "http_version": "1.1",
        "method": "POST",
        "path": "/v2/models/echo/infer",
        "raw_path": b"/v2/models/echo/infer",
        "root_path": "",
        "headers": headers,
    }


async def _serve(
    app: V2App, pieces: list[tuple[float, bytes]], content_length: int | None = None
) -> list[dict[str, Any]]:
    """Call ``app`` with a body sent as ``pieces`` (a delay, then the bytes);
    after the last, ``receive`` waits forever unless the last piece ended
    the body. ``content_length`` replaces the request's. Returns what the app sent."""
    headers, _ = _request()
    if content_length is not None:
        headers = [(k, b"%d" % content_length if k == b"content-length" else v) for k, v in headers]
    queue = list(pieces)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if not queue:
            await asyncio.Event().wait()  # (a client that sends nothing more)
        delay, data = queue.pop(0)
        await asyncio.sleep(delay)
        return {"type": "http.request", "body": data, "more_body": bool(queue)}

    async def send(message: Message) -> None:
        sent.append(dict(message))

    # (Bounded: without a body timeout a stalled body would hang the test.)
    await asyncio.wait_for(app(_scope(headers), receive, send), 5)
    return sent


def _answer(sent: list[dict[str, Any]]) -> tuple[int, dict[bytes, bytes], bytes]:
    start = sent[0]
    body = b"".join(bytes(m.get("body", b"")) for m in sent[1:])
    return start["status"], dict(start["headers"]), body


def _stalling(body: bytes, keep: int) -> list[tuple[float, bytes]]:
    """The first ``keep`` bytes of ``body`` and then nothing (a last piece
    that never comes: ``receive`` waits for it)."""
    return [(0.0, body[:keep]), (3600.0, body[keep:])]


@pytest.mark.parametrize("keep", [0, 100, 4000 - 1])
def test_a_body_that_stops_coming_is_answered_408(keep: int) -> None:
    _, body = _request()
    app = V2App(body_timeout=0.2)
    pieces = _stalling(body, keep) if keep else [(3600.0, body)]
    start = time.monotonic()
    sent = asyncio.run(_serve(app, pieces))
    elapsed = time.monotonic() - start
    status, headers, payload = _answer(sent)
    assert status == 408
    assert headers[b"connection"] == b"close"  # the rest of the body is not waited for
    error = json.loads(payload)["error"]
    assert "timed out waiting for the body" in error and "0.2 s" in error
    # One timeout, checked a quarter of it late at most (plus the loop's own slack).
    assert 0.2 <= elapsed < 0.2 + 0.05 + 0.5
    assert app.body_bytes_in_flight == 0


def test_a_body_too_big_to_drop_that_stops_coming_is_answered_408_and_closed() -> None:
    # Past what is read and dropped for an answer: the close comes from the
    # stall itself, not from a failed drop.
    _, body = _request()
    sent = asyncio.run(
        _serve(V2App(body_timeout=0.2), _stalling(body, 10), content_length=300 << 20)
    )
    status, headers, _ = _answer(sent)
    assert status == 408 and headers[b"connection"] == b"close"


def test_under_trio_the_body_timeout_is_not_applied() -> None:
    trio = pytest.importorskip("trio")
    headers, body = _request()
    sent: list[Message] = []
    first = [body[:100]]

    async def receive() -> dict[str, Any]:
        if first:
            return {"type": "http.request", "body": first.pop(), "more_body": True}
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        sent.append(message)

    async def main() -> bool:
        with trio.move_on_after(0.6) as waited:
            await V2App(body_timeout=0.1)(_scope(headers), receive, send)
        return bool(waited.cancelled_caught)

    assert trio.run(main)  # still waiting for the body at 6 times the timeout
    assert sent == [] and not first


def test_a_slow_body_that_keeps_moving_is_read() -> None:
    # Inactivity, not a deadline: each piece comes within the timeout, the
    # whole body takes three times as long.
    _, body = _request()
    third = len(body) // 3
    pieces = [
        (0.1, body[:third]),
        (0.1, body[third : 2 * third]),
        (0.1, body[2 * third :]),
    ]
    start = time.monotonic()
    sent = asyncio.run(_serve(V2App(body_timeout=0.15), pieces))
    assert time.monotonic() - start >= 0.3
    status, _, payload = _answer(sent)
    assert status == 200
    decoded = binproto.decode_response(payload, header_length=_header_length(sent))
    assert np.array_equal(decoded.tensors["input0"], np.arange(1000, dtype=np.float32))


def _header_length(sent: list[dict[str, Any]]) -> int:
    """The response's JSON header length (the whole body when it is all JSON)."""
    headers: dict[bytes, bytes] = dict(sent[0]["headers"])
    return int(headers.get(b"inference-header-content-length", headers[b"content-length"]))


def test_without_a_body_timeout_a_stalled_body_is_waited_for() -> None:
    _, body = _request()

    async def main() -> bool:
        task = asyncio.ensure_future(_serve(V2App(body_timeout=None), _stalling(body, 100)))
        await asyncio.sleep(0.5)
        waiting = not task.done()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return waiting

    assert asyncio.run(main())


def test_a_cancelled_request_is_not_taken_for_a_stall() -> None:
    # The server cancels the app (shutting down): the cancellation goes on,
    # no 408 is sent, and the timer lets go of the request.
    _, body = _request()
    sent: list[dict[str, Any]] = []

    async def main() -> None:
        async def serve() -> None:
            sent.extend(await _serve(V2App(body_timeout=5), _stalling(body, 100)))

        task = asyncio.ensure_future(serve())
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert sent == []
    stalls = _asgi_reader._last_stalls
    assert stalls is not None and not stalls.waiting  # the timer let go of it


def test_a_shorter_timeout_is_checked_at_its_own_pace() -> None:
    # A request with a long timeout arms the loop's check for its period;
    # one with a short timeout, after it, is still answered on time.
    _, body = _request()

    async def main() -> float:
        slow = asyncio.ensure_future(_serve(V2App(body_timeout=4), _stalling(body, 100)))
        await asyncio.sleep(0.05)
        start = time.monotonic()
        sent = await _serve(V2App(body_timeout=0.2), _stalling(body, 100))
        elapsed = time.monotonic() - start
        assert _answer(sent)[0] == 408
        slow.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await slow
        return elapsed

    assert asyncio.run(main()) < 0.2 + 0.05 + 0.5


def test_a_refused_request_whose_body_stalls_is_answered_and_closed() -> None:
    # An unknown model: the answer waits for the rest of the body (so that
    # the client sees it), but a body that stalls is not waited for again.
    # (A body too big to be read ahead: the model is looked up first.)
    headers, body = _request(100_000)
    scope = {
        **_scope(headers),
        "path": "/v2/models/nope/infer",
        "raw_path": b"/v2/models/nope/infer",
    }
    queue = _stalling(body, 10_000)  # (the JSON header and some tensor bytes)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if len(queue) == 1:
            await asyncio.Event().wait()
        delay, data = queue.pop(0)
        await asyncio.sleep(delay)
        return {"type": "http.request", "body": data, "more_body": True}

    async def send(message: Message) -> None:
        sent.append(dict(message))

    asyncio.run(asyncio.wait_for(V2App(body_timeout=0.2)(scope, receive, send), 5))
    status, answer_headers, _ = _answer(sent)
    assert status == 404
    assert answer_headers[b"connection"] == b"close"


def test_each_event_loop_keeps_its_own_stall_check() -> None:
    # Servers that run a loop per thread alternate loops: each keeps its
    # one check, and a loop that is gone takes its check along.
    async def current() -> Any:
        return _asgi_reader._stalls()

    first, second = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        a = first.run_until_complete(current())
        b = second.run_until_complete(current())
        assert a is not b
        assert first.run_until_complete(current()) is a
        assert second.run_until_complete(current()) is b
    finally:
        first.close()
        second.close()
    gone = weakref.ref(first)
    del first, a
    gc.collect()
    assert gone() is None  # (the check does not keep its loop alive)


@pytest.mark.parametrize("bad", [0, -1, float("nan"), "30", True])
def test_a_body_timeout_is_a_positive_number_or_none(bad: Any) -> None:
    with pytest.raises(LocalProtocolError, match="body_timeout"):
        V2App(body_timeout=bad)


@contextlib.contextmanager
def _uvicorn(app: V2App) -> Iterator[int]:
    """``app`` under a real uvicorn in a thread; yields its port."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def _until_closed(sock: socket.socket) -> bytes:
    out = bytearray()
    with contextlib.suppress(ConnectionError):
        while data := sock.recv(65536):
            out += data
    return bytes(out)


def test_under_uvicorn_a_stalled_body_is_answered_408_and_closed() -> None:
    wire = request_bytes({"input0": np.zeros(1000, dtype=np.float32)})
    with _uvicorn(V2App(body_timeout=0.5)) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            start = time.monotonic()
            sock.sendall(wire[:-100])
            received = _until_closed(sock)
            elapsed = time.monotonic() - start
    assert received.startswith(b"HTTP/1.1 408 "), received[:200]
    assert b"timed out waiting for the body" in received
    assert b"connection: close" in received.lower()
    assert 0.5 <= elapsed < 0.5 + 0.125 + 0.5


def test_the_v2app_instruction_loop_answers_each_request_with_the_echo() -> None:
    # benchmarks.instructions' request-v2app loop asserts a 200 with the
    # tensor echoed for each request: its count is of real work.
    from benchmarks.instructions import loop

    loop("request-v2app", 50)
