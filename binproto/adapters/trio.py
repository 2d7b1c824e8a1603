"""binproto over trio: a V2 HTTP/1.1 server and client (h11 underneath).

The same server and client as ``binproto.adapters.asyncio``, over any
:class:`trio.abc.Stream`; all the HTTP and protocol work is done by the
backend-independent core in ``binproto.adapters._server`` and ``_client``.
This module only wraps trio streams into its
:class:`~binproto.adapters._server.ByteStream`:

* :class:`TrioStream` wraps any ``trio.abc.Stream`` (TLS, in-memory, ...):
  bytes are read with ``receive_some`` (``zero_copy=False``);
* :class:`TrioSocketStream` wraps a :class:`trio.SocketStream` and adds
  ``receive_into`` (the default for TCP): while a binary tensor of a
  ``Content-Length`` body is being received, the kernel writes its bytes
  straight into the tensor's destination array with the socket's
  ``recv_into`` (trio waits until the socket is readable, then calls the
  non-blocking ``recv_into``).

Nothing is read before the consumer asks for the next event, so memory stays
O(chunk) plus what the consumer keeps. Sending never joins tensor buffers:
each one is written as it is (h11 hands them over as views of at most 1 MiB).

Server::

    trio.run(binproto.adapters.trio.serve, None, "127.0.0.1", 8000)

or, in a nursery, ``port = await nursery.start(serve)`` (port 0, the default,
picks a free port; ``start`` returns the bound one).

Client::

    async with binproto.adapters.trio.Client("127.0.0.1", 8000) as c:
        outputs = await c.infer("echo", {"x": array}, binary_data_output=True)
"""

from __future__ import annotations

import errno
import logging
import math
import os
import ssl as ssl_module
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

try:
    import trio
except ModuleNotFoundError as exc:  # an optional dependency: say which extra brings it
    from binproto.adapters import missing_extra

    raise missing_extra(exc, "trio") from None

from binproto._util import as_byte_view, gather_small

from ._client import (
    ClientCore,
    Endpoint,
    EndpointClient,
    ResponseStream,
    Retry,
)
from ._metadata import ModelMetadata, ServerMetadata, TensorMetadata

# The server's model API, the same for every backend.
from ._server import (
    InferenceError,
    InferRequest,
    Model,
    StreamingResponse,
    Timeouts,
    V2Server,
    echo_model,
)

__all__ = [
    "Client",
    "ClientCore",
    "InferRequest",
    "InferenceError",
    "Model",
    "ModelMetadata",
    "ResponseStream",
    "Retry",
    "ServerMetadata",
    "StreamingResponse",
    "TensorMetadata",
    "Timeouts",
    "TrioSocketStream",
    "TrioStream",
    "V2Server",
    "connect",
    "connection_handler",
    "echo_model",
    "serve",
    "wrap",
]


_T = TypeVar("_T")

log = logging.getLogger("binproto.server")

#: Seconds the server stops accepting when the process is out of file
#: descriptors (as trio's serve_listeners).
ACCEPT_RETRY = 0.1
#: Seconds between two warnings of a shortage of descriptors.
SHORTAGE_LOG_EVERY = 60.0
# What accept() says when the process or the system is out of descriptors
# or memory: nothing to do but wait for a connection to close.
_SHORTAGE = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class TrioStream:
    """A :class:`~binproto.adapters._server.ByteStream` over any ``trio.abc.Stream``.

    ``timeout`` bounds each wait for the peer: one receive, or the sending of
    one buffer (None: no bound); past it :class:`TimeoutError` is raised (not
    trio's ``TooSlowError``), which the server answers with 408.
    """

    def __init__(self, stream: trio.abc.Stream, timeout: float | None = None) -> None:
        self.stream = stream
        self.timeout = timeout

    def is_readable(self) -> bool:
        """True when bytes or the end of the stream wait on a socket stream's
        socket (see :class:`~binproto.adapters._server.ProbesIdle`); False,
        unknown, for any other stream (TLS, in memory)."""
        stream = self.stream
        return isinstance(stream, trio.SocketStream) and bool(stream.socket.is_readable())

    async def _bounded(self, op: Callable[[], Awaitable[_T]]) -> _T:
        """``await op()`` within :attr:`timeout`. Past it :class:`TimeoutError`
        (trio would say TooSlowError; the ByteStream contract and the server's
        408 want what asyncio raises); a broken connection is
        :class:`ConnectionResetError`, as asyncio says it. One cancel scope per
        wait, made directly: this runs for every read and write."""
        timeout = self.timeout
        deadline = math.inf if timeout is None else trio.current_time() + timeout
        with trio.CancelScope(deadline=deadline):
            try:
                return await op()
            except trio.BrokenResourceError as exc:
                raise _reset(exc) from exc
        # Only the scope's own deadline gets here (it caught its cancellation).
        raise TimeoutError(f"no bytes from the peer within {timeout} s")

    async def receive_some(self, max_bytes: int) -> bytes:
        """Up to ``max_bytes`` bytes; ``b""`` at end of stream."""
        data = await self._receive_now(max_bytes)
        if data is not None:
            return data
        return await self._bounded(lambda: self._receive(max_bytes))

    async def send_all(self, buffers: Sequence[Any]) -> None:
        """Write the buffers in order: small ones gathered into one send, big
        ones never joined (see :func:`binproto._util.gather_small`)."""
        for buf in gather_small(buffers):
            view = as_byte_view(buf)
            sent = await self._send_now(view)
            if sent is not None:
                view = view[sent:]
            if len(view):
                await self._bounded(lambda: self._send(view))  # noqa: B023 (awaited at once)

    # The primitives: a call made now, which never waits (None: it would, or
    # the stream cannot tell), and a call that may wait (bounded above).

    async def _receive_now(self, max_bytes: int) -> bytes | None:
        """A receive made without waiting; None when it would wait. Any trio
        stream may wait on any call: this one always says so."""
        return None

    async def _send_now(self, view: memoryview) -> int | None:
        """Bytes of ``view`` sent without waiting; None when that would wait."""
        return None

    async def _receive(self, max_bytes: int) -> bytes:
        """One receive, unbounded (:meth:`receive_some` bounds it)."""
        return bytes(await self.stream.receive_some(max_bytes))

    async def _send(self, view: memoryview) -> None:
        """Send all of ``view``, unbounded (:meth:`send_all` bounds it)."""
        await self.stream.send_all(view)

    async def to_thread(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Run ``fn(*args)`` in a worker thread and return its result (bodies
        are compressed there, off the event loop)."""
        return await trio.to_thread.run_sync(fn, *args)

    async def checkpoint(self) -> None:
        """Let other tasks run (while a compressed body is decompressed)."""
        await trio.lowlevel.checkpoint()

    async def send_eof(self) -> None:
        """End the sending side, when the stream can (a socket stream; not TLS)."""
        if isinstance(self.stream, trio.abc.HalfCloseableStream):
            await self._bounded(self.stream.send_eof)

    async def aclose(self) -> None:
        """Close the stream."""
        await self.stream.aclose()


def _broken(sock: trio.socket.SocketType, exc: OSError) -> Exception:
    """An ``OSError`` of a socket as :class:`trio.SocketStream` reports it."""
    if exc.errno in (errno.EBADF, errno.ENOTSOCK) or sock.fileno() == -1:
        return trio.ClosedResourceError("the socket was closed")
    return trio.BrokenResourceError(f"socket connection broken: {exc}")


def _reset(exc: trio.BrokenResourceError) -> ConnectionResetError:
    """A broken connection as the ByteStream contract (and asyncio) says it."""
    return ConnectionResetError(f"the connection is broken: {exc}")


# A socket is a file descriptor here: os.read, os.readv and os.write make its
# non-blocking calls (on Windows, trio's socket methods make them all).
_DESCRIPTORS = os.name == "posix"


class TrioSocketStream(TrioStream):
    """A :class:`TrioStream` over a :class:`trio.SocketStream`, with
    ``receive_into``: the kernel writes into the caller's buffer.

    It calls the trio socket's own ``recv``, ``recv_into`` and ``send``:
    the stream layer around them adds a context manager and a conflict
    check to every call, a share of each small request's cost. So, unlike a
    ``trio.SocketStream``, it does not detect two tasks sending (or
    receiving) at once: one task at a time uses it, as the server and the
    client do. And each call is first made at once, without a deadline:
    the timeout bounds waits, and a trio cancel scope per call is over a
    tenth of a small request's cost; only a call that would wait (the
    kernel says EAGAIN) waits, within the timeout.
    """

    stream: trio.SocketStream

    async def _at_once(self, call: Callable[[int], _T]) -> _T | None:
        """``call(fd)`` on the socket's (non-blocking) descriptor, made now as
        trio makes a socket call that does not wait: a cancellation point
        before it, a schedule point after it. None when it would wait (the
        caller then waits within the timeout). A fault is raised as a
        bounded call raises it."""
        if not _DESCRIPTORS:
            return None
        sock = self.stream.socket
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            result = call(sock.fileno())  # a closed socket's is -1: EBADF
        except BlockingIOError:
            return None
        except OSError as exc:
            fault = _broken(sock, exc)
            raise (_reset(fault) if isinstance(fault, trio.BrokenResourceError) else fault) from exc
        await trio.lowlevel.cancel_shielded_checkpoint()
        return result

    async def receive_into(self, view: memoryview) -> int:
        """Receive up to ``len(view)`` bytes into ``view``; 0 at end of stream."""
        if not len(view):
            return 0
        received = await self._at_once(lambda fd: os.readv(fd, [view]))
        if received is not None:
            return received
        sock = self.stream.socket

        async def recv_into() -> int:
            try:
                # Waits for readability, then a non-blocking recv_into.
                return await sock.recv_into(view, len(view))
            except OSError as exc:
                raise _broken(sock, exc) from exc

        return await self._bounded(recv_into)

    async def _receive_now(self, max_bytes: int) -> bytes | None:
        if max_bytes < 1:  # (b"" would read as the end of the stream)
            raise ValueError("max_bytes must be >= 1")
        return await self._at_once(lambda fd: os.read(fd, max_bytes))

    async def _send_now(self, view: memoryview) -> int | None:
        return await self._at_once(lambda fd: os.write(fd, view))

    async def _receive(self, max_bytes: int) -> bytes:
        sock = self.stream.socket
        try:
            return await sock.recv(max_bytes)
        except OSError as exc:
            raise _broken(sock, exc) from exc

    async def _send(self, view: memoryview) -> None:
        sock = self.stream.socket
        sent = 0
        try:
            while sent < len(view):
                sent += await sock.send(view[sent:])
        except OSError as exc:
            raise _broken(sock, exc) from exc


def wrap(
    stream: trio.abc.Stream, *, zero_copy: bool = True, timeout: float | None = None
) -> TrioStream:
    """The ByteStream for a trio stream: a :class:`TrioSocketStream` for a
    ``trio.SocketStream`` when ``zero_copy``, else a :class:`TrioStream`."""
    if zero_copy and isinstance(stream, trio.SocketStream):
        return TrioSocketStream(stream, timeout)
    return TrioStream(stream, timeout)


def connection_handler(
    server: V2Server | None = None, *, zero_copy: bool = True, timeout: float | None = None
) -> Callable[[trio.abc.Stream], Awaitable[None]]:
    """A handler for :func:`trio.serve_listeners` (or ``serve_tcp``,
    ``serve_ssl_over_tcp``) that serves ``server`` on each connection.

    ``server`` defaults to one with the ``echo`` model; see :func:`serve` for
    the options.
    """
    app = server if server is not None else V2Server()
    bounds = Timeouts.every(timeout) if timeout is not None else None

    async def handle(stream: trio.abc.Stream) -> None:
        await app.serve_connection(wrap(stream, zero_copy=zero_copy), bounds)

    return handle


async def serve(
    server: V2Server | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    zero_copy: bool = True,
    timeout: float | None = None,
    ready: Callable[[int], object] | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``server`` (default: one with the ``echo`` model) until cancelled.

    ``zero_copy`` receives tensor bytes in place with ``recv_into``. The
    server's :class:`Timeouts` bound each phase of a request; ``timeout``,
    when given, is used for every phase instead. Port 0
    picks a free port: ``port = await nursery.start(serve, ...)`` gives the
    bound one, and ``ready(port)`` is called once listening. (With port 0 and
    a host name with several addresses, each listener gets its own port; the
    first one is reported.)
    """
    handler = connection_handler(server, zero_copy=zero_copy, timeout=timeout)
    # What trio.serve_tcp does, with the bound port reported in between.
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound: int = listeners[0].socket.getsockname()[1]
    if ready is not None:
        ready(bound)
    task_status.started(bound)
    await _serve_listeners(handler, listeners)


async def _serve_listeners(
    handler: Callable[[trio.abc.Stream], Awaitable[None]],
    listeners: Sequence[trio.SocketListener],
) -> None:
    """What ``trio.serve_listeners`` does, but a shortage of descriptors is
    logged at most once per :data:`SHORTAGE_LOG_EVERY` seconds (trio logs
    each retry, with a traceback: ten a second while it lasts)."""
    warned: list[float] = []

    async def run(stream: trio.abc.Stream) -> None:
        try:
            await handler(stream)
        finally:
            await trio.aclose_forcefully(stream)

    async def accept_from(listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        async with listener:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:
                    if exc.errno not in _SHORTAGE:
                        raise
                    now = time.monotonic()
                    if not warned or now - warned[0] >= SHORTAGE_LOG_EVERY:
                        warned[:] = [now]
                        log.warning(
                            "cannot accept connections: %s; retrying every %s s until one"
                            " closes (raise the limit on open files: ulimit -n)",
                            exc,
                            ACCEPT_RETRY,
                        )
                    await trio.sleep(ACCEPT_RETRY)
                    continue
                nursery.start_soon(run, stream)

    async with trio.open_nursery() as nursery:
        for listener in listeners:
            nursery.start_soon(accept_from, listener, nursery)


async def connect(
    host: str,
    port: int,
    *,
    zero_copy: bool = True,
    timeout: float | None = None,
    ssl: ssl_module.SSLContext | None = None,
) -> TrioStream:
    """Open a connection as a ByteStream (see :func:`serve` for the options;
    ``ssl``: TLS with this context)."""
    if ssl is not None:
        tls = await trio.open_ssl_over_tcp_stream(host, port, ssl_context=ssl)
        return wrap(tls, zero_copy=zero_copy, timeout=timeout)
    return wrap(await trio.open_tcp_stream(host, port), zero_copy=zero_copy, timeout=timeout)


class Client(EndpointClient):
    """A V2 client over a pool of HTTP/1.1 keep-alive connections.

    ::

        async with Client("http://127.0.0.1:8000") as c:
            outputs = await c.infer("echo", {"x": array})

    The options are those of :class:`binproto.adapters.asyncio.Client`:
    a base URL or a host and port, ``ssl`` for TLS, one client shared by
    many tasks over at most ``max_connections`` connections, binary outputs
    by default, and ``retry``. For another kind of trio stream, give
    :class:`ClientCore` an ``open_stream`` that returns :func:`wrap` of it.
    """

    async def _connect(
        self, where: Endpoint, *, zero_copy: bool, timeout: float | None
    ) -> TrioStream:
        return await connect(
            where.host, where.port, zero_copy=zero_copy, timeout=timeout, ssl=where.ssl
        )
