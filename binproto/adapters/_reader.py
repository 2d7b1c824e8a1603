"""The HTTP/1.1 request body reader of binproto's servers: a body read from a
byte stream and an ``h11.Connection``, a ``Content-Length`` body without h11,
in place where the stream allows it, and a chunked body's lines measured."""

from __future__ import annotations

import logging
import re
from collections.abc import (
    Awaitable,
    Callable,
)
from typing import Any, cast

try:
    import h11
except ModuleNotFoundError as exc:  # an optional dependency: say which extra brings it
    from binproto.adapters import missing_extra

    raise missing_extra(exc, "h11") from None

from binproto import (
    RemoteProtocolError,
)
from binproto._util import aligned_copy

from ._intake import (
    BodyBudget,
)
from ._streams import (
    CHUNK,
    ByteStream,
    ReceivesInto,
    Recycles,
    RunsInThreads,
    Yields,
    capabilities,
)
from .h11 import (
    remote_error,
)

__all__ = ["MAX_CHUNK_LINE", "BodyReader", "ChunkLines"]

log = logging.getLogger("binproto.server")

#: Longest line of a chunked request body (a chunk's size and extensions,
#: with its CRLF) the server takes: a longer one is answered 431.
MAX_CHUNK_LINE = 16 * 1024


def _stalled(exc: TimeoutError) -> RemoteProtocolError:
    """The fault of a body whose bytes stopped coming (``exc``: the stream's
    timeout)."""
    detail = f" ({exc})" if str(exc) else ""
    return RemoteProtocolError(f"timed out waiting for the body{detail}", status_hint=408)


_LF = re.compile(b"\n")
_CHUNK_SIZE = re.compile(b"[0-9A-Fa-f]{1,20}")


class ChunkLines:
    """Measures the lines of a chunked body (each chunk's size and
    extensions) as its bytes are read, and refuses one longer than
    :data:`MAX_CHUNK_LINE` bytes with a 431, however the bytes arrive. h11
    bounds only what it holds unfinished between two reads, so a long line
    that came in one read was taken and the same line in two was refused.
    The chunks' data is skipped by their sizes; h11 checks the framing
    itself (after a line this cannot read, it stops measuring), and the
    trailer's lines (within h11's bound of what it holds)."""

    def __init__(self) -> None:
        self._skip = 0  # chunk data still to pass, with the CRLF after it
        self._line = 0  # bytes of the current line seen
        self._start = bytearray()  # the current line's first bytes (its size)
        self._done = False  # the last chunk's line is read: trailers are h11's

    def feed(self, data: Any) -> None:
        """Measure the next ``data`` of the body (bytes-like)."""
        at, end = 0, len(data)
        while at < end and not self._done:
            if self._skip:
                step = min(self._skip, end - at)
                self._skip -= step
                at += step
                continue
            found = _LF.search(data, at)
            stop = end if found is None else found.end()
            if len(self._start) < 32:
                self._start += data[at : min(stop, at + 32 - len(self._start))]
            self._line += stop - at
            if self._line > MAX_CHUNK_LINE:
                raise RemoteProtocolError(
                    f"a line of the chunked body is longer than {MAX_CHUNK_LINE} bytes"
                    " (a chunk's size and extensions)",
                    status_hint=431,
                )
            at = stop
            if found is not None:
                size = _CHUNK_SIZE.match(self._start)
                if size is None or int(size.group(), 16) == 0:
                    self._done = True  # the last chunk, or h11 refuses the line
                else:
                    self._skip = int(size.group(), 16) + 2
                self._line = 0
                self._start.clear()


class BodyReader:
    """Reads one message body from a stream and an ``h11.Connection``.

    ``read()`` returns the next piece of the body (empty at its end). A
    ``Content-Length`` body is read without h11 (``direct``): first the bytes
    h11 received past the head, then the stream. h11 would turn every piece
    into an event, copying it, and has no way to skip bytes it did not see,
    so the next message starts a fresh ``h11.Connection`` with what was
    received past this body (:meth:`rest`). Then, with ``receive_in_place``
    and a stream that has ``receive_into``, ``read_into()`` receives into the
    caller's memory. A chunked body goes through h11; with ``chunked``, its
    lines are measured too (see :class:`ChunkLines`).
    """

    # (Class defaults: a server with no budget sets none of these per request.)
    #: The server's :class:`BodyBudget` this body counts against, or None.
    budget: BodyBudget | None = None
    #: The bytes this body holds of the budget (see :meth:`BodyBudget.claim`).
    claimed = 0
    _through_h11 = 0  # bytes of a chunked body read so far
    # A chunked body's line measure, and the bytes it has yet to see first.
    _lines: ChunkLines | None = None
    _lines_ahead: tuple[Any, ...] = ()

    def __init__(
        self,
        stream: ByteStream,
        conn: h11.Connection,
        content_length: int | None,
        *,
        receive_in_place: bool,
        ahead: Any = b"",
        chunked: bool = False,
    ) -> None:
        self._stream = stream
        offers = capabilities(stream)
        #: The stream's ``checkpoint`` (see :class:`Yields`), or None.
        self.checkpoint: Callable[[], Awaitable[None]] | None = (
            cast(Yields, stream).checkpoint if offers.yields else None
        )
        #: The stream's ``to_thread`` (see :class:`RunsInThreads`), or None.
        self.to_thread: Callable[..., Awaitable[Any]] | None = (
            cast(RunsInThreads, stream).to_thread if offers.runs_in_threads else None
        )
        self._conn = conn
        self._remaining = content_length
        self._receive_into: Callable[[memoryview], Awaitable[int]] | None = (
            cast(ReceivesInto, stream).receive_into
            if receive_in_place and offers.receives_into
            else None
        )
        self._recycle: Callable[[Any], None] | None = (
            cast(Recycles, stream).recycle if offers.recycles else None
        )
        #: h11 is bypassed: the body has a Content-Length.
        self.direct = content_length is not None
        # What was received past the head, read before the stream: what h11
        # holds, then ``ahead`` (received with the head's end, not given to h11).
        self._pending: Any = b""
        self._ended = False
        if self.direct:
            held, self._ended = conn.trailing_data
            self._pending = held + bytes(ahead) if len(held) else ahead
        else:
            if chunked:  # (What h11 holds of the body: bytes pipelined behind the head.)
                self._lines = ChunkLines()
                self._lines_ahead = (conn.trailing_data[0], ahead)
            if len(ahead):
                conn.receive_data(ahead)
        self._taken = 0  # bytes of _pending handed out
        # Streams that buffer ahead may prefer larger reads of the body.
        self._read_size = offers.read_size
        self.done = False  #: the whole body has been read
        self.failed: RemoteProtocolError | None = None  #: the fault that ended reading
        # False once reading ended on the peer's close or on its stall.
        self._may_send = True

    @property
    def in_place(self) -> bool:
        """True when :meth:`read_into` may be used now."""
        return self.direct and self._receive_into is not None and self._taken == len(self._pending)

    def rest(self) -> tuple[Any, bool]:
        """What was received past the body (the start of the next message),
        and whether the peer closed its side: ``h11.Connection.trailing_data``
        for the body read around h11. Only meaningful once the body is done."""
        if not self.direct:
            return self._conn.trailing_data
        return self._pending[self._taken :], self._ended

    @property
    def remaining(self) -> int | None:
        """Body bytes still to come, when the body has a ``Content-Length``."""
        return self._remaining

    @property
    def may_still_send(self) -> bool:
        """True when the peer may still be sending this body: it is not all
        read, and reading did not end on the peer's close or a stall (it may
        have ended on a fault in the body's framing)."""
        return not self.done and self._may_send

    @property
    def awaits_continue(self) -> bool:
        """True when the peer waits for ``100 Continue`` before sending its body."""
        return not self.done and bool(self._conn.they_are_waiting_for_100_continue)

    async def read(self, max_bytes: int = 1 << 62) -> Any:
        """The next piece of the body; ``b""`` at its end. ``max_bytes``
        bounds what is read in direct mode.
        After a fault, every call raises it again; after the stream's
        :class:`TimeoutError`, every later call raises :attr:`failed` (a 408
        fault) at once, without waiting for the peer again."""
        if self.failed is not None:
            raise self.failed
        try:
            return await self._read(max_bytes)
        except RemoteProtocolError as exc:
            self.failed = exc
            raise
        except TimeoutError as exc:
            self.failed = _stalled(exc)
            self._may_send = False
            raise

    async def _continue(self) -> None:
        # A client that sent "Expect: 100-continue" waits for this before the
        # body (unless some of it came anyway).
        if self._conn.they_are_waiting_for_100_continue and not self._pending:
            await self._stream.send_all(
                [self._conn.send(h11.InformationalResponse(status_code=100, headers=[]))]
            )

    async def _read(self, max_bytes: int) -> Any:
        if self.done:
            return b""
        await self._continue()
        if self.direct:
            return await self._read_direct(max_bytes)
        conn = self._conn
        lines = self._lines
        if lines is not None and self._lines_ahead:
            # (Measured here, not at the head: a refusal is a fault of the body.)
            ahead, self._lines_ahead = self._lines_ahead, ()
            for data in ahead:
                lines.feed(data)
        closed = False
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise (self._closed() if closed else remote_error(exc)) from None
            if type(event) is h11.Data:
                if self._remaining is not None:
                    self._remaining -= len(event.data)
                if self.budget is not None:  # a chunked body claims its bytes as they come
                    self._through_h11 += len(event.data)
                    self.budget.claim(self, self._through_h11)
                return event.data
            if type(event) is h11.EndOfMessage:
                self.done = True
                return b""
            if event is not h11.NEED_DATA or closed:
                raise RemoteProtocolError(f"unexpected HTTP event {type(event).__name__}")
            data = await self._stream.receive_some(CHUNK)
            if not len(data):
                # The peer closed: the end of a response framed by the close
                # (neither a length nor chunks), else a body cut short (h11 says).
                closed = True
            if lines is not None:
                lines.feed(data)
            conn.receive_data(data)

    async def finish(self) -> None:
        """Read the end of the body (the parser found it complete)."""
        data = await self.read()
        if len(data):
            raise RemoteProtocolError("unexpected additional data after the end of the message")

    async def _read_direct(self, max_bytes: int) -> Any:
        remaining = self._remaining
        assert remaining is not None
        if not remaining:
            self.done = True
            return b""
        pending = self._pending
        if self._taken < len(pending):
            start = self._taken
            self._taken = min(len(pending), start + min(max_bytes, remaining))
            self._remaining = remaining - (self._taken - start)
            return memoryview(pending)[start : self._taken]
        if self._ended:
            raise self._closed()
        data = await self._stream.receive_some(min(max_bytes, remaining, self._read_size))
        if not len(data):
            raise self._closed()
        self._remaining = remaining - len(data)
        return data

    def take_whole(self, most: int, align_at: int) -> memoryview | None:
        """The rest of a ``Content-Length`` body of at most ``most`` bytes that
        has all been received already, as a copy of its own (so its arrays are
        writable and hold nothing else received) whose byte ``align_at`` is
        aligned (see :func:`binproto._util.aligned_copy`); else None. The body
        is then read to its end, and when nothing was received past it, the
        memory it came in is the stream's again (see :class:`Recycles`)."""
        remaining = self._remaining
        start = self._taken
        if (
            not self.direct
            or remaining is None
            or remaining > most
            or self.failed is not None
            or len(self._pending) - start < remaining
        ):
            return None
        pending = self._pending
        end = self._taken = start + remaining
        self._remaining = 0
        self.done = True
        body = aligned_copy(memoryview(pending)[start:end], align_at)
        if end == len(pending) and self._recycle is not None:
            # Nothing was received past the body: the stream may receive the
            # next request into the memory this one came in.
            self._pending, self._taken = b"", 0
            self._recycle(pending)
        return body

    async def read_into(self, view: memoryview) -> int:
        """Receive body bytes into ``view`` (only when ``direct``); returns how many."""
        assert self.in_place and self._receive_into is not None and self._remaining is not None
        if self.failed is not None:
            raise self.failed
        try:
            await self._continue()
            n: int = await self._receive_into(view[: self._remaining])
        except TimeoutError as exc:
            self.failed = _stalled(exc)
            self._may_send = False
            raise
        if not n:
            self.failed = self._closed()
            raise self.failed
        self._remaining -= n
        if not self._remaining:
            self.done = True
        return n

    def _closed(self) -> RemoteProtocolError:
        self._may_send = False  # (the peer closed its side)
        if self._remaining is None:
            return RemoteProtocolError("the peer closed the connection before the end of the body")
        return RemoteProtocolError(
            f"the peer closed the connection with {self._remaining} body bytes missing"
        )
