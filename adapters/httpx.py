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
``{"error": ...}`` message.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any, cast

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
from binproto._compression import ENCODINGS
from binproto._util import as_byte_view
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

#: Most bytes of an error response body read into memory.
MAX_ERROR_BODY = 1 << 20


def request_content(body: EncodedBody, chunk_size: int = CHUNK_SIZE) -> Iterator[memoryview]:
    """The body's buffers as byte views of at most ``chunk_size`` bytes (no copy).

    Pass it as ``content=`` with :func:`request_headers` (which sets
    ``Content-Length``) so httpx streams it rather than joining it.
    """
    for buffer in body.buffers:
        view = as_byte_view(buffer)
        for start in range(0, len(view), chunk_size):
            yield view[start : start + chunk_size]


async def arequest_content(
    body: EncodedBody, chunk_size: int = CHUNK_SIZE
) -> AsyncIterator[memoryview]:
    """:func:`request_content` as an async iterator, for ``httpx.AsyncClient``."""
    for piece in request_content(body, chunk_size):
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
    ACCEPT_ENCODING}`` (the codings binproto decodes).
    """
    out = {str(k): str(v) for k, v in body.headers}
    out["Accept-Encoding"] = "identity"
    if headers:
        out.update(headers)
    return out


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


def _check_status(response: httpx.Response, body: bytes) -> None:
    if not 200 <= response.status_code < 300:
        raise error_message(response.status_code, body)


def _feed(parser: Parser, chunk: bytes) -> Iterator[Event]:
    if len(chunk):
        parser.receive_data(chunk)
        yield from parser.events()


def _finish(parser: Parser) -> Iterator[Event]:
    parser.receive_data(b"")
    yield from parser.events()


def iter_events(
    response: httpx.Response,
    *,
    parser: Parser | None = None,
    limits: Limits | None = None,
    strict_bool: bool = True,
) -> Iterator[Event]:
    """Parse a streamed response (``client.stream(...)``) as it arrives.

    Reads with ``iter_raw`` (binproto decodes the content encoding); raises
    :class:`HTTPError` for an error status (its body, decoded by httpx, gives
    the message) and :class:`binproto.RemoteProtocolError` for a bad body. A
    :class:`~binproto.TensorChunk`'s data is valid until the next event is
    requested.
    """
    if not 200 <= response.status_code < 300:
        _check_status(response, _read_limited(response.iter_bytes()))
    if parser is None:
        parser = parser_for_response(response, limits=limits, strict_bool=strict_bool)
    for chunk in response.iter_raw():
        yield from _feed(parser, chunk)
    yield from _finish(parser)


async def aiter_events(
    response: httpx.Response,
    *,
    parser: Parser | None = None,
    limits: Limits | None = None,
    strict_bool: bool = True,
) -> AsyncIterator[Event]:
    """:func:`iter_events` for an ``httpx.AsyncClient`` response (``aiter_raw``)."""
    if not 200 <= response.status_code < 300:
        _check_status(response, await _aread_limited(response.aiter_bytes()))
    if parser is None:
        parser = parser_for_response(response, limits=limits, strict_bool=strict_bool)
    async for chunk in response.aiter_raw():
        for event in _feed(parser, chunk):
            yield event
    for event in _finish(parser):
        yield event


def _read_limited(chunks: Iterator[bytes]) -> bytes:
    data = bytearray()
    for chunk in chunks:
        data += chunk[: MAX_ERROR_BODY - len(data)]
        if len(data) >= MAX_ERROR_BODY:
            break
    return bytes(data)


async def _aread_limited(chunks: AsyncIterator[bytes]) -> bytes:
    data = bytearray()
    async for chunk in chunks:
        data += chunk[: MAX_ERROR_BODY - len(data)]
        if len(data) >= MAX_ERROR_BODY:
            break
    return bytes(data)


def read_response(
    response: httpx.Response,
    *,
    destinations: Destinations = None,
    limits: Limits | None = None,
    strict_bool: bool = True,
) -> DecodedMessage:
    """Read a streamed response into numpy arrays as it arrives (one copy per byte)."""
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
    if options.get("outputs") is None:
        # Ask for every output in binary unless told otherwise (as tritonclient does).
        options.setdefault("binary_data_output", True)
    return binproto.encode_request(inputs, **options)


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
    Without ``outputs``, ``binary_data_output`` defaults to true: every output
    comes back binary.
    Use as ``with stream_infer(...) as events: for event in events: ...``;
    the response is closed on leaving the block.
    """
    body = _encode(inputs, encode_options)
    with client.stream(
        "POST",
        infer_path(model_name, model_version),
        content=_content(request_content(body, chunk_size)),
        headers=request_headers(body, headers),
    ) as response:
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
    async with client.stream(
        "POST",
        infer_path(model_name, model_version),
        content=_acontent(arequest_content(body, chunk_size)),
        headers=request_headers(body, headers),
    ) as response:
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
    with client.stream(
        "POST",
        infer_path(model_name, model_version),
        content=_content(request_content(body, chunk_size)),
        headers=request_headers(body, headers),
    ) as response:
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
    async with client.stream(
        "POST",
        infer_path(model_name, model_version),
        content=_acontent(arequest_content(body, chunk_size)),
        headers=request_headers(body, headers),
    ) as response:
        return await aread_response(
            response, destinations=destinations, limits=limits, strict_bool=strict_bool
        )
