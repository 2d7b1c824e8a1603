"""Taking in a request body: what it is read as, and when it is refused.

A body comes from a :class:`BodySource` (the HTTP/1.1 server's
:class:`~binproto.adapters._server.BodyReader`, or an ASGI ``receive``
callable). :class:`MessageBody` decides how to read it: a small body all
here is decoded whole; a small compressed body is read ahead and its gzip
size checked; any other body is parsed as it arrives. :class:`BodyBudget`
bounds the body bytes all requests of a process hold at once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import numpy as np

import binproto
from binproto import (
    NEED_DATA,
    BodyClaims,
    Event,
    HeaderParsed,
    InferenceHeader,
    Kind,
    Limits,
    LocalProtocolError,
    MessageComplete,
    NeedData,
    Parser,
    ProtocolError,
    TensorAssembler,
    TensorChunk,
    TensorSpec,
)
from binproto._assemble import Destinations
from binproto._compression import GZIP_AHEAD, check_gzip_size
from binproto._decode import _decode_plain
from binproto._http import SLOW_HEADER
from binproto._parser import DEFAULT_LIMITS
from binproto._util import aligned_arrays, whole_number

__all__ = [
    "THREAD_HEADER",
    "THREAD_JSON",
    "WHOLE_BODY",
    "YIELD_BYTES",
    "BodyBudget",
    "BodySource",
    "InferenceError",
    "MessageBody",
    "header_rest",
    "receive_target",
]

#: Decompressed tensor bytes handed out between two chances for other tasks to run.
YIELD_BYTES = 1 << 20
#: A body of at most this many bytes that has all arrived with its head is
#: decoded whole (:func:`binproto.decode_request`): the parser's checks
#: without its events, and one copy into memory of its own. 64 KiB of tensor
#: bytes and a JSON header of up to 4 KiB: a bound of 64 KiB would leave a
#: tensor of 64 KiB (a power of two, as tensors often are) out by its header.
WHOLE_BODY = (64 + 4) * 1024

#: JSON headers at least this long are parsed in a worker thread when the
#: stream offers ``to_thread``, so the event loop goes on serving meanwhile
#: (see :meth:`binproto.BodyClaims.slow_header_from`).
THREAD_HEADER = SLOW_HEADER
#: Responses that may write at least this many elements as JSON data are
#: encoded in a worker thread.
THREAD_JSON = 1 << 16


def header_rest(parser: Parser, fed: int) -> int:
    """Bytes left of the JSON header after ``fed`` body bytes, or a large number
    when that is not known (plain JSON, compressed body, header parsed)."""
    hl = parser.header_length
    if parser.header is not None or not hl or parser.content_encoding is not None or fed >= hl:
        return 1 << 62
    return hl - fed


def receive_target(parser: Parser, assembler: binproto.TensorAssembler) -> memoryview | None:
    """The tensor memory the next body bytes belong in, when they may be
    received there directly (see :meth:`binproto.Parser.next_tensor_region`):
    a view of the assembler's target for them, to ``recv_into`` and then
    pass to ``parser.receive_data``. None when the next bytes are not tensor
    bytes that can go in place: read them into any buffer, at most
    :func:`header_rest` bytes. The one algorithm of every in-place reader
    (this module's :func:`receive_body_into`, the servers' and clients')."""
    region = parser.next_tensor_region()
    if region is None:
        return None
    index, offset, count = region
    return assembler.target(index)[offset : offset + count]


class BodySource(Protocol):
    """Where a :class:`MessageBody` reads its bytes from (a
    :class:`~binproto.adapters._server.BodyReader` is one)."""

    #: The :class:`BodyBudget` the body counts against, or None.
    budget: BodyBudget | None
    #: The body bytes claimed of it.
    claimed: int
    #: Lets other tasks run (while a compressed body inflates), or None.
    checkpoint: Callable[[], Awaitable[None]] | None
    #: Runs a function in a worker thread, or None (then on the event loop).
    to_thread: Callable[..., Awaitable[Any]] | None

    @property
    def failed(self) -> BaseException | None:
        """The fault that ended reading, or None."""

    @property
    def remaining(self) -> int | None:
        """Body bytes still to come, when the length is known."""

    @property
    def in_place(self) -> bool:
        """True when :meth:`read_into` may be used now."""

    async def read(self, max_bytes: int = 1 << 62) -> Any:
        """The next piece of the body; empty at its end."""

    async def finish(self) -> None:
        """Read the end of the body (the parser found it complete)."""

    def take_whole(self, most: int, align_at: int) -> memoryview | None:
        """The whole body, when it is all here and at most ``most`` bytes."""

    async def read_into(self, view: memoryview) -> int:
        """Receive body bytes into ``view``; returns how many."""


class InferenceError(Exception):
    """Raise from a handler to answer with a V2 error response.

    ``status`` is an HTTP error status, 400 to 599; any other is a
    :class:`binproto.LocalProtocolError` (a handler raising it is answered 500).
    """

    def __init__(self, message: str, status: int = 400, *, allow: str | None = None) -> None:
        try:
            code = whole_number(status, "status")  # (an HTTPStatus, a numpy integer)
        except LocalProtocolError:
            code = 0
        if not 400 <= code <= 599:
            raise LocalProtocolError(
                f"an InferenceError's status is an HTTP error status, 400-599; got {status!r}"
            )
        super().__init__(message)
        self.message = message
        self.status = code
        #: The methods of the resource, sent in ``Allow`` with a 405.
        self.allow = allow


def drains_for_answer(exc: ProtocolError | InferenceError, remaining: int | None) -> bool:
    """Whether the rest of a refused request's body is read and dropped
    before the answer, so that a client still sending sees it (``remaining``:
    the body bytes still to come, None when no length says). Not for a
    chunked body refused for what its header claims (413): a client waiting
    for the answer would get it only at the body timeout."""
    status = exc.status if isinstance(exc, InferenceError) else exc.status_hint
    return not (status == 413 and remaining is None)


class BodyBudget:
    """The request body bytes a server's connections may hold at once.

    Each inference request claims the bytes its body will take before they
    are read: its ``Content-Length`` (or its JSON header's length, when more)
    when its head arrives; then what its JSON header announces (a compressed
    or chunked body's tensors), once that is parsed; and a chunked body's
    bytes as they come. A claim that would take the total past ``most`` while
    other requests hold bytes is refused with a 503 (an
    :class:`InferenceError`, answered as any refusal: after the rest of the
    body is read and dropped, so the client sees it). One request alone is
    always admitted, bounded by its own :class:`~binproto.Limits`. A
    request's claim is given back when its response has been sent, or when
    it fails (before the rest of its body is dropped). Not thread-safe: one
    per event loop.
    """

    __slots__ = ("held", "most")

    def __init__(self, most: int) -> None:
        if type(most) is not int or most < 0:
            raise LocalProtocolError(
                f"max_body_bytes_in_flight must be None or an int >= 0, got {most!r}"
            )
        self.most = most
        #: The bytes claimed by the requests in flight.
        self.held = 0

    def claim(self, reader: BodySource, size: int) -> None:
        """Raise the claim of ``reader``'s request to ``size`` bytes (never
        lowers it), or refuse it with a 503."""
        extra = size - reader.claimed
        if extra <= 0:
            return
        others = self.held - reader.claimed
        if others and self.held + extra > self.most:
            raise InferenceError(
                f"the server is busy: requests in flight hold {others} body bytes, and this"
                f" one's {size} would pass the {self.most} it takes at once; retry later",
                503,
            )
        self.held += extra
        reader.claimed = size

    def release(self, reader: BodySource) -> None:
        """Give back what ``reader``'s request claimed."""
        self.held -= reader.claimed
        reader.claimed = 0


class MessageBody:
    """The events of one message body, read from the stream on demand.

    Used for request bodies on the server and response bodies on the client.
    ``kind`` says which; ``claims`` are what the message's head says of its
    body (:func:`binproto.body_claims`); ``limits`` and ``strict_bool`` are
    the parser's. ``header`` is set once HeaderParsed has been returned.

    A small body that is all received with its head is decoded whole
    (:data:`WHOLE_BODY`), with no parser; :attr:`parser` is built when events
    are asked for.
    """

    def __init__(
        self,
        kind: Kind,
        claims: BodyClaims,
        reader: BodySource,
        *,
        limits: Limits | None = None,
        strict_bool: bool = True,
        raw_input: TensorSpec | None = None,
    ) -> None:
        self.kind: Kind = kind
        self.claims = claims
        self.limits = limits  # None: the parser's defaults
        self.strict_bool = strict_bool
        self.raw_input = raw_input  # what a raw binary request's body is
        self._parser: Parser | None = None
        self._reader = reader
        # A compressed body expands on the event loop: yield now and then.
        compressed = claims.content_encoding is not None
        self._checkpoint = reader.checkpoint if compressed else None
        self._unyielded = 0  # decompressed tensor bytes handed out since the last yield
        self.header: InferenceHeader | None = None
        self._header_event: HeaderParsed | None = None
        self._fed = 0  # body bytes given to the parser
        self._tensor_events = False  # next_event() has returned tensor events
        #: The assembler :meth:`tensors` used (its counters tell what was
        #: copied); None when the body was decoded whole (see WHOLE_BODY).
        self.assembler: TensorAssembler | None = None
        # The body bytes from which parser steps run in a worker thread, until
        # the header is parsed: a JSON header big enough to slow the loop,
        # once all of it is in; a compressed one, inflated and parsed in the
        # step that has its bytes; one whose end is the body's end (chunked).
        self._thread_from = claims.slow_header_from() if reader.to_thread is not None else None
        hl = claims.header_length
        #: True when the JSON header was parsed in a worker thread (it was big).
        self.header_in_thread = False
        # A small compressed body with binary tensors is read whole first: a
        # gzip trailer then tells its decompressed size before it is inflated.
        remaining = reader.remaining
        self._ahead = (
            compressed and hl is not None and remaining is not None and remaining <= GZIP_AHEAD
        )
        self._start = b""  # the first and last bytes of a body read ahead
        self._end = b""
        # A small body decoded whole (see WHOLE_BODY): its bytes, until the
        # parser is given them (when events are asked for), and its tensors;
        # then whether they were taken whole (tensors(), or drained unread):
        # the body is then complete, with no events to hand out.
        self._whole: memoryview | None = None
        self._decoded: dict[str, np.ndarray[Any, Any]] | None = None
        self._taken_whole = False
        self._tensors: dict[str, np.ndarray[Any, Any]] | None = None  # what tensors() returned

    @property
    def parser(self) -> Parser:
        """The body's parser, built the first time it is asked for."""
        if self._parser is None:
            claims = self.claims
            self._parser = Parser(
                self.kind,
                header_length=claims.header_length,
                content_length=claims.content_length,
                limits=self.limits,
                strict_bool=self.strict_bool,
                content_encoding=claims.content_encoding,
                raw_input=self.raw_input,
            )
        return self._parser

    @property
    def failed(self) -> bool:
        """True when parsing the body found a fault."""
        parser = self._parser
        return parser is not None and parser.state is binproto.ParserState.ERROR

    async def _next_in_thread(self) -> Event | NeedData:
        """``parser.next_event()`` in a worker thread: a step that may parse
        a big JSON header or inflate a compressed one (nothing else touches
        the parser meanwhile)."""
        self.header_in_thread = True
        to_thread = self._reader.to_thread
        assert to_thread is not None
        event: Event | NeedData = await to_thread(self.parser.next_event)
        return event

    @property
    def complete(self) -> bool:
        """True once MessageComplete has been returned, or a body decoded
        whole was taken whole (by :meth:`tensors` or :meth:`drain`)."""
        parser = self._parser
        return self._taken_whole or (
            parser is not None and parser.state is binproto.ParserState.DONE
        )

    def release(self) -> None:
        """Let go of the body's tensor memory (its assembler and arrays):
        what a reader that failed calls, so that the arrays go now, not when
        the fault that references this body is collected. The parser stays
        as it is (in its ERROR state after a fault it found), so a later call
        fails as it would have."""
        self.assembler = None
        self._whole = self._decoded = self._tensors = None

    def _take_whole(self) -> None:
        """A body decoded whole is taken whole: no events are left."""
        self._taken_whole = True
        self._whole = self._decoded = None

    def _decode_whole(self) -> None:
        """Decode a small body that is all here at once, whole: the parser's
        own checks (in :func:`binproto.decode_request`), without its events."""
        claims = self.claims
        hl = claims.header_length
        if claims.content_encoding is not None or hl == 0:
            return  # compressed, or raw: the parser's own path
        body = self._reader.take_whole(WHOLE_BODY, hl or 0)
        if body is None:
            return
        self._fed = len(body)
        # (decode_request's own checks of its arguments hold here: skipped.)
        limits = self.limits if self.limits is not None else DEFAULT_LIMITS
        decoded = _decode_plain(self.kind, body, hl, limits, self.strict_bool)
        self.header = decoded.header
        self._whole = body
        self._decoded = aligned_arrays(decoded.tensors)

    def _to_parser(self) -> None:
        """Give the parser a body decoded whole, for its events: its header
        event is taken here, as :meth:`read_header` took it."""
        body = self._whole
        if body is None:
            return
        self._whole = self._decoded = None
        parser = self.parser
        parser.receive_data(body)
        event = parser.next_event()
        assert type(event) is HeaderParsed
        self._header_event = event

    async def next_event(self) -> Event:
        """The next parser event; reads the stream only when the parser needs bytes."""
        if self._taken_whole:
            raise LocalProtocolError("no more events: the message is complete")
        self._to_parser()
        parser = self.parser
        while True:
            start = self._thread_from
            if start is not None and self._fed >= start:
                event = await self._next_in_thread()
            else:
                event = parser.next_event()
            if event is not NEED_DATA:
                if type(event) is HeaderParsed:
                    self._thread_from = None
                    self.header = event.header
                    self._header_event = event
                    if self._end:
                        self._check_gzip_size(event.header)
                elif type(event) is MessageComplete:
                    await self._reader.finish()
                else:
                    self._tensor_events = True
                    if self._checkpoint is not None and type(event) is TensorChunk:
                        await self._pause(len(event.data))
                return event
            if self._ahead:
                await self._read_ahead()
                continue
            data = await self._reader.read()
            self._fed += len(data)
            parser.receive_data(data)

    async def _read_ahead(self) -> None:
        """Give the parser the whole (small, compressed) body, keeping its
        first and last bytes for :meth:`_check_gzip_size`."""
        self._ahead = False
        while True:
            data = await self._reader.read()
            self._fed += len(data)
            self.parser.receive_data(data)
            if not len(data):
                return
            if len(self._start) < 2:
                self._start += bytes(data[: 2 - len(self._start)])
            self._end = (self._end + bytes(data[-4:]))[-4:]

    def _check_gzip_size(self, header: InferenceHeader) -> None:
        """Refuse a gzip body (read whole) whose trailer is not what the
        header claims, before inflating its tensors (see check_gzip_size)."""
        hl = self.claims.header_length
        if hl is not None:
            check_gzip_size(self._start, self._end, hl + header.binary_size, hl)

    async def read_header(self) -> InferenceHeader:
        """Read up to HeaderParsed (if not done yet) and return the header."""
        if self.header is None and not self._fed:
            self._decode_whole()
        while self.header is None:
            await self.next_event()
        return self.header

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._events()

    async def _events(self) -> AsyncIterator[Event]:
        self._to_parser()
        while not self.complete:
            yield await self.next_event()

    async def drain(self) -> None:
        """Parse (and drop) the rest of the body, so that it is checked to the end."""
        if self._whole is not None:  # decoded whole: checked to the end already
            self._take_whole()
            return
        while not self.complete:
            await self.next_event()

    async def tensors(self, destinations: Destinations = None) -> dict[str, np.ndarray[Any, Any]]:
        """Read the rest of the body and return every tensor as an array.

        ``destinations`` is as for :class:`binproto.TensorAssembler`. When the
        stream allows it, tensor bytes are received straight into the tensors'
        memory, with no copy (``assembler.bytes_in_place`` counts them).
        Call it before taking any tensor event with :meth:`next_event`. A
        second call returns the same arrays (without ``destinations``).
        """
        if self._tensors is not None:
            if destinations is not None:
                raise LocalProtocolError("tensors() was called already: destinations come too late")
            return self._tensors
        if self._tensor_events:
            raise LocalProtocolError("tensors() needs every tensor event; some were taken")
        decoded = self._decoded
        if decoded is not None and destinations is None:
            self._take_whole()
            self._tensors = decoded
            return decoded
        self._to_parser()
        asm = TensorAssembler(destinations)
        self.assembler = asm
        if self._header_event is not None:
            asm.feed(self._header_event)
        parser = self.parser
        reader = self._reader
        while not self.complete:
            start = self._thread_from
            if start is not None and self._fed >= start:
                event = await self._next_in_thread()
            else:
                event = parser.next_event()
            if event is NEED_DATA:
                view = receive_target(parser, asm) if reader.in_place else None
                if view is not None:
                    n = await reader.read_into(view)
                    self._fed += n
                    parser.receive_data(view[:n])
                else:
                    # Stop at the end of the JSON header, so tensor bytes go in place.
                    data = await reader.read(header_rest(parser, self._fed))
                    self._fed += len(data)
                    parser.receive_data(data)
                continue
            if type(event) is HeaderParsed:
                self._thread_from = None
                self.header = event.header
                self._header_event = event
            elif type(event) is MessageComplete:
                await reader.finish()
            asm.feed(event)
            if self._checkpoint is not None and type(event) is TensorChunk:
                await self._pause(len(event.data))
        self._tensors = asm.tensors
        return asm.tensors

    async def _pause(self, n: int) -> None:
        """Count ``n`` more decompressed bytes; past :data:`YIELD_BYTES`, let
        other tasks run."""
        self._unyielded += n
        if self._unyielded >= YIELD_BYTES and self._checkpoint is not None:
            self._unyielded = 0
            await self._checkpoint()
