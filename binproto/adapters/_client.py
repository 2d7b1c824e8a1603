"""The V2 HTTP client, independent of the I/O library.

:class:`ClientCore` speaks HTTP/1.1 through h11 over a
:class:`~binproto.adapters._server.ByteStream` that a backend opens. Requests
are encoded as buffer lists and written without joining them; responses are
parsed as they are read, and read only as fast as the caller takes events.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import email.utils
import errno
import random
import re
import ssl as ssl_module
import sys
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, NoReturn, cast

try:
    import h11
    from h11._headers import Headers as H11Headers
except ModuleNotFoundError as exc:  # an optional dependency: say which extra brings it
    from binproto.adapters import missing_extra

    raise missing_extra(exc, "h11") from None
import numpy as np

import binproto
from binproto import (
    BodyClaims,
    Event,
    HeaderFields,
    InferenceHeader,
    Limits,
    LocalProtocolError,
    RemoteProtocolError,
    RequestedOutput,
    body_claims,
)
from binproto._assemble import Destinations
from binproto._compression import inflate_whole, normalize_encoding
from binproto._http import header_value

from ._metadata import ModelMetadata, ServerMetadata, check_body
from ._server import (
    BodyReader,
    ByteStream,
    MessageBody,
    ProbesIdle,
    capabilities,
    seconds_or_none,
    write_compressed,
)
from .h11 import (
    HTTPError,
    error_message,
    fields_of,
    infer_path,
    remote_error,
    request_for,
    send_body,
    send_compressed,
)

__all__ = [
    "CLIENT_TIMEOUT",
    "COMPRESSION_LEVEL",
    "DEFAULT_RETRY",
    "KEEPALIVE_EXPIRY",
    "MAX_CONNECTIONS",
    "NO_RETRY",
    "ClientCore",
    "Endpoint",
    "HTTPError",
    "ModelMetadata",
    "ResponseStream",
    "Retry",
    "ServerMetadata",
]

#: The clients' default bound, in seconds, on each wait for the server (for its
#: bytes, or for it to take ours): generous for a slow model, but a server that
#: falls silent does not hang its client forever. None: no bound.
CLIENT_TIMEOUT = 300.0

#: Largest error body the client reads.
MAX_ERROR_BODY = 1 << 20
# Decoded, an error body may grow no further than MAX_ERROR_BODY either.
_ERROR_BODY_LIMITS = Limits(max_decompressed_bytes=MAX_ERROR_BODY)


class ResponseStream:
    """An inference response being received.

    ``status`` and ``http`` (the ``h11.Response``) are known on entry;
    ``async for event in response`` yields the body's parser events as they
    are read; :meth:`tensors` reads the rest into arrays. ``header`` is set
    once HeaderParsed has been returned.
    """

    def __init__(self, http: h11.Response, body: MessageBody) -> None:
        self.http = http
        self.status = http.status_code
        self.body = body

    @property
    def header(self) -> InferenceHeader | None:
        """The response's JSON header, once parsed."""
        return self.body.header

    def __aiter__(self) -> AsyncIterator[Event]:
        return self.body.__aiter__()

    async def next_event(self) -> Event:
        """The next event of the body."""
        return await self.body.next_event()

    async def tensors(self, destinations: Destinations = None) -> dict[str, np.ndarray[Any, Any]]:
        """Every output as an array (received in place when the stream allows it)."""
        return await self.body.tensors(destinations)


class _WholeBody:
    """The body record of a :class:`_WholeResponse` (nothing held to release)."""

    complete = True
    failed = None

    def release(self) -> None:
        """Nothing to let go of: the arrays are the caller's."""


class _WholeResponse(ResponseStream):
    """A response whose body came whole with its head: ``tensors()``
    decodes it at once (``binproto.decode_response``); it has no events."""

    def __init__(
        self, http: h11.Response, data: Any, claims: BodyClaims, limits: Limits | None
    ) -> None:
        self.http = http
        self.status = http.status_code
        self.body = cast(MessageBody, _WholeBody())
        # A copy the arrays may be written through (what came is read-only).
        self._data = bytearray(memoryview(data)[: claims.content_length])
        self._claims = claims
        self._limits = limits
        self._decoded: binproto.DecodedMessage | None = None

    @property
    def header(self) -> InferenceHeader | None:
        """The response's JSON header, once decoded."""
        return self._decoded.header if self._decoded is not None else None

    def __aiter__(self) -> AsyncIterator[Event]:
        raise LocalProtocolError("a response read whole has no events: use stream()")

    async def next_event(self) -> Event:
        """Not offered: see :meth:`__aiter__`."""
        raise LocalProtocolError("a response read whole has no events: use stream()")

    async def tensors(self, destinations: Destinations = None) -> dict[str, np.ndarray[Any, Any]]:
        """Every output as an array (views of one buffer holding the body)."""
        if destinations is not None:
            raise LocalProtocolError("a response read whole takes no destinations")
        if self._decoded is None:
            self._decoded = binproto.decode_response(
                self._data, header_length=self._claims.header_length, limits=self._limits
            )
        return self._decoded.tensors


def _requested(outputs: Iterable[str | RequestedOutput] | None) -> list[RequestedOutput] | None:
    if outputs is None:
        return None
    return [o if isinstance(o, RequestedOutput) else RequestedOutput(o) for o in outputs]


def _closes(response: h11.Response, fields: HeaderFields | None, plain: _Plain | None) -> bool:
    """True when the server will close the connection after ``response``
    (``fields``: its header fields, when read; ``plain``: its plain head)."""
    if plain is not None:
        return plain.closes
    tokens = (fields or fields_of(response)).get("connection") or ""
    closing = any(t.strip() == "close" for t in tokens.lower().split(","))
    return closing or response.http_version != b"1.1"


def _closed_or_busy(stream: ByteStream) -> bool:
    """Whether a kept connection must not carry the next request: bytes or
    the end wait on it, or asking failed."""
    try:
        return cast(ProbesIdle, stream).is_readable()
    except (OSError, ValueError):
        return True


def _error(response: h11.Response, data: bytes) -> HTTPError:
    """The error an error response stands for; a gzip or deflate body (one
    the client asked for with ``accept_encoding``) decoded, to at most
    :data:`MAX_ERROR_BODY` bytes, and one in another coding kept as sent."""
    try:
        encoding = normalize_encoding(header_value(list(response.headers), "content-encoding"))
    except RemoteProtocolError:
        encoding = None  # br, zstd, ...: not decoded
    if encoding is not None and data:
        try:
            data = bytes(inflate_whole(memoryview(data), encoding, _ERROR_BODY_LIMITS))
        except RemoteProtocolError as exc:
            return HTTPError(response.status_code, f"the error body could not be decoded: {exc}")
    return error_message(response.status_code, data)


_CLOSED_IN_FLIGHT = "the Client was closed while this request was in flight"


def _from_the_connection(exc: Exception) -> bool:
    """True for what reading or writing a closed connection raises (the
    caller's own exceptions, thrown into a ``stream()`` block, are not)."""
    if isinstance(exc, (RemoteProtocolError, ConnectionError, h11.ProtocolError)):
        return True
    if isinstance(exc, OSError) and exc.errno == errno.EBADF:  # a socket closed under a call
        return True
    trio = sys.modules.get("trio")  # (loaded when a trio client is in use)
    return trio is not None and isinstance(
        exc, (trio.ClosedResourceError, trio.BrokenResourceError)
    )


def _cut_error(response: h11.Response, data: bytes, fault: RemoteProtocolError) -> HTTPError:
    """The error an error response stands for when its body could not be
    read whole: its status kept, with what was read (unless compressed) and
    why the rest is missing, as the httpx adapter reports it."""
    note = f"the error body could not be read: {fault}"
    coded = header_value(list(response.headers), "content-encoding") is not None
    text = "" if coded else data.decode("utf-8", "replace")
    return HTTPError(response.status_code, f"{text} ({note})" if text else note)


def _drop_locals(exc: BaseException) -> None:
    """Clear the locals of binproto's own finished frames in the traceback of
    ``exc`` and of the exceptions chained to it; the traceback stays.

    A failed response's arrays live in those locals, and the body reader and
    the parser keep the fault, which their frames reach: a reference cycle
    that would hold the arrays until the garbage collector runs, not free
    them as the caller lets go of the error. The caller's frames, and frames
    still running, are left alone.
    """
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        fault = stack.pop()
        if fault is None or id(fault) in seen:
            continue
        seen.add(id(fault))
        tb = fault.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            module = str(frame.f_globals.get("__name__", ""))
            if module == "binproto" or module.startswith("binproto."):
                with contextlib.suppress(RuntimeError):  # a frame still running
                    frame.clear()
            tb = tb.tb_next
        stack += (fault.__cause__, fault.__context__)


#: zlib's level for compressed requests: tensor bytes compress little at any
#: level, and level 1 is much faster than the usual 6 on them.
COMPRESSION_LEVEL = 1

#: The most connections a client keeps open at once, by default.
MAX_CONNECTIONS = 10

#: Seconds an idle kept connection stays open, by default (httpx's default).
KEEPALIVE_EXPIRY = 5.0

#: Statuses a request is sent again after (the server is busy, or asks to slow down).
RETRY_STATUSES = frozenset({429, 503})


@dataclass(frozen=True)
class Retry:
    """When and how a client sends a request again.

    A request is sent again, with the same encoded buffers, when its
    connection was lost before any byte of an answer came, or when the server
    answered 503 or 429. No other error is retried.

    Attributes:
        attempts: the most times a request is sent, the first included
            (1: no retries).
        total: seconds from the first send after which no retry starts.
        backoff: the first wait between attempts, in seconds; it doubles each
            time, up to ``max_backoff``. Each wait is drawn at random between
            zero and that bound ("full jitter").
        max_backoff: the bound on one backoff wait.
        max_retry_after: the bound on a wait a ``Retry-After`` header asks for.
    """

    attempts: int = 3
    total: float = 30.0
    backoff: float = 0.1
    max_backoff: float = 2.0
    max_retry_after: float = 10.0

    def __post_init__(self) -> None:
        if type(self.attempts) is not int or self.attempts < 1:
            raise LocalProtocolError(f"Retry.attempts must be an int >= 1, got {self.attempts!r}")
        for name in ("total", "backoff", "max_backoff", "max_retry_after"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value >= 0:
                raise LocalProtocolError(f"Retry.{name} must be a number >= 0, got {value!r}")

    def wait(self, retry: int) -> float:
        """The backoff before retry number ``retry`` (1 for the first)."""
        return random.uniform(0, min(self.max_backoff, self.backoff * 2 ** (retry - 1)))


#: No retries: each request is sent once.
NO_RETRY = Retry(attempts=1)

#: What a client does by default: three attempts within 30 s.
DEFAULT_RETRY = Retry()


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` header value asks to wait (delay-seconds or an
    HTTP date), or None when it says neither."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    now = time.time() if now is None else now
    return max(0.0, when.timestamp() - now)


class _Retryable(Exception):
    """An attempt that may be made again: ``error`` is raised when it is not."""

    def __init__(self, error: BaseException, wait: float | None = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.wait = wait  # what Retry-After asked for (None: back off)


class _NoAnswer(RemoteProtocolError):
    """The connection ended before any byte of a response."""


#: Most bytes of an answer's head read around h11; a longer one goes to h11.
_PLAIN_HEAD_MAX = 16 << 10

_FIELDS = re.compile(rb"(?:\r\n[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[^\x00-\x08\x0a-\x1f\x7f]*)*")


class _Plain(NamedTuple):
    """A plain ``200`` head read around h11, and what it says of its body."""

    response: h11.Response
    claims: BodyClaims | None  # None: read them from its fields
    closes: bool  # the server closes the connection after it


def _plain_200(head: bytes) -> _Plain | None:
    """The response a head stands for when it is ``HTTP/1.1 200`` with one
    valid ``Content-Length`` and no ``Transfer-Encoding``; else None (h11
    reads it, and refuses what is malformed). Its body's claims come with
    it when they are plain digits and no coding."""
    end = head.find(b"\r\n")
    status = head if end < 0 else head[:end]
    if not status.startswith(b"HTTP/1.1 200") or status[12:13] not in (b"", b" "):
        return None
    if end >= 0 and _FIELDS.fullmatch(head, end) is None:
        return None  # (obs-fold, a bad name or value: one check of every line)
    lines = head.split(b"\r\n")
    items = []
    length = None
    header_length: bytes | None = None
    plain = True  # the claims are read here
    closes = False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        value = value.strip(b" \t")
        lower = name.lower()
        if lower == b"content-length":
            if length is not None or not value.isdigit() or len(value) > 18:
                return None
            length = value
        elif lower == b"transfer-encoding":
            return None
        elif lower == b"inference-header-content-length":
            plain = plain and header_length is None and value.isdigit() and len(value) <= 18
            header_length = value
        elif lower == b"content-encoding":
            plain = False
        elif lower == b"connection":
            closes = closes or b"close" in [t.strip() for t in value.lower().split(b",")]
        items.append((name, lower, value))
    if length is None:
        return None
    claims = None
    if plain:
        size = int(length)
        header = int(header_length) if header_length is not None else None
        if header is None or header <= size:
            claims = BodyClaims(size, None, header)
    # (h11's own record of parsed headers: what its parser would have made)
    response = h11.Response(
        status_code=200,
        headers=H11Headers(items),
        http_version=b"1.1",
        reason=status[13:],
        _parsed=True,
    )
    return _Plain(response, claims, closes)


class _Conn:
    """One pooled connection: its stream and h11 state."""

    __slots__ = ("ahead", "h11", "idle_since", "plain", "raw", "received", "stream", "to_close")

    def __init__(self, stream: ByteStream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT)
        self.idle_since = 0.0
        self.received = False  # a byte of a response came on it
        self.to_close = False  # the server will not serve another request on it
        # The request sent around h11 (target, body), for h11 to be told of it
        # when the answer is not a plain 200; None: h11 sent it.
        self.raw: tuple[str, binproto.EncodedBody] | None = None
        self.ahead: bytes = b""  # body bytes received with a head read around h11
        self.plain: _Plain | None = None  # that head


class _Lib:
    """The async library's event and sleep (asyncio or trio, as the caller runs)."""

    def __init__(self) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            import trio

            self.event: Callable[[], Any] = trio.Event
            self.sleep: Callable[[float], Awaitable[None]] = trio.sleep
        else:
            self.event = asyncio.Event
            self.sleep = asyncio.sleep


def _lost(exc: BaseException) -> bool:
    """True for a connection lost under a request (not one the client closed)."""
    if isinstance(exc, (_NoAnswer, ConnectionError)):
        return True
    trio = sys.modules.get("trio")
    return trio is not None and isinstance(exc, trio.BrokenResourceError)


class ClientCore:
    """A V2 client over a pool of keep-alive connections, opened as needed.

    Args:
        open_stream: opens a new connection as a ByteStream.
        host: the ``Host`` header.
        zero_copy: receive response tensors in place when the stream allows it
            (compressed responses are decompressed as they are read instead).
        limits: limits for response bodies (decompressed sizes included).
        accept_encoding: sent as the ``Accept-Encoding`` header of inference
            requests (e.g. ``"gzip, deflate"``); the parser decodes gzip and
            deflate responses within ``limits``. None sends no such header.
        request_encoding: ``"gzip"`` or ``"deflate"`` to compress inference
            request bodies (sent chunked, with ``Content-Encoding``, compressed
            a piece at a time at :data:`COMPRESSION_LEVEL`); None sends them as
            they are.
        max_connections: the most connections open at once; more concurrent
            requests wait for one to be free.
        keepalive_expiry: seconds an idle connection is kept; older ones are
            closed when the client is next used. None: kept until the server
            closes them.
        retry: when to send a request again (:class:`Retry`; None or
            :data:`NO_RETRY`: never).
        path_prefix: put before every path (a base URL's path).
        clock: seconds, monotonic (for tests).

    One client serves many tasks at once: each request takes an idle
    connection, or opens one while fewer than ``max_connections`` are open,
    or waits for one.
    """

    def __init__(
        self,
        open_stream: Callable[[], Awaitable[ByteStream]],
        *,
        host: str,
        zero_copy: bool = True,
        limits: Limits | None = None,
        accept_encoding: str | None = None,
        request_encoding: str | None = None,
        max_connections: int = MAX_CONNECTIONS,
        keepalive_expiry: float | None = KEEPALIVE_EXPIRY,
        retry: Retry | None = DEFAULT_RETRY,
        path_prefix: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._open_stream = open_stream
        self._host = host
        self._zero_copy = zero_copy
        self._limits = limits
        self._accept = [] if accept_encoding is None else [("Accept-Encoding", accept_encoding)]
        try:
            self._request_encoding = normalize_encoding(request_encoding)
        except RemoteProtocolError:
            raise LocalProtocolError(
                f"request_encoding must be 'gzip', 'deflate' or None, got {request_encoding!r}"
            ) from None
        if type(max_connections) is not int or max_connections < 1:
            raise LocalProtocolError(
                f"max_connections must be an int >= 1, got {max_connections!r}"
            )
        if retry is not None and not isinstance(retry, Retry):
            raise LocalProtocolError(f"retry must be a Retry or None, got {retry!r}")
        try:  # (checked once here: inference heads are then made without h11)
            request_for("/", None, host=host, headers=self._accept)
        except h11.LocalProtocolError as exc:
            raise LocalProtocolError(f"bad host or accept_encoding: {exc}") from None
        self._fixed_lines = [f"Host: {host}", *(f"{n}: {v}" for n, v in self._accept)]
        self._max = max_connections
        self._expiry = seconds_or_none(keepalive_expiry, "keepalive_expiry")
        self._retry = retry if retry is not None else NO_RETRY
        self._prefix = path_prefix.rstrip("/")
        self._clock = clock
        self._idle: list[_Conn] = []  # oldest first
        self._in_use: set[_Conn] = set()
        self._opening = 0
        self._waiters: collections.deque[Any] = collections.deque()
        self._generation = 0  # one more at each aclose()
        self._lib: _Lib | None = None
        self._metadata: dict[tuple[str, str | None], ModelMetadata] = {}
        self._paths: dict[tuple[str, str | None], str] = {}  # inference paths made

    async def __aenter__(self) -> ClientCore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def open_connections(self) -> int:
        """How many connections are open (idle, in use or opening)."""
        return len(self._idle) + len(self._in_use) + self._opening

    async def aclose(self) -> None:
        """Close every connection (a later call opens new ones). Requests
        other tasks have in flight then fail with
        :class:`binproto.LocalProtocolError`."""
        self._generation += 1
        conns = self._idle + list(self._in_use)
        self._idle.clear()
        for conn in conns:
            await conn.stream.aclose()

    # -- the pool ---------------------------------------------------------------

    def _wake_one(self) -> None:
        if self._waiters:
            self._waiters.popleft().set()

    async def _acquire(self, generation: int) -> _Conn:
        """A connection for one request: an idle one, a new one, or the
        first one another request gives back."""
        if self._lib is None:
            self._lib = _Lib()
        while True:
            if self._expiry is not None and self._idle:
                await self._close_expired()
            while self._idle:
                conn = self._idle.pop()  # the most recent: the least likely closed
                stream = conn.stream
                if capabilities(stream).probes_idle and _closed_or_busy(stream):
                    # Between requests the server closed the connection (its keep-alive
                    # timeout, most often) or sent what no request asked for: a new one.
                    await stream.aclose()
                    continue
                self._in_use.add(conn)
                return conn
            if self.open_connections < self._max:
                self._opening += 1
                try:
                    stream = await self._open_stream()
                except BaseException:
                    self._opening -= 1
                    self._wake_one()  # (the room it held goes to a waiting request)
                    raise
                self._opening -= 1
                if generation != self._generation:  # aclose() came while it was opening
                    await stream.aclose()
                    self._wake_one()
                    raise LocalProtocolError(_CLOSED_IN_FLIGHT)
                conn = _Conn(stream)
                self._in_use.add(conn)
                return conn
            event = self._lib.event()
            self._waiters.append(event)
            try:
                await event.wait()
            except BaseException:
                if event in self._waiters:
                    self._waiters.remove(event)
                elif event.is_set():
                    self._wake_one()  # the turn it was given goes to the next
                raise

    async def _close_expired(self) -> None:
        assert self._expiry is not None
        old = self._clock() - self._expiry
        while self._idle and self._idle[0].idle_since <= old:
            await self._idle.pop(0).stream.aclose()

    async def _release(self, conn: _Conn, keep: bool) -> None:
        """Give a connection back: kept idle when ``keep``, else closed."""
        self._in_use.discard(conn)
        try:
            if keep and not conn.to_close and conn.h11.our_state is h11.IDLE:
                conn.idle_since = self._clock()
                conn.received = False
                self._idle.append(conn)
            else:
                await conn.stream.aclose()
        finally:
            self._wake_one()

    def _local(self, exc: Exception, generation: int) -> Exception:
        """What a request's failure is for its caller: a connection that
        aclose() closed under it is the caller's doing, not the server's."""
        if generation != self._generation and _from_the_connection(exc):
            error = LocalProtocolError(_CLOSED_IN_FLIGHT)
            error.__cause__ = exc
            return error
        return exc

    async def _backoff(
        self, policy: Retry, retry: int, started: float, asked: float | None
    ) -> bool:
        """Wait before retry number ``retry``: what Retry-After ``asked``
        (capped), else a jittered backoff. False when the retry would start
        past the total time, or no attempt is left."""
        if retry >= policy.attempts:
            return False
        wait = policy.wait(retry) if asked is None else min(asked, policy.max_retry_after)
        if self._clock() + wait - started > policy.total:
            return False
        assert self._lib is not None
        await self._lib.sleep(wait)
        return True

    # -- one exchange -------------------------------------------------------------

    async def _head(self, conn: _Conn) -> h11.Response:
        if conn.raw is not None:
            response = await self._plain_head(conn)
            if response is not None:
                return response
        stream, state = conn.stream, conn.h11
        while True:
            try:
                event = state.next_event()
            except h11.RemoteProtocolError as exc:  # a garbled head, or a close before it
                if not conn.received:
                    raise _NoAnswer("the server closed the connection without a response") from None
                raise remote_error(exc) from None
            if type(event) is h11.Response:
                return event
            if event is h11.NEED_DATA:
                data = bytes(await stream.receive_some(1 << 16))
                if not data:
                    error = _NoAnswer if not conn.received else RemoteProtocolError
                    raise error("the server closed the connection without a response")
                conn.received = True
                state.receive_data(data)
            elif type(event) is h11.InformationalResponse:
                continue
            else:
                raise binproto.RemoteProtocolError("the server closed the connection")

    def _raw_head(self, target: str, body: binproto.EncodedBody) -> bytes:
        """The head of an inference request, made without h11: every part
        was checked (the host and headers when the client was made, the
        target by :func:`infer_path`, the framing by the encoder)."""
        lines = [f"POST {target} HTTP/1.1", *self._fixed_lines]
        lines += [f"{name}: {value}" for name, value in body.headers]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def _plain_head(self, conn: _Conn) -> h11.Response | None:
        """Read the answer's head around h11 when it is a plain ``200`` with
        a ``Content-Length`` (the common answer, read at a fraction of h11's
        cost); None when it is anything else, once h11 has been told of the
        request and given what was read (it then reads the head itself)."""
        assert conn.raw is not None
        stream = conn.stream
        data = b""
        closed = False
        while True:
            more = bytes(await stream.receive_some(1 << 16))
            if not more:
                if not data:
                    raise _NoAnswer("the server closed the connection without a response")
                closed = True
                break
            conn.received = True
            data += more
            end = data.find(b"\r\n\r\n")
            if end >= 0:
                plain = _plain_200(data[:end])
                if plain is not None:
                    conn.raw, conn.ahead, conn.plain = None, data[end + 4 :], plain
                    return plain.response
                break
            if len(data) > _PLAIN_HEAD_MAX:
                break
        # Not plain: h11 is told of the request (its bytes are dropped) and
        # reads the head from what came.
        target, body = conn.raw
        conn.raw = None
        state = conn.h11
        state.send(request_for(target, body, host=self._host, headers=self._accept))
        send_body(state, body)
        state.receive_data(data)
        if closed:
            state.receive_data(b"")
        return None

    async def _exchange(
        self,
        generation: int,
        send: Callable[[_Conn], Awaitable[None]],
        policy: Retry,
    ) -> tuple[_Conn, h11.Response]:
        """Send a request (``send`` writes it) until a response head other
        than a retried status comes; retries as :class:`Retry` says. The
        connection returned is in use: give it back with :meth:`_release`."""
        started = self._clock()
        attempt = 0
        while True:
            attempt += 1
            conn: _Conn | None = None
            try:
                try:
                    conn = await self._acquire(generation)
                    try:
                        await send(conn)
                    except ConnectionError as exc:
                        await self._raise_early_answer(conn, exc)
                    response = await self._head(conn)
                except BaseException as exc:
                    # (Cancelled too: a connection left mid-request is closed.)
                    if conn is not None:
                        await self._release(conn, keep=False)
                    if (
                        isinstance(exc, Exception)
                        and generation == self._generation
                        and _lost(exc)
                        and not (conn is not None and conn.received)
                    ):
                        raise _Retryable(exc) from exc
                    raise
                if response.status_code in RETRY_STATUSES and attempt < policy.attempts:
                    # Read the refusal whole: the connection then carries the retry.
                    try:
                        data, fault = await self._read_small(conn)
                    except BaseException:
                        await self._release(conn, keep=False)
                        raise
                    if fault is None:
                        self._next_cycle(conn)
                    await self._release(conn, keep=fault is None)
                    error: Exception = (
                        _cut_error(response, data, fault)
                        if fault is not None
                        else _error(response, data)
                    )
                    asked = retry_after(header_value(list(response.headers), "retry-after"))
                    raise _Retryable(error, asked)
                return conn, response
            except _Retryable as retry:
                if not await self._backoff(policy, attempt, started, retry.wait):
                    raise retry.error from None

    async def get(self, path: str) -> tuple[int, bytes]:
        """A GET request: the status and the (small) body. ``path`` is sent
        as it is (quote what needs quoting), after the base URL's path."""
        return await self._get(path, self._retry)

    async def _get(self, path: str, policy: Retry) -> tuple[int, bytes]:
        try:
            head = request_for(self._prefix + path, None, host=self._host, method="GET")
        except h11.LocalProtocolError as exc:
            raise LocalProtocolError(f"cannot send GET {path!r}: {exc}") from None

        async def send(conn: _Conn) -> None:
            await conn.stream.send_all([conn.h11.send(head), conn.h11.send(h11.EndOfMessage())])

        generation = self._generation
        try:
            conn, response = await self._exchange(generation, send, policy)
            keep = False
            try:
                data = await self._small_body(conn)
                self._next_cycle(conn)
                keep = True
            finally:
                await self._release(conn, keep)
        except Exception as exc:
            raise self._local(exc, generation) from None
        return response.status_code, data

    # -- health and metadata ----------------------------------------------------------

    async def _get_ok(self, path: str) -> bytes:
        status, data = await self.get(path)
        if status != 200:
            raise error_message(status, data)
        return data

    async def server_live(self) -> bool:
        """Whether the server says it is live (``GET /v2/health/live``)."""
        return (await self.get("/v2/health/live"))[0] == 200

    async def server_ready(self) -> bool:
        """Whether the server says it is ready (``GET /v2/health/ready``)."""
        return (await self.get("/v2/health/ready"))[0] == 200

    async def model_ready(self, model: str, model_version: str | None = None) -> bool:
        """Whether the server says a model is ready (``GET .../ready``)."""
        return (await self.get(_model_path(model, model_version) + "/ready"))[0] == 200

    async def server_metadata(self) -> ServerMetadata:
        """The server's metadata (``GET /v2``); an error status raises
        :class:`~binproto.adapters.h11.HTTPError`."""
        return ServerMetadata.parse(await self._get_ok("/v2"))

    async def model_metadata(
        self, model: str, model_version: str | None = None, *, cached: bool = False
    ) -> ModelMetadata:
        """A model's metadata (``GET /v2/models/{model}``); an error status
        raises :class:`~binproto.adapters.h11.HTTPError`. ``cached``: the one
        fetched before, if any (what ``check=True`` uses)."""
        key = (model, model_version)
        if cached and key in self._metadata:
            return self._metadata[key]
        path = _model_path(model, model_version)
        meta = ModelMetadata.parse(await self._get_ok(path))
        self._metadata[key] = meta
        return meta

    async def check_inputs(
        self, model: str, inputs: Mapping[str, Any], model_version: str | None = None
    ) -> None:
        """Raise :class:`binproto.LocalProtocolError` when ``inputs`` do not
        fit the model's metadata (names, datatypes, shapes; see
        :func:`~binproto.adapters._metadata.check_body`). Nothing is sent but
        the metadata request (once per model: it is cached)."""
        body = self._encode(inputs, None, None, None, None, True)
        check_body(await self.model_metadata(model, model_version, cached=True), body)

    async def wait_until_ready(self, timeout: float = 30.0, model: str | None = None) -> None:
        """Wait until the server (and ``model``, when given) says it is
        ready, asking again with a growing pause (50 ms to 1 s); a server
        not listening yet counts as not ready. Raises ``TimeoutError`` after
        ``timeout`` seconds."""
        if self._lib is None:
            self._lib = _Lib()
        deadline = self._clock() + timeout
        pause = 0.05
        while True:
            try:
                ready = await self._ready_once(model)
            except (OSError, RemoteProtocolError):
                ready = False
            if ready:
                return
            left = deadline - self._clock()
            if left <= 0:
                raise TimeoutError(f"the server was not ready within {timeout} s")
            await self._lib.sleep(min(pause, left))
            pause = min(1.0, pause * 2)

    async def _ready_once(self, model: str | None) -> bool:
        # (sent once each: this loop is the retry)
        if (await self._get("/v2/health/ready", NO_RETRY))[0] != 200:
            return False
        path = _model_path(model, None) + "/ready" if model is not None else None
        return path is None or (await self._get(path, NO_RETRY))[0] == 200

    async def _small_body(self, conn: _Conn) -> bytes:
        data, fault = await self._read_small(conn)
        if fault is not None:
            raise fault
        return data

    async def _read_small(self, conn: _Conn) -> tuple[bytes, RemoteProtocolError | None]:
        """A small body (an error's, a GET's), at most :data:`MAX_ERROR_BODY`
        bytes, and the fault that left it incomplete (None: it is whole)."""
        reader = BodyReader(conn.stream, conn.h11, None, receive_in_place=False)
        out = bytearray()
        try:
            while True:
                data = await reader.read()
                if not len(data):
                    return bytes(out), None
                out += data
                if len(out) > MAX_ERROR_BODY:
                    fault = RemoteProtocolError(
                        f"the response body is longer than {MAX_ERROR_BODY} bytes"
                    )
                    return bytes(out[:MAX_ERROR_BODY]), fault
        except Exception as exc:  # cut short, badly framed, or the connection reset
            if not _from_the_connection(exc):
                raise
            fault = (
                exc
                if isinstance(exc, RemoteProtocolError)
                else RemoteProtocolError(str(exc) or type(exc).__name__)
            )
            return bytes(out), fault

    def _next_cycle(self, conn: _Conn) -> None:
        # (A response framed by the close ends DONE/DONE too: the peer has
        # closed, which h11 has seen. Bytes past the response, which no
        # request asked for, end the connection too.)
        state = conn.h11
        extra, closed = state.trailing_data
        if state.our_state is h11.DONE and state.their_state is h11.DONE and not (closed or extra):
            state.start_next_cycle()
        else:
            conn.to_close = True

    def _encode(
        self,
        inputs: Mapping[str, Any],
        outputs: Iterable[str | RequestedOutput] | None,
        binary_data_output: bool | None,
        parameters: Mapping[str, Any] | None,
        id: str | None,
        binary: bool | set[str],
    ) -> binproto.EncodedBody:
        return binproto.encode_request(
            inputs,
            outputs=_requested(outputs),
            binary_data_output=binary_data_output,
            parameters=parameters,
            id=id,
            binary=binary,
        )

    @contextlib.asynccontextmanager
    async def stream(
        self,
        model: str,
        inputs: Mapping[str, Any],
        *,
        outputs: Iterable[str | RequestedOutput] | None = None,
        binary_data_output: bool | None = True,
        model_version: str | None = None,
        id: str | None = None,
        parameters: Mapping[str, Any] | None = None,
        binary: bool | set[str] = True,
        check: bool = False,
        whole: bool = False,
    ) -> AsyncIterator[ResponseStream]:
        """Send an inference request and yield the response as it arrives.

        Outputs come back binary unless ``binary_data_output`` is False (JSON)
        or None (not sent: the server's default, JSON). The request body is
        encoded once and goes out as the encoder's buffer list, never joined;
        a retry sends the same buffers again. ``check`` compares the inputs
        with the model's metadata first (see :meth:`check_inputs`). ``whole``:
        a body that came whole with the head is decoded at once (its
        ``tensors()`` only, no events: what :meth:`infer` uses). An error
        status raises :class:`~binproto.adapters.h11.HTTPError` (with the V2
        error message). Leaving the block before the body was read to its
        end closes the connection.
        """
        body = self._encode(inputs, outputs, binary_data_output, parameters, id, binary)
        if not isinstance(model, str) or not isinstance(model_version, (str, type(None))):
            raise LocalProtocolError("model and model_version must be strings")
        path = self._paths.get((model, model_version))
        if path is None:
            path = self._prefix + infer_path(model, model_version)
            if len(self._paths) < 1024:  # (a bound, for clients of many model names)
                self._paths[(model, model_version)] = path
        if check:
            check_body(await self.model_metadata(model, model_version, cached=True), body)

        async def send(conn: _Conn) -> None:
            await self._send_request(conn, path, body)

        generation = self._generation
        try:
            conn, response = await self._exchange(generation, send, self._retry)
        except Exception as exc:
            raise self._local(exc, generation) from None
        ok = False
        result: ResponseStream | None = None
        try:
            if response.status_code != 200:
                data, fault = await self._read_small(conn)
                if fault is not None:  # (the connection is closed below: not ok)
                    raise _cut_error(response, data, fault) from fault
                self._next_cycle(conn)
                ok = True
                raise _error(response, data)
            plain, conn.plain = conn.plain, None
            fields = None
            if plain is not None and plain.claims is not None:
                claims = plain.claims
            else:
                fields = fields_of(response)
                claims = body_claims(fields)
            ahead, conn.ahead = conn.ahead, b""
            length = claims.content_length
            if (
                whole
                and length is not None
                and len(ahead) >= length
                and claims.content_encoding is None
            ):
                # The whole body came with the head (a small answer): decoded
                # at once, without the streaming body's machinery.
                yield _WholeResponse(response, ahead, claims, self._limits)
                conn.to_close = _closes(response, fields, plain) or len(ahead) > length
                ok = True
                return
            reader = BodyReader(
                conn.stream,
                conn.h11,
                claims.content_length,
                receive_in_place=self._zero_copy,
                ahead=ahead,
            )
            result = ResponseStream(
                response, MessageBody("response", claims, reader, limits=self._limits)
            )
            yield result
            ok = result.body.complete and not reader.direct
            if ok:
                self._next_cycle(conn)
            elif result.body.complete:
                # h11 did not see the body: a fresh connection state, same socket,
                # unless the server said it closes, or closed, or sent bytes past
                # its response (that no request asked for: not to be taken for
                # the next answer; see also ProbesIdle).
                extra, closed = reader.rest()
                if conn.h11.our_state is not h11.IDLE:  # (unused when the head was plain)
                    conn.h11 = h11.Connection(h11.CLIENT)
                conn.to_close = _closes(response, fields, plain) or closed or bool(len(extra))
                ok = True
        except BaseException as exc:
            # The fault keeps frames that reach the response (the caller's
            # ``infer`` frame, say): its arrays go now, not when it is collected.
            _drop_locals(exc)
            if result is not None:
                result.body.release()
            if isinstance(exc, Exception):
                local = self._local(exc, generation)
                if local is not exc:
                    raise local from None
            raise
        finally:
            await self._release(conn, ok)

    async def _raise_early_answer(self, conn: _Conn, exc: ConnectionError) -> NoReturn:
        """Sending failed: raise the server's answer if it sent one before
        closing (a refusal, e.g. 413, while the body was still going out),
        else ``exc``."""
        try:
            response = await self._head(conn)
            data, fault = await self._read_small(conn)
        except Exception:
            raise exc from None
        if response.status_code == 200:
            raise exc
        if fault is not None:
            raise _cut_error(response, data, fault) from exc
        raise _error(response, data) from exc

    async def _send_request(self, conn: _Conn, target: str, body: binproto.EncodedBody) -> None:
        encoding = self._request_encoding
        state = conn.h11
        if encoding is None and state.our_state is h11.IDLE:
            # Sent around h11: its head and body pieces cost more than the
            # rest of a small request (see _plain_head for the answer).
            conn.raw = (target, body)
            await conn.stream.send_all([self._raw_head(target, body), *body.buffers])
            return
        head = request_for(target, body, host=self._host, headers=self._accept, encoding=encoding)
        if encoding is None:
            await conn.stream.send_all([state.send(head), *send_body(state, body)])
            return
        batches = send_compressed(state, body, encoding, level=COMPRESSION_LEVEL)
        await write_compressed(conn.stream, state.send(head), batches)

    async def infer(
        self,
        model: str,
        inputs: Mapping[str, Any],
        *,
        outputs: Iterable[str | RequestedOutput] | None = None,
        binary_data_output: bool | None = True,
        model_version: str | None = None,
        id: str | None = None,
        parameters: Mapping[str, Any] | None = None,
        binary: bool | set[str] = True,
        destinations: Destinations = None,
        check: bool = False,
    ) -> dict[str, np.ndarray[Any, Any]]:
        """Run inference and return every output as a numpy array.

        ``outputs`` names the outputs wanted (or gives
        :class:`binproto.RequestedOutput` entries); outputs come back binary
        unless ``binary_data_output`` is False (JSON); ``binary`` is passed to
        :func:`binproto.encode_request`; ``destinations`` to the assembler;
        ``check`` compares the inputs with the model's metadata before any
        byte is sent (see :meth:`stream`).
        """
        async with self.stream(
            model,
            inputs,
            outputs=outputs,
            binary_data_output=binary_data_output,
            model_version=model_version,
            id=id,
            parameters=parameters,
            binary=binary,
            check=check,
            whole=destinations is None,
        ) as response:
            return await response.tensors(destinations)


def _model_path(model: str, model_version: str | None) -> str:
    """``/v2/models/{model}[/versions/{version}]``, names quoted."""
    return infer_path(model, model_version).removesuffix("/infer")


@dataclass(frozen=True)
class Endpoint:
    """Where a client connects: from a base URL or a host and port."""

    host: str
    port: int
    ssl: ssl_module.SSLContext | None
    host_header: str
    path_prefix: str

    @classmethod
    def of(cls, url_or_host: str, port: int | None, ssl: ssl_module.SSLContext | None) -> Endpoint:
        """``"http://host:port/prefix"`` or ``"https://..."`` (TLS, with
        ``ssl`` or the default context), or a bare host with ``port``
        (default 8000; TLS when ``ssl`` is given)."""
        if not isinstance(url_or_host, str):
            raise LocalProtocolError(f"a client's host or URL is a str, got {url_or_host!r}")
        if ssl is not None and not isinstance(ssl, ssl_module.SSLContext):
            raise LocalProtocolError(f"ssl must be an ssl.SSLContext, got {ssl!r}")
        if "://" not in url_or_host:
            port = 8000 if port is None else port
            return cls(url_or_host, port, ssl, f"{url_or_host}:{port}", "")
        parts = urllib.parse.urlsplit(url_or_host)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise LocalProtocolError(f"a base URL is http:// or https://, got {url_or_host!r}")
        if parts.query or parts.fragment or parts.username or parts.password:
            raise LocalProtocolError(f"a base URL has no query, fragment or user: {url_or_host!r}")
        if port is not None:
            raise LocalProtocolError("give the port in the URL, not as an argument")
        tls = parts.scheme == "https"
        try:
            port = parts.port or (443 if tls else 80)
        except ValueError as exc:
            raise LocalProtocolError(f"bad port in {url_or_host!r}: {exc}") from None
        if tls and ssl is None:
            ssl = ssl_module.create_default_context()
        elif not tls and ssl is not None:
            raise LocalProtocolError(f"ssl given for an http:// URL: {url_or_host!r}")
        return cls(parts.hostname, port, ssl, parts.netloc, parts.path)


class EndpointClient(ClientCore):
    """A :class:`ClientCore` made from a base URL or a host and port: what
    the asyncio and trio ``Client`` share. Each gives :meth:`_connect`, the
    one thing that differs: how its I/O library opens a stream.

    The arguments are those of :class:`binproto.adapters.asyncio.Client`.
    """

    def __init__(
        self,
        url_or_host: str = "127.0.0.1",
        port: int | None = None,
        *,
        zero_copy: bool = True,
        timeout: float | None = CLIENT_TIMEOUT,
        limits: Limits | None = None,
        accept_encoding: str | None = None,
        request_encoding: str | None = None,
        ssl: ssl_module.SSLContext | None = None,
        max_connections: int = MAX_CONNECTIONS,
        keepalive_expiry: float | None = KEEPALIVE_EXPIRY,
        retry: Retry | None = DEFAULT_RETRY,
    ) -> None:
        bound = seconds_or_none(timeout, "timeout")
        where = Endpoint.of(url_or_host, port, ssl)

        async def open_stream() -> Any:
            return await self._connect(where, zero_copy=zero_copy, timeout=bound)

        super().__init__(
            open_stream,
            host=where.host_header,
            zero_copy=zero_copy,
            limits=limits,
            accept_encoding=accept_encoding,
            request_encoding=request_encoding,
            max_connections=max_connections,
            keepalive_expiry=keepalive_expiry,
            retry=retry,
            path_prefix=where.path_prefix,
        )

    async def _connect(self, where: Endpoint, *, zero_copy: bool, timeout: float | None) -> Any:
        """A new stream to ``where``."""
        raise NotImplementedError
