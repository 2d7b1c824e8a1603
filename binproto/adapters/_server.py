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

This module is the HTTP/1.1 connection loop and its body reader. The V2
application it answers with (models, routes, statuses) is in ``_app``, the
body intake in ``_intake``, the stream protocols in ``_streams`` and the
remembered heads in ``_heads``; users import from :mod:`binproto.adapters.server`.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import (
    Iterator,
    Sequence,
)
from dataclasses import dataclass, field
from typing import Any, cast

try:
    import h11
except ModuleNotFoundError as exc:  # an optional dependency: say which extra brings it
    from binproto.adapters import missing_extra

    raise missing_extra(exc, "h11") from None

import binproto
from binproto import (
    EncodedBody,
    HeaderFields,
    Limits,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    body_claims,
)
from binproto._http import TE_IN_HTTP_1_0
from binproto._writer import response_start

from ._app import (
    _ALLOWED,
    DISCARD_LIMIT,
    InferRequest,
    Model,
    Route,
    StreamingResponse,
    V2Application,
    _route_of,
    echo_model,
    route,
)
from ._app import AsgiHead as AsgiHead
from ._app import Handler as Handler
from ._app import HandlerResult as HandlerResult
from ._app import RequestHead as RequestHead
from ._app import _remembered_route as _remembered_route
from ._heads import REMEMBERED_HEAD_BYTES as REMEMBERED_HEAD_BYTES
from ._heads import REMEMBERED_HEADER_LINES as REMEMBERED_HEADER_LINES
from ._heads import REMEMBERED_HEADS as REMEMBERED_HEADS
from ._heads import Head, _split_at_head_end
from ._heads import KnownHeads as KnownHeads
from ._intake import THREAD_HEADER as THREAD_HEADER
from ._intake import THREAD_JSON as THREAD_JSON
from ._intake import (
    WHOLE_BODY,
    BodyBudget,
    InferenceError,
    MessageBody,
    drains_for_answer,
)
from ._intake import YIELD_BYTES as YIELD_BYTES
from ._intake import BodySource as BodySource
from ._reader import MAX_CHUNK_LINE as MAX_CHUNK_LINE
from ._reader import BodyReader
from ._streams import CHUNK as CHUNK
from ._streams import (
    ByteStream,
    Capabilities,
    HalfCloses,
    ProbesIdle,
    ReadsAhead,
    ReceivesInto,
    Recycles,
    RunsInThreads,
    Timeouts,
    Yields,
    capabilities,
)
from ._streams import seconds_or_none as seconds_or_none
from .h11 import (
    ResponseFramer,
    content_length_of,
    error_response,
    fields_of,
    has_both_lengths,
    json_response,
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

#: Largest request head (request line and headers) the server accepts.
MAX_HEAD = 64 * 1024
#: Seconds a connection closed on a refused request is kept half-open at most,
#: the bytes still coming read and dropped, so that the close does not reset
#: it before the peer has read the answer (see :meth:`V2Server._linger`)...
LINGER = 30.0
#: ... and the longest wait for those bytes (nginx's lingering_time and
#: lingering_timeout).
LINGER_IDLE = 5.0
#: Bytes asked of the stream by the first read of a request head: a head of
#: up to 4 KiB with a body of :data:`WHOLE_BODY` bytes behind it can come in
#: that one read.
HEAD_READ = WHOLE_BODY + 4 * 1024


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
        #: The V2 application this server answers with (models, routes, statuses).
        self.app = V2Application(self.models, name=self.name, limits=self.limits)
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
        self.app.add_model(model)

    def metadata(self) -> dict[str, Any]:
        """The server metadata object (``GET /v2``)."""
        return self.app.metadata()

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
        if r.kind == "not_found":
            return error_response("Not Found", 404)
        return json_response(self.app.get(r))

    async def _infer(
        self, req: h11.Request, fields: HeaderFields, r: Route, reader: BodyReader
    ) -> tuple[MessageBody, Any]:
        return await self.app.infer(req, body_claims(fields), r, reader, self._budget)

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
        # connection, or say it closes (the lingering close drains it then).
        drains = drains_for_answer(exc, reader.remaining)
        close = not drains or not await self._discard(reader)
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
