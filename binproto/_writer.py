"""A Sans-IO streaming writer for bodies whose tensors are produced piece by piece."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, TypeVar

import numpy as np

from ._bytes import BytesFramer
from ._encode import EncodedBody, check_parameters, dumps_header
from ._errors import LocalProtocolError, RemoteProtocolError
from ._header import InferenceHeader, Kind
from ._http import message_headers
from ._json import loads_header
from ._limits import Limits
from ._readers import check_header
from ._util import as_byte_view, big_endian, check_bool, index_below

__all__ = ["BodyWriter", "response_start"]

_T = TypeVar("_T")

# The writer describes the caller's own header: no peer limits apply to it.
_NO_LIMITS = Limits(
    max_header_bytes=2**62,
    max_tensors=2**62,
    max_tensor_bytes=2**62,
    max_body_bytes=2**62,
    max_json_depth=2**31,
)


class _State(enum.Enum):
    IDLE = "IDLE"  # start() not called yet
    BODY = "BODY"  # header written; tensor bytes going out
    DONE = "DONE"  # end() succeeded
    ERROR = "ERROR"  # a misuse was reported; every later call raises


class BodyWriter:
    """Write one body whose binary tensors are produced incrementally.

    ``header`` describes the body: the JSON header object as a mapping (an
    ``$inference_request`` with ``inputs``, or an ``$inference_response`` with
    ``outputs``), that object already serialized (``bytes``), or an
    :class:`EncodedBody` whose header is used (e.g. from :func:`encode_response`
    on placeholder arrays of the final shapes, to apply a request's output
    policy; its buffers are ignored). Each tensor
    sent binary declares ``"parameters": {"binary_data_size": N}``; tensors
    with ``data`` travel in the header. The header is validated as the parser
    would validate it (its JSON text as sent, bytes as given, then sizes
    against shapes and datatypes), so a body the writer accepts is one a peer
    accepts; a header it refuses is :class:`LocalProtocolError`.

    Usage::

        w = BodyWriter(header)
        send_headers(w.headers)
        write(w.start())             # the JSON header
        for index, piece in produce():
            write(w.send(index, piece))  # the caller's buffer, passed through
        w.end()

    ``send(tensor, data)`` takes the tensor's index in the header's
    inputs/outputs (as in parser events) or its name, and any C-contiguous
    buffer. Tensors are sent in header order, each exactly its declared size
    (zero-size tensors need no send). BYTES tensors are sent in wire form (see
    :func:`join_bytes`); their length prefixes are checked as they pass, as
    BOOL bytes are (0 or 1).
    Sending out of order, beyond a tensor's size, after :meth:`end`, or ending
    early raises :class:`LocalProtocolError`; after any error the writer is
    unusable and every later call raises.

    Attributes:
        header: the validated header (an :class:`InferenceHeader`).
        header_length: the Inference-Header-Content-Length, or None when no
            tensor is binary.
        content_length: total body length in bytes.
        headers: the HTTP headers framing the body, as :func:`encode_request`'s.
    """

    def __init__(
        self, header: Mapping[str, Any] | bytes | EncodedBody, *, kind: Kind | None = None
    ) -> None:
        if isinstance(header, EncodedBody):
            header = header.json
        if isinstance(header, Mapping):
            raw = dumps_header(dict(header))
        elif isinstance(header, (bytes, bytearray, memoryview)):
            raw = bytes(header)  # sent as given
        else:
            raise LocalProtocolError(
                "header must be a mapping, JSON bytes or an EncodedBody,"
                f" got {type(header).__name__}"
            )
        if kind is not None and kind not in ("request", "response"):
            raise LocalProtocolError(f"kind must be 'request' or 'response', got {kind!r}")
        # The text sent is checked as a peer's parser checks it (a mapping's
        # too: keys 1 and "1" are both written "1").
        try:
            obj = loads_header(raw, max_depth=_NO_LIMITS.max_json_depth, kind=kind or "header")
            if kind is None:
                kind = "request" if isinstance(obj, dict) and "inputs" in obj else "response"
            self.header: InferenceHeader = check_header(raw, obj, kind, _NO_LIMITS)
        except RemoteProtocolError as exc:
            what = f"{kind} header" if kind else "header"
            raise LocalProtocolError(f"invalid {what}: {exc.msg}") from None
        # Parameters as strict as the encoder's: no NaN, no nested values.
        check_parameters(self.header.parameters, f"the {kind}")
        for t in self.header.tensors:
            check_parameters(t.parameters, f"'{t.name}'")
        for out in self.header.requested_outputs or ():
            check_parameters(out.parameters, f"requested output '{out.name}'")
        self._raw = raw
        binary = self.header.binary_size
        has_binary = any(t.binary_size is not None for t in self.header.tensors)
        self.header_length: int | None = len(raw) if has_binary else None
        self.content_length: int = len(raw) + binary
        self.headers: list[tuple[str, str]] = message_headers(
            self.header_length, self.content_length
        )
        self._role = "input" if kind == "request" else "output"
        self._state = _State.IDLE
        # Binary tensors in order, as (index, size); the current one is _order[_k].
        self._order = [
            (t.index, t.binary_size) for t in self.header.tensors if t.binary_size is not None
        ]
        self._k = 0
        self._sent = 0  # bytes of the current tensor sent
        self._offset = len(raw)  # body offset of the next byte
        self._framer: BytesFramer | None = None
        self._skip_complete()

    # -- state helpers ----------------------------------------------------------

    def _misuse(self, msg: str) -> LocalProtocolError:
        self._state = _State.ERROR
        return LocalProtocolError(msg)

    def _check_open(self, what: str) -> None:
        if self._state is _State.BODY:
            return
        if self._state is _State.IDLE:
            raise self._misuse(f"cannot {what} before start()")
        if self._state is _State.DONE:
            raise self._misuse(f"cannot {what} after end()")
        raise LocalProtocolError(f"cannot {what}: the writer is in the ERROR state")

    def _label(self, index: int) -> str:
        return f"{self._role} '{self.header.tensors[index].name}'"

    def _skip_complete(self) -> None:
        """Move past tensors whose bytes are all sent (and zero-size ones)."""
        while self._k < len(self._order):
            index, size = self._order[self._k]
            info = self.header.tensors[index]
            if info.datatype == "BYTES" and self._framer is None:
                self._framer = BytesFramer(self._label(index), info.elements, size, self._offset)
            if self._sent < size:
                return
            if self._framer is not None:
                try:
                    self._framer.finish()
                except RemoteProtocolError as exc:
                    raise self._misuse(f"malformed BYTES data: {exc.msg}") from None
                self._framer = None
            self._k += 1
            self._sent = 0

    def _resolve(self, tensor: int | str) -> int:
        tensors = self.header.tensors
        if isinstance(tensor, str):
            for t in tensors:
                if t.name == tensor:
                    return t.index
            raise self._misuse(f"no {self._role} named '{tensor}' in the header")
        index = index_below(tensor, len(tensors))
        if index is None:
            raise self._misuse(f"no {self._role} with index {tensor!r} in the header")
        return index

    # -- the API ----------------------------------------------------------------

    def start(self) -> bytes:
        """Begin the body: return the JSON header, the body's first bytes."""
        if self._state is not _State.IDLE:
            if self._state is _State.ERROR:
                raise LocalProtocolError("cannot start: the writer is in the ERROR state")
            raise self._misuse("start() was already called")
        self._state = _State.BODY
        return self._raw

    def send(self, tensor: int | str, data: _T) -> _T:
        """Check ``data`` as the next bytes of binary tensor ``tensor`` and
        return it unchanged (write it to the peer).

        ``tensor`` is the tensor's index in the header or its name. ``data``
        is sent as its bytes (an array of another dtype than the tensor's
        included); a big-endian one is refused. An empty ``data`` for a
        binary tensor is always accepted while the body is open.
        """
        self._check_open("send")
        index = self._resolve(tensor)
        info = self.header.tensors[index]
        if info.binary_size is None:
            raise self._misuse(f"{self._label(index)} is not sent binary (no binary_data_size)")
        buffer: Any = data
        try:
            exported = memoryview(buffer)
        except (TypeError, ValueError):  # (as_byte_view below says why, or takes it)
            exported = None
        if exported is not None:
            swapped = exported.format if big_endian(exported) else None
        else:  # (an array memoryview cannot export, such as datetime64: its dtype says)
            big = isinstance(buffer, np.ndarray) and buffer.dtype.byteorder == ">"
            swapped = str(buffer.dtype) if big else None
        if swapped is not None:
            raise self._misuse(
                f"data for {self._label(index)} must be raw little-endian bytes, got"
                f" big-endian values ({swapped!r})"
            )
        try:
            view = as_byte_view(exported if exported is not None else data)
        except LocalProtocolError as exc:  # not a buffer, or not C-contiguous
            raise self._misuse(f"data for {self._label(index)}: {exc.msg}") from None
        n = view.nbytes
        if n == 0:
            return data
        if self._k == len(self._order):
            raise self._misuse(
                f"{self._label(index)} is complete: every binary tensor has all its bytes"
            )
        current, size = self._order[self._k]
        if index != current:
            if index < current:
                raise self._misuse(f"{self._label(index)} is already complete")
            raise self._misuse(
                f"{self._label(index)} sent out of order: {self._label(current)} still"
                f" needs {size - self._sent} bytes"
            )
        left = size - self._sent
        if n > left:
            raise self._misuse(
                f"{n} bytes for {self._label(index)} exceed the {left} left of its"
                f" binary_data_size {size}"
            )
        if self._framer is not None:
            try:
                self._framer.feed(view, self._sent)
            except RemoteProtocolError as exc:
                raise self._misuse(f"malformed BYTES data: {exc.msg}") from None
        elif info.datatype == "BOOL":  # as strict as a peer's parser
            try:
                check_bool(view, self._label(index), self._offset)
            except RemoteProtocolError as exc:
                raise self._misuse(f"{exc.msg} (body byte {exc.offset})") from None
        self._sent += n
        self._offset += n
        self._skip_complete()
        return data

    def end(self) -> None:
        """Finish the body; raises if any binary tensor is short of bytes."""
        self._check_open("end")
        if self._k < len(self._order):
            index, size = self._order[self._k]
            missing = size - self._sent + sum(s for _, s in self._order[self._k + 1 :])
            raise self._misuse(
                f"cannot end: {self._label(index)} has {self._sent} of its {size} bytes"
                f" ({missing} bytes of binary data missing in all)"
            )
        self._state = _State.DONE

    @property
    def bytes_sent(self) -> int:
        """Body bytes accepted so far, header included once started."""
        if self._state is _State.IDLE:
            return 0
        return self._offset

    def __repr__(self) -> str:
        return (
            f"BodyWriter(kind={self.header.kind!r}, state={self._state.value},"
            f" content_length={self.content_length})"
        )


def response_start(writer: BodyWriter) -> bytes:
    """``writer.start()`` for a response's body: a writer of a request's
    header is :class:`LocalProtocolError` (its body would go out as an
    answer). For the servers and the ASGI adapter, before any of the
    response is sent."""
    if writer.header.kind != "response":
        raise LocalProtocolError("a streaming response needs a BodyWriter of a response header")
    return writer.start()
