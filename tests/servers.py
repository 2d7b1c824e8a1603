"""binproto's own servers on each backend, for tests: a server in a thread
with its own event loop, over loopback. ``uvicorn`` serves the same models
through :class:`~binproto.adapters.asgi.V2App` under a real uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import h11
import httpx
import numpy as np
import pytest
import trio

import binproto
from binproto.adapters import asyncio as ba
from binproto.adapters import trio as bt
from binproto.adapters._server import V2Server
from binproto.adapters.asgi import V2App
from binproto.adapters.h11 import request_for, send_message

__all__ = [
    "ALL_BACKENDS",
    "ASYNCIO_BACKENDS",
    "BACKENDS",
    "Running",
    "Served",
    "answering_pids",
    "as_v2app",
    "assert_served",
    "connect",
    "gone",
    "infer_bytes",
    "new_loop",
    "read_all",
    "read_response",
    "request_bytes",
    "running",
    "serve_command",
    "serving",
    "serving_here",
    "until_closed",
    "wait_ready",
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


def new_loop(kind: str = "asyncio") -> asyncio.AbstractEventLoop:
    """A new event loop: asyncio's own, or uvloop's (the test skips where it is missing)."""
    if kind == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        return loop
    return asyncio.new_event_loop()


class Running:
    """A server on one backend, in a thread with its own event loop.

    ``loop`` picks the event loop of the asyncio backends ("asyncio" or
    "uvloop"). ``options`` go to the backend's ``serve`` (``timeout``).
    """

    def __init__(
        self,
        backend: str,
        app: V2Server,
        *,
        http: str = "auto",
        loop: str = "asyncio",
        **options: Any,
    ) -> None:
        self.backend = backend
        self.http = http  # uvicorn's HTTP implementation: "auto", "h11" or "httptools"
        self.app = app
        self.port = 0
        self.options = options
        self._ready = threading.Event()
        self._stop: Callable[[], object] | None = None
        self._call_soon: Callable[[Callable[[], object]], object] | None = None
        if backend == "uvloop":  # (asyncio receiving in place, on uvloop)
            loop = "uvloop"
        self._loop = None if backend == "trio" or loop == "asyncio" else new_loop(loop)
        self._thread = threading.Thread(target=self._run, args=(app,), daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    def _started(self, port: int) -> None:
        self.port = port
        self._ready.set()

    def _run(self, app: V2Server) -> None:
        if self.backend == "trio":
            trio.run(self._trio, app)
            return
        main = self._uvicorn(app) if self.backend == "uvicorn" else self._asyncio(app)
        if self._loop is None:
            asyncio.run(main)
            return
        try:
            self._loop.run_until_complete(main)
        finally:
            self._loop.close()

    def call_soon(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` on the server's event loop (asyncio backends)."""
        assert self._call_soon is not None
        self._call_soon(fn)

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
            serve = functools.partial(bt.serve, app, ready=self._started, **self.options)
            await nursery.start(serve)

    async def _asyncio(self, app: V2Server) -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        self._stop = lambda: loop.call_soon_threadsafe(task.cancel)
        self._call_soon = loop.call_soon_threadsafe
        zero_copy = self.backend in ("asyncio", "uvloop")
        try:
            await ba.serve(app, port=0, zero_copy=zero_copy, ready=self._started, **self.options)
        except asyncio.CancelledError:
            pass

    def close(self) -> None:
        assert self._stop is not None
        self._stop()
        self._thread.join(10)


#: binproto's own HTTP/1.1 servers: asyncio receiving in place, asyncio
#: through streams, trio. For what their HTTP loops do themselves.
BACKENDS = ["asyncio", "asyncio-streams", "trio"]
#: Every way to serve the V2 application: also asyncio on uvloop, and
#: V2App under uvicorn. For what the application answers.
ALL_BACKENDS = ["asyncio", "asyncio-streams", "uvloop", "trio", "uvicorn"]
#: The asyncio server's transports and loops: for the asyncio adapter's own work.
ASYNCIO_BACKENDS = ["asyncio", "asyncio-streams", "uvloop"]


def serving(backend: str, app: V2Server, **options: Any) -> Iterator[Running]:
    """``app`` served on ``backend`` while the caller (a fixture) yields.

    ``options`` are those of :class:`Running`.
    """
    server = Running(backend, app, **options)
    try:
        yield server
    finally:
        server.close()


#: ``with running(backend, app) as server:`` in a test body.
running = contextlib.contextmanager(serving)


@contextlib.asynccontextmanager
async def serving_here(server: V2Server) -> AsyncIterator[int]:
    """``server`` on the running event loop (asyncio, in place); yields its port.

    For a client test on the same loop: no thread.
    """
    srv = await ba.start_server(server, "127.0.0.1", 0)
    try:
        yield srv.sockets[0].getsockname()[1]
    finally:
        await ba.close_server(srv)


def connect(port: int) -> socket.socket:
    """A connection to the server on ``port`` of loopback, sending without delay."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Everything until the server closes."""
    out = bytearray()
    while data := sock.recv(65536):
        out += data
    return bytes(out)


def until_closed(sock: socket.socket) -> bytes:
    """Everything until the server closes, or resets (the timeout bounds each wait)."""
    data = bytearray()
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(1 << 20):
            data += chunk
    return bytes(data)


def infer_bytes(
    inputs: dict[str, Any], target: str = "/v2/models/echo/infer", **options: Any
) -> bytes:
    """A whole request of ``inputs`` to ``target``, binary outputs asked for.

    ``options`` go to :func:`binproto.encode_request`.
    """
    body = binproto.encode_request(inputs, binary_data_output=True, **options)
    conn = h11.Connection(h11.CLIENT)
    return b"".join(bytes(p) for p in send_message(conn, request_for(target, body), body))


def read_response(sock: socket.socket, check_closed: bool = True) -> tuple[int, bytes, bool]:
    """Status, body, and (when checked) whether the server then closed the connection."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
    conn.send(h11.EndOfMessage())
    status = 0
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(sock.recv(65536))
            continue
        if type(event) is h11.Response:
            status = event.status_code
        elif type(event) is h11.Data:
            body += event.data
        elif type(event) is h11.EndOfMessage:
            break
    closed = False
    if not check_closed:
        return status, bytes(body), closed
    sock.settimeout(5)
    try:
        closed = sock.recv(1) == b""
    except (TimeoutError, ConnectionError):
        closed = False
    return status, bytes(body), closed


def assert_served(port: int) -> None:
    """A normal request on a new connection is answered in full."""
    x = np.arange(1000, dtype=np.int32)
    with connect(port) as sock:
        sock.sendall(infer_bytes({"x": x}))
        status, body, _ = read_response(sock, check_closed=False)
    assert status == 200 and body.endswith(x.tobytes()), (status, body[:200])


def request_bytes(arrays: dict[str, Any]) -> bytes:
    """An echo request of ``arrays``, head and body."""
    body = binproto.encode_request(arrays)
    head = "POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in body.headers)
    return head.encode() + b"\r\n" + bytes(body)


def _pid_request() -> bytes:
    """A request to the ``pid`` model of tests/cli_models.py."""
    body = binproto.encode_request({"x": np.zeros(1, np.float32)}, binary_data_output=True)
    head = "POST /v2/models/pid/infer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in body.headers)
    return head.encode() + b"\r\n" + bytes(body)


def answering_pids(port: int, connections: int) -> list[int]:
    """Open ``connections`` connections at once; the pid answering on each."""
    socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(connections)]
    pids = []
    try:
        for sock in socks:
            sock.sendall(_pid_request())
        for sock in socks:
            answer = b""
            while data := sock.recv(65536):
                answer += data
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), answer[:300]
            hl = int(head.lower().split(b"inference-header-content-length: ")[1].split(b"\r\n")[0])
            decoded = binproto.decode_response(body, header_length=hl)
            pids.append(int(decoded.tensors["pid"][0]))
    finally:
        for sock in socks:
            sock.close()
    return pids


def gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie counts)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"  # (exited, not yet reaped by its parent)


# -- `binproto serve` as a process ------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent


class Served:
    """A ``binproto serve`` process: its ``Popen`` and the port it serves on."""

    def __init__(self, proc: subprocess.Popen[str], port: int) -> None:
        self.proc = proc
        self.port = port
        self.url = f"http://127.0.0.1:{port}"

    def children(self) -> set[int]:
        """The worker processes' ids."""
        path = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        return {int(p) for p in path.read_text().split()} if path.exists() else set()


@contextlib.contextmanager
def serve_command(*args: str, env: dict[str, str] | None = None) -> Iterator[Served]:
    """``python -m binproto serve *args --port 0``, ready, until the block ends;
    then its process group is killed."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    proc = subprocess.Popen(
        [sys.executable, "-m", "binproto", "serve", *args, "--port", "0"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # (its own group: cleaned up whole, whatever happens)
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, "no 'serving' line within 30 s"
        line = proc.stdout.readline()
        assert "serving V2 on http://127.0.0.1:" in line, line
        port = int(line.split("127.0.0.1:")[1].split()[0].rstrip("/"))
        served = Served(proc, port)
        wait_ready(served)
        yield served
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def wait_ready(served: Served) -> None:
    """Wait up to 30 s for the served process to answer its ready check."""
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(served.url + "/v2/health/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert served.proc.poll() is None, "the server exited"
        assert time.monotonic() < deadline, "not ready within 30 s"
        time.sleep(0.05)
