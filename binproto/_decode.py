"""Whole-body decoding: zero-copy numpy views of a complete body."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._assemble import DecodedMessage, TensorAssembler, array_from_bytes
from ._bytes import BytesFramer, object_array
from ._compression import inflate_whole, normalize_encoding
from ._errors import RemoteProtocolError
from ._events import HeaderParsed, TensorChunk, TensorComplete
from ._header import InferenceHeader, Kind
from ._limits import Limits
from ._parser import DEFAULT_LIMITS, Parser, ParserState, check_arguments
from ._raw import TensorSpec
from ._readers import TENSOR_CHECKS, check_announced, check_lengths, parse_header
from ._util import as_byte_view

__all__ = ["DecodedMessage", "decode", "decode_request", "decode_response"]


def decode(
    kind: Kind,
    body: Any,
    *,
    header_length: int | None,
    limits: Limits | None = None,
    strict_bool: bool = True,
    content_encoding: str | None = None,
    raw_input: TensorSpec | None = None,
) -> DecodedMessage:
    """Decode a whole body. See :func:`decode_request`."""
    view = as_byte_view(body)
    check_arguments(kind, header_length, len(view), limits, raw_input)
    limits = limits if limits is not None else DEFAULT_LIMITS
    encoding = normalize_encoding(content_encoding)
    raw = header_length == 0 and raw_input is not None
    if encoding is None and not raw:
        return _decode_plain(kind, view, header_length, limits, strict_bool)
    if raw and encoding is not None and raw_input is not None and raw_input.needs_length:
        # The raw input's shape comes from the decompressed body's length,
        # which only decompressing tells: parse that as an uncompressed body.
        view = memoryview(inflate_whole(view, encoding, limits))
        encoding = None
    # A compressed or raw body: through the parser's events.
    parser = Parser(
        kind,
        header_length=header_length,
        content_length=len(view),
        limits=limits,
        strict_bool=strict_bool,
        content_encoding=encoding,
        raw_input=raw_input,
    )
    if len(view):  # an empty chunk would already mean the end
        parser.receive_data(view)
    parser.receive_data(b"")
    if encoding is not None:
        return _decode_compressed(parser)
    return _decode_events(parser)


def _decode_plain(
    kind: Kind, view: memoryview, header_length: int | None, limits: Limits, strict_bool: bool
) -> DecodedMessage:
    """Decode an uncompressed body given whole: each binary tensor an array
    straight over its bytes in ``view``.

    The checks are the parser's own, in its order: the lengths
    (:func:`check_lengths`), the header (:func:`parse_header`), the body it
    announces against the body's length (:func:`check_announced`: every
    tensor's bytes are there and nothing follows them), then each tensor's
    bytes, in one piece, by the check its tensor reader would make
    (:data:`TENSOR_CHECKS`); a BYTES tensor's elements are collected by the
    same walk.
    """
    length = len(view)
    end = length if header_length is None else header_length
    check_lengths(header_length, length, length, end, limits, raw=False)
    header = parse_header(bytes(view[:end]), kind, limits)
    offset = header.header_length
    check_announced(
        header,
        offset + header.binary_size,
        limits,
        framed=header_length is not None,
        body_length=length,
        inflater=None,
    )
    tensors: dict[str, np.ndarray[Any, Any]] = {}
    shared: list[str] = []
    role = "input" if kind == "request" else "output"
    for info in header.tensors:
        size = info.binary_size
        if size is None:
            if info.shared_memory:
                shared.append(info.name)
            elif info.array is not None:
                tensors[info.name] = info.array
            continue
        make = TENSOR_CHECKS.get(info.datatype)
        check = make(info, role, offset, strict_bool, True) if make is not None else None
        if check is None:
            tensors[info.name] = array_from_bytes(info, view, offset)
        elif isinstance(check, BytesFramer):  # BYTES: the check collects the elements
            check.feed(bytes(view[offset : offset + size]), 0)
            check.finish()
            tensors[info.name] = object_array(check.take()).reshape(info.shape)
        else:
            check.feed(view[offset : offset + size], 0)
            tensors[info.name] = array_from_bytes(info, view, offset)
        offset += size
    return DecodedMessage(header, tensors, tuple(shared))  # positional, as in build_header


def _decode_events(parser: Parser) -> DecodedMessage:
    """Decode a whole raw binary request through the parser's events."""
    header: InferenceHeader | None = None
    tensors: dict[str, np.ndarray[Any, Any]] = {}
    pieces: list[memoryview] = []
    for event in parser.events():
        if type(event) is TensorChunk:
            pieces.append(event.data)
        elif type(event) is TensorComplete:
            # A raw BYTES element comes as its synthesized prefix, then its bytes.
            buf: Any = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            tensors[event.info.name] = array_from_bytes(event.info, buf)
            pieces = []
        elif type(event) is HeaderParsed:
            header = event.header
    _check_complete(parser)
    assert header is not None
    return DecodedMessage(header=header, tensors=tensors)


def _decode_compressed(parser: Parser) -> DecodedMessage:
    """Decode a compressed body: each tensor copied once, from binproto's own
    decompressed output into its array."""
    assembler = TensorAssembler()
    for event in parser.events():
        assembler.feed(event)
    _check_complete(parser)
    return assembler.message()


def _check_complete(parser: Parser) -> None:
    if parser.state is not ParserState.DONE:  # pragma: no cover - the whole body was given
        raise RemoteProtocolError("unexpected end of body", offset=parser.bytes_parsed)


def decode_request(
    body: Any,
    *,
    header_length: int | None,
    limits: Limits | None = None,
    strict_bool: bool = True,
    content_encoding: str | None = None,
    raw_input: TensorSpec | None = None,
) -> DecodedMessage:
    """Decode a whole request body.

    ``header_length`` is the Inference-Header-Content-Length (None for a plain
    JSON body). Binary tensors are zero-copy views of ``body`` (read-only when
    ``body`` is ``bytes``) with explicit little-endian dtypes; BOOL becomes
    ``bool_``; BYTES an object array of ``bytes``; JSON data arrays of the
    tensor's dtype and shape.

    ``content_encoding`` (``"gzip"``, ``"deflate"``, ``"identity"`` or None)
    names the body's Content-Encoding; a compressed body is decompressed
    within the limits, and its tensors are arrays holding the decompressed
    bytes (one copy, not views of ``body``). ``raw_input`` describes the
    model's input for a raw binary request (``header_length=0``); see
    :class:`Parser`. A compressed raw body whose input takes its shape from
    the body's length is decompressed whole first (within the limits), then
    parsed.
    """
    return decode(
        "request",
        body,
        header_length=header_length,
        limits=limits,
        strict_bool=strict_bool,
        content_encoding=content_encoding,
        raw_input=raw_input,
    )


def decode_response(
    body: Any,
    *,
    header_length: int | None,
    limits: Limits | None = None,
    strict_bool: bool = True,
    content_encoding: str | None = None,
) -> DecodedMessage:
    """Decode a whole response body; see :func:`decode_request`."""
    return decode(
        "response",
        body,
        header_length=header_length,
        limits=limits,
        strict_bool=strict_bool,
        content_encoding=content_encoding,
    )
