"""The parser's pieces: the chunk queue and one reader per state.

Each reader takes bytes from the :class:`ChunkQueue` and returns an event,
returns ``NEED_DATA``, or raises (see :mod:`binproto._parser` for the state
machine that dispatches to them).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from ._bytes import BytesFramer
from ._compression import Inflater
from ._errors import RemoteProtocolError
from ._events import NEED_DATA, Event, MessageComplete, NeedData, TensorChunk, TensorComplete
from ._header import InferenceHeader, Kind, TensorInfo, build_header
from ._json import loads_header, refuse_repeated_keys
from ._limits import Limits
from ._util import check_bool

__all__ = [
    "MESSAGE_COMPLETE",
    "TENSOR_CHECKS",
    "BoolCheck",
    "ChunkQueue",
    "TensorCheck",
    "TensorReader",
    "check_announced",
    "check_header",
    "check_lengths",
    "parse_header",
    "past_the_end",
    "read_end",
    "read_header",
]


class ChunkQueue:
    """Body bytes not parsed yet: views of the caller's buffers, in order.

    For a compressed body the queue holds decompressed bytes, and ``source``
    (the :class:`~binproto._compression.Inflater`) refills it one bounded step
    at a time when a reader finds it empty.
    """

    __slots__ = ("_chunks", "input_ended", "source")

    def __init__(self, source: Inflater | None = None) -> None:
        self._chunks: deque[memoryview] = deque()
        #: True once :meth:`end` was called.
        self.input_ended = False
        self.source = source

    def append(self, data: memoryview) -> None:
        """Queue a non-empty piece of the body as it came (compressed or not)."""
        if self.source is not None:
            self.source.feed(data)
        else:
            self._chunks.append(data)

    def end(self) -> None:
        """The body's bytes end after the ones appended so far."""
        self.input_ended = True
        if self.source is not None:
            self.source.end()

    @property
    def ended(self) -> bool:
        """True once no byte can follow the queued ones."""
        if self.source is not None:
            return self.source.finished
        return self.input_ended

    def take(self, most: int) -> memoryview | None:
        """Up to ``most`` bytes from the front, as one view; None when no byte
        is queued (or can be decompressed yet). Never joins chunks."""
        chunks = self._chunks
        if not chunks and (self.source is None or not self._refill()):
            return None
        data = chunks.popleft()
        if len(data) > most:
            chunks.appendleft(data[most:])
            data = data[:most]
        return data

    def has_data(self) -> bool:
        """True when a byte is queued, decompressing one step if need be."""
        return bool(self._chunks) or (self.source is not None and self._refill())

    @property
    def waiting(self) -> bool:
        """True when plain bytes are queued (nothing is decompressed to tell)."""
        return bool(self._chunks)

    def clear(self) -> None:
        """Drop every queued byte (and the compressed bytes the source holds)."""
        self._chunks.clear()
        self.source = None

    def _refill(self) -> bool:
        source = self.source
        if source is None:
            return False
        piece = source.step()
        if piece is None:
            if not source.finished:  # the parser is about to ask for data
                source.detach()  # let go of the caller's buffers
            return False
        self._chunks.append(piece)
        return True


def read_header(
    queue: ChunkQueue, buffer: bytearray, length: int | None, kind: Kind, limits: Limits
) -> InferenceHeader | NeedData:
    """The validated header, or NEED_DATA.

    Copies the JSON header into ``buffer`` (the one buffer the parser owns)
    until it is whole, then decodes and validates it. ``length`` is where the
    header ends: the Inference-Header-Content-Length, else (a plain JSON body)
    the body's length, else None (the end of the body).
    """
    limit = limits.max_header_bytes
    want = length if length is not None else limit + 1
    while len(buffer) < want:
        data = queue.take(want - len(buffer))
        if data is None:
            break
        if not buffer and len(data) == length:  # the whole header at once
            return parse_header(bytes(data), kind, limits)
        buffer += data
    if len(buffer) > limit:  # only reachable when the header's end is not known
        raise RemoteProtocolError(
            f"the JSON body exceeds the header limit of {limit} bytes",
            status_hint=413,
            offset=limit,
        )
    if length is None:
        if not queue.ended:
            return NEED_DATA
    elif len(buffer) < length:
        if queue.ended:
            raise RemoteProtocolError(
                f"unexpected end of body in the inference header: expecting"
                f" {length - len(buffer)} additional bytes (received {len(buffer)}"
                f" of {length})",
                offset=len(buffer),
            )
        return NEED_DATA
    raw = bytes(buffer)
    buffer.clear()  # the header's copy is all the parser keeps
    return parse_header(raw, kind, limits)


def parse_header(raw: bytes, kind: Kind, limits: Limits) -> InferenceHeader:
    """Decode and validate the JSON header ``raw`` (exactly its bytes)."""
    obj = loads_header(
        raw, max_depth=limits.max_json_depth, kind=kind, max_values=limits.max_json_values
    )
    return check_header(raw, obj, kind, limits)


def check_header(raw: bytes, obj: Any, kind: Kind, limits: Limits) -> InferenceHeader:
    """Validate ``obj``, the JSON header ``raw`` decoded by :func:`loads_header`."""
    try:
        header, keys = build_header(obj, kind, limits, len(raw))
    except RemoteProtocolError:
        # A repeated key is the fault a reader of the JSON meets first.
        refuse_repeated_keys(raw, 0, kind)
        raise
    refuse_repeated_keys(raw, keys, kind)
    return header


def check_lengths(
    header_length: int | None,
    content_length: int | None,
    body_length: int | None,
    length: int | None,
    limits: Limits,
    *,
    raw: bool,
) -> None:
    """Check the lengths a body comes with before reading any of it.

    ``body_length`` is the (decompressed) body's length when known, ``length``
    where the JSON header ends when known, ``raw`` whether a raw binary
    request is accepted.
    """
    if content_length is not None and content_length > limits.max_body_bytes:
        raise RemoteProtocolError(
            f"Content-Length {content_length} exceeds the limit of {limits.max_body_bytes} bytes",
            status_hint=413,
            offset=0,
        )
    if header_length == 0 and not raw:
        raise RemoteProtocolError(
            "raw binary requests (Inference-Header-Content-Length: 0) are not accepted here",
            offset=0,
        )
    if header_length is not None and body_length is not None and header_length > body_length:
        raise RemoteProtocolError(
            f"inference header size should be in range (0, {body_length}),"
            f" got: {header_length} (a header longer than the {body_length}-byte body,"
            " which ends there)",
            offset=body_length,
        )
    if length is not None and length > limits.max_header_bytes:
        raise RemoteProtocolError(
            f"inference header size {length} exceeds the limit of {limits.max_header_bytes} bytes",
            status_hint=413,
            offset=0,
        )


def check_announced(
    header: InferenceHeader,
    total: int,
    limits: Limits,
    *,
    framed: bool,
    body_length: int | None,
    inflater: Inflater | None,
    raw: bool = False,
) -> None:
    """Check the body a header announces (``total`` bytes) against the limits
    and the body's length (when known), before any tensor byte is read.

    ``framed``: the body came with an Inference-Header-Content-Length (else
    it is plain JSON and may hold no binary data); ``inflater``: the
    decompressor of a compressed body; ``raw``: the header was made for a
    raw binary request to fit the body's length.
    """
    start = header.header_length
    binary = total - start
    if total > limits.max_body_bytes:
        raise RemoteProtocolError(
            f"the body would be {total} bytes, over the limit of {limits.max_body_bytes} bytes",
            status_hint=413,
            offset=start,
        )
    if not framed and binary:
        raise RemoteProtocolError(
            "must specify valid 'Inference-Header-Content-Length' in request header"
            " and 'binary_data_size' when passing inputs in binary data format",
            offset=start,
        )
    if raw:
        return
    if inflater is not None and total > inflater.max_output:
        raise RemoteProtocolError(
            f"the header announces a body of {total} bytes, more than the"
            f" {inflater.max_output} bytes the {inflater.encoding} body may expand to",
            status_hint=413,
            offset=start,
        )
    if body_length is not None and total > body_length:
        raise RemoteProtocolError(
            f"the header announces {binary} bytes of binary data,"
            f" more than the {body_length - start} left in the body (Content-Length {body_length})",
            offset=start,
        )
    if body_length is not None and total < body_length:
        raise RemoteProtocolError(
            f"unexpected additional input data: the body has {body_length - total} bytes"
            f" beyond the {binary} bytes of binary data announced",
            offset=start,
        )


class TensorCheck(Protocol):
    """Checks one tensor's bytes as they pass: ``feed`` each run of them in
    order (``offset`` counts from the tensor's first byte), then ``finish``."""

    def feed(self, data: memoryview, offset: int) -> None: ...

    def finish(self) -> None: ...


class BoolCheck:
    """A BOOL tensor's bytes are all 0 or 1."""

    __slots__ = ("base", "label")

    def __init__(self, label: str, base: int) -> None:
        self.label = label
        self.base = base  # body offset of the tensor's first byte

    def feed(self, data: memoryview, offset: int) -> None:
        check_bool(data, self.label, self.base + offset)

    def finish(self) -> None:
        pass


def _framing(
    info: TensorInfo, role: str, base: int, strict_bool: bool, collect: bool
) -> TensorCheck:
    size = info.binary_size
    assert size is not None  # (a binary tensor's)
    return BytesFramer(f"{role} '{info.name}'", info.elements, size, base, collect=collect)


def _bool_values(
    info: TensorInfo, role: str, base: int, strict_bool: bool, collect: bool
) -> TensorCheck | None:
    return BoolCheck(f"{role} '{info.name}'", base) if strict_bool else None


#: The check a binary tensor's bytes need, by datatype (the others need none),
#: made as ``make(info, role, base, strict_bool, collect)``: ``base`` is the
#: body offset of its first byte, ``role`` ``"input"`` or ``"output"``. BYTES
#: framing always (a :class:`BytesFramer`, collecting the elements with
#: ``collect``); BOOL values with ``strict_bool`` (else None). Nothing is sized
#: by the claims: a check holds at most a 4-byte partial length prefix. (The
#: readers look a datatype up here, and make no call for the others.)
TENSOR_CHECKS: dict[str, Callable[[TensorInfo, str, int, bool, bool], TensorCheck | None]] = {
    "BYTES": _framing,
    "BOOL": _bool_values,
}


class TensorReader:
    """Emits the binary tensors' bytes, as they are queued, and each tensor's
    completion, in header order: the one place that slices body bytes.

    ``index`` is the current tensor (called ``name``), ``offset`` the bytes of
    it emitted so far, ``remaining`` the bytes of it still to come, ``position`` the body
    offset of the next byte. ``prefix`` (a raw BYTES element's length prefix,
    which the body does not carry) is emitted before the first tensor's bytes.
    """

    __slots__ = (
        "check",
        "header",
        "index",
        "name",
        "offset",
        "position",
        "prefix",
        "remaining",
        "role",
        "strict_bool",
        "total",
    )

    def __init__(self, header: InferenceHeader, strict_bool: bool, prefix: bytes = b"") -> None:
        self.header = header
        self.role = "input" if header.kind == "request" else "output"
        self.strict_bool = strict_bool
        self.position = header.header_length
        # The body's length (a raw element's prefix is not in the body).
        self.total = header.header_length + header.binary_size - len(prefix)
        self.prefix = prefix
        self._enter(0)

    def _enter(self, index: int) -> None:
        """Make tensor ``index`` the current one (past the last: none)."""
        tensors = self.header.tensors
        self.index = index
        self.offset = 0
        self.check: TensorCheck | None = None
        if index < len(tensors):
            info = tensors[index]
            self.name = info.name
            self.remaining = info.binary_size or 0
            make = TENSOR_CHECKS.get(info.datatype)
            if make is not None and info.binary_size is not None:
                self.check = make(info, self.role, self.position, self.strict_bool, False)
        else:
            self.name = ""
            self.remaining = 0

    def read(self, queue: ChunkQueue) -> Event | NeedData | None:
        """The next TensorChunk or TensorComplete, NEED_DATA, or None once
        every tensor is complete."""
        remaining = self.remaining
        if remaining:
            data: memoryview | None
            if self.prefix:
                data = memoryview(self.prefix)
                self.prefix = b""
            else:
                data = queue.take(remaining)
                if data is None:
                    if queue.ended:
                        raise self._short_body()
                    return NEED_DATA
                self.position += len(data)
            offset = self.offset
            if self.check is not None:
                self.check.feed(data, offset)
            self.offset = offset + len(data)
            self.remaining = remaining - len(data)
            # Positional: this is built once per chunk (index, name, offset, data).
            return TensorChunk(self.index, self.name, offset, data)
        tensors = self.header.tensors
        index = self.index
        if index == len(tensors):
            return None
        if self.check is not None:
            self.check.finish()
        self._enter(index + 1)
        info = tensors[index]
        return TensorComplete(index, info.name, info)  # positional, as TensorChunk

    def region(self) -> tuple[int, int, int] | None:
        """``(index, offset, count)`` of the bytes this reader takes next."""
        if not self.remaining or self.prefix:
            return None
        return (self.index, self.offset, self.remaining)

    def _short_body(self) -> RemoteProtocolError:
        header = self.header
        info = header.tensors[self.index]
        role = "input" if header.kind == "request" else "output"
        model = f" for model '{header.model_name}'" if header.model_name else ""
        return RemoteProtocolError(
            f"unexpected size for {role} '{info.name}', expecting {self.remaining} additional"
            f" bytes{model} (received {self.position} of {self.total} body bytes)",
            offset=self.position,
        )


def past_the_end(offset: int) -> RemoteProtocolError:
    """The fault of bytes after the end of a message, found at ``offset``."""
    return RemoteProtocolError(
        "unexpected additional input data after the end of the message", offset=offset
    )


#: The one MessageComplete: it has no fields, so every parser can return the same.
MESSAGE_COMPLETE = MessageComplete()


def read_end(queue: ChunkQueue, position: int, length: int | None) -> MessageComplete | NeedData:
    """MessageComplete once the body is known to end at ``position``, where
    the last tensor ended (``length``: the body's length, when known)."""
    if queue.has_data():
        raise past_the_end(position)
    if position == length or queue.ended:
        return MESSAGE_COMPLETE
    return NEED_DATA
