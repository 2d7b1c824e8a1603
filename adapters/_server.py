"""The V2 HTTP server, independent of the I/O library.

Everything here is written against :class:`ByteStream`, a minimal async byte
stream (receive some bytes, optionally receive into a buffer, send a list of
buffers, close). The asyncio and trio adapters only wrap their streams into
it; routing, the h11 state machine, parsing request bodies, encoding responses
and mapping errors to V2 error responses all live here.

Request bodies are read on demand: nothing is read from the socket until the
handler asks for the next event, so memory stays O(chunk) plus what the
handler keeps. h11 parses message heads and frames chunked bodies; the bytes
of a ``Content-Length`` body are read from the stream directly once h11 holds
none of them (see :class:`BodyReader`). When the stream also supports
``receive_into`` and the body is not compressed, binary tensor bytes are
received straight into the tensor's destination array (see
:meth:`binproto.Parser.next_tensor_region`).
"""

from __future__ import annotations

import functools
import logging
import math
import numbers
import re
import time
import traceback
import urllib.parse
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, cast, runtime_checkable

try:
    import h11
except ModuleNotFoundError as exc:  # an optional dependency: say which extra brings it
    from binproto.adapters import missing_extra

    raise missing_extra(exc, "h11") from None
import numpy as np

import binproto
from binproto import (
    NEED_DATA,
    BodyClaims,
    BodyWriter,
    EncodedBody,
    Event,
    HeaderFields,
    HeaderParsed,
    InferenceHeader,
    Kind,
    Limits,
    LocalProtocolError,
    MessageComplete,
    NeedData,
    Parser,
    ProtocolError,
    RemoteProtocolError,
    Tensor,
    TensorAssembler,
    TensorChunk,
    TensorSpec,
    body_claims,
)
from binproto._assemble import Destinations
from binproto._compression import GZIP_AHEAD, check_gzip_size
from binproto._http import CREDENTIAL_HEADERS, SLOW_HEADER, TE_IN_HTTP_1_0, KeptOnSecondSight
from binproto._parser import DEFAULT_LIMITS
from binproto._util import aligned_arrays, aligned_copy, whole_number
from binproto._writer import response_start

from .h11 import (
    ResponseFramer,
    content_length_of,
    error_response,
    fields_of,
    has_both_lengths,
    header_rest,
    json_response,
    receive_target,
    remote_error,
    response_for,
    send_compressed,
    send_data,
)

__all__ = [
    "BodyBudget",
    "BodyReader",
    "ByteStream",
    "Capabilities",
    "HalfCloses",
    "InferRequest",
    "InferenceError",
    "MessageBody",
    "Model",
    "ProbesIdle",
    "ReadsAhead",
    "ReceivesInto",
    "Recycles",
    "Route",
    "RunsInThreads",
    "StreamingResponse",
    "Timeouts",
    "V2Server",
    "Yields",
    "capabilities",
    "echo_model",
    "route",
]

log = logging.getLogger("binproto.server")

#: Bytes asked of the stream per read when not receiving into a tensor.
CHUNK = 1 << 16
#: Longest line of a chunked request body (a chunk's size and extensions,
#: with its CRLF) the server takes: a longer one is answered 431.
MAX_CHUNK_LINE = 16 * 1024
#: Largest request head (request line and headers) the server accepts.
MAX_HEAD = 64 * 1024
#: Most body bytes read and dropped after an error, so the client sees the answer.
DISCARD_LIMIT = 256 * 1024 * 1024
#: Seconds a connection closed on a refused request is kept half-open at most,
#: the bytes still coming read and dropped, so that the close does not reset
#: it before the peer has read the answer (see :meth:`V2Server._linger`)...
LINGER = 30.0
#: ... and the longest wait for those bytes (nginx's lingering_time and
#: lingering_timeout).
LINGER_IDLE = 5.0
#: Decompressed tensor bytes handed out between two chances for other tasks to run.
YIELD_BYTES = 1 << 20
#: A body of at most this many bytes that has all arrived with its head is
#: decoded whole (:func:`binproto.decode_request`): the parser's checks
#: without its events, and one copy into memory of its own. 64 KiB of tensor
#: bytes and a JSON header of up to 4 KiB: a bound of 64 KiB would leave a
#: tensor of 64 KiB (a power of two, as tensors often are) out by its header.
WHOLE_BODY = (64 + 4) * 1024
#: Bytes asked of the stream by the first read of a request head: a head of
#: up to 4 KiB with a body of :data:`WHOLE_BODY` bytes behind it can come in
#: that one read.
HEAD_READ = WHOLE_BODY + 4 * 1024
#: JSON headers at least this long are parsed in a worker thread when the
#: stream offers ``to_thread``, so the event loop goes on serving meanwhile
#: (see :meth:`binproto.BodyClaims.slow_header_from`).
THREAD_HEADER = SLOW_HEADER
#: Responses that may write at least this many elements as JSON data are
#: encoded in a worker thread.
THREAD_JSON = 1 << 16


def json_output_elements(header: InferenceHeader, result: Any) -> int:
    """The elements of ``result`` a response to ``header`` may write as JSON
    (all of them unless the request asked for every output binary): whether
    encoding is worth a worker thread."""
    wanted = header.requested_outputs
    if header.binary_data_output is True and (
        wanted is None or all(o.binary_data is not False for o in wanted)
    ):
        return 0
    values = result.values() if isinstance(result, Mapping) else result
    total = 0
    for value in values:
        size = getattr(value, "size", None)
        if size is None:  # a Tensor, or a list
            size = getattr(getattr(value, "array", None), "size", None)
        total += size if type(size) is int else 0
    return total


class ByteStream(Protocol):
    """What the server and client need from a connected byte stream.

    A stream may offer more, each declared by a protocol of its own, and
    then it is used (see :func:`capabilities`): :class:`ReceivesInto` (tensor
    bytes received in place), :class:`RunsInThreads` (response compression
    and big JSON headers off the event loop), :class:`Yields` (a compressed
    body yields to other tasks every :data:`YIELD_BYTES` of its tensor
    bytes), :class:`ReadsAhead` (larger reads of a body), :class:`ProbesIdle`
    (the client checks that the server has not closed an idle
    connection before reusing it) and
    :class:`Recycles` (memory a small body came in is received into again)
    and :class:`HalfCloses` (a refused body is drained after the answer
    before the connection closes).

    A stream has a settable ``timeout``: the seconds one wait for the peer
    may take, to receive its bytes or to have ours taken (None: no bound).
    Past it the wait raises :class:`TimeoutError`. :class:`V2Server` sets it
    before each phase of a request (see :class:`Timeouts`).
    """

    timeout: float | None

    async def receive_some(self, max_bytes: int) -> Any:
        """Up to ``max_bytes`` bytes (a bytes-like object); empty at end of stream."""

    async def send_all(self, buffers: Sequence[Any]) -> None:
        """Write every buffer, in order, without joining them."""

    async def aclose(self) -> None:
        """Close the stream."""


@runtime_checkable
class ReceivesInto(Protocol):
    """A :class:`ByteStream` that receives into the caller's memory."""

    async def receive_into(self, buf: memoryview) -> int:
        """Bytes written into ``buf``; 0 at end of stream."""


@runtime_checkable
class RunsInThreads(Protocol):
    """A :class:`ByteStream` that can run blocking work in a worker thread."""

    async def to_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` run in a worker thread; its result."""


@runtime_checkable
class Yields(Protocol):
    """A :class:`ByteStream` whose event loop other tasks can be let run on."""

    async def checkpoint(self) -> None:
        """Let other tasks run."""


@runtime_checkable
class ReadsAhead(Protocol):
    """A :class:`ByteStream` that buffers ahead, and prefers reads this large."""

    read_size: int


@runtime_checkable
class Recycles(Protocol):
    """A :class:`ByteStream` that can receive again into memory the caller
    is done with."""

    def recycle(self, data: Any) -> None:
        """The caller is done with ``data``, the rest of a piece
        ``receive_some`` returned, and with all before it: no view of that
        piece is used again, and its memory may receive later bytes."""


@runtime_checkable
class ProbesIdle(Protocol):
    """A :class:`ByteStream` that tells, without waiting, whether the peer
    has sent bytes or closed its side. The client asks before it sends a
    request on a connection that was idle: a server closes an idle
    connection after its keep-alive timeout, and a request sent on it would
    fail; the client opens a new connection instead."""

    def is_readable(self) -> bool:
        """True when bytes (or the end of the stream) are waiting to be read."""


@runtime_checkable
class HalfCloses(Protocol):
    """A :class:`ByteStream` that can end its sending side and still receive."""

    async def send_eof(self) -> None:
        """Send the end of the stream (a TCP FIN); receiving goes on."""


class Capabilities(NamedTuple):
    """Which of the optional protocols a stream's class implements."""

    receives_into: bool
    runs_in_threads: bool
    yields: bool
    read_size: int
    probes_idle: bool = False
    recycles: bool = False
    half_closes: bool = False


_CAPABILITIES: dict[type, Capabilities] = {}


def capabilities(stream: ByteStream) -> Capabilities:
    """What ``stream`` offers beyond :class:`ByteStream`: looked up once per
    stream class (a check against a protocol tests each of its members)."""
    kind = type(stream)
    found = _CAPABILITIES.get(kind)
    if found is None:
        found = _CAPABILITIES[kind] = Capabilities(
            isinstance(stream, ReceivesInto),
            isinstance(stream, RunsInThreads),
            isinstance(stream, Yields),
            stream.read_size if isinstance(stream, ReadsAhead) else CHUNK,
            isinstance(stream, ProbesIdle),
            isinstance(stream, Recycles),
            isinstance(stream, HalfCloses),
        )
    return found


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


def seconds_or_none(value: Any, what: str) -> float | None:
    """``value`` as a bound in seconds: None (no bound), or a positive number
    a float holds finitely (an int, a float or a numpy number; not a bool,
    not NaN, not an int too big for a float). Anything else is the caller's
    :class:`LocalProtocolError`, naming ``what``."""
    if value is None:
        return None
    try:
        real = isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
        seconds = float(value) if real else None
    except OverflowError:
        seconds = None
    if seconds is None or not 0 < seconds < math.inf:
        raise LocalProtocolError(
            f"{what} must be a positive number of seconds or None, got {value!r}"
        )
    return seconds


@dataclass(frozen=True, slots=True)
class Timeouts:
    """How long a server waits for a peer, in seconds (None: no bound).

    The defaults are those of production HTTP servers (uvicorn's keep-alive,
    hypercorn's and gunicorn's read timeouts). A request refused by a timeout
    is answered with 408 when an answer can still be sent, then the
    connection is closed.

    Attributes:
        keep_alive: idle time allowed before the first byte of a request (on
            a new connection, or after a response): then the connection is
            closed without an answer.
        head: a deadline for the whole request head, from its first byte (a
            head dripped a byte at a time is cut at it): 408.
        body: the longest wait for more of the request body (inactivity, not
            a deadline: a slow body that keeps moving is read): 408.
        write: the longest wait for the peer to take the response's bytes (a
            client that stops reading): the connection is closed.
    """

    keep_alive: float | None = 5.0
    head: float | None = 10.0
    body: float | None = 30.0
    write: float | None = 30.0

    def __post_init__(self) -> None:
        for name in ("keep_alive", "head", "body", "write"):
            value = getattr(self, name)
            seconds = seconds_or_none(value, f"timeout {name}")
            if type(value) not in (int, float):
                # A number of another kind (numpy's) kept as a float: the
                # server adds it to the clock (frozen: set directly).
                object.__setattr__(self, name, seconds)

    @classmethod
    def every(cls, seconds: float | None) -> Timeouts:
        """The same bound for every phase."""
        return cls(seconds, seconds, seconds, seconds)


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

    def claim(self, reader: BodyReader, size: int) -> None:
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

    def release(self, reader: BodyReader) -> None:
        """Give back what ``reader``'s request claimed."""
        self.held -= reader.claimed
        reader.claimed = 0


def _release(*faults: BaseException | None) -> None:
    """Drop the frames each fault, and every exception chained to it, holds.

    A failed request's arrays live in the locals of those frames, and a fault
    kept where its own frames reach it (the body reader's or the parser's
    stored error) makes a reference cycle: without this the arrays would
    stay until the garbage collector runs, not go as the request ends. The
    finished frames are cleared too, for a traceback kept elsewhere (a log
    record holds its ``exc_info``).
    """
    seen: set[int] = set()
    stack = list(faults)
    while stack:
        exc = stack.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)  # skips frames still running
        exc.__traceback__ = None
        stack += (exc.__cause__, exc.__context__)


def _closing(head: h11.Response) -> h11.Response:
    """``head`` saying the connection closes after this response."""
    return h11.Response(
        status_code=head.status_code, headers=[*head.headers, (b"Connection", b"close")]
    )


async def write_compressed(stream: ByteStream, head: Any, batches: Iterator[list[Any]]) -> None:
    """Write ``head``, then each batch of :func:`~binproto.adapters.h11.send_compressed`.

    Each batch compresses up to 1 MiB of the body: in a worker thread when the
    stream offers ``to_thread``, so the event loop goes on serving meanwhile.
    """
    to_thread = (
        cast(RunsInThreads, stream).to_thread if capabilities(stream).runs_in_threads else None
    )
    pending = [head]
    while True:
        batch = await to_thread(next, batches, None) if to_thread else next(batches, None)
        if batch is None:
            return
        pending.extend(batch)
        await stream.send_all(pending)
        pending = []


def _internal_error(exc: Exception, target: str) -> InferenceError:
    """A fault of the server's own (a handler's) while serving ``target``:
    logged, and answered 500."""
    log.error("error while serving %s", target, exc_info=exc)
    return InferenceError(f"internal error: {exc}", 500)


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
        reader: BodyReader,
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
        decode = binproto.decode_request if self.kind == "request" else binproto.decode_response
        decoded = decode(body, header_length=hl, limits=self.limits, strict_bool=self.strict_bool)
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


@dataclass
class InferRequest:
    """An inference request as a handler sees it.

    ``body`` gives the request body's events on demand (``async for event in
    request.body``) or every tensor at once (``await request.tensors()``);
    ``header`` is the parsed JSON header (read before the handler is called).
    """

    model: Model
    version: str | None
    #: The request's head (requests with the same head may share one:
    #: see :class:`KnownHeads`).
    http: h11.Request
    header: InferenceHeader
    body: MessageBody

    async def tensors(self, destinations: Destinations = None) -> dict[str, np.ndarray[Any, Any]]:
        """Every input as a numpy array (see :meth:`MessageBody.tensors`)."""
        return await self.body.tensors(destinations)


@dataclass
class StreamingResponse:
    """A response whose tensor bytes a handler produces as it goes.

    ``writer`` is a :class:`binproto.BodyWriter` for the response header;
    ``chunks`` yields ``(tensor index, buffer)`` pairs in body order.
    """

    writer: BodyWriter
    chunks: AsyncIterable[tuple[int, Any]]


#: What a handler returns: outputs by name (encoded with the request's output
#: policy), an already encoded body, or a streaming response.
HandlerResult = Mapping[str, Any] | Sequence[Tensor] | EncodedBody | StreamingResponse
Handler = Callable[[InferRequest], Awaitable[HandlerResult]]


@dataclass
class Model:
    """A model the server serves: its name, versions, metadata and handler.

    The handler gets an :class:`InferRequest` and returns a mapping of output
    names to arrays (or lists, or :class:`binproto.Tensor`), an encoded body,
    or a :class:`StreamingResponse`; it may raise :class:`InferenceError`.
    """

    name: str
    handler: Handler
    versions: Sequence[str] = ("1",)  # (a str is one version, not its characters)
    inputs: Sequence[Mapping[str, Any]] = ()
    outputs: Sequence[Mapping[str, Any]] = ()
    platform: str = "binproto"

    def raw_input(self) -> TensorSpec | None:
        """What a raw binary request's body stands for: the model's one
        declared input (its ``name``, ``datatype`` and ``shape``, ``-1`` for a
        variable dimension); None when it declares none or several."""
        if len(self.inputs) != 1:
            return None
        (spec,) = self.inputs
        try:
            return TensorSpec(spec["name"], spec["datatype"], spec["shape"])
        except KeyError as exc:
            raise LocalProtocolError(f"model '{self.name}' input metadata has no {exc}") from None

    def __post_init__(self) -> None:
        if isinstance(self.versions, str):
            raise LocalProtocolError(
                f"Model versions are a sequence of strings, got the string {self.versions!r}"
            )
        self.versions = tuple(self.versions)

    def metadata(self) -> dict[str, Any]:
        """The model metadata object (``GET /v2/models/{name}``)."""
        return {
            "name": self.name,
            "versions": list(self.versions),
            "platform": self.platform,
            "inputs": [dict(t) for t in self.inputs],
            "outputs": [dict(t) for t in self.outputs],
        }


async def _echo(request: InferRequest) -> Mapping[str, Any]:
    tensors = await request.tensors()
    header = request.header
    wanted = header.requested_outputs
    names = [o.name for o in wanted] if wanted is not None else list(tensors)
    outputs: dict[str, Any] = {}
    for name in names:
        if name not in tensors:
            raise InferenceError(
                f"unexpected inference output '{name}' for model '{request.model.name}'"
            )
        info = header.tensor(name)
        outputs[name] = binproto.Tensor(name, tensors[name], datatype=info.datatype)
    return outputs


def _unknown_outputs(header: InferenceHeader, result: Any) -> list[str]:
    """The outputs the request asks for that ``result`` (outputs by name, or a
    sequence of :class:`binproto.Tensor`) does not hold."""
    wanted = header.requested_outputs
    if wanted is None:
        return []
    if isinstance(result, Mapping):
        given = set(result)
    elif isinstance(result, Sequence) and all(isinstance(t, Tensor) for t in result):
        given = {t.name for t in result}
    else:
        return []  # (the encoder says what is wrong with it)
    return [o.name for o in wanted if o.name not in given]


def echo_model(name: str = "echo") -> Model:
    """The built-in model: each input comes back as the output of the same name."""
    return Model(name=name, handler=_echo)


@dataclass(frozen=True, slots=True)
class Route:
    """Where a request goes: ``kind`` and, for model routes, the model and version."""

    kind: str  # "server", "live", "ready", "model", "model_ready", "infer", "not_found"
    model: str | None = None
    version: str | None = None
    method: str = "GET"  #: the method the route accepts


#: The ``Allow`` header of a route's 405, by the method the route accepts.
_ALLOWED = {"GET": "GET, HEAD", "POST": "POST"}


def route(method: str, target: str) -> Route:
    """Route a request target (a path with an optional query) to an endpoint."""
    try:
        path = urllib.parse.urlsplit(target).path
    except ValueError:  # e.g. "//[": not a target any endpoint has
        return Route("not_found")
    parts = [urllib.parse.unquote(p) for p in path.strip("/").split("/")]
    if parts == ["v2"]:
        return Route("server")
    if parts == ["v2", "health", "live"]:
        return Route("live")
    if parts == ["v2", "health", "ready"]:
        return Route("ready")
    if len(parts) >= 3 and parts[:2] == ["v2", "models"] and parts[2]:
        name = parts[2]
        rest = parts[3:]
        version = None
        if len(rest) >= 2 and rest[0] == "versions" and rest[1]:
            version = rest[1]
            rest = rest[2:]
        if not rest:
            return Route("model", name, version)
        if rest == ["ready"]:
            return Route("model_ready", name, version)
        if rest == ["infer"]:
            return Route("infer", name, version, method="POST")
    return Route("not_found")


#: Targets up to this long have their routes remembered (see _route_of).
_REMEMBERED_TARGET = 256


@functools.lru_cache(maxsize=256)
def _remembered_route(target: str) -> Route:
    return route("", target)


def _route_of(target: str) -> Route:
    """``route(target)``; a server sees the same few targets again and again,
    so the routes of the last 256 short ones are kept (a few dozen KiB at most)."""
    if len(target) <= _REMEMBERED_TARGET:
        return _remembered_route(target)
    return route("", target)


#: Where a request head ends: its first empty line (as h11 finds it).
_HEAD_END = re.compile(rb"\n\r?\n")


def _split_at_head_end(data: Any) -> tuple[Any, Any]:
    """``data`` cut after the first empty line in it: what h11 needs to end
    the head it is reading, and the rest (a view, not a copy). h11 would copy
    the rest into its buffer, and the body reader out of it again; a body
    sent with its head skips both. No empty line: all of ``data``, and
    ``b""``. (An empty line that spans two reads is missed: h11 then holds
    what follows it, which the body reader takes from it, as before.)"""
    found = _HEAD_END.search(data)
    if found is None or found.end() == len(data):
        return data, b""
    view = memoryview(data)
    return view[: found.end()], view[found.end() :]


class Head(NamedTuple):
    """A request head as the server read it."""

    request: h11.Request  #: what h11 read from it
    fields: HeaderFields  #: its header fields (:func:`~binproto.adapters.h11.fields_of`)
    ahead: Any  #: bytes received past its end that h11 was not given (see _split_at_head_end)


#: Longest request head remembered, in bytes (see KnownHeads).
REMEMBERED_HEAD_BYTES = 1024
#: Most header lines a remembered head has.
REMEMBERED_HEADER_LINES = 32
#: Most heads a server remembers at once by default (``V2Server.remembered_heads``):
#: under 1 MiB at the very most.
REMEMBERED_HEADS = 64
#: Headers of a head that is never remembered (those that carry credentials among them).
_NOT_REMEMBERED = (*CREDENTIAL_HEADERS, "transfer-encoding", "expect", "upgrade")


class KnownHeads:
    """The requests h11 read from the last few request heads, by their bytes.

    A client sends the same head again and again: the same target, headers
    and body length. What h11 reads from a head depends on its bytes alone
    when the connection held nothing else; and past the head the server uses
    h11 for nothing when the body is framed by ``Content-Length`` (read
    around h11: see :class:`BodyReader`) and no ``Expect: 100-continue``
    waits for an answer: the connection is then as it was before the head.
    Such a head, received whole into an empty connection, is remembered the
    second time h11 reads it (the first time only its hash is noted: a head
    that never comes again, a body length new each time, costs a set entry,
    not a kept request); when its bytes come again, its request (the same
    ``h11.Request`` object) is reused and h11 is not given them. As precautions, heads that
    ask for a protocol switch (``Upgrade``, ``CONNECT``) or carry
    ``Transfer-Encoding`` are read each time, and heads carrying credentials
    (``Authorization``, ``Proxy-Authorization``, ``Cookie``) are never kept:
    the heads are shared by the server's connections, and a known head is
    answered sooner. Up to ``capacity`` heads are kept (0: none), and the
    hashes of up to :data:`~binproto._http.SEEN_PER_KEPT` times as many seen
    once (see :class:`~binproto._http.KeptOnSecondSight`).
    """

    def __init__(self, capacity: int = REMEMBERED_HEADS) -> None:
        self.capacity = capacity
        self._heads: KeptOnSecondSight[bytes, tuple[h11.Request, HeaderFields]] = (
            KeptOnSecondSight()
        )

    def get(self, head: bytes) -> tuple[h11.Request, HeaderFields] | None:
        """The request h11 read from ``head`` before, and its fields; or None."""
        return self._heads.get(head)

    def remember(self, head: bytes, request: h11.Request, fields: HeaderFields) -> None:
        """Keep ``request``, which h11 read from ``head`` alone (given it whole,
        in an empty connection, which holds nothing more), and its ``fields``
        (:func:`~binproto.adapters.h11.fields_of`), when it qualifies.
        (The server offers only heads of at most :data:`REMEMBERED_HEAD_BYTES` bytes:
        a longer one is not copied to be looked up.)"""
        if not self.capacity or not self._heads.seen_before(head, self.capacity):
            return
        if len(request.headers) > REMEMBERED_HEADER_LINES or request.method == b"CONNECT":
            return
        if "content-length" not in fields or any(name in fields for name in _NOT_REMEMBERED):
            return
        self._heads.keep(head, (request, fields), self.capacity)


def _next_connection(rest: tuple[Any, bool], last: h11.Connection) -> h11.Connection:
    """A fresh h11 connection for the next request on a stream, holding
    ``rest``: what was received past the last request, and whether the peer
    closed (:meth:`BodyReader.rest`). h11 only reads request heads (and
    chunked bodies) here: responses are framed by ResponseFramer, and a
    ``Content-Length`` body is read around h11 (see BodyReader), so the last
    request's connection cannot start a next cycle itself. ``last`` serves
    again when h11 read nothing from it (the request's head was known): it is
    as it was made."""
    if last.their_state is h11.IDLE:
        fresh = last
    else:
        fresh = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
    data, closed = rest
    if data:
        fresh.receive_data(data)
    if closed:
        fresh.receive_data(b"")
    return fresh


def _carry(keep: bool, reader: BodyReader) -> tuple[Any, bool] | None:
    """What the next request starts with, when the connection is kept."""
    return reader.rest() if keep else None


@dataclass
class V2Server:
    """A V2 inference server, independent of the I/O library.

    Serve each accepted connection with :meth:`serve_connection`. The server
    answers ``GET /v2`` (server metadata, listing ``binary_tensor_data``),
    ``/v2/health/live`` and ``/ready``, model metadata and readiness, and
    ``POST /v2/models/{name}[/versions/{v}]/infer``.

    Inference responses are compressed (gzip or deflate, by q-value) when the request's
    ``Accept-Encoding`` allows it (see :func:`binproto.preferred_encoding`):
    the body is compressed and written a piece at a time, never held whole,
    with ``Content-Encoding``, ``Vary: Accept-Encoding``, the uncompressed JSON
    length in ``Inference-Header-Content-Length`` and no ``Content-Length``
    (h11 sends it chunked to HTTP/1.1 peers). Responses a handler streams
    (:class:`StreamingResponse`), metadata and error responses are always sent
    uncompressed: a streamed body's bytes go out as the handler produces them.

    Args:
        models: the models to serve (default: the built-in ``echo`` model).
        limits: limits for request bodies.
        zero_copy: receive tensor bytes in place when the stream allows it.
        compress_responses: compress inference responses when the client
            accepts it; False never compresses.
        compression_level: zlib's level for them (0 to 9). Level 1 by
            default: tensor bytes compress little at any level (random floats
            hardly at all), and level 1 is two to three times faster than the
            usual 6 on them for nearly the same size. Compression costs CPU
            time (tens of MB/s), so it pays only on slow links;
            ``compress_responses=False`` turns it off. It runs a 1 MiB piece
            at a time in a worker thread when the stream offers ``to_thread``
            (the asyncio and trio adapters' streams do; zlib releases the GIL),
            so other connections are served meanwhile.
        timeouts: how long to wait for a peer in each phase of a request
            (:class:`Timeouts`: keep-alive idle 5 s, the request head 10 s,
            body inactivity 30 s, response write stall 30 s).
        remembered_heads: how many request heads to remember, so that h11
            reads a head that comes again only once (see
            :class:`KnownHeads`); 0 has h11 read every head.
        max_body_bytes_in_flight: the inference request body bytes all
            connections may hold at once (a :class:`BodyBudget`); None (the
            default) sets no bound beyond each request's own ``limits``. A
            request whose claim would pass it while others are in flight is
            refused before its body is read, answered 503 with
            ``Retry-After: 1`` once what it sends is dropped (a client waiting
            on ``Expect: 100-continue`` never sends it); one request alone is
            always admitted.
    """

    models: Sequence[Model] = field(default_factory=lambda: [echo_model()])
    limits: Limits | None = None
    zero_copy: bool = True
    name: str = "binproto"
    compress_responses: bool = True
    compression_level: int = 1
    timeouts: Timeouts = Timeouts()
    remembered_heads: int = REMEMBERED_HEADS
    max_body_bytes_in_flight: int | None = None

    def __post_init__(self) -> None:
        most = self.max_body_bytes_in_flight
        self._budget = BodyBudget(most) if most is not None else None
        self._models = {m.name: m for m in self.models}
        heads = self.remembered_heads
        if type(heads) is not int or heads < 0:
            raise LocalProtocolError(f"remembered_heads must be an int >= 0, got {heads!r}")
        self._heads = KnownHeads(heads)
        level = self.compression_level
        if type(level) is not int or not 0 <= level <= 9:
            raise LocalProtocolError(f"compression_level must be 0..9, got {level!r}")
        if not isinstance(self.timeouts, Timeouts):
            raise LocalProtocolError(f"timeouts must be a Timeouts, got {self.timeouts!r}")

    @property
    def body_bytes_in_flight(self) -> int:
        """The body bytes the requests in flight have claimed of
        ``max_body_bytes_in_flight`` (0 when it is None: nothing is counted)."""
        return self._budget.held if self._budget is not None else 0

    def add_model(self, model: Model) -> None:
        """Serve one more model."""
        self._models[model.name] = model

    def metadata(self) -> dict[str, Any]:
        """The server metadata object (``GET /v2``)."""
        return {
            "name": self.name,
            "version": binproto.__version__,
            "extensions": ["binary_tensor_data"],
        }

    async def serve_connection(self, stream: ByteStream, timeouts: Timeouts | None = None) -> None:
        """Serve requests on ``stream`` until the peer closes or an error ends it.

        Closes the stream when done. A fault in one request never escapes:
        it is answered with a V2 error response when possible, and the
        connection is closed when its state is unknown. The stream's
        ``timeout`` is set for each phase from ``timeouts`` (default: the
        server's :attr:`timeouts`).
        """
        bounds = timeouts if timeouts is not None else self.timeouts
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        try:
            while True:
                head = await self._next_request(stream, conn, bounds)
                if head is None:
                    return
                rest = await self._respond(stream, conn, head, bounds)
                if rest is None:
                    return
                conn = _next_connection(rest, conn)
                # The next request's h11 connection holds a copy of what it
                # needs: no view into this request's receive buffers is kept
                # while it is awaited (an idle connection holds no buffer).
                head = rest = None
        except Exception:  # the peer went away, or a write failed: just close
            log.debug("connection closed on an error", exc_info=True)
        finally:
            await stream.aclose()

    async def _next_request(
        self, stream: ByteStream, conn: h11.Connection, timeouts: Timeouts
    ) -> Head | None:
        """The next request's head; None when the connection is done (closed,
        or refused with an answer)."""
        # Bytes of this head read so far (with what may follow it): some may
        # have come with the previous request (pipelined), and then the head
        # has begun, and its deadline runs, already.
        held, closed = conn.trailing_data
        received = len(held)
        # A connection holding nothing has no event to give: read first.
        ask = bool(received) or closed
        deadline = time.monotonic() + (timeouts.head or 0.0)
        ahead: Any = b""
        # The head's bytes, when they came in one read into the empty
        # connection: looked up, or offered, among the KnownHeads.
        fresh_head: bytes | None = None
        while True:
            try:
                event = conn.next_event() if ask else h11.NEED_DATA
                ask = True
            except h11.RemoteProtocolError as exc:
                stream.timeout = timeouts.write
                await self._send_error_and_close(stream, ResponseFramer(None), remote_error(exc))
                return None
            # h11 only counts what it holds between reads: the first read of
            # a head takes at most HEAD_READ bytes, the later ones are bounded
            # so that h11 holds at most max(HEAD_READ, MAX_HEAD + 1) bytes.
            if received > MAX_HEAD and (
                event is h11.NEED_DATA
                or received - len(ahead) - len(conn.trailing_data[0]) > MAX_HEAD
            ):
                stream.timeout = timeouts.write
                too_big = RemoteProtocolError(
                    f"request head larger than {MAX_HEAD} bytes", status_hint=431
                )
                await self._send_error_and_close(stream, ResponseFramer(None), too_big)
                return None
            if type(event) is h11.Request:
                fields = fields_of(event)
                # (A precaution: h11 stops where _split_at_head_end cut, so it
                # holds nothing; were it to hold bytes, a hit would drop them.)
                if fresh_head is not None and not len(conn.trailing_data[0]):
                    self._heads.remember(fresh_head, event, fields)
                return Head(event, fields, ahead)
            if event is not h11.NEED_DATA:
                return None  # ConnectionClosed or PAUSED without a request
            fresh_head = None
            if len(ahead):  # (not the head's end after all: h11 decides)
                conn.receive_data(ahead)
                ahead = b""
                continue
            if not received:
                stream.timeout = timeouts.keep_alive  # idle: closed quietly
            elif timeouts.head is not None:
                stream.timeout = deadline - time.monotonic()
            else:  # no bound on a head: not the keep-alive or write timeout either
                stream.timeout = None
            try:
                if stream.timeout is not None and stream.timeout <= 0:
                    raise TimeoutError
                most = HEAD_READ if not received else min(CHUNK, MAX_HEAD + 1 - received)
                data = await stream.receive_some(most)
            except TimeoutError:
                if received:  # a head began: say why it is refused
                    stream.timeout = timeouts.write
                    late = RemoteProtocolError(
                        "timed out waiting for the request head"
                        f" (not complete within {timeouts.head} s)",
                        status_hint=408,
                    )
                    # (A peer too slow for its head is not waited for again.)
                    await self._send_error_and_close(
                        stream, ResponseFramer(None), late, linger=False
                    )
                return None
            first = not received
            if first and len(data):
                # The head's deadline runs from its first byte.
                deadline = time.monotonic() + (timeouts.head or 0.0)
            received += len(data)
            head, ahead = _split_at_head_end(data)
            if first and self._heads.capacity and len(head) <= REMEMBERED_HEAD_BYTES:
                fresh_head = bytes(head)
                known = self._heads.get(fresh_head)
                if known is not None:
                    return Head(*known, ahead)  # h11 has read these bytes before
            conn.receive_data(head)
            data = head = b""  # (h11 holds a copy: no view of the read waits with the next)

    async def _send_error_and_close(
        self,
        stream: ByteStream,
        framer: ResponseFramer,
        exc: ProtocolError,
        *,
        linger: bool = True,
    ) -> None:
        """Answer a request refused at its head, saying the connection closes;
        then, with ``linger``, drain what the peer still sends (its body,
        say: see :meth:`_linger`)."""
        if framer.our_state is not h11.SEND_RESPONSE:
            return
        head, payload = error_response(exc)
        head = _closing(head)
        try:
            out = [
                framer.send(head),
                framer.send(h11.Data(data=payload)),
                framer.send(h11.EndOfMessage()),
            ]
        except h11.LocalProtocolError:
            return
        await stream.send_all([b for b in out if b])
        if linger:
            await self._linger(stream)

    async def _respond(
        self,
        stream: ByteStream,
        conn: h11.Connection,
        head: Head,
        timeouts: Timeouts,
    ) -> tuple[Any, bool] | None:
        """Answer one request. When the connection may serve another: what was
        received past this request, and whether the peer has closed its side
        (see :meth:`BodyReader.rest`); else None."""
        req, fields, ahead = head
        framer = ResponseFramer(req)
        stream.timeout = timeouts.body
        try:
            if has_both_lengths(fields):
                # Two framings: whichever one is used, a peer (or a proxy in front)
                # may have meant the other and smuggled a request into the body.
                raise RemoteProtocolError(
                    "a request may not carry both Content-Length and Transfer-Encoding"
                )
            if req.http_version == b"1.0" and "transfer-encoding" in fields:
                # HTTP/1.0 has no Transfer-Encoding: the framing is faulty (RFC 9112, 6.1).
                raise RemoteProtocolError(TE_IN_HTTP_1_0)
            length = content_length_of(fields)
        except RemoteProtocolError as exc:
            stream.timeout = timeouts.write
            await self._send_error_and_close(stream, framer, exc)
            return None
        target = req.target.decode("latin-1")
        r = _route_of(target)
        reader = BodyReader(
            stream,
            conn,
            length,
            receive_in_place=self.zero_copy,
            ahead=ahead,
            chunked=length is None and "transfer-encoding" in fields,
        )
        try:
            method = req.method.decode("latin-1")
            if (
                r.kind != "not_found"
                and method != r.method
                and (method, r.method) != ("HEAD", "GET")
            ):
                raise InferenceError(f"method {method} not allowed", 405, allow=_ALLOWED[r.method])
            if r.kind == "infer":
                body, result = await self._infer(req, fields, r, reader)
                stream.timeout = timeouts.write
                if isinstance(result, StreamingResponse):
                    await self._stream_response(stream, framer, result)
                    return _carry(body.complete and framer.reusable, reader)
                encoding = self._response_encoding(req)
                if encoding is not None:
                    await self._send_compressed(stream, framer, result, encoding)
                    return _carry(framer.reusable, reader)
                pieces = framer.send_response(200, result)
            else:
                await self._drain_small(reader)
                response, payload = self._get(r)
                pieces = [
                    framer.send(response),
                    framer.send(h11.Data(data=payload)) if payload else b"",
                ]
                pieces.append(framer.send(h11.EndOfMessage()))
        except (ProtocolError, InferenceError) as exc:
            if isinstance(exc, LocalProtocolError):  # a handler's misuse: the server's fault
                log.error("error while serving %s", target, exc_info=exc)
            _release(exc, reader.failed)
            return _carry(await self._error(stream, framer, exc, reader, timeouts), reader)
        except TimeoutError as exc:
            if framer.our_state is not h11.SEND_RESPONSE:
                _release(exc, reader.failed)
                return None  # the peer stopped taking the response: close
            # The body stalled (the reader's 408 fault): answer without waiting
            # for it any more. Any other timeout is the handler's own.
            fault = reader.failed if reader.failed is not None else _internal_error(exc, target)
            _release(exc, reader.failed)
            return _carry(await self._error(stream, framer, fault, reader, timeouts), reader)
        except (BrokenPipeError, ConnectionResetError) as exc:
            # The peer went away (reset mid-body, or closed while the response
            # was going out): nobody to answer, and not a fault of the server.
            log.info("connection lost while serving %s: %r", target, exc)
            _release(exc, reader.failed)
            return None
        except Exception as exc:  # a handler failed: the server's fault
            failure = _internal_error(exc, target)
            _release(exc, reader.failed)
            return _carry(await self._error(stream, framer, failure, reader, timeouts), reader)
        else:
            await stream.send_all([p for p in pieces if p])
            return _carry(framer.reusable, reader)
        finally:
            # The request's claim on the budget ends with its answer (or its failure).
            if reader.budget is not None:
                reader.budget.release(reader)

    def _response_encoding(self, req: h11.Request) -> str | None:
        """The coding for an inference response to ``req``, or None."""
        if not self.compress_responses:
            return None
        # Accept-Encoding may be split over several header lines.
        values = [
            v.decode("latin-1")
            for k, v in req.headers.raw_items()
            if k.lower() == b"accept-encoding"
        ]
        return binproto.preferred_encoding(", ".join(values))

    async def _send_compressed(
        self, stream: ByteStream, framer: ResponseFramer, body: EncodedBody, encoding: str
    ) -> None:
        head = response_for(200, body, headers=[("Vary", "Accept-Encoding")], encoding=encoding)
        batches = send_compressed(framer, body, encoding, level=self.compression_level)
        await write_compressed(stream, framer.send(head), batches)

    async def _drain_small(self, reader: BodyReader) -> None:
        """Read the (expectedly empty) body of a GET."""
        total = 0
        while True:
            data = await reader.read()
            if not len(data):
                return
            total += len(data)
            if total > MAX_HEAD:
                raise RemoteProtocolError(
                    "request body too large for this endpoint", status_hint=413
                )

    def _get(self, r: Route) -> tuple[h11.Response, bytes]:
        if r.kind == "server":
            return json_response(self.metadata())
        if r.kind in ("live", "ready"):
            return json_response({r.kind: True})  # (KServe's clients read the field)
        if r.kind == "not_found":
            return error_response("Not Found", 404)
        model = self._model(r)
        if r.kind == "model_ready":
            return json_response({"name": model.name, "ready": True})
        return json_response(model.metadata())

    def _model(self, r: Route) -> Model:
        assert r.model is not None
        model = self._models.get(r.model)
        if model is None:
            raise InferenceError(f"Request for unknown model: '{r.model}' is not found", 404)
        if r.version is not None and r.version not in model.versions:
            raise InferenceError(
                f"Request for unknown model: '{r.model}' version {r.version} is not found", 404
            )
        return model

    async def _infer(
        self, req: h11.Request, fields: HeaderFields, r: Route, reader: BodyReader
    ) -> tuple[MessageBody, Any]:
        model = self._model(r)
        claims = body_claims(fields)
        raw_input = None
        if claims.header_length == 0:  # a raw binary request: the body is the one input
            raw_input = model.raw_input()
            if raw_input is None:
                raise InferenceError(
                    "a raw binary request is the bytes of a model's one input: model"
                    f" '{model.name}' declares {len(model.inputs)} inputs"
                )
            claims.check_raw_length(raw_input)
        budget = self._budget
        if budget is not None:  # (a known model: a request for none takes no memory)
            reader.budget = budget
            # Its Content-Length, or the JSON header a compressed body inflates
            # to before it is parsed, when that is more.
            if reader.remaining is not None:
                budget.claim(reader, max(reader.remaining, claims.header_length or 0))
        body = MessageBody("request", claims, reader, limits=self.limits, raw_input=raw_input)
        header = await body.read_header()
        if budget is not None:  # what the header announces, before those bytes are read
            budget.claim(reader, header.header_length + header.binary_size)
        shared = [t.name for t in header.tensors if t.shared_memory]
        if shared:
            raise InferenceError(f"shared memory is not supported here (inputs {shared})")
        classified = [
            o.name
            for o in header.requested_outputs or ()
            if "classification" in (o.parameters or {})
        ]
        if classified:  # (an extension this server does not list: not the tensor in its place)
            raise InferenceError(f"classification is not supported here (outputs {classified})")
        request = InferRequest(model, r.version, req, header, body)
        try:
            result = await model.handler(request)
        except Exception:
            remaining = reader.remaining
            if (
                not body.complete
                and not body.failed
                and reader.failed is None
                and remaining is not None
                and remaining <= DISCARD_LIMIT
            ):
                # A fault in the body comes first, whatever the handler said;
                # but a body too big to read for it (a claim the server could
                # not allocate, say) is refused with the handler's answer now,
                # and one that stalled (the reader's fault) is not waited for again.
                await body.drain()
            raise
        if not body.complete:
            await body.drain()
        if isinstance(result, (StreamingResponse, EncodedBody)):
            return body, result
        unknown = _unknown_outputs(header, result)
        if unknown:  # the client asked for what the model does not give: its fault (400)
            raise InferenceError(
                f"unexpected inference output '{unknown[0]}' for model '{model.name}'"
            )
        version = r.version
        if version is None and model.versions:
            version = model.versions[0]
        limits = self.limits if self.limits is not None else DEFAULT_LIMITS
        encode = functools.partial(
            binproto.encode_response,
            result,
            model_name=model.name,
            model_version=version,
            id=header.id,
            request=header,
            max_json_elements=limits.max_json_output_elements,
        )
        if reader.to_thread is not None and (
            body.header_in_thread or json_output_elements(header, result) >= THREAD_JSON
        ):
            # JSON text is written a slice at a time, each slice a pass in C:
            # in a thread, the event loop runs between slices.
            return body, await reader.to_thread(encode)
        return body, encode()

    async def _stream_response(
        self, stream: ByteStream, framer: ResponseFramer, response: StreamingResponse
    ) -> None:
        writer = response.writer
        # A writer that cannot start (a request's header, started already) is
        # refused before the head goes out: the client gets a 500, not a cut body.
        start = response_start(writer)
        head = framer.send(response_for(200, None, headers=writer.headers))
        await stream.send_all([head, framer.send(h11.Data(data=start))])
        async for index, data in response.chunks:
            await stream.send_all(send_data(framer, writer.send(index, data)))
        writer.end()
        tail = framer.send(h11.EndOfMessage())
        if tail:
            await stream.send_all([tail])

    async def _error(
        self,
        stream: ByteStream,
        framer: ResponseFramer,
        exc: ProtocolError | InferenceError,
        reader: BodyReader,
        timeouts: Timeouts,
    ) -> bool:
        if reader.budget is not None:
            # A failed request holds no body: what is read now is dropped, and
            # not counted (a claim refused here would stop the answer).
            reader.budget.release(reader)
            reader.budget = None
        if framer.our_state is not h11.SEND_RESPONSE:
            return False  # the response had begun: all we can do is close
        if isinstance(exc, InferenceError):
            head, payload = error_response(exc.message, exc.status)
            if exc.allow is not None:
                head = h11.Response(
                    status_code=head.status_code, headers=[*head.headers, ("Allow", exc.allow)]
                )
        else:
            head, payload = error_response(exc)
        # A client still sending its body would not see the answer if the
        # server closed now; read the rest (within bounds) and keep the
        # connection, or say it closes.
        # A chunked body refused for what its header claims is not read for
        # the answer: no length says how much is to come, and a client that
        # waits would get the 413 only at the body timeout. (A client still
        # sending is drained by the lingering close.)
        status = exc.status if isinstance(exc, InferenceError) else exc.status_hint
        refused_claim = status == 413 and reader.remaining is None
        close = refused_claim or not await self._discard(reader)
        stream.timeout = timeouts.write
        if close:
            head = _closing(head)
        out = [
            framer.send(head),
            framer.send(h11.Data(data=payload)),
            framer.send(h11.EndOfMessage()),
        ]
        await stream.send_all([b for b in out if b])
        if close and reader.may_still_send:
            # (A client waiting for 100 Continue reads the answer and closes;
            # one that sent its body at once is drained, as is one whose
            # chunked framing h11 refused.)
            await self._linger(stream)
        return not close and framer.reusable

    async def _linger(self, stream: ByteStream) -> None:
        """After an answer that closes a connection whose peer may still be
        sending: end our side, then read and drop what comes until the peer
        closes, for at most :data:`LINGER` seconds, each wait at most
        :data:`LINGER_IDLE`. Closed at once, the connection would be reset
        under the peer's sending, and a peer that reads only once it has sent
        everything would get the reset, not the answer. (A stream that cannot
        half-close is closed at once.)"""
        if not capabilities(stream).half_closes:
            return
        before = stream.timeout
        deadline = time.monotonic() + LINGER
        try:
            await cast(HalfCloses, stream).send_eof()
            while (left := deadline - time.monotonic()) > 0:
                stream.timeout = min(left, LINGER_IDLE)
                if not len(await stream.receive_some(CHUNK)):
                    return
        except (TimeoutError, OSError):
            return
        finally:
            stream.timeout = before  # (the close's own bound)

    async def _discard(self, reader: BodyReader) -> bool:
        """Read and drop the rest of a request body, up to :data:`DISCARD_LIMIT`
        bytes; True when the whole body has been read."""
        remaining = reader.remaining
        if reader.awaits_continue or (remaining is not None and remaining > DISCARD_LIMIT):
            # Never invite a body that is refused, nor read more of one than
            # the limit: answer now, and close.
            return False
        total = 0
        try:
            while not reader.done:
                data = await reader.read()
                total += len(data)
                if total > DISCARD_LIMIT:
                    return False
        except (RemoteProtocolError, TimeoutError):
            return False
        return True
