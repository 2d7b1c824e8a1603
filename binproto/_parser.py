"""The Sans-IO body parser.

Theory of operation
-------------------
A body of the binary tensor data extension is a JSON header of
``header_length`` bytes followed by the binary tensors the header announces,
back to back, in header order. The parser is a small state machine:

    HEADER ──HeaderParsed──▶ TENSORS ──(last TensorComplete)──▶ END ──MessageComplete──▶ DONE
       │                        │                                │
       └────────────── any RemoteProtocolError ─────────────────┴──▶ ERROR (a sink)

``receive_data()`` only buffers: header bytes are copied into the one buffer
the parser owns (bounded by ``Limits.max_header_bytes``); every other byte stays
in the caller's buffer, held as a ``memoryview``. ``next_event()`` runs the
reader of the current state (``_READERS``), which returns one event, returns
``NEED_DATA``, or raises. Each call does a bounded amount of work and changes
state only as far as the event it returns, so events come out one at a time
however the body was chunked.

Claims are checked before the bytes they describe are waited for: the header
length against the limits and ``content_length``; each ``binary_data_size``
against its shape and the limits; the sum of all of them against
``content_length``. Nothing is allocated from a claimed size. The only
per-byte work is on bytes that must be checked (BOOL values, BYTES prefixes),
done by numpy or by skipping whole elements.

Once a TENSORS step has emitted part of a binary tensor, it arms a hot path
(``_need``): while bytes of that tensor are queued, ``next_event`` slices and
emits them without the full reader, and ``receive_data`` queues flat views
without re-checking the state. Anything else (a new tensor, the end, a
compressed body) goes through the readers.

The end of the body is known when ``content_length`` bytes have been parsed, or
when ``receive_data(b"")`` is called. A body that ends early is an error that
says how many bytes were missing; a byte after the end is an error too.

A compressed body (``content_encoding``) is queued as it arrives, still
compressed, in an :class:`~binproto._compression.Inflater`. The readers pull
decompressed bytes from it only when their queue is empty, one bounded step at
a time (``_pull``), so a reader sees the same kind of chunk queue as for a
plain body, memory stays bounded, and the decompression limits are checked as
bytes are produced. Offsets in errors and events count decompressed bytes.

A raw binary request (``header_length=0`` with ``raw_input``) has no JSON
header: the HEADER reader synthesizes the one the model's input stands for,
and a raw BYTES element, which travels without its length prefix, gets the
prefix emitted as its first chunk so every consumer sees the usual framing.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import numpy as np

from ._bytes import BytesFramer
from ._compression import Inflater, normalize_encoding
from ._errors import LocalProtocolError, RemoteProtocolError
from ._events import (
    NEED_DATA,
    Event,
    HeaderParsed,
    MessageComplete,
    NeedData,
    TensorComplete,
    _make_chunk,
)
from ._header import InferenceHeader, Kind, TensorInfo, build_header
from ._json import loads_header
from ._limits import Limits
from ._raw import TensorSpec, raw_header

__all__ = ["Parser", "ParserState", "as_byte_view"]

# Limits are frozen, so parsers without their own share one (building and
# checking a Limits costs as much as the rest of a small body's decode).
_DEFAULT_LIMITS = Limits()


class ParserState(enum.Enum):
    """Where the parser is in the body."""

    HEADER = "HEADER"  #: reading the JSON header
    TENSORS = "TENSORS"  #: emitting the tensors the header announced
    END = "END"  #: every tensor is complete; waiting for the end of the body
    DONE = "DONE"  #: MessageComplete was returned
    ERROR = "ERROR"  #: a protocol error was raised; every later call raises


_NOT_CONTIGUOUS = "buffers passed to binproto must be C-contiguous"


def as_byte_view(data: Any) -> memoryview:
    """A flat unsigned-byte view of any C-contiguous buffer, without copying.

    A numpy array whose dtype the buffer protocol cannot describe (such as
    ``ml_dtypes.bfloat16``) is taken as its bytes too.
    """
    try:
        mv = memoryview(data)
    except TypeError:
        raise LocalProtocolError(
            f"expected a bytes-like object, got {type(data).__name__}"
        ) from None
    except ValueError as exc:
        mv = _array_bytes(data, exc)
    if not mv.c_contiguous:
        raise LocalProtocolError(_NOT_CONTIGUOUS)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return mv


def _array_bytes(data: Any, exc: ValueError) -> memoryview:
    """The bytes of a numpy array ``memoryview`` refused (``exc``), as a view."""
    if not isinstance(data, np.ndarray):
        raise LocalProtocolError(f"cannot take the bytes of {type(data).__name__}: {exc}")
    if not data.flags.c_contiguous:
        raise LocalProtocolError(_NOT_CONTIGUOUS)
    try:
        return data.reshape(-1).view(np.uint8).data
    except (TypeError, ValueError) as err:  # e.g. an object array: no bytes to take
        raise LocalProtocolError(
            f"cannot take the bytes of an array of {data.dtype}: {err}"
        ) from None


def _check_count(name: str, value: int | None) -> None:
    if value is not None and (type(value) is not int or value < 0):
        raise LocalProtocolError(f"{name} must be None or a non-negative int, got {value!r}")


class Parser:
    """Parse one request or response body, in any chunking, into events.

    Args:
        kind: ``"request"`` or ``"response"``: which JSON object to expect.
        header_length: the Inference-Header-Content-Length (see
            :func:`header_length_from`); None when the body is plain JSON.
        content_length: the body's total length when known; enables the early
            check of the header's claims against it, and ends the body without
            ``receive_data(b"")``.
        limits: bounds on what the peer may make the parser hold or process.
        strict_bool: reject BOOL tensor bytes other than 0 and 1.
        content_encoding: the body's Content-Encoding (see
            :func:`content_encoding_from`): ``"gzip"``, ``"deflate"`` (zlib-wrapped
            or raw), ``"identity"`` or None. The body is then decompressed as it
            is parsed; ``content_length`` is the compressed length on the wire,
            and ``header_length`` still counts the uncompressed JSON. An
            unsupported coding is a :class:`RemoteProtocolError` with status
            hint 415 from the first :meth:`next_event`.
        raw_input: the model's single input, used when ``header_length`` is 0
            (a raw binary request: the body is that input's bytes). When its
            shape has a variable dimension, or it is BYTES, the body's length
            decides the shape, so ``content_length`` is required (else
            :class:`LocalProtocolError`), and the body cannot be compressed:
            a ``content_encoding`` is then a :class:`RemoteProtocolError` with
            status hint 415 from the first :meth:`next_event`
            (:func:`decode_request`, which has the whole body, decompresses it
            first).
    """

    def __init__(
        self,
        kind: Kind,
        *,
        header_length: int | None = None,
        content_length: int | None = None,
        limits: Limits | None = None,
        strict_bool: bool = True,
        content_encoding: str | None = None,
        raw_input: TensorSpec | None = None,
    ) -> None:
        if kind not in ("request", "response"):
            raise LocalProtocolError(f"kind must be 'request' or 'response', got {kind!r}")
        _check_count("header_length", header_length)
        _check_count("content_length", content_length)
        self.kind: Kind = kind
        self.header_length = header_length
        self.content_length = content_length
        if limits is not None and not isinstance(limits, Limits):
            raise LocalProtocolError(f"limits must be a binproto.Limits, got {limits!r}")
        self.limits = limits if limits is not None else _DEFAULT_LIMITS
        self.strict_bool = strict_bool

        self._state = ParserState.HEADER
        self._chunks: deque[memoryview] = deque()
        self._ended = False  # the (decompressed) body is known to end here
        self._input_ended = False  # receive_data(b"") was called
        self._pos = 0  # body offset of the next byte to parse
        self._error: BaseException | None = None

        # An unsupported coding is the peer's fault: raised by next_event.
        self._encoding_error: RemoteProtocolError | None = None
        encoding: str | None = None
        try:
            encoding = normalize_encoding(content_encoding)
        except RemoteProtocolError as exc:
            self._encoding_error = exc
        #: The normalized content coding: ``"gzip"``, ``"deflate"`` or None.
        self.content_encoding = encoding
        self._inflater = (
            Inflater(encoding, self.limits, content_length) if encoding is not None else None
        )
        # The decompressed body's length, when known before parsing.
        self._decoded_length = content_length if encoding is None else None

        if raw_input is not None and not isinstance(raw_input, TensorSpec):
            raise LocalProtocolError(f"raw_input must be a TensorSpec, got {raw_input!r}")
        self._raw = raw_input if header_length == 0 else None
        if self._raw is not None:
            if kind != "request":
                raise LocalProtocolError("raw_input applies to requests only")
            if self._raw.needs_length and self._decoded_length is None:
                if encoding is None:  # the caller left content_length out
                    raise LocalProtocolError(
                        f"raw input '{self._raw.name}' takes its shape or size from the"
                        " body's length: pass content_length"
                    )
                # The peer's headers chose a compressed raw body: its fault,
                # reported by next_event like an unsupported coding.
                self._encoding_error = RemoteProtocolError(
                    f"raw input '{self._raw.name}' takes its shape or size from the body's"
                    f" length, which a {encoding} body does not give up front: send it"
                    " without Content-Encoding",
                    status_hint=415,
                )
        self._raw_prefix = b""  # bytes emitted before a raw BYTES element's

        self._header_buf = bytearray()
        # The header ends at header_length, else (plain JSON) at content_length,
        # else at the end of the body.
        self._header_target = header_length if header_length is not None else self._decoded_length
        self._header: InferenceHeader | None = None
        self._body_total: int | None = None  # body length the header announces

        self._tensors: tuple[TensorInfo, ...] = ()
        self._checks: list[Callable[[memoryview, int], None] | None] = []
        self._framers: list[BytesFramer | None] = []
        self._ti = 0  # index of the current tensor
        # The hot path: while a binary tensor still needs ``_need`` bytes and
        # bytes are queued, next_event emits them without the full reader;
        # receive_data queues flat views at once while ``_fast_input`` holds.
        self._need = 0
        self._name = ""
        self._check: Callable[[memoryview, int], None] | None = None
        self._fast_input = False
        self._toff = 0  # bytes of the current tensor already emitted

    # -- public state -----------------------------------------------------------

    @property
    def state(self) -> ParserState:
        """The parser's current state."""
        return self._state

    @property
    def header(self) -> InferenceHeader | None:
        """The parsed header, once HeaderParsed has been returned."""
        return self._header

    @property
    def bytes_parsed(self) -> int:
        """Body bytes parsed so far (the offset of the next byte; for a
        compressed body, in the decompressed body)."""
        return self._pos

    def next_tensor_region(self) -> tuple[int, int, int] | None:
        """Where the next body bytes belong, when they are binary tensor bytes.

        Returns ``(index, offset, count)``: the next ``count`` body bytes are
        bytes ``[offset, offset + count)`` of binary tensor ``index``. It returns
        None when the next event needs no body bytes, when bytes are already
        waiting in the parser, after the end of the body, or when the body is
        transformed before parsing (a content encoding). An adapter may then read
        up to ``count`` bytes from its socket straight into the tensor's
        destination and pass that same memory to :meth:`receive_data`; the
        chunk is checked and evented as any other.
        """
        if (
            self._state is not ParserState.TENSORS
            or self._chunks
            or self._ended
            or self._raw_prefix
            or getattr(self, "content_encoding", None) not in (None, "identity")
            or self._ti >= len(self._tensors)
        ):
            return None
        size = self._tensors[self._ti].binary_size
        if size is None or self._toff >= size:
            return None
        return (self._ti, self._toff, size - self._toff)

    # -- input ------------------------------------------------------------------

    def receive_data(self, data: Any) -> None:
        """Add bytes of the body; ``b""`` marks the end of the body.

        Accepts any C-contiguous bytes-like object. Tensor bytes are not
        copied: events hand out views of ``data``, valid until the next call.
        Raises :class:`LocalProtocolError` after the end of the body or an
        error, and :class:`RemoteProtocolError` for bytes after a complete
        message.
        """
        # The hot path, once per chunk of a large tensor: a flat byte view
        # queued as it is.
        if (
            self._fast_input
            and type(data) is memoryview
            and data.format == "B"
            and data.ndim == 1
            and data.c_contiguous
            and data
        ):
            self._chunks.append(data)
            return
        mv = as_byte_view(data)
        state = self._state
        if state is ParserState.ERROR:
            raise LocalProtocolError("cannot receive data: the parser is in the ERROR state")
        if self._input_ended:
            raise LocalProtocolError("cannot receive data after the end of the body")
        if not len(mv):
            self._input_ended = True
            self._fast_input = False
            if self._inflater is not None:
                self._inflater.end()
            else:
                self._ended = True
            return
        if state is ParserState.DONE:
            self._fail(
                RemoteProtocolError(
                    "unexpected additional input data after the end of the message",
                    offset=self._pos,
                )
            )
        if self._inflater is not None:
            self._inflater.feed(mv)
            return
        if state is ParserState.HEADER and not self._chunks:
            mv = self._buffer_header(mv)
            if not len(mv):
                return
        self._chunks.append(mv)

    def _buffer_header(self, mv: memoryview) -> memoryview:
        """Copy header bytes of ``mv`` into the header buffer; return the rest."""
        target = self._header_target
        room = (target if target is not None else self.limits.max_header_bytes + 1) - len(
            self._header_buf
        )
        if room <= 0:
            return mv
        self._header_buf += mv[:room]
        return mv[room:]

    # -- output -----------------------------------------------------------------

    def next_event(self) -> Event | NeedData:
        """Return the next event, or :data:`NEED_DATA` if more bytes are needed.

        Any exception it raises leaves the parser in the ERROR state, as a
        :class:`RemoteProtocolError` does.
        """
        need = self._need
        if need:  # the hot path: more bytes of the current binary tensor
            chunks = self._chunks
            if chunks:
                mv = chunks.popleft()
                n = len(mv)
                if n > need:  # the chunk holds the next tensor's bytes too
                    chunks.appendleft(mv[need:])
                    mv = mv[:need]
                    n = need
                offset = self._toff
                if self._check is not None:
                    try:
                        self._check(mv, offset)
                    except Exception as exc:
                        self._fail(exc)
                self._toff = offset + n
                self._need = need - n
                self._pos += n
                return _make_chunk(self._ti, self._name, offset, mv)
            if self._fast_input:
                return NEED_DATA
        state = self._state
        if state is ParserState.TENSORS:
            try:
                return self._read_tensors()
            except Exception as exc:
                self._fail(exc)
        if state is ParserState.ERROR:
            raise LocalProtocolError(
                "no more events: the parser is in the ERROR state"
            ) from self._error
        if state is ParserState.DONE:
            raise LocalProtocolError("no more events: the message is complete")
        try:
            if state is ParserState.HEADER:
                return self._read_header()
            return self._read_end()
        except Exception as exc:
            self._fail(exc)

    def events(self) -> Iterator[Event]:
        """Yield events until NEED_DATA, or until MessageComplete."""
        while True:
            event = self.next_event()
            if event is NEED_DATA:
                return
            yield event
            if type(event) is MessageComplete:
                return
            if self._fast_input and not self._chunks and self._need:
                return  # mid-tensor with nothing queued: next_event would say NEED_DATA

    def _pull(self) -> bool:
        """Decompress one bounded step into the chunk queue (compressed bodies).

        Returns True when a chunk was queued; sets ``_ended`` once the
        compressed stream and the body have ended cleanly.
        """
        inflater = self._inflater
        if inflater is None:
            return False
        piece = inflater.step()
        if piece is None:
            if inflater.finished:
                self._ended = True
            else:  # the parser is about to ask for data: let go of the caller's buffers
                inflater.detach()
            return False
        self._chunks.append(piece)
        return True

    def _enter_tensors(self) -> None:
        self._state = ParserState.TENSORS
        self._fast_input = self._inflater is None and not self._input_ended

    def _fail(self, exc: BaseException) -> NoReturn:
        # Not only the peer's faults: whatever stopped the parser midway, it
        # cannot safely go on, so it stays in ERROR.
        self._state = ParserState.ERROR
        self._need = 0
        self._fast_input = False
        self._error = exc
        self._chunks.clear()
        self._inflater = None  # drop the compressed bytes it still holds
        raise exc

    # -- readers ----------------------------------------------------------------

    def _check_claims(self) -> None:
        """Check header_length and content_length before reading anything."""
        if self._encoding_error is not None:
            raise self._encoding_error
        limits = self.limits
        hl = self.header_length
        cl = self.content_length
        if cl is not None and cl > limits.max_body_bytes:
            raise RemoteProtocolError(
                f"Content-Length {cl} exceeds the limit of {limits.max_body_bytes} bytes",
                status_hint=413,
                offset=0,
            )
        if hl == 0 and self._raw is None:
            raise RemoteProtocolError(
                "raw binary requests (Inference-Header-Content-Length: 0) are not accepted here",
                offset=0,
            )
        cl = self._decoded_length
        if hl is not None and cl is not None and hl > cl:
            raise RemoteProtocolError(
                f"inference header size should be in range (0, {cl}), got: {hl}"
                f" (a header longer than the {cl}-byte body, which ends there)",
                offset=cl,
            )
        target = self._header_target
        if target is not None and target > limits.max_header_bytes:
            raise RemoteProtocolError(
                f"inference header size {target} exceeds the limit of"
                f" {limits.max_header_bytes} bytes",
                status_hint=413,
                offset=0,
            )

    def _read_header(self) -> HeaderParsed | NeedData:
        self._check_claims()
        if self._raw is not None:
            return self._read_raw_header(self._raw)
        target = self._header_target
        buf = self._header_buf
        limit = self.limits.max_header_bytes
        # Move bytes that arrived while earlier chunks were queued (or that a
        # compressed body decompresses to).
        while (target is None or len(buf) < target) and len(buf) <= limit:
            if self._chunks:
                rest = self._buffer_header(self._chunks.popleft())
                if len(rest):
                    self._chunks.appendleft(rest)
            elif not self._pull():
                break
        if len(buf) > limit:  # only reachable when the header's end is not known
            raise RemoteProtocolError(
                f"the JSON body exceeds the header limit of {limit} bytes",
                status_hint=413,
                offset=limit,
            )
        if target is None:
            if not self._ended:
                return NEED_DATA
        elif len(buf) < target:
            if self._ended:
                raise RemoteProtocolError(
                    f"unexpected end of body in the inference header: expecting"
                    f" {target - len(buf)} additional bytes (received {len(buf)} of {target})",
                    offset=len(buf),
                )
            return NEED_DATA
        raw = bytes(buf)
        del buf  # drop the last reference, or the next line's cannot free it
        self._header_buf = bytearray()
        obj = loads_header(raw, max_depth=self.limits.max_json_depth, kind=self.kind)
        header = build_header(obj, self.kind, self.limits, len(raw))
        self._plan(header)
        self._pos = len(raw)
        self._header = header
        self._enter_tensors()
        return HeaderParsed(header=header)

    def _read_raw_header(self, spec: TensorSpec) -> HeaderParsed:
        """Synthesize the header of a raw binary request."""
        header, prefix = raw_header(spec, self._decoded_length, self.limits)
        size = header.tensors[0].nbytes - len(prefix)  # body bytes
        if size > self.limits.max_body_bytes:
            raise RemoteProtocolError(
                f"the body would be {size} bytes, over the limit of"
                f" {self.limits.max_body_bytes} bytes",
                status_hint=413,
                offset=0,
            )
        info = header.tensors[0]
        strict = info.datatype == "BOOL" and self.strict_bool
        self._tensors = header.tensors
        self._checks = [_bool_checker(f"input '{info.name}'", 0) if strict else None]
        self._framers = [None]
        self._raw_prefix = prefix
        self._body_total = size
        self._header = header
        self._enter_tensors()
        return HeaderParsed(header=header)

    def _plan(self, header: InferenceHeader) -> None:
        """Set up per-tensor checks, and check the sizes claimed against the body."""
        start = header.header_length
        role = "input" if self.kind == "request" else "output"
        tensors = header.tensors
        checks: list[Callable[[memoryview, int], None] | None] = [None] * len(tensors)
        framers: list[BytesFramer | None] = [None] * len(tensors)
        # One walk builds the checkers (nothing sized by the claims) and sums
        # the claimed sizes, which are checked below before any body byte is read.
        offset = start
        for i, t in enumerate(tensors):
            size = t.binary_size
            if size is None:
                continue
            datatype = t.datatype
            if datatype == "BYTES":
                framer = BytesFramer(f"{role} '{t.name}'", t.elements, size, offset)
                framers[i] = framer
                checks[i] = framer.feed
            elif datatype == "BOOL" and self.strict_bool:
                checks[i] = _bool_checker(f"{role} '{t.name}'", offset)
            offset += size
        total = offset
        binary = total - start
        if total > self.limits.max_body_bytes:
            raise RemoteProtocolError(
                f"the body would be {total} bytes, over the limit of"
                f" {self.limits.max_body_bytes} bytes",
                status_hint=413,
                offset=start,
            )
        if self.header_length is None and binary:
            raise RemoteProtocolError(
                "must specify valid 'Inference-Header-Content-Length' in request header"
                " and 'binary_data_size' when passing inputs in binary data format",
                offset=start,
            )
        inflater = self._inflater
        if inflater is not None and total > inflater.max_output:
            raise RemoteProtocolError(
                f"the header announces a body of {total} bytes, more than the"
                f" {inflater.max_output} bytes the {inflater.encoding} body may expand to",
                status_hint=413,
                offset=start,
            )
        self._body_total = total
        cl = self._decoded_length
        if cl is not None and total != cl:
            if total > cl:
                msg = (
                    f"the header announces {binary} bytes of binary data,"
                    f" more than the {cl - start} left in the body (Content-Length {cl})"
                )
            else:
                msg = (
                    f"unexpected additional input data: the body has {cl - total} bytes"
                    f" beyond the {binary} bytes of binary data announced"
                )
            raise RemoteProtocolError(msg, offset=start)
        self._tensors = tensors
        self._checks = checks
        self._framers = framers

    def _read_tensors(self) -> Event | NeedData:
        ti = self._ti
        tensors = self._tensors
        if ti == len(tensors):
            self._state = ParserState.END
            return self._read_end()
        info = tensors[ti]
        size = info.binary_size
        if size is None or self._toff == size:
            framer = self._framers[ti]
            if framer is not None:
                framer.finish()
            self._ti = ti + 1
            self._toff = 0
            self._need = 0
            return TensorComplete(index=ti, name=info.name, info=info)
        if self._raw_prefix:
            # A raw BYTES element's length prefix: not in the body, emitted first.
            prefix = memoryview(self._raw_prefix)
            self._raw_prefix = b""
            self._toff = len(prefix)
            return _make_chunk(ti, info.name, 0, prefix)
        chunks = self._chunks
        if not chunks and not self._pull():
            if self._ended:
                raise self._short_body(info, size - self._toff)
            return NEED_DATA
        mv = chunks[0]
        need = size - self._toff
        if len(mv) <= need:
            chunks.popleft()
            piece = mv
        else:
            piece = mv[:need]
            chunks[0] = mv[need:]
        offset = self._toff
        check = self._checks[ti]
        if check is not None:
            check(piece, offset)
        self._toff = offset + len(piece)
        self._pos += len(piece)
        # Arm the hot path for the rest of this tensor.
        self._need = size - self._toff
        self._name = info.name
        self._check = check
        return _make_chunk(ti, info.name, offset, piece)

    def _short_body(self, info: TensorInfo, need: int) -> RemoteProtocolError:
        header = self._header
        assert header is not None
        role = "input" if self.kind == "request" else "output"
        model = f" for model '{header.model_name}'" if header.model_name else ""
        total = self._body_total
        return RemoteProtocolError(
            f"unexpected size for {role} '{info.name}', expecting {need} additional"
            f" bytes{model} (received {self._pos} of {total} body bytes)",
            offset=self._pos,
        )

    def _read_end(self) -> MessageComplete | NeedData:
        if self._chunks or self._pull():
            raise RemoteProtocolError(
                "unexpected additional input data after the end of the message",
                offset=self._pos,
            )
        if self._ended or self._pos == self._decoded_length:
            self._state = ParserState.DONE
            self._fast_input = False
            return MessageComplete()
        return NEED_DATA


def _bool_checker(label: str, base: int) -> Callable[[memoryview, int], None]:
    def check(data: memoryview, offset: int) -> None:
        values = np.frombuffer(data, dtype=np.uint8)
        if values.size and values.max() > 1:
            bad = int(np.argmax(values > 1))
            raise RemoteProtocolError(
                f"invalid BOOL value {int(values[bad])} for {label}: expecting 0 or 1",
                offset=base + offset + bad,
            )

    return check
