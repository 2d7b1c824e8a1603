"""binproto over ASGI: parse request bodies as they arrive, stream encoded responses.

This module works on the raw ASGI ``receive`` / ``send`` callables, so it fits
any ASGI server (uvicorn, hypercorn, ...) and framework. Starlette is optional:
when it is installed, the response classes here are also Starlette
``Response`` objects, so a FastAPI or Starlette endpoint can return them.

Reading a request::

    async def app(scope, receive, send):
        try:
            request = await read_request(scope, receive)   # or iter_events(...)
        except binproto.ProtocolError as exc:
            await error_response(exc)(scope, receive, send)
            return
        body = binproto.encode_response(outputs, model_name="m", request=request.header)
        await EncodedResponse(body)(scope, receive, send)

With Starlette or FastAPI, pass ``request.scope`` and ``request.stream()`` (or
``request.receive``) instead of ``scope`` and ``receive``.

Sending: each buffer of 64 KiB or more of an encoded body goes out as its own
``http.response.body`` messages (``more_body=True``), as views of
the caller's memory, never joined or copied; runs of smaller buffers (the JSON
header, small tensors) are joined into one message, as each message costs the
server a write. No message is larger than ``chunk_size``: a bigger piece is
sent as several views of it, so a server that keeps what the socket did not
take (asyncio on Python < 3.12 copies it into its write buffer) holds at most
that much extra per message.
"""

from __future__ import annotations

import logging
import re
import traceback
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    MutableMapping,
    Sequence,
)
from typing import TYPE_CHECKING, Any

import binproto
from binproto import (
    DecodedMessage,
    Event,
    Limits,
    LocalProtocolError,
    Parser,
    ParserState,
    ProtocolError,
    RemoteProtocolError,
    TensorSpec,
)
from binproto._assemble import Destinations
from binproto._compression import (
    ENCODINGS,
    check_level,
    compress_buffers,
    normalize_encoding,
)
from binproto._http import (
    CREDENTIAL_HEADERS,
    TE_IN_HTTP_1_0,
    HeaderFields,
    KeptOnSecondSight,
    error_body,
)
from binproto._parser import DEFAULT_LIMITS, check_arguments
from binproto._util import (
    GATHER_BELOW,
    as_byte_view,
    gather_small,
    whole_number,
)
from binproto._writer import response_start

from ._asgi_reader import (
    AsgiBodyReader,
    ClientDisconnected,
    _Chunks,
)
from ._intake import MessageBody

if TYPE_CHECKING:
    from starlette.background import BackgroundTask
    from starlette.responses import Response as _ResponseBase

    from binproto import BodyWriter, EncodedBody

    from ._app import InferRequest, Model, StreamingResponse, echo_model
    from ._asgi_app import V2App
    from ._intake import InferenceError
else:
    try:
        from starlette.responses import Response as _ResponseBase
    except ImportError:  # Starlette is optional: plain ASGI applications then.
        _ResponseBase = object

#: Names of the V2 application importable from here too.
_APP_NAMES = ("InferRequest", "InferenceError", "Model", "StreamingResponse", "echo_model")

__all__ = [
    "CHUNK_SIZE",
    "BodySource",
    "BufferResponse",
    "ClientDisconnected",
    "EncodedResponse",
    "InferRequest",
    "InferenceError",
    "Message",
    "Model",
    "Receive",
    "Scope",
    "Send",
    "StreamingResponse",
    "V2App",
    "WriterResponse",
    "body_chunks",
    "echo_model",
    "error_response",
    "iter_events",
    "parser_from_scope",
    "read_request",
    "send_buffers",
]

#: An ASGI message, connection scope, and the two callables (as in the ASGI spec).
Message = MutableMapping[str, Any]
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

#: Where body bytes come from: an ASGI ``receive`` callable, or an async
#: iterable of bytes such as Starlette's ``request.stream()``.
BodySource = Receive | AsyncIterable[Any]

#: The largest view of a buffer sent in one ``http.response.body`` message.
CHUNK_SIZE = 1 << 20


log = logging.getLogger("binproto.asgi")


# -- reading ------------------------------------------------------------------------


#: Most header lists whose fields the ASGI readers keep (see _scope_fields); 0: none.
KNOWN_HEADER_LISTS = 64
#: Longest header list kept: lines, and bytes of its names and values. A
#: client sending to a server directly sends a few headers; a list that came
#: through proxies is longer, and carries a request id: never the same twice,
#: so not even looked up.
KNOWN_HEADER_LINES = 8
KNOWN_HEADER_BYTES = 512
_known_lists: KeptOnSecondSight[tuple[tuple[bytes, bytes], ...], HeaderFields] = KeptOnSecondSight()


def _scope_fields(scope: Scope) -> HeaderFields:
    """The request's header fields (:class:`binproto.HeaderFields`), read once
    per header list that comes again.

    A client sends the same headers again and again, and what binproto reads
    from them (:func:`binproto.body_claims`, kept with the fields) depends on
    their bytes alone. As the servers' remembered heads: a list is noted (its
    hash) the first time, its fields kept the second time, and those serve
    when the same bytes come again (a lookup where reading four headers takes
    microseconds); a list that never comes again (a request id in it, say)
    costs a set entry. Only lists of ``bytes`` names and values (as ASGI
    servers give them; ``str`` or views are read each time) of at most
    :data:`KNOWN_HEADER_BYTES` bytes and :data:`KNOWN_HEADER_LINES` lines
    are kept, none that carries credentials (``Authorization``,
    ``Proxy-Authorization``, ``Cookie``): the kept ones are shared by every
    request of the process. Up to :data:`KNOWN_HEADER_LISTS` are kept, and
    the hashes of :data:`~binproto._http.SEEN_PER_KEPT` times as many (see
    :class:`~binproto._http.KeptOnSecondSight`).
    """
    key = tuple(scope.get("headers", ()))
    if not KNOWN_HEADER_LISTS or len(key) > KNOWN_HEADER_LINES:
        return HeaderFields(key)
    size = 0
    for pair in key:
        # Only bytes: a str or a view equal to bytes would be taken for them
        # (and compared with them: a BytesWarning under python -bb).
        if type(pair) is not tuple or len(pair) != 2:
            return HeaderFields(key)
        name, value = pair
        if type(name) is not bytes or type(value) is not bytes:
            return HeaderFields(key)
        size += len(name) + len(value)
    if size > KNOWN_HEADER_BYTES:
        return HeaderFields(key)
    fields = _known_lists.get(key)
    if fields is None:
        fields = HeaderFields(key)
        if _known_lists.seen_before(key, KNOWN_HEADER_LISTS) and not any(
            name in fields for name in CREDENTIAL_HEADERS
        ):
            _known_lists.keep(key, fields, KNOWN_HEADER_LISTS)
    return fields


def _request_fields(scope: Scope) -> HeaderFields:
    """The request's header fields; a :class:`binproto.RemoteProtocolError`
    for an HTTP/1.0 request with ``Transfer-Encoding`` (RFC 9112, section
    6.1: its framing is faulty, whatever the ASGI server made of it)."""
    fields = _scope_fields(scope)
    if scope.get("http_version") == "1.0" and "transfer-encoding" in fields:
        raise RemoteProtocolError(TE_IN_HTTP_1_0)
    return fields


def parser_from_scope(
    scope: Scope,
    *,
    limits: Limits | None = None,
    strict_bool: bool = True,
    raw_input: TensorSpec | None = None,
) -> Parser:
    """A request :class:`binproto.Parser` configured from an ASGI HTTP scope.

    ``Inference-Header-Content-Length``, ``Content-Length`` and
    ``Content-Encoding`` (gzip and deflate are decoded by binproto) come from
    ``scope["headers"]``; ``raw_input`` is the model's one input, which a raw
    binary request's body stands for (see :class:`binproto.Parser`). Raises
    :class:`binproto.RemoteProtocolError` for bad values of those headers (a
    content encoding binproto cannot decode has status hint 415), and for an
    HTTP/1.0 request with ``Transfer-Encoding`` (a faulty framing, RFC 9112
    section 6.1: answer 400 and close).
    """
    return binproto.parser_from_headers(
        "request",
        _request_fields(scope),
        limits=limits,
        strict_bool=strict_bool,
        raw_input=raw_input,
    )


async def body_chunks(receive: Receive) -> AsyncIterator[bytes]:
    """Yield the request body's bytes from ASGI ``http.request`` messages.

    Ends after the message with ``more_body`` false. A client that disconnects
    first is a :class:`ClientDisconnected` (a :class:`binproto.RemoteProtocolError`):
    the body is incomplete.
    """
    async for chunk in _Chunks(receive):
        yield chunk


async def iter_events(
    scope: Scope,
    source: BodySource,
    *,
    parser: Parser | None = None,
    limits: Limits | None = None,
    strict_bool: bool = True,
    raw_input: TensorSpec | None = None,
) -> AsyncIterator[Event]:
    """Parse a request body as it arrives; yield each event.

    ``source`` is the ASGI ``receive`` callable or an async iterable of bytes
    (Starlette's ``request.stream()``). The parser comes from
    :func:`parser_from_scope` unless one is given (with ``limits``,
    ``strict_bool`` and ``raw_input``). Only the next chunk is read
    while the consumer holds an event, so memory stays bounded by the chunk
    size plus what the consumer keeps. A :class:`~binproto.TensorChunk`'s data
    is valid until the next event is requested. Raises
    :class:`binproto.RemoteProtocolError` for a bad or incomplete body, and
    :class:`ClientDisconnected` when the client leaves mid-body (Starlette's
    ``ClientDisconnect`` included).
    """
    if parser is None:
        parser = parser_from_scope(
            scope, limits=limits, strict_bool=strict_bool, raw_input=raw_input
        )
    async for events in _event_batches(parser, source):
        for event in events:
            yield event


async def _event_batches(
    parser: Parser, source: BodySource, chunks: AsyncIterator[Any] | None = None
) -> AsyncIterator[Iterator[Event]]:
    """The events of the body, an iterator per received chunk (one step of
    this async generator per chunk, not per event: each step costs
    microseconds). Take every event of one before asking for the next: they
    are made as they are taken, so a compressed chunk that expands to
    gigabytes is never held expanded.
    ``chunks``: the body's chunks (:class:`_Chunks`), when some were taken
    (and given to the parser) already."""
    # The claims of the HTTP head (lengths against the limits, the coding) are
    # checked before the first receive: a server answers "Expect:
    # 100-continue" on that call, which would invite a body already refused.
    if parser.state is ParserState.HEADER:
        yield parser.events()
    if chunks is None:
        chunks = _Chunks(source)
    async for chunk in chunks:
        parser.receive_data(chunk)
        yield parser.events()
    parser.receive_data(b"")
    yield parser.events()
    if parser.state is not ParserState.DONE:  # pragma: no cover - the parser raises first
        raise RemoteProtocolError("the body ended early", offset=parser.bytes_parsed)


async def read_request(
    scope: Scope,
    source: BodySource,
    *,
    destinations: Destinations = None,
    limits: Limits | None = None,
    strict_bool: bool = True,
    raw_input: TensorSpec | None = None,
) -> DecodedMessage:
    """Read a whole request body into numpy arrays, as it arrives.

    Each binary tensor's bytes are copied once, from the received chunks into
    the tensor's own memory (or into ``destinations``, as with
    :class:`binproto.TensorAssembler`). Returns the header and the tensors by
    name.

    The body is taken in as binproto's servers take it (one rule, in
    :class:`~binproto.adapters.server.MessageBody`): a small body that arrives
    in one message (most small requests) is copied once, whole, and decoded as
    a whole body (:func:`binproto.decode_request`: the parser's checks without
    its per-event work), its tensors arrays over that copy; without
    ``destinations`` only, and not a raw body. A compressed body of up to
    16 MiB is read whole before it is parsed, and a gzip body whose trailer
    does not give the size its header claims is refused before its tensors
    are inflated. Any other body is parsed as it arrives, never held whole;
    a big JSON header (or a compressed one) is parsed in a worker thread
    under asyncio. ``raw_input`` is the model's one input, which a raw
    binary request's body stands for (``Inference-Header-Content-Length: 0``;
    refused without it).
    """
    claims = binproto.body_claims(_request_fields(scope))
    check_arguments("request", claims.header_length, claims.content_length, limits, raw_input)
    # The head's claims are checked before the first receive (see iter_events).
    claims.check(limits if limits is not None else DEFAULT_LIMITS, raw_input=raw_input)
    reader = AsgiBodyReader(source, claims.content_length)
    if claims.content_length and claims.content_encoding is None and destinations is None:
        await reader.prime()  # (a body all in its first message is decoded whole)
    body = MessageBody(
        "request", claims, reader, limits=limits, strict_bool=strict_bool, raw_input=raw_input
    )
    try:
        header = await body.read_header()
        tensors = await body.tensors(destinations)
    except BaseException as exc:
        # The fault's traceback keeps the reading frames (and the parser may
        # keep the fault, a cycle): drop the arrays now, not when the
        # collector runs (as binproto's servers do).
        body.release()
        traceback.clear_frames(exc.__traceback__)  # (skips frames still running)
        raise
    shared = tuple(t.name for t in header.tensors if t.shared_memory)
    return DecodedMessage(header, tensors, shared)


# -- sending ------------------------------------------------------------------------


# A header name is a token (RFC 9110 5.6.2); a value holds no CR, LF or NUL,
# which would end the header (or the head) early: response splitting.
_TOKEN = re.compile(rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+")
_VALUE_ENDS = re.compile(rb"[\r\n\x00]")


def _raw_headers(headers: Iterable[tuple[Any, Any]]) -> list[tuple[bytes, bytes]]:
    """The caller's headers as ASGI wants them: lower-cased names, values as
    bytes. Anything a server could not send as it is, is the caller's
    :class:`binproto.LocalProtocolError`."""
    try:
        pairs = iter(headers)
    except TypeError:
        raise LocalProtocolError(f"headers must be (name, value) pairs, got {headers!r}") from None
    raw = []
    for pair in pairs:
        try:
            name, value = pair
            name = (name if isinstance(name, bytes) else str(name).encode("latin-1")).lower()
            value = value if isinstance(value, bytes) else str(value).encode("latin-1")
            if not _TOKEN.fullmatch(name) or _VALUE_ENDS.search(value):
                raise ValueError
        except (TypeError, ValueError):  # (UnicodeEncodeError is a ValueError)
            raise LocalProtocolError(
                "a response header is a (name, value) pair of latin-1 str or bytes, its"
                f" name a token, its value without CR, LF or NUL; got {pair!r}"
            ) from None
        raw.append((name, value))
    return raw


def _pieces(buffers: Iterable[Any], chunk_size: int) -> Iterator[Any]:
    """``buffers`` as the messages of a body: runs of small buffers joined
    (:func:`~binproto._util.gather_small`), then each piece cut into views of
    at most ``chunk_size`` bytes. Cut after joining: a big buffer is only ever
    sent as views of its own memory, whatever the ``chunk_size``."""
    for piece in gather_small(map(as_byte_view, buffers)):
        if len(piece) <= chunk_size:
            yield piece
        else:
            view = memoryview(piece)
            for start in range(0, len(view), chunk_size):
                yield view[start : start + chunk_size]


def _header_pairs(headers: Iterable[tuple[Any, Any]] | Mapping[Any, Any]) -> Iterable[Any]:
    """The ``(name, value)`` pairs of a header list or mapping."""
    if isinstance(headers, (list, tuple)):  # (before the slower Mapping check)
        return headers
    return headers.items() if isinstance(headers, Mapping) else headers


async def send_buffers(
    send: Send,
    buffers: Iterable[Any],
    *,
    status: int = 200,
    headers: Iterable[tuple[Any, Any]] = (),
    chunk_size: int = CHUNK_SIZE,
) -> None:
    """Send a whole response: its start, then its body in few messages.

    ``headers`` should include the framing (``Content-Length``; without it the
    server frames the body, chunked for HTTP/1.1). A buffer of 64 KiB or
    more is sent as byte views of the caller's memory (of at most
    ``chunk_size`` bytes), never joined or copied; runs of smaller buffers
    (the JSON header, small tensors) are joined into one message, as each
    message costs the server a write. The last message ends the body.
    ``buffers`` may be lazy (a compressor's output): it is read as it is sent.
    """
    await _send_raw(
        send,
        buffers,
        status,
        _raw_headers(headers),
        whole_number(chunk_size, "chunk_size", positive=True),
    )


async def _send_raw(
    send: Send,
    buffers: Iterable[Any],
    status: int,
    raw_headers: list[tuple[bytes, bytes]],
    chunk_size: int,
) -> None:
    """:func:`send_buffers` with headers already as ASGI wants them."""
    await _send_pieces(send, _pieces(buffers, chunk_size), status, raw_headers)


async def _send_pieces(
    send: Send, pieces: Iterable[Any], status: int, raw_headers: list[tuple[bytes, bytes]]
) -> None:
    """Send a response's start, then each of ``pieces`` as a body message."""
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    held: Any = b""
    for piece in pieces:
        if len(held):
            await send({"type": "http.response.body", "body": held, "more_body": True})
        held = piece
    await send({"type": "http.response.body", "body": held, "more_body": False})


class BufferResponse(_ResponseBase):
    """An ASGI response made of buffers, sent as :func:`send_buffers` does:
    big ones as views of their memory, never joined; runs of small ones joined.

    Call it as an ASGI application (``await response(scope, receive, send)``).
    When Starlette is installed it is also a Starlette ``Response``, so a
    FastAPI or Starlette endpoint may return it; ``headers``, ``background``
    and ``status_code`` work as there.

    Args:
        buffers: the body, as bytes-like objects, in order.
        status_code: the HTTP status.
        headers: the response headers; they must frame the body
            (``Content-Length``) and give its ``Content-Type``.
        background: a task to run after the response is sent (Starlette).
        chunk_size: the largest view sent in one message.
    """

    def __init__(
        self,
        buffers: Iterable[Any],
        status_code: int = 200,
        headers: Iterable[tuple[Any, Any]] | Mapping[str, str] = (),
        *,
        background: BackgroundTask | None = None,
        chunk_size: int = CHUNK_SIZE,
    ) -> None:
        self.buffers = list(buffers)
        self.status_code = status_code
        none = type(headers) is tuple and not headers  # (the default: nothing to walk through)
        self.raw_headers = [] if none else _raw_headers(_header_pairs(headers))
        self.background = background
        self.chunk_size = whole_number(chunk_size, "chunk_size", positive=True)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Send the response (an ASGI application)."""
        await _send_raw(send, self.buffers, self.status_code, self.raw_headers, self.chunk_size)
        if self.background is not None:
            await self.background()


class EncodedResponse(BufferResponse):
    """A response carrying an encoded body (:func:`binproto.encode_response`).

    The body's own headers (``Content-Length``, ``Content-Type`` and, when a
    tensor is binary, ``Inference-Header-Content-Length``) come first, then
    ``headers``. Each of ``body.buffers`` is sent as it is: the JSON header,
    then the tensors' memory.

    With ``encoding`` (``"gzip"`` or ``"deflate"``, e.g. what
    :func:`binproto.preferred_encoding` picked from the request's
    ``Accept-Encoding``) the body is compressed while it is sent, a piece at a
    time (never held whole), at zlib level ``compression_level`` (1 by
    default: tensor bytes compress little at any level, and level 1 is two to
    three times faster than 6 on them). ``Content-Length`` is then left out
    (the server frames the body, chunked for HTTP/1.1), and
    ``Content-Encoding`` and ``Vary: Accept-Encoding`` are added;
    ``Inference-Header-Content-Length`` still counts the uncompressed JSON.
    None or ``"identity"`` sends it as it is.
    """

    def __init__(
        self,
        body: EncodedBody,
        status_code: int = 200,
        headers: Iterable[tuple[Any, Any]] | Mapping[str, str] = (),
        *,
        encoding: str | None = None,
        compression_level: int = 1,
        background: BackgroundTask | None = None,
        chunk_size: int = CHUNK_SIZE,
    ) -> None:
        coding = None
        if encoding is not None:  # (None: nothing to look up)
            try:
                coding = normalize_encoding(encoding)
            except RemoteProtocolError:
                raise LocalProtocolError(
                    f"encoding must be 'gzip', 'deflate' or None, got {encoding!r}"
                ) from None
        if coding is not None:
            check_level(compression_level)  # (now, not when the body is sent)
        framing = _encoded_headers(body, coding)
        super().__init__(
            body.buffers,
            status_code,
            headers,
            background=background,
            chunk_size=chunk_size,
        )
        # The body's own headers first, then the caller's.
        self.raw_headers[:0] = framing
        self.encoded = body
        #: The content coding the body is sent with, or None.
        self.encoding = coding
        self.compression_level = compression_level

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Send the response (an ASGI application)."""
        pieces = _encoded_pieces(
            self.buffers,
            self.encoded.content_length,
            self.encoding,
            self.compression_level,
            self.chunk_size,
        )
        await _send_pieces(send, pieces, self.status_code, self.raw_headers)
        if self.background is not None:
            await self.background()


def _encoded_headers(body: EncodedBody, coding: str | None) -> list[tuple[bytes, bytes]]:
    """An encoded body's own headers, sent with ``coding`` (a normalized
    content coding, or None): compressed, it has no ``Content-Length``."""
    framing = body.raw_headers
    if coding is not None:
        framing = [(k, v) for k, v in framing if k != b"content-length"]
        framing += [(b"content-encoding", coding.encode()), (b"vary", b"Accept-Encoding")]
    return framing


def _encoded_pieces(
    buffers: Sequence[Any], length: int, coding: str | None, level: int, chunk_size: int
) -> Iterable[Any]:
    """The body messages of an encoded body of ``length`` bytes, sent with
    ``coding`` (see :class:`EncodedResponse`)."""
    if coding is not None:
        return _pieces(compress_buffers(buffers, coding, level=level), chunk_size)
    if length < GATHER_BELOW and length <= chunk_size:
        # A small body is one message, as _pieces would join it: joined
        # here without weighing each buffer first, as its length says how
        # big it is (a hand-made body whose buffers say otherwise is sent
        # as any other).
        whole = b"".join([b if type(b) is bytes else as_byte_view(b) for b in buffers])
        if len(whole) == length:
            return (whole,)
    return _pieces(buffers, chunk_size)


#: Tensor data for a :class:`WriterResponse`: ``(index or name, buffer)`` pairs.
TensorPieces = AsyncIterable[tuple[int | str, Any]] | Iterable[tuple[int | str, Any]]


class WriterResponse(_ResponseBase):
    """A response whose tensor data is produced while it is sent.

    ``writer`` is a :class:`binproto.BodyWriter` for the response header;
    ``pieces`` yields ``(index, buffer)`` pairs in body order (sync or async;
    the index of the tensor in the header, or its name):
    each buffer is checked by ``writer.send`` and sent as views of the same
    memory. After the last piece, ``writer.end()`` checks that every tensor got
    exactly its declared size; a producer that sends too much or too little
    raises :class:`binproto.LocalProtocolError` (the response is then cut
    short, so the client sees an incomplete body, never a wrong one).
    """

    def __init__(
        self,
        writer: BodyWriter,
        pieces: TensorPieces,
        status_code: int = 200,
        headers: Iterable[tuple[Any, Any]] | Mapping[str, str] = (),
        *,
        background: BackgroundTask | None = None,
        chunk_size: int = CHUNK_SIZE,
    ) -> None:
        items = list(_header_pairs(headers))
        self.writer = writer
        self.pieces = pieces
        self.status_code = status_code
        self.raw_headers = _raw_headers([*writer.headers, *items])
        self.background = background
        self.chunk_size = whole_number(chunk_size, "chunk_size", positive=True)

    async def _iter_pieces(self) -> AsyncIterator[tuple[int | str, Any]]:
        pieces = self.pieces
        if isinstance(pieces, AsyncIterable):
            async for item in pieces:
                yield item
        else:
            for item in pieces:
                yield item

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Send the response (an ASGI application)."""
        writer = self.writer
        start = response_start(writer)  # (refused before the response starts)
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        await send({"type": "http.response.body", "body": start, "more_body": True})
        async for index, data in self._iter_pieces():
            for piece in _pieces((writer.send(index, data),), self.chunk_size):
                if len(piece):
                    await send({"type": "http.response.body", "body": piece, "more_body": True})
        writer.end()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        if self.background is not None:
            await self.background()


def error_response(error: BaseException | str, status: int | None = None) -> BufferResponse:
    """A V2 error response: ``{"error": "..."}`` as JSON.

    The status is ``status``, else a :class:`binproto.ProtocolError`'s
    ``status_hint``, else 400. A 415 (unsupported content encoding) also
    names the encodings binproto decodes in ``Accept-Encoding``; a 503 says
    ``Retry-After: 1``.
    """
    if isinstance(error, ProtocolError):
        code = status if status is not None else error.status_hint
    else:
        code = status if status is not None else 400
    payload = error_body(error)
    headers = [("content-type", "application/json"), ("content-length", str(len(payload)))]
    if code == 415:
        # Tell the client which content codings it may use instead (RFC 7694).
        headers.append(("accept-encoding", ", ".join(ENCODINGS)))
    if code == 503:  # busy, not broken: say when to come back
        headers.append(("retry-after", "1"))
    return BufferResponse([payload], code, headers)


def __getattr__(name: str) -> Any:
    # The whole V2 application (and the names its models are written with)
    # live in modules that import this one: looked up when first asked for.
    if name == "V2App":
        from ._asgi_app import V2App

        return V2App
    if name in _APP_NAMES:
        from . import server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
