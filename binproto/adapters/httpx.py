"""binproto over httpx: send encoded requests unjoined, parse responses as they arrive.

Sync and async helpers for the V2 inference endpoint
``POST /v2/models/{name}[/versions/{version}]/infer``::

    with httpx.Client(base_url="http://127.0.0.1:8000") as client:
        result = infer(client, "echo", {"x": np.arange(4, dtype=np.float32)})
        result.tensors["x"]

    async with httpx.AsyncClient(base_url=...) as client:
        async with astream_infer(client, "echo", inputs) as events:
            async for event in events:
                ...

The request body goes out as streaming request content with its
``Content-Length`` set: an iterator over views of ``body.buffers`` (views of at
most ``chunk_size`` bytes, since the HTTP layer below copies each piece it is
given once), so the tensors are never joined. The response is read with
``iter_raw`` / ``aiter_raw``, the bytes as they came over the wire, and fed to
a :class:`binproto.Parser` that handles the ``Content-Encoding`` itself; the
``Accept-Encoding`` sent names only the encodings binproto can decode.

A response with an error status raises :class:`HTTPError` with the V2
``{"error": ...}`` message. A body that breaks off (closed early, or the
connection reset) or is malformed raises :class:`binproto.RemoteProtocolError`,
never httpx's own errors; so does a response head httpx refuses (garbled,
cut short, an upgrade, bad framing) in :func:`infer`, :func:`ainfer`,
:func:`stream_infer` and :func:`astream_infer` (httpx's error is the
``__cause__``), unless this side closed the client meanwhile: then it is a
:class:`binproto.LocalProtocolError`. httpx's connect errors, write errors
and timeouts are raised as they are.
"""

from __future__ import annotations

import errno
import sys
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Mapping
from contextlib import AsyncExitStack, ExitStack, asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any, NoReturn, cast

try:
    import httpx
except ModuleNotFoundError as exc:  # an optional dependency: say which extra brings it
    from binproto.adapters import missing_extra

    raise missing_extra(exc, "httpx") from None

import binproto
from binproto import (
    DecodedMessage,
    Event,
    Limits,
    LocalProtocolError,
    Parser,
    TensorAssembler,
)
from binproto._assemble import Destinations
from binproto._compression import ENCODINGS, Inflater, normalize_encoding
from binproto._util import as_byte_view, whole_number
from binproto.adapters.h11 import HTTPError, error_message, infer_path

if TYPE_CHECKING:
    from binproto import EncodedBody

__all__ = [
    "ACCEPT_ENCODING",
    "CHUNK_SIZE",
    "HTTPError",
    "ainfer",
    "aiter_events",
    "aread_response",
    "arequest_content",
    "astream_infer",
    "infer",
    "infer_path",
    "iter_events",
    "parser_for_response",
    "read_response",
    "request_content",
    "request_headers",
    "stream_infer",
]

#: The largest view of a request buffer handed to httpx at once.
CHUNK_SIZE = 1 << 20

#: The content codings binproto's parser decodes, sent as ``Accept-Encoding``.
ACCEPT_ENCODING = ", ".join(ENCODINGS)

#: Most bytes of an error response body read into memory (after decoding).
MAX_ERROR_BODY = 1 << 20

_ERROR_BODY_LIMITS = Limits(max_decompressed_bytes=MAX_ERROR_BODY)

# What httpx raises for a body that breaks off (closed early, or the connection
# reset), is badly framed or badly coded. (Its timeouts are the caller's own
# bounds, left as they are.)
_BODY_ERRORS = (httpx.RemoteProtocolError, httpx.ReadError, httpx.DecodingError)


def request_content(body: EncodedBody, chunk_size: int = CHUNK_SIZE) -> Iterator[memoryview]:
    """The body's buffers as byte views of at most ``chunk_size`` bytes (no copy).

    Pass it as ``content=`` with :func:`request_headers` (which sets
    ``Content-Length``) so httpx streams it rather than joining it.
    ``chunk_size`` must be a positive int (else
    :class:`binproto.LocalProtocolError`, raised here, not as httpx sends).
    """
    return _pieces(body, whole_number(chunk_size, "chunk_size", positive=True))


def _pieces(body: EncodedBody, chunk_size: int) -> Iterator[memoryview]:
    for buffer in body.buffers:
        view = as_byte_view(buffer)
        for start in range(0, len(view), chunk_size):
            yield view[start : start + chunk_size]


def arequest_content(body: EncodedBody, chunk_size: int = CHUNK_SIZE) -> AsyncIterator[memoryview]:
    """:func:`request_content` as an async iterator, for ``httpx.AsyncClient``."""
    return _apieces(request_content(body, chunk_size))


async def _apieces(pieces: Iterator[memoryview]) -> AsyncIterator[memoryview]:
    for piece in pieces:
        yield piece


def _content(pieces: Iterator[memoryview]) -> Iterable[bytes]:
    # httpx's annotation says bytes; it passes each piece to h11, which takes
    # any bytes-like object. Views keep the tensors unjoined.
    return cast("Iterable[bytes]", pieces)


def _acontent(pieces: AsyncIterator[memoryview]) -> AsyncIterable[bytes]:
    return cast("AsyncIterable[bytes]", pieces)


def request_headers(body: EncodedBody, headers: Mapping[str, str] | None = None) -> dict[str, str]:
    """The HTTP headers for sending ``body``: its framing, ``Accept-Encoding``, then ``headers``.

    ``Accept-Encoding`` is ``identity`` (httpx would otherwise offer gzip and
    more): compressing tensors costs the server far more time than it saves on
    a fast link. Ask for compression with ``headers={"Accept-Encoding":
    ACCEPT_ENCODING}`` (the codings binproto decodes). A header of
    ``headers`` replaces one of the same name in any case; the headers that
    frame the body (Content-Length, Transfer-Encoding, Content-Encoding,
    Inference-Header-Content-Length) come from the body only: giving one is
    a :class:`binproto.LocalProtocolError` (a body sent under other framing
    would be cut or run on).
    """
    out = {str(k): str(v) for k, v in body.headers}
    out["Accept-Encoding"] = "identity"
    for name, value in (headers or {}).items():
        key = str(name).lower()
        if key in _FRAMING:
            raise LocalProtocolError(f"the {name} header comes from the body: it cannot be given")
        for same in [k for k in out if k.lower() == key]:
            del out[same]
        out[name] = value
    return out


_FRAMING = frozenset(
    {"content-length", "transfer-encoding", "content-encoding", "inference-header-content-length"}
)


def parser_for_response(
    response: httpx.Response, *, limits: Limits | None = None, strict_bool: bool = True
) -> Parser:
    """A response :class:`binproto.Parser` configured from the response headers.

    ``Inference-Header-Content-Length``, ``Content-Length`` and
    ``Content-Encoding`` (gzip and deflate, decoded by binproto) come from the
    response; bad values raise :class:`binproto.RemoteProtocolError`.
    """
    return binproto.parser_from_headers(
        "response", list(response.headers.raw), limits=limits, strict_bool=strict_bool
    )


def _feed(parser: Parser, chunk: bytes) -> Iterator[Event]:
    if len(chunk):
        parser.receive_data(chunk)
        yield from parser.events()


def _finish(parser: Parser) -> Iterator[Event]:
    parser.receive_data(b"")
    yield from parser.events()


def _said(exc: httpx.HTTPError) -> str:
    # (httpx's ReadError for a reset connection has no message.)
    return str(exc) or f"httpx.{type(exc).__name__}"


def _closed_here(exc: BaseException) -> bool:
    """True when httpx's error stands for this side closing the connection
    (the client closed by another task: anyio's ClosedResourceError, or a
    socket closed under a read), not for the peer."""
    anyio = sys.modules.get("anyio")  # (what an async httpx client runs on)
    closed: tuple[type[BaseException], ...] = (anyio.ClosedResourceError,) if anyio else ()
    # Down httpx's and httpcore's own errors (raised from, or while handling,
    # another) to the first of another library's: what happened. (Past it,
    # the context may be whatever the caller was handling.)
    httpcore = sys.modules.get("httpcore")
    network = (httpx.NetworkError, httpcore.NetworkError) if httpcore else (httpx.NetworkError,)
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and type(link).__module__.partition(".")[0] in ("httpx", "httpcore"):
        if id(link) in seen:
            return False
        seen.add(id(link))
        # (httpcore raises a network error inside the handler of the error
        # it stands for; any other of its errors, raised with no cause, has
        # the caller's for a context)
        link = link.__cause__ or (link.__context__ if isinstance(link, network) else None)
    return isinstance(link, closed) or (isinstance(link, OSError) and link.errno == errno.EBADF)


def _body_error(exc: httpx.HTTPError, offset: int) -> binproto.ProtocolError:
    if _closed_here(exc):
        return LocalProtocolError(
            "the httpx client was closed while the response was read (at byte"
            f" {offset} of its body)"
        )
    return binproto.RemoteProtocolError(
        f"the response body could not be read: {_said(exc)}", offset=offset
    )


class _ErrorBody:
    """An error response's body, taken from its raw bytes: at most
    MAX_ERROR_BODY bytes, decoded by binproto when its coding is gzip or
    deflate, so a small compressed body cannot expand in memory."""

    def __init__(self, response: httpx.Response) -> None:
        self.status = response.status_code
        self.data = bytearray()
        self.fault: binproto.RemoteProtocolError | None = None
        self._failure = "read"  # or "decoded": what went wrong, for the message
        self._received = False
        self._raw = 0  # bytes read as sent
        try:
            encoding = normalize_encoding(response.headers.get("content-encoding"))
        except binproto.RemoteProtocolError:
            encoding = None  # br, zstd, ...: not decoded, kept as sent
        self._inflater = None if encoding is None else Inflater(encoding, _ERROR_BODY_LIMITS, None)

    def add(self, chunk: bytes) -> bool:
        """Take the next raw chunk; True once no more is wanted (a fault, or
        MAX_ERROR_BODY bytes taken, decoded or, for a body that decodes to
        little, as sent)."""
        self._raw += len(chunk)
        if self._inflater is None:
            self.data += chunk[: MAX_ERROR_BODY - len(self.data)]
        elif chunk:
            self._received = True
            self._inflater.feed(memoryview(chunk))
            self._inflate()
        return self.fault is not None or max(len(self.data), self._raw) >= MAX_ERROR_BODY

    def end(self) -> None:
        """The body ended: check its compressed stream did too."""
        if self._inflater is not None and self._received:  # (an empty body has none)
            self._inflater.end()
            self._inflate()

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Around the reads of the body: what httpx raises ends it as a fault."""
        try:
            yield
        except _BODY_ERRORS as exc:
            self.fault = binproto.RemoteProtocolError(_said(exc), offset=len(self.data))
            self.fault.__cause__ = exc

    def _inflate(self) -> None:
        assert self._inflater is not None
        try:
            while len(self.data) < MAX_ERROR_BODY:
                piece = self._inflater.step()
                if piece is None:
                    return
                self.data += piece
        except binproto.RemoteProtocolError as exc:
            self.fault = exc
            self._failure = "decoded"

    def error(self) -> HTTPError:
        """The error for the status and the body read."""
        if self.fault is None:
            return error_message(self.status, bytes(self.data))
        # Keep the status and what could be read; say why the rest is missing.
        note = f"the error body could not be {self._failure}: {self.fault}"
        text = self.data.decode("utf-8", "replace")
        return HTTPError(self.status, f"{text} ({note})" if text else note)


def _read_error(response: httpx.Response) -> HTTPError:
    # httpx read (and decoded) the body already, e.g. for client.post(); or it
    # was taken, or closed unread, before: then the status is all there is.
    try:
        data = response.content
    except httpx.StreamError:
        return HTTPError(response.status_code, "(the error body was read or closed before)")
    return error_message(response.status_code, data[:MAX_ERROR_BODY])


def _raise_error_status(response: httpx.Response) -> NoReturn:
    if response.is_stream_consumed or response.is_closed:
        raise _read_error(response)
    body = _ErrorBody(response)
    with body.reading():
        for chunk in response.iter_raw():
            if body.add(chunk):
                break
        else:
            body.end()
    raise body.error() from body.fault


async def _araise_error_status(response: httpx.Response) -> NoReturn:
    if response.is_stream_consumed or response.is_closed:
        raise _read_error(response)
    body = _ErrorBody(response)
    with body.reading():
        async for chunk in response.aiter_raw():
            if body.add(chunk):
                break
        else:
            body.end()
    raise body.error() from body.fault


def _check_unread(response: httpx.Response) -> None:
    # iter_raw would raise httpx's StreamConsumed or StreamClosed.
    if response.is_stream_consumed or response.is_closed:
        raise LocalProtocolError(
            "the response's body was read already, or its stream closed: parse a"
            " response of client.stream(...) (or use infer), within its block"
        )


def iter_events(
    response: httpx.Response,
    *,
    parser: Parser | None = None,
    limits: Limits | None = None,
    strict_bool: bool = True,
) -> Iterator[Event]:
    """Parse a streamed response (``client.stream(...)``) as it arrives.

    Reads with ``iter_raw`` (binproto decodes the content encoding). A
    :class:`~binproto.TensorChunk`'s data is valid until the next event is
    requested.

    Raises :class:`binproto.RemoteProtocolError` for a bad body: malformed,
    or cut short (closed early, or the connection reset), badly framed or
    badly coded on the wire (httpx's ``RemoteProtocolError``, ``ReadError``
    and ``DecodingError`` are turned into it, as its ``__cause__``, with
    ``offset`` the body bytes parsed before the fault). httpx's timeouts
    (``ReadTimeout``), the bounds the caller gave httpx, are raised as they
    are.

    Raises :class:`HTTPError` for an error status, its message the V2
    ``{"error": ...}`` of the body. At most :data:`MAX_ERROR_BODY` bytes of
    that body are read, after decoding gzip or deflate, so a compressed
    body's expansion costs no more memory; a body in another coding (br,
    zstd, ...) is not decoded and its raw bytes are the message. A body that
    cannot be read or decoded still gives the :class:`HTTPError`, with the
    status, the text read before the fault and a note saying why the rest is
    missing (the :class:`binproto.RemoteProtocolError` is its ``__cause__``).
    A response httpx has read already (not streamed) gives the body as httpx
    decoded it.

    A successful response whose body httpx has read already (``client.post``,
    not ``client.stream``), or read through, or whose stream is closed, is
    the caller's :class:`binproto.LocalProtocolError`: the body is parsed as
    it arrives, and there is none left to arrive.
    """
    if not 200 <= response.status_code < 300:
        _raise_error_status(response)
    _check_unread(response)
    if parser is None:
        parser = parser_for_response(response, limits=limits, strict_bool=strict_bool)
    try:
        for chunk in response.iter_raw():
            yield from _feed(parser, chunk)
    except _BODY_ERRORS as exc:
        raise _body_error(exc, parser.bytes_parsed) from exc
    yield from _finish(parser)


async def aiter_events(
    response: httpx.Response,
    *,
    parser: Parser | None = None,
    limits: Limits | None = None,
    strict_bool: bool = True,
) -> AsyncIterator[Event]:
    """:func:`iter_events` for an ``httpx.AsyncClient`` response (``aiter_raw``),
    with the same errors."""
    if not 200 <= response.status_code < 300:
        await _araise_error_status(response)
    _check_unread(response)
    if parser is None:
        parser = parser_for_response(response, limits=limits, strict_bool=strict_bool)
    try:
        async for chunk in response.aiter_raw():
            for event in _feed(parser, chunk):
                yield event
    except _BODY_ERRORS as exc:
        raise _body_error(exc, parser.bytes_parsed) from exc
    for event in _finish(parser):
        yield event


def read_response(
    response: httpx.Response,
    *,
    destinations: Destinations = None,
    limits: Limits | None = None,
    strict_bool: bool = True,
) -> DecodedMessage:
    """Read a streamed response into numpy arrays as it arrives (one copy per byte).

    ``response`` comes from ``client.stream(...)``, its body not yet read
    (see :func:`iter_events` for the errors).
    """
    assembler = TensorAssembler(destinations)
    for event in iter_events(response, limits=limits, strict_bool=strict_bool):
        assembler.feed(event)
    return assembler.message()


async def aread_response(
    response: httpx.Response,
    *,
    destinations: Destinations = None,
    limits: Limits | None = None,
    strict_bool: bool = True,
) -> DecodedMessage:
    """:func:`read_response` for an ``httpx.AsyncClient`` response."""
    assembler = TensorAssembler(destinations)
    async for event in aiter_events(response, limits=limits, strict_bool=strict_bool):
        assembler.feed(event)
    return assembler.message()


def _encode(inputs: Any, options: dict[str, Any]) -> EncodedBody:
    if hasattr(inputs, "buffers") and hasattr(inputs, "headers"):
        if options:
            raise LocalProtocolError(
                f"encoding options {sorted(options)} cannot apply to an already encoded body"
            )
        encoded: EncodedBody = inputs
        return encoded
    # Ask for outputs in binary unless told otherwise (as tritonclient does);
    # a RequestedOutput's own binary_data still decides for that output.
    options.setdefault("binary_data_output", True)
    return binproto.encode_request(inputs, **options)


def _head_error(exc: httpx.HTTPError) -> binproto.ProtocolError:
    if _closed_here(exc):
        return LocalProtocolError("the httpx client was closed while the response head was read")
    return binproto.RemoteProtocolError(f"the response head could not be read: {_said(exc)}")


@contextmanager
def _post(
    client: httpx.Client, path: str, body: EncodedBody, headers: dict[str, str], chunk_size: int
) -> Iterator[httpx.Response]:
    """``client.stream`` of the request, its response head read: a head httpx
    refuses (garbled, cut short, badly framed) is binproto's
    RemoteProtocolError, as a bad body is."""
    content = _content(request_content(body, chunk_size))
    with ExitStack() as stack:
        try:
            response = stack.enter_context(
                client.stream("POST", path, content=content, headers=headers)
            )
        except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
            raise _head_error(exc) from exc
        yield response


@asynccontextmanager
async def _apost(
    client: httpx.AsyncClient,
    path: str,
    body: EncodedBody,
    headers: dict[str, str],
    chunk_size: int,
) -> AsyncIterator[httpx.Response]:
    """:func:`_post` for ``httpx.AsyncClient``."""
    content = _acontent(arequest_content(body, chunk_size))
    async with AsyncExitStack() as stack:
        try:
            response = await stack.enter_async_context(
                client.stream("POST", path, content=content, headers=headers)
            )
        except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
            raise _head_error(exc) from exc
        yield response


@contextmanager
def stream_infer(
    client: httpx.Client,
    model_name: str,
    inputs: Any,
    *,
    model_version: str | None = None,
    headers: Mapping[str, str] | None = None,
    limits: Limits | None = None,
    strict_bool: bool = True,
    chunk_size: int = CHUNK_SIZE,
    **encode_options: Any,
) -> Iterator[Iterator[Event]]:
    """Send an inference request; give the response's events as they arrive.

    ``inputs`` is an :class:`binproto.EncodedBody`, or what
    :func:`binproto.encode_request` takes (``encode_options`` are passed on:
    ``outputs``, ``binary_data_output``, ``parameters``, ``id``, ``binary``).
    ``binary_data_output`` defaults to true: outputs come back binary (False:
    JSON; a :class:`binproto.RequestedOutput`'s ``binary_data`` decides for
    its output).
    Use as ``with stream_infer(...) as events: for event in events: ...``;
    the response is closed on leaving the block.
    """
    body = _encode(inputs, encode_options)
    path = infer_path(model_name, model_version)
    with _post(client, path, body, request_headers(body, headers), chunk_size) as response:
        yield iter_events(response, limits=limits, strict_bool=strict_bool)


@asynccontextmanager
async def astream_infer(
    client: httpx.AsyncClient,
    model_name: str,
    inputs: Any,
    *,
    model_version: str | None = None,
    headers: Mapping[str, str] | None = None,
    limits: Limits | None = None,
    strict_bool: bool = True,
    chunk_size: int = CHUNK_SIZE,
    **encode_options: Any,
) -> AsyncIterator[AsyncIterator[Event]]:
    """:func:`stream_infer` for ``httpx.AsyncClient`` (``async with`` / ``async for``)."""
    body = _encode(inputs, encode_options)
    path = infer_path(model_name, model_version)
    async with _apost(client, path, body, request_headers(body, headers), chunk_size) as response:
        yield aiter_events(response, limits=limits, strict_bool=strict_bool)


def infer(
    client: httpx.Client,
    model_name: str,
    inputs: Any,
    *,
    model_version: str | None = None,
    headers: Mapping[str, str] | None = None,
    destinations: Destinations = None,
    limits: Limits | None = None,
    strict_bool: bool = True,
    chunk_size: int = CHUNK_SIZE,
    **encode_options: Any,
) -> DecodedMessage:
    """Send an inference request; return the response header and its tensors as arrays.

    See :func:`stream_infer` for ``inputs`` and ``encode_options``; binary
    output tensors are assembled as they arrive, into ``destinations`` when
    given (see :class:`binproto.TensorAssembler`).
    """
    body = _encode(inputs, encode_options)
    path = infer_path(model_name, model_version)
    with _post(client, path, body, request_headers(body, headers), chunk_size) as response:
        return read_response(
            response, destinations=destinations, limits=limits, strict_bool=strict_bool
        )


async def ainfer(
    client: httpx.AsyncClient,
    model_name: str,
    inputs: Any,
    *,
    model_version: str | None = None,
    headers: Mapping[str, str] | None = None,
    destinations: Destinations = None,
    limits: Limits | None = None,
    strict_bool: bool = True,
    chunk_size: int = CHUNK_SIZE,
    **encode_options: Any,
) -> DecodedMessage:
    """:func:`infer` for ``httpx.AsyncClient``."""
    body = _encode(inputs, encode_options)
    path = infer_path(model_name, model_version)
    async with _apost(client, path, body, request_headers(body, headers), chunk_size) as response:
        return await aread_response(
            response, destinations=destinations, limits=limits, strict_bool=strict_bool
        )
