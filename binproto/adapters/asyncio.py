"""binproto over asyncio: a V2 HTTP/1.1 server and client (h11 underneath;
install the ``binproto[h11]`` extra).

Ways to move bytes, each adapted to the backend-independent core in
``binproto.adapters._server`` (``zero_copy`` picks one):

* streams (``asyncio.start_server`` / ``open_connection``): bytes go through
  a ``StreamReader`` (``zero_copy=False``, server and client);
* the server's default, an :class:`asyncio.BufferedProtocol`: the event loop
  calls ``recv_into`` on the buffer this module hands it, which is the
  tensor's destination array while a binary tensor of a ``Content-Length``
  body is being received. Reading is paused whenever nobody waits for bytes,
  so the socket is read only as fast as the consumer takes events;
* the client's default, an :class:`asyncio.BufferedProtocol` too
  (:class:`ClientStream`, over TCP or TLS): responses are received in place
  the same way, and requests are sent from the caller's arrays.

Sending never joins buffers. Through a transport (the server), each buffer is
written in pieces of at most 1 MiB, waiting for the transport to drain between
pieces (before Python 3.12 an asyncio transport copies what the kernel did
not take at once; the pieces bound that copy).

Server::

    await binproto.adapters.asyncio.serve(port=8000)  # until cancelled

    # or, to control its life:
    server = await binproto.adapters.asyncio.start_server(port=8000)
    ...
    await binproto.adapters.asyncio.close_server(server)  # with its connections

Client::

    async with binproto.adapters.asyncio.Client("127.0.0.1", 8000) as c:
        outputs = await c.infer("echo", {"x": array}, binary_data_output=True)
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import ssl as ssl_module
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar, cast

from binproto._util import gather_small

from ._client import (
    ClientCore,
    Endpoint,
    EndpointClient,
    ResponseStream,
    Retry,
)
from ._metadata import ModelMetadata, ServerMetadata, TensorMetadata
from ._server import (
    HEAD_READ,
    InferenceError,
    InferRequest,
    Model,
    StreamingResponse,
    Timeouts,
    V2Server,
    echo_model,
)

# The server's model API, the same for every backend.
from .h11 import body_pieces

__all__ = [
    "BufferedStream",
    "Client",
    "ClientCore",
    "ClientStream",
    "InferRequest",
    "InferenceError",
    "Model",
    "ModelMetadata",
    "ResponseStream",
    "Retry",
    "ServerMetadata",
    "StreamingResponse",
    "StreamsStream",
    "TensorMetadata",
    "Timeouts",
    "V2Server",
    "close_server",
    "connect",
    "echo_model",
    "serve",
    "start_server",
]

log = logging.getLogger("binproto.server")


#: Bytes in the transport's write buffer above which a writer waits.
HIGH_WATER = 1 << 20


#: Bytes a StreamReader buffers ahead, and reads of a body through it.
STREAM_LIMIT = 1 << 20

#: Connections the kernel queues for accept (uvicorn's default; asyncio's is 100).
BACKLOG = 2048


_T = TypeVar("_T")


class _WorkerThreads:
    """``to_thread`` for the streams: CPU-heavy work (compressing a response
    or a request) runs in asyncio's default executor, off the event loop; and
    ``checkpoint``, a chance for other tasks to run while a compressed body
    is being decompressed."""

    async def to_thread(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Run ``fn(*args)`` in a worker thread and return its result."""
        return await asyncio.to_thread(fn, *args)

    async def checkpoint(self) -> None:
        """Let the event loop run other tasks."""
        await asyncio.sleep(0)


async def _within(awaitable: Awaitable[_T], timeout: float | None, waiting: str = "bytes") -> _T:
    """``awaitable``'s result, or the built-in TimeoutError after ``timeout``
    seconds (asyncio's own, a different class before Python 3.11, is what the
    servers would otherwise not recognise). ``waiting`` says for what."""
    if timeout is None:
        return await awaitable
    # asyncio.timeout (Python 3.11+) is a timer handle on the waiting task;
    # wait_for would make a task per wait (memory held by every idle connection).
    timer = getattr(asyncio, "timeout", None)
    try:
        if timer is not None:
            async with timer(timeout):
                return await awaitable
        return await asyncio.wait_for(awaitable, timeout)
    except asyncio.TimeoutError:
        raise TimeoutError(f"no {waiting} from the peer within {timeout} s") from None


_TAKE = "room to write"  # what a send waits for: the peer reading


async def _closed_within(
    transport: asyncio.WriteTransport, closed: Awaitable[None], timeout: float | None
) -> None:
    """Wait for a closing transport to be closed, at most ``timeout`` seconds,
    then drop the connection. asyncio's ``close()`` first sends what is
    buffered, with no deadline: a peer that stopped reading would keep the
    connection (a file descriptor, the unsent bytes) for as long as it likes."""
    waiting = asyncio.ensure_future(closed)  # (a timeout must not cancel the close itself)
    # (How the peer left, a reset say, is no news here: a close never raises it.)
    try:
        await _within(asyncio.shield(waiting), timeout, _TAKE)
    except TimeoutError:
        transport.abort()
    except OSError:
        pass
    with contextlib.suppress(OSError):
        await waiting


class StreamsStream(_WorkerThreads):
    """A :class:`~binproto.adapters._server.ByteStream` over asyncio streams."""

    #: Body bytes asked for per read (the StreamReader holds up to twice its limit).
    read_size = STREAM_LIMIT

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        timeout: float | None = None,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self.timeout = timeout

    async def receive_some(self, max_bytes: int) -> bytes:
        """Up to ``max_bytes`` bytes; ``b""`` at end of stream (a reset ends
        it too, as for :class:`ClientStream`: what is missing says the rest)."""
        try:
            return await _within(self._reader.read(max_bytes), self.timeout)
        except ConnectionResetError:
            return b""

    async def send_all(self, buffers: Sequence[Any]) -> None:
        """Write the buffers in order (small ones gathered, big ones never joined)."""
        writer = self._writer
        await _write_all(
            writer.transport, lambda: _within(writer.drain(), self.timeout, _TAKE), buffers
        )

    async def send_eof(self) -> None:
        """End the sending side (when the transport can: not over TLS)."""
        if self._writer.can_write_eof():
            self._writer.write_eof()

    async def aclose(self) -> None:
        """Close the connection (see :func:`_closed_within`)."""
        writer = self._writer
        writer.close()
        await _closed_within(writer.transport, writer.wait_closed(), self.timeout)

    def is_readable(self) -> bool:
        """True when bytes the peer sent wait in the stream reader, or it has
        closed its side (see :class:`~binproto.adapters._server.ProbesIdle`)."""
        # StreamReader has no public way to say it holds bytes: its buffer
        # (a bytearray since Python 3.4) is read directly.
        reader = self._reader
        held = reader._buffer  # type: ignore[attr-defined]
        return bool(held) or reader.at_eof() or self._writer.is_closing()


class _WaitTimer:
    """One timer for a connection's waits, each bounded by a timeout.

    A keep-alive connection waits a few times per request. Instead of a
    timer made and cancelled per wait (two operations on the event loop's
    timer heap), one timer stays armed at or before the running wait's
    deadline. When it fires, it fails the wait whose deadline has passed,
    moves to the deadline of the wait under way, or lapses if none waits.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._at = 0.0  # when the handle fires
        self._waiter: asyncio.Future[None] | None = None
        self._deadline = 0.0
        self._timeout = 0.0
        self._what = ""

    def start(
        self,
        loop: asyncio.AbstractEventLoop,
        waiter: asyncio.Future[None],
        timeout: float,
        what: str,
    ) -> None:
        """Fail ``waiter`` with the built-in TimeoutError if it waits for
        ``what`` longer than ``timeout`` seconds (until :meth:`stop`)."""
        self._loop = loop
        self._waiter, self._timeout, self._what = waiter, timeout, what
        self._deadline = deadline = loop.time() + timeout
        if self._handle is None or deadline < self._at:
            self._arm(deadline)

    def stop(self) -> None:
        """The wait is over (the timer stays armed for the next one)."""
        self._waiter = None

    def cancel(self) -> None:
        """The connection is gone: no timer is left behind."""
        self._waiter = None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _arm(self, at: float) -> None:
        assert self._loop is not None
        if self._handle is not None:
            self._handle.cancel()
        self._handle = self._loop.call_at(at, self._fire)
        self._at = at

    def _fire(self) -> None:
        self._handle = None
        waiter = self._waiter
        if waiter is None or waiter.done() or self._loop is None:
            return
        if self._loop.time() >= self._deadline:
            waiter.set_exception(
                TimeoutError(f"no {self._what} from the peer within {self._timeout} s")
            )
        else:
            self._arm(self._deadline)


#: Most receive buffers a server keeps between requests for its
#: connections' next request heads (see :class:`_ReceiveBuffers`): of
#: :data:`~binproto.adapters._server.HEAD_READ` bytes each, 4.5 MiB in all.
KEPT_RECEIVE_BUFFERS = 64


class _ReceiveBuffers:
    """The buffers a server's connections receive request heads into, kept
    for the next heads once the server is done with them (up to ``most``).

    When several connections' requests arrive at once, the event loop
    receives each into a buffer of its own before any is served. Made afresh
    for each read and freed after each request, those buffers come and go in
    batches, and the allocator gives the top of its heap back to the system
    and takes it again each time: a page fault every 4 KiB of them, 14 a
    request of 64 KiB at 64 connections. Kept, a buffer serves its next read
    with no allocation and no page to fault in (and none to clear). A
    buffer comes back at once when what it received was small enough to copy
    out (see :data:`LEND_FROM`), else when the server says it is done with
    every byte of it (see :meth:`_ReceiveProtocol.recycle`); one it never
    gives back is simply freed.
    """

    def __init__(self, most: int = 0) -> None:
        self.most = most
        self._free: list[bytearray] = []

    def take(self) -> bytearray:
        """A buffer of :data:`HEAD_READ` bytes: a kept one, else a new one."""
        return self._free.pop() if self._free else self._make()

    def _make(self) -> bytearray:
        return bytearray(HEAD_READ)

    def give(self, buf: bytearray) -> None:
        """Keep ``buf`` (which :meth:`take` gave) for a next read, if there is room."""
        if len(self._free) < self.most:
            self._free.append(buf)


#: A read waiting for bytes that gets at least this many in a kept buffer is
#: handed a view of the buffer (a body of tens of KiB is not copied twice);
#: fewer bytes, or bytes nobody waited for, are copied out, and the buffer
#: kept again at once.
LEND_FROM = 16 * 1024

_EMPTY = memoryview(b"")


class _ReceiveProtocol(asyncio.BufferedProtocol):
    """Receives into the buffer of the reader waiting for bytes.

    Reading is not paused between reads: a keep-alive client's next request
    lands straight in the read already waiting for it, with no system call to
    stop and restart reading per request. Bytes that arrive with nobody waiting
    are kept for the next read, and only then is reading paused, so a peer
    that sends ahead is held to one read's worth. A read with no buffer of its
    own (``receive_some``) gets one when bytes arrive, not while it waits: an
    idle connection holds no receive buffer. A read of a request head, and
    bytes that arrive with nobody waiting, go into one of the server's kept
    ``buffers`` (see :class:`_ReceiveBuffers`): at least
    :data:`LEND_FROM` bytes for a read that waits for them are handed to it
    as a view of the buffer, until :meth:`recycle` gives it back; fewer, or
    bytes nobody waits for yet, are copied out, and the buffer is kept again
    at once.
    """

    def __init__(
        self,
        on_connect: Callable[[BufferedStream], object] | None = None,
        timeout: float | None = None,
        buffers: _ReceiveBuffers | None = None,
    ) -> None:
        self.transport: asyncio.Transport | None = None
        # Looked up once: before Python 3.12, get_running_loop() makes a
        # getpid() system call each time.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_connect = on_connect
        self._timeout = timeout
        self._target: memoryview | None = None  # the waiting receive_into's memory
        self._want = HEAD_READ  # size of a buffer made for a waiting receive_some
        self._spare: bytearray | None = None  # the buffer get_buffer made
        self._buffers = buffers if buffers is not None else _ReceiveBuffers()
        # The kept buffer the last read went into, until given back or the next read.
        self._lent: bytearray | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._timer = _WaitTimer()  # bounds the waiting read
        self._received = 0  # bytes the last read put into _target
        self._leftover = _EMPTY  # bytes received with no _target to put them in
        self._eof = False
        self._writable: asyncio.Future[None] | None = None
        self._paused = False
        self._closed: asyncio.Future[None] | None = None

    # -- protocol callbacks ------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are no asyncio.Transport subclasses, though they
        # have its methods: a cast, not an isinstance check)
        self.transport = cast(asyncio.Transport, transport)
        self._loop = loop = asyncio.get_running_loop()
        self._closed = loop.create_future()
        if self._on_connect is not None:
            self._on_connect(BufferedStream(self, self._timeout))

    def get_buffer(self, sizehint: int) -> memoryview | bytearray:
        if self._target is not None:
            return self._target
        # Bytes nobody asked for yet begin the next request: the room the
        # server's first read of a request asks for (HEAD_READ), so a request
        # that comes whole with them still can be decoded whole.
        want = self._want if self._waiter is not None else HEAD_READ
        if want == HEAD_READ:
            self._spare = self._lent = self._buffers.take()
        else:
            self._spare = bytearray(want)
        return self._spare

    def buffer_updated(self, nbytes: int) -> None:
        if self._target is not None:
            self._target = None
            self._received = nbytes
            self._wake()
            return
        spare = self._spare
        assert spare is not None
        self._spare = None
        if spare is self._lent:
            # A kept buffer is never resized: it keeps its size for its next read.
            got = memoryview(spare)[:nbytes]
            if nbytes < LEND_FROM or self._waiter is None:
                # Lent, bytes that wait would hold all of it: a few (the start
                # of a slow body), or any nobody asked for yet (a pipelined
                # request, while the one before it is served).
                got = memoryview(bytearray(got))
                self._lent = None
                self._buffers.give(spare)
        else:
            try:
                del spare[nbytes:]  # (shrunk in place: no copy)
            except BufferError:
                # The loop still holds the buffer during this call (uvloop does),
                # and a bytearray that is held cannot be resized: copy what came.
                spare = spare[:nbytes]
            got = memoryview(spare)
        if len(self._leftover):
            joined = bytearray(self._leftover)
            joined += got
            self._leftover = memoryview(joined)
        else:
            self._leftover = got
        if self._waiter is not None:
            self._wake()
        else:
            # Nobody asked for these: keep the rest in the kernel until someone does.
            assert self.transport is not None
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        self._eof = True
        self._target = None
        self._wake()
        return True  # keep the transport open: we may still answer

    def connection_lost(self, exc: Exception | None) -> None:
        self._timer.cancel()
        self._eof = True
        self._target = None
        self._wake()
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        if self._closed is not None and not self._closed.done():
            self._closed.set_result(None)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def _wake(self) -> None:
        waiter = self._waiter
        self._waiter = None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- used by BufferedStream ---------------------------------------------------

    async def _wait_for_bytes(self, target: memoryview | None, timeout: float | None) -> None:
        """Wait until a read put bytes in ``target`` (or, with None, in the
        leftover), or the stream ended; TimeoutError after ``timeout`` seconds
        (see :class:`_WaitTimer`)."""
        transport, loop, timer = self.transport, self._loop, self._timer
        assert transport is not None and loop is not None
        # A buffer made for a read that found nothing (uvloop asks for one
        # whenever a read filled the last): not kept while this one waits.
        if self._spare is not None and self._spare is self._lent:
            self._buffers.give(self._spare)
        self._spare = None
        # A kept buffer is given back before the next read, or not at all:
        # forgotten, it goes when the last view of it does.
        self._lent = None
        self._target = target
        self._received = 0
        self._waiter = waiter = loop.create_future()
        transport.resume_reading()  # (a no-op unless bytes nobody asked for paused it)
        if timeout is not None:
            timer.start(loop, waiter, timeout, "bytes")
        try:
            await waiter
        finally:
            timer.stop()
            if self._waiter is waiter:  # timed out or cancelled: nobody waits any more
                self._waiter = None
                self._target = None

    async def receive_into(self, view: memoryview, timeout: float | None) -> int:
        if not len(view):
            return 0
        leftover = self._leftover
        if len(leftover):
            n = min(len(view), len(leftover))
            view[:n] = leftover[:n]
            # (an empty view would still hold the memory it was cut from)
            self._leftover = leftover[n:] if n < len(leftover) else _EMPTY
            return n
        if self._eof or self.transport is None or self.transport.is_closing():
            return 0
        await self._wait_for_bytes(view, timeout)
        if self._received:
            return self._received
        return await self.receive_into(view, timeout)  # bytes went to the leftover, or EOF

    async def receive_some(self, max_bytes: int, timeout: float | None) -> memoryview | bytes:
        if not len(self._leftover):
            if self._eof or self.transport is None or self.transport.is_closing():
                return b""
            self._want = max_bytes
            await self._wait_for_bytes(None, timeout)
        data = self._leftover
        if len(data) <= max_bytes:
            self._leftover = _EMPTY
            return data
        self._leftover = data[max_bytes:]
        return data[:max_bytes]

    def recycle(self, data: Any) -> None:
        """The server is done with ``data``, the rest of a piece
        :meth:`receive_some` gave, and with all before it: when that piece
        was received into a kept buffer, the buffer is kept for a next read.
        (A kept buffer is lent whole to the one read that waited for its
        bytes, so no other bytes wait in it.)"""
        lent = self._lent
        if lent is None or type(data) is not memoryview or data.obj is not lent:
            return
        self._lent = None
        self._buffers.give(lent)

    async def drain(self, timeout: float | None) -> None:
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("the connection is closed")
        if self._paused:
            assert self._loop is not None
            self._writable = self._loop.create_future()
            await _within(self._writable, timeout, _TAKE)
            if self.transport.is_closing():
                raise ConnectionResetError("the connection is closed")

    async def wait_closed(self) -> None:
        if self._closed is not None:
            await self._closed


async def _write_all(
    transport: asyncio.WriteTransport,
    drain: Callable[[], Awaitable[None]],
    buffers: Sequence[Any],
) -> None:
    """Write ``buffers`` (small ones gathered into one write, big ones never
    joined), waiting for the transport to drain above :data:`HIGH_WATER`."""
    try:
        for buf in gather_small(buffers):
            if transport.is_closing():
                raise ConnectionResetError("the connection is closed")
            transport.write(buf)
            if transport.get_write_buffer_size() > HIGH_WATER:
                await drain()
        await drain()
    except TimeoutError:
        # The peer stopped reading: drop the connection now. A graceful close
        # would wait the write timeout once more for it to take what is buffered.
        transport.abort()
        raise


class BufferedStream(_WorkerThreads):
    """A :class:`~binproto.adapters._server.ByteStream` over a BufferedProtocol,
    with ``receive_into``: the kernel writes into the caller's buffer."""

    def __init__(self, protocol: _ReceiveProtocol, timeout: float | None = None) -> None:
        self._protocol = protocol
        self.timeout = timeout

    async def receive_into(self, view: memoryview) -> int:
        """Receive up to ``len(view)`` bytes into ``view``; 0 at end of stream."""
        return await self._protocol.receive_into(view, self.timeout)

    async def receive_some(self, max_bytes: int) -> memoryview | bytes:
        """Up to ``max_bytes`` bytes, a view of the memory they came in
        (which, after :meth:`recycle`, may receive later bytes); empty at end
        of stream."""
        return await self._protocol.receive_some(max_bytes, self.timeout)

    def recycle(self, data: Any) -> None:
        """The server is done with ``data`` (see
        :class:`~binproto.adapters._server.Recycles`): its memory may
        receive the next request."""
        self._protocol.recycle(data)

    async def send_all(self, buffers: Sequence[Any]) -> None:
        """Write the buffers in order (small ones gathered, big ones never joined)."""
        protocol = self._protocol
        transport = protocol.transport
        assert transport is not None
        await _write_all(transport, lambda: protocol.drain(self.timeout), buffers)

    async def send_eof(self) -> None:
        """End the sending side (when the transport can: not over TLS)."""
        transport = self._protocol.transport
        if transport is not None and transport.can_write_eof():
            transport.write_eof()

    async def aclose(self) -> None:
        """Close the connection (see :func:`_closed_within`)."""
        transport = self._protocol.transport
        if transport is not None:
            if not transport.is_closing():
                transport.close()
            await _closed_within(transport, self._protocol.wait_closed(), self.timeout)


#: Buffers one sendmsg takes at most (Linux's IOV_MAX is 1024).
_IOV_MAX = 512
_SENDMSG = hasattr(socket.socket, "sendmsg")


def _nbytes(buf: Any) -> int:
    return len(buf) if type(buf) is bytes else memoryview(buf).nbytes


def _after(views: list[memoryview], sent: int) -> list[memoryview]:
    """What is left of ``views`` once their first ``sent`` bytes are gone."""
    for i, view in enumerate(views):
        if sent < len(view):
            return [view[sent:], *views[i + 1 :]] if sent else views[i:]
        sent -= len(view)
    return []


#: Bytes a client connection holds of what came before a read took it: an
#: answer's head and a small body, taken in one read.
RECEIVE_BUFFER = 1 << 16

_BYTES = "bytes"  # what a receive waits for


class ClientStream(_WorkerThreads, asyncio.BufferedProtocol):
    """The asyncio client's connection, over TCP or TLS: the protocol the
    event loop feeds, and the :class:`~binproto.adapters._server.ByteStream`
    the client reads and writes.

    The socket stays registered with the event loop while the connection
    lives: waiting for an answer costs a future, and no system call. The
    loop receives into the buffer of the read that waits (``receive_into``:
    a tensor's bytes land in their array), else into the connection's own
    buffer of :data:`RECEIVE_BUFFER` bytes. Reading pauses only when that
    buffer is full. Each wait for the server is bounded by ``timeout``
    seconds, with one timer per connection that moves only when it fires.

    Requests go out from the caller's buffers. Over TCP, one ``sendmsg``
    sends what the kernel takes at once; the rest goes through the
    transport in pieces of at most 1 MiB (as the servers write:
    :func:`~binproto.adapters.h11.body_pieces`), waiting for the server to
    take them. ``sock`` is the transport's socket, sent on
    directly only while nothing waits in the transport (None over TLS).
    """

    def __init__(self, timeout: float | None = None, sock: socket.socket | None = None) -> None:
        self.timeout = timeout
        self._sock = sock if _SENDMSG else None
        self.transport: asyncio.Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._buf = bytearray(RECEIVE_BUFFER)
        self._view = memoryview(self._buf)
        self._start = 0  # what came and no read took yet: _buf[_start:_end]
        self._end = 0
        self._target: memoryview | None = None  # the waiting receive_into's memory
        self._into_target = False  # whether get_buffer lent the loop self._target
        self._received = 0  # bytes the loop put in _target
        self._waiter: asyncio.Future[None] | None = None
        self._waiting_for = ""  # _BYTES or _TAKE, while _waiter waits
        self._eof = False
        self._reading_paused = False
        self._writing_paused = False
        self._closed: asyncio.Future[None] | None = None
        self._timer = _WaitTimer()  # bounds the waiting call

    # -- protocol callbacks ------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are no asyncio.Transport subclasses: a cast)
        self.transport = cast(asyncio.Transport, transport)
        self._loop = loop = asyncio.get_running_loop()
        self._closed = loop.create_future()
        self.transport.set_write_buffer_limits(HIGH_WATER)

    def get_buffer(self, sizehint: int) -> memoryview:
        # Only a read still waiting takes bytes into its memory: one cancelled
        # or timed out has not yet let go of it, but gave up on it.
        waiter = self._waiter
        if self._target is not None and waiter is not None and not waiter.done():
            self._into_target = True
            return self._target
        self._into_target = False
        start, end = self._start, self._end
        if start == end:
            self._start = self._end = end = 0
        elif end == len(self._buf):
            # No room after what is held: it moves to the front. A full
            # buffer grows, for a transport that still delivers once
            # reading is paused (TLS before Python 3.11 does).
            held = bytes(self._view[start:end])
            if start == 0:
                self._buf = bytearray(2 * len(self._buf))
                self._view = memoryview(self._buf)
            end = len(held)
            self._view[:end] = held
            self._start, self._end = 0, end
        return self._view[end:]

    def buffer_updated(self, nbytes: int) -> None:
        if self._into_target:
            self._into_target = False
            self._target = None
            self._received = nbytes
        else:
            self._end += nbytes
            if self._end - self._start == len(self._buf):
                # Full: the rest waits in the kernel until a read takes these.
                assert self.transport is not None
                self.transport.pause_reading()
                self._reading_paused = True
        if self._waiting_for == _BYTES:
            self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        # The transport closes: a server that ended its side serves no more
        # requests, and what it sent stays here to be read. (True would
        # also draw a warning from a TLS transport.)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._target = None
        self._timer.cancel()
        self._wake()
        if self._closed is not None and not self._closed.done():
            self._closed.set_result(None)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._waiting_for == _TAKE:
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        self._waiter = None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self, what: str, target: memoryview | None = None) -> None:
        """Wait for the event loop's news for a call waiting for ``what``
        (bytes, put in ``target`` when given; or room to write); the
        built-in TimeoutError after ``timeout`` seconds (see :class:`_WaitTimer`)."""
        transport, loop, timer = self.transport, self._loop, self._timer
        assert transport is not None and loop is not None
        if self._reading_paused and what == _BYTES:
            self._reading_paused = False
            transport.resume_reading()
        self._target, self._received, self._waiting_for = target, 0, what
        self._waiter = waiter = loop.create_future()
        if self.timeout is not None:
            timer.start(loop, waiter, self.timeout, what)
        try:
            await waiter
        finally:
            # (Cancelled or timed out, no later bytes may go to the target.)
            timer.stop()
            self._waiter = self._target = None
            self._waiting_for = ""

    def _ended(self) -> bool:
        return self._eof or self.transport is None or self.transport.is_closing()

    # -- the ByteStream ------------------------------------------------------------

    async def receive_into(self, view: memoryview) -> int:
        """Receive up to ``len(view)`` bytes into ``view``; 0 at end of
        stream (a reset ends it too: what is missing says the rest)."""
        if not len(view):
            return 0
        while True:
            held = self._end - self._start
            if held:
                n = min(len(view), held)
                view[:n] = self._view[self._start : self._start + n]
                self._start += n
                return n
            if self._ended():
                return 0
            await self._wait(_BYTES, view)
            if self._received:
                return self._received

    async def receive_some(self, max_bytes: int) -> bytes:
        """Up to ``max_bytes`` bytes; ``b""`` at end of stream."""
        while self._start == self._end:
            if self._ended():
                return b""
            await self._wait(_BYTES)
        start = self._start
        end = min(self._end, start + max_bytes)
        self._start = end
        return bytes(self._view[start:end])

    async def send_all(self, buffers: Sequence[Any]) -> None:
        """Send the buffers in order, from the caller's memory (never joined):
        over TCP, what the kernel takes in one ``sendmsg`` at once (on
        loopback each send runs the peer's receive path too), the rest in
        pieces through the transport."""
        transport = self.transport
        assert transport is not None
        if transport.is_closing():
            raise ConnectionResetError("the connection is closed")
        sent = 0
        sock = self._sock
        if sock is not None and len(buffers) <= _IOV_MAX and not transport.get_write_buffer_size():
            try:
                sent = sock.sendmsg(buffers)
            except BlockingIOError:
                pass
            if sent == sum(map(_nbytes, buffers)):
                return  # (the common case: no view made)
        # (In pieces: before Python 3.12 a transport copies what the kernel did not take.)
        pending = _after([memoryview(b).cast("B") for b in buffers if _nbytes(b)], sent)
        await _write_all(transport, self._room, list(body_pieces(pending)))

    async def _room(self) -> None:
        """Wait while the transport holds more than its high-water mark."""
        transport = self.transport
        while self._writing_paused and transport is not None and not transport.is_closing():
            await self._wait(_TAKE)

    async def send_eof(self) -> None:
        """End the sending side (when the transport can: not over TLS)."""
        transport = self.transport
        if transport is not None and transport.can_write_eof():
            transport.write_eof()

    async def aclose(self) -> None:
        """Close the connection: at once when a request was not sent whole,
        else once the transport is done (see :func:`_closed_within`). A
        call another task waits in ends (at end of stream, or with
        ``ConnectionResetError`` for a send)."""
        transport = self.transport
        if transport is None or self._closed is None:
            return
        if transport.get_write_buffer_size():
            transport.abort()
        elif not transport.is_closing():
            transport.close()
        await _closed_within(transport, self._closed, self.timeout)

    def is_readable(self) -> bool:
        """True when bytes came that no read took, or the server closed its
        side (see :class:`~binproto.adapters._server.ProbesIdle`): what the
        event loop saw, with no system call."""
        return self._end > self._start or self._ended()


#: Seconds the server stops accepting when the process is out of file
#: descriptors (trio's serve_listeners waits as long).
ACCEPT_RETRY = 0.1

#: Seconds between two warnings of a shortage of descriptors.
SHORTAGE_LOG_EVERY = 60.0

# What accept() says when the process or the system is out of descriptors
# or memory: nothing to do but wait for a connection to close.
_SHORTAGE = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

# Connections accepted per wake-up of a listening socket.
_ACCEPTS_PER_WAKE = 128


class _Acceptor:
    """Accepts the connections of one listening socket of ``server`` in
    place of asyncio's selector loops, which retry at once when accept()
    runs out of descriptors: once per queued connection, each retry with a
    logged traceback (the loop spins, and the log grows by megabytes a
    second). Here a shortage stops accepting for :data:`ACCEPT_RETRY`
    seconds and is logged at most once per :data:`SHORTAGE_LOG_EVERY`."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        server: asyncio.Server,
        listener: Any,
        factory: Callable[[], asyncio.BaseProtocol],
        tasks: set[asyncio.Task[Any]],
    ) -> None:
        self._loop = loop
        self._server = server
        self._fd: int = listener.fileno()
        self._kind = (listener.family, listener.type, listener.proto)
        self._factory = factory
        self._tasks = tasks
        self._warned_at: float | None = None

    def start(self) -> None:
        """Watch the listening socket with :meth:`_ready` instead of asyncio."""
        self._loop.remove_reader(self._fd)
        self._loop.add_reader(self._fd, self._ready)

    def _accept(self) -> tuple[socket.socket, Any]:
        # A socket object over the server's descriptor for one call, detached
        # after it: the server's own socket object owns (and closes) the descriptor.
        family, kind, proto = self._kind
        listener = socket.socket(family, kind, proto, fileno=self._fd)
        try:
            return listener.accept()
        finally:
            listener.detach()

    def _ready(self) -> None:
        for _ in range(_ACCEPTS_PER_WAKE):
            try:
                conn, _ = self._accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno in _SHORTAGE:
                    self._rest(exc)
                else:
                    log.warning("accept failed: %s", exc)
                return
            conn.setblocking(False)
            task = self._loop.create_task(self._connect(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _connect(self, conn: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(self._factory, conn)
        except Exception:  # (the peer gone already, say: nothing to serve)
            log.debug("could not set up an accepted connection", exc_info=True)
            conn.close()

    def _rest(self, exc: OSError) -> None:
        now = time.monotonic()
        if self._warned_at is None or now - self._warned_at >= SHORTAGE_LOG_EVERY:
            self._warned_at = now
            log.warning(
                "cannot accept connections: %s; retrying every %s s until one closes"
                " (raise the limit on open files: ulimit -n)",
                exc,
                ACCEPT_RETRY,
            )
        self._loop.remove_reader(self._fd)
        self._loop.call_later(ACCEPT_RETRY, self._resume)

    def _resume(self) -> None:
        # (A closed server's descriptor may be another socket's by now.)
        if self._server.is_serving():
            self._loop.add_reader(self._fd, self._ready)


def _accept_with_backoff(
    server: asyncio.Server, factory: Callable[[], asyncio.BaseProtocol]
) -> None:
    """Accept ``server``'s connections with an :class:`_Acceptor` per
    listening socket, on asyncio's selector loops (uvloop and the proactor
    loop accept on their own, and back off)."""
    loop = asyncio.get_running_loop()
    if not isinstance(loop, asyncio.SelectorEventLoop):
        return
    tasks: set[asyncio.Task[Any]] = set()
    for listener in server.sockets:
        _Acceptor(loop, server, listener, factory, tasks).start()


# The connection tasks of each server start_server made (see close_server).
_CONNECTIONS: weakref.WeakKeyDictionary[asyncio.Server, set[asyncio.Task[None]]] = (
    weakref.WeakKeyDictionary()
)


async def start_server(
    server: V2Server | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    zero_copy: bool = True,
    timeout: float | None = None,
    sock: socket.socket | None = None,
) -> asyncio.Server:
    """Start serving ``server`` (default: one with the ``echo`` model).

    ``zero_copy`` picks the BufferedProtocol transport (tensor bytes received
    in place) over asyncio streams. The server's :class:`Timeouts` bound each
    phase of a request; ``timeout``, when given, is used for every phase
    instead. Port 0 picks a free port: read it from
    ``server.sockets[0].getsockname()[1]``. Stop it with :func:`close_server`,
    which also ends the connections it is serving. The listen backlog is
    :data:`BACKLOG`. ``sock``, when given, is a listening socket to serve on
    instead of ``host`` and ``port`` (one a parent process shares with its workers).
    """
    where: dict[str, Any] = {"sock": sock} if sock is not None else {"host": host, "port": port}
    app = server if server is not None else V2Server()
    bounds = Timeouts.every(timeout) if timeout is not None else None
    tasks: set[asyncio.Task[None]] = set()

    def track(task: asyncio.Task[None]) -> None:
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def spawn(stream: BufferedStream) -> None:
        track(asyncio.get_running_loop().create_task(app.serve_connection(stream, bounds)))

    srv: asyncio.Server
    if zero_copy:
        loop = asyncio.get_running_loop()
        buffers = _ReceiveBuffers(KEPT_RECEIVE_BUFFERS)

        def protocol() -> asyncio.BaseProtocol:
            return _ReceiveProtocol(spawn, timeout, buffers)

        srv = await loop.create_server(protocol, backlog=BACKLOG, **where)
        _accept_with_backoff(srv, protocol)
    else:

        async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            track(task)
            try:
                await app.serve_connection(StreamsStream(reader, writer, timeout), bounds)
            except asyncio.CancelledError:
                # Ended by close_server (or the loop's shutdown): asyncio's
                # streams would log a cancelled handler as an error.
                pass

        srv = await asyncio.start_server(on_client, limit=STREAM_LIMIT, backlog=BACKLOG, **where)

        def streams() -> asyncio.BaseProtocol:
            reader = asyncio.StreamReader(limit=STREAM_LIMIT)
            return asyncio.StreamReaderProtocol(reader, on_client)

        _accept_with_backoff(srv, streams)
    _CONNECTIONS[srv] = tasks
    return srv


async def close_server(srv: asyncio.Server) -> None:
    """Stop ``srv`` (from :func:`start_server`): stop listening, end the
    connections it is serving (idle keep-alive ones included), and wait until
    they are closed. ``srv.close()`` alone leaves them running."""
    srv.close()
    tasks = _CONNECTIONS.pop(srv, set())
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await srv.wait_closed()


async def serve(
    server: V2Server | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    zero_copy: bool = True,
    timeout: float | None = None,
    ready: Callable[[int], object] | None = None,
    sock: socket.socket | None = None,
) -> None:
    """Run the server until cancelled (options as for :func:`start_server`);
    then its connections are closed too.

    ``ready(port)`` is called once listening.
    """
    srv = await start_server(server, host, port, zero_copy=zero_copy, timeout=timeout, sock=sock)
    try:
        if ready is not None:
            ready(srv.sockets[0].getsockname()[1])
        await srv.serve_forever()
    finally:
        await close_server(srv)


async def _open_socket(loop: asyncio.AbstractEventLoop, host: str, port: int) -> socket.socket:
    """A connected non-blocking TCP socket: each address of ``host`` in
    turn, as ``open_connection`` does ("localhost" may be ::1 first, with
    the server listening on 127.0.0.1 only)."""
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    errors: list[OSError] = []
    for family, type_, proto, _, address in infos:
        sock = socket.socket(family, type_, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await loop.sock_connect(sock, address)
        except OSError as exc:
            sock.close()
            errors.append(exc)
            continue
        except BaseException:
            sock.close()
            raise
        return sock
    if len(errors) == 1:
        raise errors[0]
    raise OSError(f"could not connect to {host}:{port}: {'; '.join(map(str, errors))}")


async def connect(
    host: str,
    port: int,
    *,
    zero_copy: bool = True,
    timeout: float | None = None,
    ssl: ssl_module.SSLContext | None = None,
) -> ClientStream | StreamsStream:
    """Open a connection as a ByteStream.

    ``zero_copy``: a :class:`ClientStream` (bytes received into and sent
    from the caller's memory); else asyncio streams. ``timeout`` bounds each
    wait for the peer, for its bytes or for it to take ours. ``ssl``: TLS
    with this context.
    """
    loop = asyncio.get_running_loop()
    if not zero_copy:
        # (asyncio sets TCP_NODELAY on its TCP transports.)
        reader, writer = await asyncio.open_connection(host, port, limit=STREAM_LIMIT, ssl=ssl)
        return StreamsStream(reader, writer, timeout)
    sock = await _open_socket(loop, host, port)
    try:
        _, stream = await loop.create_connection(
            lambda: ClientStream(timeout, sock if ssl is None else None),
            sock=sock,
            ssl=ssl,
            server_hostname=host if ssl is not None else None,
        )
    except BaseException:
        sock.close()
        raise
    return stream


class Client(EndpointClient):
    """A V2 client over a pool of HTTP/1.1 keep-alive connections.

    ::

        async with Client("http://127.0.0.1:8000") as c:
            outputs = await c.infer("echo", {"x": array})
            async with c.stream("echo", {"x": array}) as response:
                async for event in response:
                    ...

    ``url_or_host`` is a base URL (``http://host:port``, ``https://...``)
    or a host, with ``port`` (default 8000). One client serves many tasks at
    once, over at most ``max_connections`` connections. Outputs come back
    binary by default. See :class:`ClientCore` for ``max_connections``,
    ``keepalive_expiry``, ``retry``, ``limits``, ``accept_encoding`` and
    ``request_encoding``.

    ``zero_copy`` receives response tensors straight into their arrays
    (a :class:`ClientStream`; False: asyncio streams); ``timeout`` bounds
    each wait for the server, for its bytes or for it to take ours
    (default :data:`CLIENT_TIMEOUT`, 300 s; None: no bound; else a positive
    number of seconds, or :class:`binproto.LocalProtocolError`); ``ssl`` is the
    ``ssl.SSLContext`` for TLS (an ``https://`` URL without one uses
    ``ssl.create_default_context()``).
    """

    async def _connect(self, where: Endpoint, *, zero_copy: bool, timeout: float | None) -> Any:
        return await connect(
            where.host, where.port, zero_copy=zero_copy, timeout=timeout, ssl=where.ssl
        )
