"""Helpers shared by the parser, the encoder, the writer and the adapters."""

from __future__ import annotations

import operator
import re
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from ._errors import LocalProtocolError, RemoteProtocolError

__all__ = [
    "ALIGNMENT",
    "GATHER_BELOW",
    "aligned_arrays",
    "aligned_copy",
    "as_byte_view",
    "check_bool",
    "gather_small",
]

_NOT_CONTIGUOUS = "buffers passed to binproto must be C-contiguous"

# The field names of a structured buffer format ("T{B:name:O:other:}"), which
# may hold any letter; the type codes are what is left.
_FIELD_NAME = re.compile(r":[^:]*:")


def as_byte_view(data: Any) -> memoryview:
    """A flat unsigned-byte view of any C-contiguous buffer, without copying.

    A numpy array whose dtype the buffer protocol cannot describe (such as
    ``ml_dtypes.bfloat16``) is taken as its bytes too.
    """
    if type(data) is bytes:  # (as received: flat bytes, nothing to check)
        return memoryview(data)
    try:
        mv = data if type(data) is memoryview else memoryview(data)
    except TypeError:
        raise LocalProtocolError(
            f"expected a bytes-like object, got {type(data).__name__}"
        ) from None
    except ValueError as exc:
        mv = _array_bytes(data, exc)
    try:
        contiguous = mv.c_contiguous
    except ValueError:  # a released memoryview: no bytes to read
        raise LocalProtocolError("cannot read a released memoryview") from None
    if not contiguous:
        raise LocalProtocolError(_NOT_CONTIGUOUS)
    if mv.format != "B" or mv.ndim != 1:
        fmt = mv.format
        if "O" in fmt and "O" in _FIELD_NAME.sub("", fmt):  # Python objects: pointers
            raise LocalProtocolError(
                "cannot take the bytes of an array of Python objects (dtype object)"
            )
        # (memoryview cannot cast a view with a zero in its shape: no bytes,
        # writable as the buffer was)
        mv = mv.cast("B") if mv.nbytes else memoryview(b"" if mv.readonly else bytearray())
    return mv


#: Alignment, in bytes, of the memory CPython's allocators hand out on 64-bit
#: platforms (malloc, and pymalloc since Python 3.8): that of every numpy dtype.
ALIGNMENT = 16


def aligned_copy(data: Any, at: int) -> memoryview:
    """A writable copy of the bytes ``data`` in memory of its own, placed so
    that its byte ``at`` (where a body's first tensor starts) is
    :data:`ALIGNMENT`-aligned: a body decoded whole over the copy hands out
    arrays aligned as the assembler's, without a copy per tensor (see also
    :func:`aligned_arrays`)."""
    pad = -at % ALIGNMENT
    copy = bytearray(pad)
    copy += data if type(data) is bytes else as_byte_view(data)  # (bytes: as received)
    return memoryview(copy)[pad:]


def whole_number(value: Any, what: str, *, positive: bool = False) -> int:
    """``value`` as an ``int``: a whole number of any integer type (numpy's
    included; not a bool), at least 0 (at least 1 when ``positive``).
    Anything else is the caller's :class:`LocalProtocolError`, naming ``what``."""
    if type(value) is int and value >= positive:
        return value
    try:
        number = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        number = None
    if number is None or number < positive:
        kind = "a positive" if positive else "a non-negative"
        raise LocalProtocolError(f"{what} must be {kind} int, got {value!r}")
    return number


def index_below(value: Any, count: int) -> int | None:
    """``value`` as an index below ``count`` (any integer type, not a bool),
    or None when it is no such index."""
    try:
        index = whole_number(value, "an index")
    except LocalProtocolError:
        return None
    return index if index < count else None


def big_endian(view: memoryview) -> bool:
    """True when a buffer's format has big-endian values (``>`` or ``!``,
    field names aside): bytes a peer would read in the wrong order."""
    fmt = _FIELD_NAME.sub("", view.format)
    return ">" in fmt or "!" in fmt


def aligned_arrays(tensors: dict[str, Any]) -> dict[str, Any]:
    """``tensors`` with each array that is not aligned for its dtype (a
    tensor after one of an odd size, in a body decoded whole) replaced by an
    aligned copy; the same dict when all are."""
    for a in tensors.values():
        if not a.flags.aligned:
            return {name: a if a.flags.aligned else a.copy() for name, a in tensors.items()}
    return tensors


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


def check_bool(data: memoryview, label: str, offset: int) -> None:
    """Refuse BOOL bytes other than 0 and 1 (one numpy pass, no copy).

    ``data`` are the bytes of ``label`` (e.g. ``"input 'x'"``) that start at body
    offset ``offset``; the error points at the first bad byte.
    """
    values = np.frombuffer(data, dtype=np.uint8)
    if values.size and values.max() > 1:
        bad = int(np.argmax(values > 1))
        raise RemoteProtocolError(
            f"invalid BOOL value {int(values[bad])} for {label}: expecting 0 or 1",
            offset=offset + bad,
        )


#: Buffers smaller than this are joined with their neighbours before a write.
GATHER_BELOW = 1 << 16


def gather_small(buffers: Iterable[Any]) -> Iterator[Any]:
    """``buffers`` with each run of small ones joined into one, lazily.

    A small message (head, JSON, a few KiB of tensor) then leaves in one write
    (or one ASGI message) instead of one per piece; a buffer of
    :data:`GATHER_BELOW` bytes or more is passed on as it is, never copied,
    and a run is never longer than that, so a lazy source (a compressor) is
    never held whole. Empty buffers are dropped.
    """
    run: list[Any] = []
    size = 0
    for buf in buffers:
        n = buf.nbytes if isinstance(buf, (memoryview, np.ndarray)) else len(buf)
        if not n:
            continue
        if n >= GATHER_BELOW:
            if run:
                yield run[0] if len(run) == 1 else b"".join(run)
                run, size = [], 0
            yield buf
            continue
        run.append(buf)
        size += n
        if size >= GATHER_BELOW:
            yield b"".join(run)
            run, size = [], 0
    if run:
        yield run[0] if len(run) == 1 else b"".join(run)
