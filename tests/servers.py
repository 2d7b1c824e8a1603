"""binproto's own servers on each backend, for tests: a server in a thread
with its own event loop, over loopback. ``uvicorn`` serves the same models
through :class:`~binproto.adapters.asgi.V2App` under a real uvicorn."""

from __future__ import annotations

import asyncio
import functools
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import trio

import binproto
from binproto.adapters import asyncio as ba
from binproto.adapters import trio as bt
from binproto.adapters._server import V2Server
from binproto.adapters.asgi import V2App

__all__ = [
    "ALL_BACKENDS",
    "BACKENDS",
    "Running",
    "as_v2app",
    "connect",
    "read_all",
    "request_bytes",
    "serving",
]


def as_v2app(server: V2Server) -> V2App:
    """The ASGI app serving what ``server`` serves, with its options."""
    return V2App(
        list(server.app.models.values()),
        limits=server.limits,
        name=server.name,
        compress_responses=server.compress_responses,
        compression_level=server.compression_level,
        max_body_bytes_in_flight=server.max_body_bytes_in_flight,
    )


#: asyncio receiving in place, asyncio through streams, trio.
class Running:
    """A server on one backend, in a thread with its own event loop."""

    def __init__(self, backend: str, app: V2Server, *, http: str = "auto") -> None:
        self.backend = backend
        self.http = http  # uvicorn's HTTP implementation: "auto", "h11" or "httptools"
        self.port = 0
        self._ready = threading.Event()
        self._stop: Callable[[], object] | None = None
        self._thread = threading.Thread(target=self._run, args=(app,), daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    def _started(self, port: int) -> None:
        self.port = port
        self._ready.set()

    def _run(self, app: V2Server) -> None:
        if self.backend == "trio":
            trio.run(self._trio, app)
        elif self.backend == "uvicorn":
            asyncio.run(self._uvicorn(app))
        else:
            asyncio.run(self._asyncio(app))

    async def _uvicorn(self, app: V2Server) -> None:
        import uvicorn

        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        config = uvicorn.Config(as_v2app(app), log_level="warning", lifespan="off", http=self.http)
        server = uvicorn.Server(config)
        loop = asyncio.get_running_loop()

        def stop() -> None:
            server.should_exit = True

        self._stop = lambda: loop.call_soon_threadsafe(stop)
        # (Off the main thread uvicorn installs no signal handlers.)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        self._started(sock.getsockname()[1])
        await task
        sock.close()

    async def _trio(self, app: V2Server) -> None:
        async with trio.open_nursery() as nursery:
            token = trio.lowlevel.current_trio_token()
            self._stop = lambda: token.run_sync_soon(nursery.cancel_scope.cancel)
            await nursery.start(functools.partial(bt.serve, app, ready=self._started))

    async def _asyncio(self, app: V2Server) -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        self._stop = lambda: loop.call_soon_threadsafe(task.cancel)
        zero_copy = self.backend == "asyncio"
        try:
            await ba.serve(app, port=0, zero_copy=zero_copy, ready=self._started)
        except asyncio.CancelledError:
            pass

    def close(self) -> None:
        assert self._stop is not None
        self._stop()
        self._thread.join(10)


BACKENDS = ["asyncio", "asyncio-streams", "trio"]
#: With V2App under uvicorn: for what the V2 application answers (not the HTTP loop's own work).
ALL_BACKENDS = [*BACKENDS, "uvicorn"]


def serving(backend: str, app: V2Server) -> Iterator[Running]:
    """``app`` served on ``backend`` while the caller (a fixture) yields."""
    running = Running(backend, app)
    try:
        yield running
    finally:
        running.close()


def connect(port: int) -> socket.socket:
    """A connection to the server on ``port`` of loopback."""
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def read_all(sock: socket.socket) -> bytes:
    """Everything until the server closes."""
    out = bytearray()
    while data := sock.recv(65536):
        out += data
    return bytes(out)


def request_bytes(arrays: dict[str, Any]) -> bytes:
    """An echo request of ``arrays``, head and body."""
    body = binproto.encode_request(arrays)
    head = "POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in body.headers)
    return head.encode() + b"\r\n" + bytes(body)
