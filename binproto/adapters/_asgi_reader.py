"""Reading a request body from an ASGI ``receive`` callable.

:class:`AsgiBodyReader` hands the body to
:class:`~binproto.adapters._intake.MessageBody`, for
:func:`~binproto.adapters.asgi.read_request` and
:class:`~binproto.adapters.asgi.V2App` alike. Its own module: both import
it when they are imported, not at each call.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from binproto import LocalProtocolError, RemoteProtocolError
from binproto._util import aligned_copy

from ._app import DISCARD_LIMIT
from ._intake import BodyBudget

if TYPE_CHECKING:
    from .asgi import BodySource, Receive

__all__ = ["AsgiBodyReader", "ClientDisconnected"]

log = logging.getLogger("binproto.asgi")

try:
    # What Starlette's request.stream() raises on http.disconnect.
    from starlette.requests import ClientDisconnect as _StarletteDisconnect
except ImportError:  # pragma: no cover - Starlette is optional

    class _StarletteDisconnect(Exception):  # type: ignore[no-redef]
        """Never raised: Starlette is not installed."""


class ClientDisconnected(RemoteProtocolError):
    """The client went away before the end of its request body.

    Nobody is left to answer: an application may return any response (the
    server drops it) or nothing. Logged once, at INFO, as a server logs a
    lost connection; never a server fault.
    """


def _disconnected(received: int) -> ClientDisconnected:
    log.info("the client disconnected after %d bytes of the request body", received)
    return ClientDisconnected("the client disconnected before the end of the body", offset=received)


class _Chunks:
    """The body's non-empty chunks from the ASGI ``receive`` callable or an
    async iterable of bytes; a client that leaves first is a
    :class:`ClientDisconnected`, whichever way the source says so.

    An iterator class, not an async generator: one left unfinished (a body
    taken whole from its first message) would be closed by a task the event
    loop starts for it, at a cost per request.
    """

    __slots__ = ("_chunks", "_done", "_receive", "_received")

    def __init__(self, source: BodySource) -> None:
        self._receive: Receive | None = None
        self._chunks: AsyncIterator[Any] | None = None
        if callable(source):
            self._receive = source
        else:
            self._chunks = aiter(source)
        self._received = 0
        self._done = False

    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> Any:
        # (One coroutine a chunk: a small body's whole read is this call.)
        while not self._done:
            if self._receive is not None:
                message = await self._receive()
                kind = message.get("type")
                if kind == "http.disconnect":
                    raise _disconnected(self._received)
                if kind != "http.request":
                    continue
                self._done = not message.get("more_body", False)
                chunk = message.get("body", b"")
            else:
                assert self._chunks is not None
                try:
                    chunk = await anext(self._chunks)
                except StopAsyncIteration:
                    break
                except _StarletteDisconnect:
                    raise _disconnected(self._received) from None
            if len(chunk):  # Starlette's stream() ends with b"": not the end mark.
                self._received += len(chunk)
                return chunk
        self._done = True
        raise StopAsyncIteration


def _thread_runner() -> Callable[..., Awaitable[Any]] | None:
    """``asyncio.to_thread`` under an asyncio event loop, else None (the
    work stays on the loop of any other library)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return None
    return asyncio.to_thread


async def _sleep0() -> None:
    await asyncio.sleep(0)


#: The longest a stalled body receive may wait past its timeout: the check's period.
STALL_CHECK = 1.0


class _Stalls:
    """The body receives waiting on one asyncio event loop, and one timer
    that ends those past their deadline (a 408 from the reader).

    A timer per receive (``asyncio.timeout``) would cost more than the rest
    of a small request's reading (docs/performance.md); this costs a dict
    entry, and one timer run per period while receives wait. A receive
    waits at most ``STALL_CHECK`` (or a quarter of the shortest timeout
    seen, when less) past its timeout."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # (Weakly: the loops' map below would otherwise keep every loop alive.)
        self.loop_ref = weakref.ref(loop)
        #: The receives waiting: reader -> (deadline, its task).
        self.waiting: dict[AsgiBodyReader, tuple[float, asyncio.Task[Any]]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._period = STALL_CHECK

    def start(self, reader: AsgiBodyReader, timeout: float) -> None:
        """Note that ``reader`` now waits for a receive, at most ``timeout`` seconds."""
        loop = self.loop_ref()
        task = asyncio.current_task(loop)
        assert loop is not None and task is not None  # (a receive is awaited in a task)
        self.waiting[reader] = (loop.time() + timeout, task)
        if timeout / 4 < self._period:
            self._period = timeout / 4
            if self._timer is not None:  # (armed for the longer period: sooner now)
                self._timer.cancel()
                self._timer = None
        if self._timer is None:
            self._timer = loop.call_later(self._period, self._check)

    def _check(self) -> None:
        loop = self.loop_ref()
        assert loop is not None  # (it runs this)
        now = loop.time()
        for reader, (deadline, task) in list(self.waiting.items()):
            if now >= deadline:
                del self.waiting[reader]
                reader.stalled = True
                task.cancel()  # (the reader turns it into its 408 fault)
        self._timer = loop.call_later(self._period, self._check) if self.waiting else None


#: Each event loop's :class:`_Stalls` (several loops, one a thread, share
#: the process under some servers); a loop that is gone takes its own along.
_stalls_of: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Stalls] = (
    weakref.WeakKeyDictionary()
)
#: The last one asked for: most processes serve on one loop.
_last_stalls: _Stalls | None = None


def _stalls() -> _Stalls | None:
    """The running asyncio loop's :class:`_Stalls`; None under another library."""
    global _last_stalls
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    stalls = _last_stalls
    if stalls is None or stalls.loop_ref() is not loop:
        stalls = _stalls_of.get(loop)
        if stalls is None:
            stalls = _stalls_of[loop] = _Stalls(loop)
        _last_stalls = stalls
    return stalls


class AsgiBodyReader:
    """A request body read from an ASGI ``receive`` callable, as
    :class:`~binproto.adapters._intake.MessageBody` reads it (a
    :class:`~binproto.adapters._intake.BodySource`). Nothing is received
    until a read asks for it (a client waiting on ``Expect: 100-continue``
    is invited then, by the server)."""

    budget: BodyBudget | None = None
    claimed = 0

    def __init__(
        self, receive: BodySource, content_length: int | None, timeout: float | None = None
    ) -> None:
        self._chunks = _Chunks(receive)
        self._remaining = content_length
        self._pending: Any = b""  # received, not handed out yet
        self._received = 0  # bytes of the body received
        self.done = content_length == 0
        self.failed: RemoteProtocolError | None = None
        # The longest wait for more of the body (asyncio only: see _Stalls).
        self._timeout = timeout
        self._stalls = _stalls() if timeout is not None else None
        #: True once a receive waited longer than the timeout.
        self.stalled = False
        self.to_thread: Callable[..., Awaitable[Any]] | None = _thread_runner()
        # Under asyncio a compressed body lets other tasks run as it inflates.
        self.checkpoint: Callable[[], Awaitable[None]] | None = (
            _sleep0 if self.to_thread is not None else None
        )

    @property
    def remaining(self) -> int | None:
        """Body bytes still to come (received or not), when the length is known."""
        return self._remaining

    @property
    def in_place(self) -> bool:
        """Never: ASGI hands the body over in messages of its own."""
        return False

    async def prime(self) -> None:
        """Receive the first message now: a small body all in it is then
        decoded whole (:meth:`take_whole`)."""
        if not self.done and not len(self._pending):
            self._pending = await self._receive()

    async def _receive(self) -> Any:
        if self.failed is not None:
            raise self.failed
        stalls = self._stalls
        if stalls is not None:
            assert self._timeout is not None
            stalls.start(self, self._timeout)
        try:
            chunk = await anext(self._chunks, None)
        except RemoteProtocolError as exc:
            self.failed = exc
            raise
        except asyncio.CancelledError:
            if not self.stalled:
                raise  # (cancelled by someone else: the server, shutting down)
            task = asyncio.current_task()
            if task is not None and hasattr(task, "uncancel"):  # (Python 3.11+)
                task.uncancel()
            self.failed = RemoteProtocolError(
                f"timed out waiting for the body (nothing came in {self._timeout:g} s)",
                status_hint=408,
                offset=self._received,
            )
            raise self.failed from None
        finally:
            if stalls is not None:
                stalls.waiting.pop(self, None)
        if chunk is None:
            self.done = True
            if self._remaining:  # (the server frames bodies: only a disconnect ends one early)
                self.failed = ClientDisconnected(
                    f"the body ended with {self._remaining} bytes missing", offset=self._received
                )
                raise self.failed
            return b""
        self._received += len(chunk)
        if self.budget is not None and self._remaining is None:
            self.budget.claim(self, self._received)  # a chunked body claims bytes as they come
        return chunk

    async def read(self, max_bytes: int = 1 << 62) -> Any:
        """The next piece of the body (at most ``max_bytes``); empty at its end."""
        data = self._pending
        if not len(data):
            if self.done:
                return b""
            data = await self._receive()
        if len(data) > max_bytes:
            view = memoryview(data)
            data, self._pending = view[:max_bytes], view[max_bytes:]
        else:
            self._pending = b""
        if self._remaining is not None:
            self._remaining -= len(data)
        return data

    async def finish(self) -> None:
        """Read the end of the body (the parser found it complete)."""
        if len(await self.read()):
            raise RemoteProtocolError("unexpected additional data after the end of the message")

    def take_whole(self, most: int, align_at: int) -> memoryview | None:
        """The whole body, copied aligned, when the first message (see
        :meth:`prime`) held all of it and it is at most ``most`` bytes."""
        pending = self._pending
        if self._remaining is None or self._remaining > most or len(pending) != self._remaining:
            return None
        self._pending = b""
        self._remaining = 0
        return aligned_copy(memoryview(pending), align_at)

    async def read_into(self, view: memoryview) -> int:  # pragma: no cover - never in_place
        """Not offered (see :attr:`in_place`)."""
        raise LocalProtocolError("an ASGI body is not received in place")

    async def discard(self) -> bool:
        """Read and drop the rest of the body, up to ``DISCARD_LIMIT``
        bytes; True when all of it was read."""
        total = 0
        try:
            while len(data := await self.read()):
                total += len(data)
                if total > DISCARD_LIMIT:
                    return False
        except RemoteProtocolError:
            return False
        return True
