"""The servers binproto's are measured against: the floors under them.

``python -m benchmarks.floor_servers KIND PORT`` serves on 127.0.0.1:PORT until
killed. Each answers every POST with a fixed 4 KiB body after reading the whole
request body, and does no inference work, so its request rate is the most any
server built on the same layer can reach:

- ``bare``: an ``asyncio.Protocol`` with a minimal HTTP/1.1 reader (request
  line and headers up to the blank line, then ``Content-Length`` bytes); the
  floor of asyncio itself.
- ``h11``: an ``asyncio.Protocol`` driving ``h11``; the floor of binproto's own
  servers, which parse HTTP with h11.
- ``h11-trio``: the ``h11`` floor on trio (a task per connection, trio's
  socket stream): the floor of binproto's trio server, whose event loop costs
  more per request than asyncio's.
- ``h11-codec``: the ``h11`` floor doing an echo with binproto's codec and
  nothing else (``decode_request`` of the whole body, ``encode_response``, no
  routing, limits, timeouts or handler): the most any h11 server doing this
  echo with this codec can reach; what binproto's servers lose below it is
  their own machinery.
- ``asgi``: a trivial ASGI app (reads the body, fixed answer), served by
  ``python -m uvicorn benchmarks.floor_servers:asgi_app``; the floor of an ASGI
  app under uvicorn.
- ``asgi-codec``: the ``asgi`` floor doing an echo with binproto's codec and
  nothing else (``decode_request`` of the whole body, ``encode_response``,
  one body message; no routing, limits or handler), served by uvicorn as
  ``benchmarks.floor_servers:asgi_codec_app``: the most any ASGI app doing
  this echo with this codec reaches under uvicorn.
- ``timed_asgi_app``, ``timed_asgi_codec_app``, ``timed_v2app``: those apps,
  each wrapped by :func:`timed`, which adds up the CPU time each step takes
  (for ``benchmarks/bench_asgi_steps.py``).
- ``binproto-asgi``: binproto's bare ASGI echo app (docs/adapters.md's shape), served
  by uvicorn as ``benchmarks.floor_servers:binproto_asgi_app``.
- ``binproto-v2app``: binproto's whole V2 server as an ASGI app (``V2App``,
  the echo model), served by uvicorn as ``benchmarks.floor_servers:v2app``.
- ``binproto-cpu1`` and ``binproto-cpu2``: ``binproto serve`` of an echo that
  spends ~1 ms of CPU a request (``cpu_models``), on one worker and on two.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any, cast

import h11

import binproto
from binproto.adapters.asgi import EncodedResponse, V2App, error_response, read_request
from binproto.adapters.server import InferRequest, Model

ANSWER = b"x" * 4096
_HEADERS = [("Content-Type", "application/octet-stream"), ("Content-Length", "4096")]
_BARE_HEAD = (
    b"HTTP/1.1 200 OK\r\n"
    + b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in _HEADERS)
    + b"\r\n"
)


class BareProtocol(asyncio.Protocol):
    """Reads heads and Content-Length bodies by hand; answers each with ANSWER."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are no asyncio.Transport subclasses, though they
        # have its methods: a cast, not an isinstance check)
        self.transport = cast(asyncio.Transport, transport)
        self.buffer = bytearray()
        self.body_left = -1  # -1: reading a head

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            if self.body_left < 0:
                end = self.buffer.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = bytes(self.buffer[:end]).lower()
                del self.buffer[: end + 4]
                start = head.find(b"content-length:")
                self.body_left = 0
                if start >= 0:
                    stop = head.find(b"\r\n", start)
                    self.body_left = int(head[start + 15 : stop if stop >= 0 else None])
            take = min(self.body_left, len(self.buffer))
            del self.buffer[:take]
            self.body_left -= take
            if self.body_left:
                return
            self.body_left = -1
            self.transport.write(_BARE_HEAD + ANSWER)


class H11Protocol(asyncio.Protocol):
    """h11 parses each request; the body is read to its end, then ANSWER sent."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are no asyncio.Transport subclasses, though they
        # have its methods: a cast, not an isinstance check)
        self.transport = cast(asyncio.Transport, transport)
        self.conn = h11.Connection(h11.SERVER)

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        conn.receive_data(data)
        while True:
            event = conn.next_event()
            if event is h11.PAUSED and conn.our_state is h11.DONE:
                conn.start_next_cycle()
                continue
            if not isinstance(event, h11.Event):  # NEED_DATA, or PAUSED mid-request
                return
            if type(event) is h11.EndOfMessage:
                self.transport.write(self.answer())
                conn.start_next_cycle()
            elif type(event) is h11.ConnectionClosed:
                self.transport.close()
                return
            else:
                self.received(event)

    def received(self, event: h11.Event) -> None:
        """A request head or a piece of its body (the floor drops them)."""

    def answer(self) -> bytes:
        """The response to the request just read, as bytes to write."""
        conn = self.conn
        head = conn.send(h11.Response(status_code=200, headers=_HEADERS))
        return head + conn.send(h11.Data(data=ANSWER)) + conn.send(h11.EndOfMessage())


class H11CodecProtocol(H11Protocol):
    """The h11 floor, but the body is decoded whole by binproto and each input
    echoed as the output of its name (a GET gets an empty 200)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.request: h11.Request | None = None
        self.parts: list[bytes] = []

    def received(self, event: h11.Event) -> None:
        if type(event) is h11.Request:
            self.request, self.parts = event, []
        elif type(event) is h11.Data:
            self.parts.append(event.data)

    def answer(self) -> bytes:
        conn, request = self.conn, self.request
        assert request is not None
        if request.method != b"POST":
            head = conn.send(h11.Response(status_code=200, headers=[("Content-Length", "0")]))
            return head + conn.send(h11.EndOfMessage())
        hl = binproto.header_length_from(request.headers.raw_items())
        decoded = binproto.decode_request(b"".join(self.parts), header_length=hl)
        out = binproto.encode_response(decoded.tensors, model_name="echo", request=decoded.header)
        headers = binproto.message_headers(out.header_length, out.content_length)
        head = conn.send(h11.Response(status_code=200, headers=headers))
        data = conn.send(h11.Data(data=b"".join(out.buffers)))
        return head + data + conn.send(h11.EndOfMessage())


async def asgi_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A trivial ASGI app: read the request body, answer ANSWER."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/octet-stream")],
        }
    )
    await send({"type": "http.response.body", "body": ANSWER})


async def asgi_codec_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The trivial ASGI app doing the echo with binproto's codec, and nothing else."""
    if scope["type"] != "http":
        return
    parts = []
    more = True
    while more:
        message = await receive()
        parts.append(message.get("body", b""))
        more = message.get("more_body", False)
    if scope["method"] != "POST":  # (the readiness probe), as the h11 codec floor answers
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    hl = binproto.header_length_from(scope["headers"])
    decoded = binproto.decode_request(b"".join(parts), header_length=hl)
    out = binproto.encode_response(decoded.tensors, model_name="echo", request=decoded.header)
    await send({"type": "http.response.start", "status": 200, "headers": out.raw_headers})
    await send({"type": "http.response.body", "body": b"".join(out.buffers)})


async def binproto_asgi_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """binproto's bare ASGI echo app, as docs/adapters.md shows it."""
    if scope["type"] != "http":
        return
    try:
        request = await read_request(scope, receive)
    except binproto.ProtocolError as exc:
        await error_response(exc)(scope, receive, send)
        return
    body = binproto.encode_response(request.tensors, model_name="echo", request=request.header)
    await EncodedResponse(body)(scope, receive, send)


#: binproto's V2 server as an ASGI app, with the echo model.
v2app = V2App()

#: CPU time the ``cpu_models`` echo spends on each request, in seconds.
CPU_SECONDS = 0.001


async def _busy_echo(request: InferRequest) -> dict[str, Any]:
    """The echo, after ~1 ms of CPU work: what more processes make faster."""
    tensors = await request.tensors()
    end = time.thread_time() + CPU_SECONDS
    while time.thread_time() < end:
        pass
    return tensors


def cpu_models() -> list[Model]:
    """``echo`` spending ~1 ms of CPU a request (``binproto serve
    benchmarks.floor_servers:cpu_models [--workers N]``)."""
    return [Model("echo", _busy_echo)]


async def _trio_connection(stream: Any) -> None:
    """The h11 floor's work for one trio connection."""
    import trio

    conn = h11.Connection(h11.SERVER)
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(65536))
            elif type(event) is h11.EndOfMessage:
                head = conn.send(h11.Response(status_code=200, headers=_HEADERS))
                await stream.send_all(
                    head + conn.send(h11.Data(data=ANSWER)) + conn.send(h11.EndOfMessage())
                )
                if conn.our_state is h11.MUST_CLOSE:  # Connection: close, HTTP/1.0
                    return
                conn.start_next_cycle()
            elif type(event) is h11.ConnectionClosed or event is h11.PAUSED:
                return
    except (trio.BrokenResourceError, h11.ProtocolError):
        # The client went away (wrk resets its connections at the end), or
        # sent what h11 refuses: that connection ends, the server goes on.
        return
    finally:
        await stream.aclose()


def _serve_trio(port: int) -> None:
    import trio

    trio.run(lambda: trio.serve_tcp(_trio_connection, port, host="127.0.0.1", backlog=2048))


async def _serve(kind: str, port: int) -> None:
    factory = {"bare": BareProtocol, "h11": H11Protocol, "h11-codec": H11CodecProtocol}[kind]
    loop = asyncio.get_running_loop()
    server = await loop.create_server(factory, "127.0.0.1", port, backlog=2048)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    if sys.argv[1] == "h11-trio":
        _serve_trio(int(sys.argv[2]))
    else:
        asyncio.run(_serve(sys.argv[1], int(sys.argv[2])))


#: Where a :func:`timed` app writes its step totals when the server stops.
STEPS_OUT = "BINPROTO_STEPS_OUT"


def timed(app: Any) -> Any:
    """``app`` with the CPU time of its thread added up per step: its
    ``receive`` calls, the response start, the body messages, and its own
    work (the rest). Only POST requests count; a GET (the readiness probe)
    starts the count again. At the lifespan's shutdown the totals
    (nanoseconds) and the request count are written as JSON to the file
    named by :data:`STEPS_OUT`."""
    totals = {"receive": 0, "own work": 0, "send the start": 0, "send the body": 0}
    count = 0

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        nonlocal count
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            with open(os.environ[STEPS_OUT], "w") as f:
                json.dump({"requests": count, "ns": totals}, f)
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["method"] != "POST":
            for step in totals:
                totals[step] = 0
            count = 0
            await app(scope, receive, send)
            return
        spent = 0

        async def timed_receive() -> Any:
            nonlocal spent
            start = time.thread_time_ns()
            message = await receive()
            took = time.thread_time_ns() - start
            totals["receive"] += took
            spent += took
            return message

        async def timed_send(message: dict[str, Any]) -> None:
            nonlocal spent
            start = time.thread_time_ns()
            await send(message)
            took = time.thread_time_ns() - start
            start_message = message["type"] == "http.response.start"
            totals["send the start" if start_message else "send the body"] += took
            spent += took

        start = time.thread_time_ns()
        await app(scope, timed_receive, timed_send)
        totals["own work"] += time.thread_time_ns() - start - spent
        count += 1

    return wrapped


timed_asgi_app = timed(asgi_app)
timed_asgi_codec_app = timed(asgi_codec_app)
timed_v2app = timed(V2App())
