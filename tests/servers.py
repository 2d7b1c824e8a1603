"""binproto's own servers on each backend, for tests: a server in a thread
with its own event loop, over loopback."""

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

__all__ = ["BACKENDS", "Running", "connect", "read_all", "request_bytes", "serving"]


#: asyncio receiving in place, asyncio through streams, trio.
class Running:
    """A server on one backend, in a thread with its own event loop."""

    def __init__(self, backend: str, app: V2Server) -> None:
        self.backend = backend
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
        else:
            asyncio.run(self._asyncio(app))

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
