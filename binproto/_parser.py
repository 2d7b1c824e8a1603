"""The Sans-IO body parser.

Theory of operation
-------------------
A body of the binary tensor data extension is a JSON header of
``header_length`` bytes followed by the binary tensors the header announces,
back to back, in header order. The parser is a small state machine:

    HEADER ──HeaderParsed──▶ TENSORS ─────────────MessageComplete──────────────▶ DONE
       │                        └─(last tensor, end to come)─▶ END ─MessageComplete─▶ DONE
       │                        │                                │
       └────────────── any RemoteProtocolError ─────────────────┴──▶ ERROR (a sink)

``receive_data()`` only queues: every byte stays in the caller's buffer, held
as a ``memoryview`` in the :class:`~binproto._readers.ChunkQueue`.
``next_event()`` runs the reader of the current state (set with the state), which
takes bytes from the queue and returns one event, returns ``NEED_DATA``, or
raises. Each call does a bounded amount of work and changes state only as far
as the event it returns, so events come out one at a time however the body
was chunked.

- HEADER: :func:`~binproto._readers.read_header` copies the header into
  the one buffer the parser owns (bounded by ``Limits.max_header_bytes``),
  then decodes and validates it. A raw binary request has no JSON header: the
  header its model input stands for is synthesized instead.
- TENSORS: the :class:`~binproto._readers.TensorReader` slices each tensor's
  bytes off the queue (never across two tensors), checks them (BOOL values,
  BYTES framing) and emits them, then each tensor's completion.
- END: :func:`~binproto._readers.read_end` waits for the end of the body
  (entered only when it has not come with the last tensor).

Claims are checked before the bytes they describe are waited for: the header
length against the limits and ``content_length``; each ``binary_data_size``
against its shape and the limits; the sum of all of them against
``content_length``. Nothing is allocated from a claimed size.

A compressed body (``content_encoding``) is queued as it arrives, still
compressed, in an :class:`~binproto._compression.Inflater`, the queue's
source: a reader that finds the queue empty makes it decompress one bounded
step. Offsets in errors and events count decompressed bytes.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from ._compression import Inflater, normalize_encoding
from ._errors import LocalProtocolError, RemoteProtocolError
from ._events import NEED_DATA, Event, HeaderParsed, MessageComplete, NeedData
from ._header import InferenceHeader, Kind
from ._limits import Limits
from ._raw import TensorSpec, raw_header
from ._readers import (
    MESSAGE_COMPLETE,
    ChunkQueue,
    TensorReader,
    check_announced,
    check_lengths,
    past_the_end,
    read_end,
    read_header,
)
from ._util import as_byte_view

__all__ = ["DEFAULT_LIMITS", "Parser", "ParserState", "check_arguments"]

#: The limits of a parser given none. Limits are frozen, so parsers share one
#: (building and checking a Limits costs as much as a small body's decode).
DEFAULT_LIMITS = Limits()


class ParserState(enum.Enum):
    """Where the parser is in the body."""

    HEADER = "HEADER"  #: reading the JSON header
    TENSORS = "TENSORS"  #: emitting the tensors the header announced
    END = "END"  #: every tensor is complete; waiting for the end of the body
    DONE = "DONE"  #: MessageComplete was returned
    ERROR = "ERROR"  #: a protocol error was raised; every later call raises


# The states as module constants, as NEED_DATA is: an Enum member looked up
# on its class costs a metaclass __getattr__ call on every change of state
# and every events() call (docs/performance.md).
_HEADER = ParserState.HEADER
_TENSORS = ParserState.TENSORS
_END = ParserState.END
_DONE = ParserState.DONE
_ERROR = ParserState.ERROR


def check_arguments(
    kind: str,
    header_length: int | None,
    content_length: int | None,
    limits: Limits | None,
    raw_input: TensorSpec | None,
) -> None:
    """Refuse arguments a parser (or a whole-body decode) cannot work with."""
    if kind not in ("request", "response"):
        raise LocalProtocolError(f"kind must be 'request' or 'response', got {kind!r}")
    if header_length is not None and (type(header_length) is not int or header_length < 0):
        raise _not_a_length("header_length", header_length)
    if content_length is not None and (type(content_length) is not int or content_length < 0):
        raise _not_a_length("content_length", content_length)
    if limits is not None and not isinstance(limits, Limits):
        raise LocalProtocolError(f"limits must be a binproto.Limits, got {limits!r}")
    if raw_input is not None and not isinstance(raw_input, TensorSpec):
        raise LocalProtocolError(f"raw_input must be a TensorSpec, got {raw_input!r}")


def _not_a_length(name: str, value: object) -> LocalProtocolError:
    return LocalProtocolError(f"{name} must be None or a non-negative int, got {value!r}")


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
        check_arguments(kind, header_length, content_length, limits, raw_input)
        self.kind: Kind = kind
        self.header_length = header_length
        self.content_length = content_length
        self.limits = limits if limits is not None else DEFAULT_LIMITS
        self.strict_bool = strict_bool
        self._state = _HEADER
        # The current state's reader (None in DONE and ERROR, which have none),
        # set with the state: a lookup by state would hash an enum member, a
        # Python-level call, on every change of state.
        self._reader: Callable[[Parser], Event | NeedData] | None = Parser._read_header
        self._error: BaseException | None = None
        # A fault of the peer's found here (an unsupported coding) is raised
        # by the first next_event, as every fault of the body is.
        self._deferred: RemoteProtocolError | None = None
        encoding: str | None = None
        if content_encoding is not None:
            try:
                encoding = normalize_encoding(content_encoding)
            except RemoteProtocolError as exc:
                self._deferred = exc
        #: The normalized content coding: ``"gzip"``, ``"deflate"`` or None.
        self.content_encoding = encoding
        self._queue = ChunkQueue(
            Inflater(encoding, self.limits, content_length) if encoding is not None else None
        )
        # The decompressed body's length, when known before parsing.
        self._body_length = content_length if encoding is None else None
        # Bytes past content_length that came with the body's last ones: the
        # fault raised by the call after MessageComplete (see _read_end).
        self._past_end: RemoteProtocolError | None = None
        self._raw_input = raw_input if header_length == 0 else None
        if self._raw_input is not None:
            self._check_raw_input(self._raw_input, kind)
        # Where the JSON header ends (None: at the end of the body), and the
        # one buffer the parser owns, for a header that comes in pieces.
        self._header_end = header_length if header_length is not None else self._body_length
        self._header_buffer = bytearray()
        self._header: InferenceHeader | None = None
        self._tensors: TensorReader | None = None
        if self._deferred is None:
            # The lengths are known now; a fault of theirs is the peer's, raised
            # by the first next_event as the others above.
            try:
                check_lengths(
                    header_length,
                    content_length,
                    self._body_length,
                    self._header_end,
                    self.limits,
                    raw=self._raw_input is not None,
                )
            except RemoteProtocolError as exc:
                self._deferred = exc

    def _check_raw_input(self, spec: TensorSpec, kind: Kind) -> None:
        if kind != "request":
            raise LocalProtocolError("raw_input applies to requests only")
        if spec.needs_length and self._body_length is None:
            if self.content_encoding is None:  # the caller left content_length out
                raise LocalProtocolError(
                    f"raw input '{spec.name}' takes its shape or size from the"
                    " body's length: pass content_length"
                )
            # The peer's headers chose a compressed raw body: its fault.
            self._deferred = RemoteProtocolError(
                f"raw input '{spec.name}' takes its shape or size from the body's"
                f" length, which a {self.content_encoding} body does not give up front:"
                " send it without Content-Encoding",
                status_hint=415,
            )

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
        return self._tensors.position if self._tensors is not None else 0

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
        queue = self._queue
        if (
            self._state is not _TENSORS
            or self._tensors is None
            or queue.source is not None
            or queue.waiting
            or queue.ended
        ):
            return None
        return self._tensors.region()

    # -- input ------------------------------------------------------------------

    def receive_data(self, data: Any) -> None:
        """Add bytes of the body; ``b""`` marks the end of the body.

        Accepts any C-contiguous bytes-like object. Tensor bytes are not
        copied: events hand out views of ``data``, valid until the next call.
        After MessageComplete, ``b""`` is accepted and does nothing. Raises
        :class:`LocalProtocolError` after the end of the body or an error, and
        :class:`RemoteProtocolError` for bytes after a complete message.
        Bytes past ``content_length`` that come with the body's last ones are
        held back: the body's events come first, MessageComplete included,
        and the next call (this one or :meth:`next_event`) raises the fault.
        So the events before it are the same for every chunking.
        """
        data = as_byte_view(data)
        queue = self._queue
        if self._reader is None or queue.input_ended or not data:
            self._receive_edge(data)  # the end mark, or anything after the end
        else:
            queue.append(data)

    def _receive_edge(self, data: memoryview) -> None:
        state = self._state
        if state is _ERROR:
            raise LocalProtocolError("cannot receive data: the parser is in the ERROR state")
        if state is _DONE and self._past_end is not None:
            self._fail(self._past_end)  # (received with the body's last bytes)
        if not data and state is _DONE:
            return  # the end of a body already complete
        if self._queue.input_ended:
            raise LocalProtocolError("cannot receive data after the end of the body")
        if not data:
            self._queue.end()
        else:  # DONE, ended by content_length
            self._fail(past_the_end(self.bytes_parsed))

    # -- output -----------------------------------------------------------------

    def next_event(self) -> Event | NeedData:
        """Return the next event, or :data:`NEED_DATA` if more bytes are needed.

        Any exception it raises leaves the parser in the ERROR state, as a
        :class:`RemoteProtocolError` does.
        """
        reader = self._reader
        if reader is None:
            if self._state is _DONE:
                if self._past_end is not None:
                    self._fail(self._past_end)
                raise LocalProtocolError("no more events: the message is complete")
            raise LocalProtocolError(
                "no more events: the parser is in the ERROR state"
            ) from self._error
        try:
            return reader(self)
        except Exception as exc:
            self._fail(exc)

    def events(self) -> Iterator[Event]:
        """Yield events until NEED_DATA, or until MessageComplete (after it,
        nothing)."""
        if self._state is _DONE:
            return
        while True:
            event = self.next_event()
            if event is NEED_DATA:
                return
            yield event
            if type(event) is MessageComplete:
                return

    def _fail(self, exc: BaseException) -> NoReturn:
        # Not only the peer's faults: whatever stopped the parser midway, it
        # cannot safely go on, so it stays in ERROR.
        self._state, self._reader = _ERROR, None
        self._error = exc
        self._queue.clear()
        raise exc

    # -- readers ----------------------------------------------------------------

    def _read_header(self) -> Event | NeedData:
        if self._deferred is not None:  # the lengths or coding, checked when made
            raise self._deferred
        if self._raw_input is not None:
            header, prefix = raw_header(self._raw_input, self._body_length, self.limits)
            tensors = TensorReader(header, self.strict_bool, prefix)
        else:
            parsed = read_header(
                self._queue, self._header_buffer, self._header_end, self.kind, self.limits
            )
            if parsed is NEED_DATA:
                return NEED_DATA
            header = parsed
            tensors = TensorReader(header, self.strict_bool)
        check_announced(
            header,
            tensors.total,
            self.limits,
            framed=self.header_length is not None,
            body_length=self._body_length,
            inflater=self._queue.source,
            raw=self._raw_input is not None,
        )
        self._header = header
        self._tensors = tensors
        self._state, self._reader = _TENSORS, Parser._read_tensors
        return HeaderParsed(header)

    def _read_tensors(self) -> Event | NeedData:
        assert self._tensors is not None
        event = self._tensors.read(self._queue)
        if event is not None:
            return event
        # Every tensor is complete: DONE at once when the body is known to end
        # here, else END until it does.
        return self._read_end()

    def _read_end(self) -> Event | NeedData:
        assert self._tensors is not None
        position = self._tensors.position
        queue = self._queue
        # Bytes past content_length that came with the body's last ones (for
        # a compressed body, the inflater dropped them): the body's events
        # come first, MessageComplete included, as when they come in a later
        # call, and the next call raises. So the events are the same for every
        # chunking; checked once, at the end, not per chunk.
        if position == self._body_length and queue.has_data():
            queue.clear()
            event: Event | NeedData = MESSAGE_COMPLETE
            past = True
        else:
            event = read_end(queue, position, self._body_length)
            past = event is MESSAGE_COMPLETE and queue.source is not None and queue.source.past_end
        if past:
            self._past_end = past_the_end(position)
        if event is NEED_DATA:
            self._state, self._reader = _END, Parser._read_end
        else:
            self._state, self._reader = _DONE, None
        return event
