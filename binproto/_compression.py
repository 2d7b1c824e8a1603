"""Content encodings: incremental, bounded decompression and streaming compression.

A compressed body (``Content-Encoding: gzip`` or ``deflate``) is decompressed
inside the parser, lazily: :class:`Inflater` holds the compressed bytes the
caller handed over and produces at most ``STEP`` decompressed bytes each time
the parser asks for more, so memory stays bounded whatever the peer sends.

Outcomes never depend on how the compressed body was chunked. zlib is always
called the same way: with consecutive ``BLOCK``-byte pieces of the compressed
body (only the last one shorter), each decompressed ``STEP`` bytes at a time.
So the decompressed bytes produced before a corrupt byte, and every limit
check, fall at the same offsets for every chunking. The price is that up to
``BLOCK - 1`` compressed bytes wait until the rest of their block (or the end
of the body) arrives.
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

from ._errors import LocalProtocolError, RemoteProtocolError
from ._limits import Limits
from ._util import as_byte_view

__all__ = [
    "BLOCK",
    "ENCODINGS",
    "GZIP_AHEAD",
    "RATIO_FLOOR",
    "STEP",
    "Inflater",
    "check_gzip_size",
    "compress_buffers",
    "inflate_whole",
    "normalize_encoding",
]

#: The content codings binproto decompresses and produces.
ENCODINGS = ("gzip", "deflate")

#: Compressed bytes handed to zlib per call (fixed, for chunking independence).
BLOCK = 16 * 1024
#: Most decompressed bytes produced per step.
STEP = 256 * 1024
#: Decompressed bytes always allowed, whatever the expansion ratio.
RATIO_FLOOR = 1024 * 1024
# Chunks smaller than this are copied together rather than queued as views.
_GATHER = 4096

_ALIASES = {"gzip": "gzip", "x-gzip": "gzip", "deflate": "deflate", "identity": None}
_GZIP_WBITS = 31  # gzip header and trailer
_ZLIB_WBITS = 15  # zlib (RFC 1950) wrapper: what "deflate" means in HTTP
_RAW_WBITS = -15  # bare RFC 1951 stream, which some peers send as "deflate"


#: A compressed body of up to this many bytes may be taken whole before it
#: is inflated: a gzip body's trailer then tells its size (check_gzip_size).
GZIP_AHEAD = 16 << 20


def check_gzip_size(head: bytes, tail: bytes, claimed: int, offset: int) -> None:
    """Refuse a gzip body whose trailer (ISIZE: its decompressed length,
    modulo 2**32) is not the ``claimed`` length its header and tensors add
    up to, before inflating its tensors: a bomb is refused as soon as its
    last bytes are in, not after gigabytes. ``head`` and ``tail`` are the
    whole body's first two and last four bytes; ``offset`` is where the
    tensors start. A body that is not gzip (zlib's trailer has no length)
    passes."""
    if head[:2] != b"\x1f\x8b" or len(tail) < 4:
        return
    isize = int.from_bytes(tail[-4:], "little")
    if isize != claimed % (1 << 32):
        raise RemoteProtocolError(
            f"the gzip body expands to {isize} bytes (modulo 2**32, by its trailer),"
            f" not the {claimed} its header and tensors claim (or bytes follow its gzip"
            " stream: its last 4 bytes are read as the trailer's length)",
            offset=offset,
        )


def unsupported_encoding(value: str) -> RemoteProtocolError:
    """The error for a content coding binproto does not support (status hint 415)."""
    return RemoteProtocolError(
        f"unsupported Content-Encoding '{value}': supported are gzip, deflate, identity"
        " (Accept-Encoding: gzip, deflate)",
        status_hint=415,
    )


def normalize_encoding(value: str | None) -> str | None:
    """``"gzip"``, ``"deflate"`` or None (identity) for a content-coding name.

    Case-insensitive; ``x-gzip`` is gzip. Raises :class:`RemoteProtocolError`
    (status hint 415) for any other name.
    """
    if value is None:
        return None
    if not isinstance(value, str):
        raise LocalProtocolError(f"content_encoding must be a str or None, got {value!r}")
    key = value.strip().lower()
    if key not in _ALIASES:
        raise unsupported_encoding(value)
    return _ALIASES[key]


def _looks_like_zlib(head: bytes) -> bool:
    """True when ``head`` starts with a valid zlib (RFC 1950) header."""
    if len(head) < 2:
        return False
    cmf, flg = head[0], head[1]
    return cmf & 0x0F == 8 and cmf >> 4 <= 7 and (cmf << 8 | flg) % 31 == 0 and not flg & 0x20


class Inflater:
    """Decompresses one body, a bounded step at a time.

    ``content_length`` is the compressed length on the wire when known: the
    compressed body ends there, and the expansion ratio is measured against it.
    Without it the ratio is measured against the compressed bytes decompressed
    so far (counted in whole blocks), so it can only trip once more than
    :data:`RATIO_FLOOR` bytes have been produced in either case.
    """

    def __init__(self, encoding: str, limits: Limits, content_length: int | None) -> None:
        self.encoding = encoding
        self._limits = limits
        self._content_length = content_length
        self._d: Any = None  # the zlib decompressor, made from the first block
        # Compressed bytes waiting for zlib: views of the caller's chunks, and
        # bytearrays into which small chunks are gathered, so that a body fed
        # in tiny chunks is not held as thousands of view objects.
        self._queue: deque[memoryview | bytearray] = deque()
        self._gather: bytearray | None = None  # the queue's last item, still growing
        self._queued = 0  # compressed bytes waiting in _queue
        self._received = 0  # compressed bytes handed to feed()
        self._input_ended = False
        self._fed = 0  # compressed bytes handed to zlib (whole blocks)
        self._tail = b""  # the current block's input zlib has not consumed yet
        self._out = 0  # decompressed bytes produced
        self._pending: RemoteProtocolError | None = None
        #: True once the stream and the body ended cleanly.
        self.finished = False
        #: True when bytes past ``content_length`` were fed: they are dropped
        #: here, and the parser refuses them once the body's events are out.
        self.past_end = False

    @property
    def produced(self) -> int:
        """Decompressed bytes produced so far."""
        return self._out

    def feed(self, data: memoryview) -> None:
        """Queue compressed bytes (not copied, unless smaller than ``_GATHER``)."""
        cl = self._content_length
        if cl is not None and self._received + len(data) > cl:
            self.past_end = True
            data = data[: cl - self._received]
        n = len(data)
        if not n:
            return
        if n < _GATHER:
            gather = self._gather
            if gather is None or len(gather) >= _GATHER:
                gather = self._gather = bytearray()
                self._queue.append(gather)
            gather += data
        else:
            self._gather = None
            self._queue.append(data)
        self._queued += n
        self._received += len(data)

    def end(self) -> None:
        """The compressed body ended."""
        self._input_ended = True

    def detach(self) -> None:
        """Copy the queued compressed bytes that are still views of the
        caller's chunks (less than a block waits here), so the caller may
        reuse its buffers once the parser has asked for more data."""
        if any(type(piece) is memoryview for piece in self._queue):
            held = bytearray().join(self._queue)
            self._queue = deque([held])
            self._gather = held

    @property
    def max_output(self) -> int:
        """Most decompressed bytes this body may produce under the limits
        (known before any is decompressed when the compressed length is)."""
        return self._cap(self._content_length)

    def _cap(self, compressed: int | None) -> int:
        """Most decompressed bytes allowed from ``compressed`` bytes (None:
        not known, only the absolute limit applies)."""
        limits = self._limits
        if compressed is None:
            return limits.max_decompressed_bytes
        by_ratio = max(RATIO_FLOOR, int(limits.max_decompression_ratio * compressed))
        return min(limits.max_decompressed_bytes, by_ratio)

    def _wire_ended(self) -> bool:
        cl = self._content_length
        return self._input_ended or (cl is not None and self._received >= cl)

    def _next_block(self) -> bytes | bytearray | memoryview | None:
        """The next BLOCK compressed bytes (fewer only at the end), or None."""
        cl = self._content_length
        avail = self._queued if cl is None else min(self._queued, cl - self._fed)
        if avail >= BLOCK:
            n = BLOCK
        elif avail > 0 and self._wire_ended():
            n = avail
        else:
            return None
        self._gather = None  # the queue is consumed from here: gather afresh
        queue = self._queue
        first = queue[0]
        block: bytes | bytearray | memoryview
        if len(first) >= n:
            block = first[:n]
            if len(first) == n:
                queue.popleft()
            else:
                queue[0] = first[n:]
        else:  # the block spans chunks: join at most BLOCK bytes
            parts = []
            need = n
            while need:
                piece = queue[0]
                if len(piece) <= need:
                    queue.popleft()
                    parts.append(piece)
                    need -= len(piece)
                else:
                    parts.append(piece[:need])
                    queue[0] = piece[need:]
                    need = 0
            block = b"".join(parts)
        self._queued -= n
        self._fed += n
        return block

    def _decompressor(self, head: bytes | bytearray | memoryview) -> Any:
        # Like Triton, which inflates either coding with zlib's automatic
        # gzip/zlib detection, take a gzip or zlib stream under either name;
        # "deflate" may also be a bare deflate stream, as some peers send it.
        start = bytes(head[:2])
        if start == b"\x1f\x8b":
            wbits = _GZIP_WBITS
        elif _looks_like_zlib(start):
            wbits = _ZLIB_WBITS
        else:
            wbits = _GZIP_WBITS if self.encoding == "gzip" else _RAW_WBITS
        return zlib.decompressobj(wbits)

    def _allowed(self) -> int:
        """Most decompressed bytes allowed with what has been fed so far."""
        return self._cap(self._content_length if self._content_length is not None else self._fed)

    def _over_limit(self, allowed: int) -> RemoteProtocolError:
        limits = self._limits
        if allowed >= limits.max_decompressed_bytes:
            msg = (
                f"the decompressed body exceeds the limit of {limits.max_decompressed_bytes} bytes"
            )
        else:
            basis = self._content_length if self._content_length is not None else self._fed
            msg = (
                f"the {self.encoding} body expands more than"
                f" {limits.max_decompression_ratio:g} times: over {allowed} bytes from"
                f" {basis} compressed bytes"
            )
        return RemoteProtocolError(msg, status_hint=413, offset=allowed)

    def _at_stream_end(self) -> None:
        """The stream is complete: check nothing follows it; maybe finish."""
        leftover = len(self._d.unused_data) + self._queued
        cl = self._content_length
        stream_end = self._fed - len(self._d.unused_data)
        # (Bytes past content_length never get here: feed() drops them.)
        if leftover or (cl is not None and stream_end < cl):
            raise RemoteProtocolError(
                f"unexpected data after the end of the {self.encoding} stream"
                f" (at compressed byte {stream_end})",
                offset=self._out,
            )
        if self._wire_ended():
            self.finished = True

    def step(self) -> memoryview | None:
        """Up to STEP more decompressed bytes, or None.

        None means more compressed bytes are needed, or (``finished``) the body
        is complete. Raises :class:`RemoteProtocolError` for a corrupt or
        truncated stream, data after the stream's end, or a limit exceeded; its
        offset is the count of decompressed bytes produced before the fault.
        """
        while True:
            if self._pending is not None:
                raise self._pending
            if self.finished:
                if self._queued:
                    self._at_stream_end()
                return None
            if self._d is not None and self._d.eof:
                self._at_stream_end()
                return None
            data: bytes | bytearray | memoryview
            if self._tail:
                data = self._tail
            else:
                block = self._next_block()
                if block is None:
                    if self._wire_ended():
                        raise RemoteProtocolError(
                            f"the compressed body ended before the end of its"
                            f" {self.encoding} stream (truncated after {self._fed}"
                            " compressed bytes)",
                            offset=self._out,
                        )
                    return None
                if self._d is None:
                    self._d = self._decompressor(block)
                data = block
            try:
                out = self._d.decompress(data, STEP)
            except zlib.error as exc:
                self._pending = RemoteProtocolError(
                    f"invalid {self.encoding} data: {exc}", offset=self._out
                )
                raise self._pending from None
            self._tail = self._d.unconsumed_tail
            if not out:
                continue  # input consumed without output (headers, empty blocks)
            allowed = self._allowed()
            if self._out + len(out) > allowed:
                self._pending = self._over_limit(allowed)
                out = out[: allowed - self._out]
                if not out:
                    raise self._pending
            self._out += len(out)
            return memoryview(out)


def inflate_whole(data: memoryview, encoding: str, limits: Limits) -> bytearray:
    """Decompress a whole compressed body, within the limits, into one buffer.

    For a body whose decompressed length must be known before it is parsed
    (a raw request whose input's shape comes from it). Raises
    :class:`RemoteProtocolError` as :meth:`Inflater.step` does.
    """
    inflater = Inflater(encoding, limits, len(data))
    if len(data):
        inflater.feed(data)
    inflater.end()
    out = bytearray()
    while (piece := inflater.step()) is not None:
        out += piece
    return out


def check_level(level: Any) -> None:
    """Refuse a zlib compression level other than an int of -1..9 (a bool
    included): the caller's :class:`LocalProtocolError`."""
    if isinstance(level, bool) or not (isinstance(level, int) and -1 <= level <= 9):
        raise LocalProtocolError(f"compression level must be -1..9, got {level!r}")


def compress_buffers(
    buffers: Iterable[Any], encoding: str, *, level: int = 6, piece: int = 1024 * 1024
) -> Iterator[bytes]:
    """Compress a body given as buffers (e.g. an encoder's ``[json, tensor, ...]``).

    Streams: yields compressed pieces as they are produced, feeding zlib at
    most ``piece`` bytes of input at a time, so no joined copy of the body is
    ever made. ``encoding`` is ``"gzip"`` or ``"deflate"`` (zlib-wrapped, as
    HTTP and tritonclient mean it); ``level`` is zlib's 0 (store) to 9
    (smallest), 6 by default. The concatenated pieces are the whole
    compressed body; send them with ``Content-Encoding: <encoding>`` and keep
    Inference-Header-Content-Length as the uncompressed JSON length.

    Raises :class:`LocalProtocolError` for any other ``encoding`` (identity or
    an unsupported coding), a ``level`` outside -1..9 or a ``piece`` that is
    not a positive int.
    """
    # The coding is the caller's choice here, so an unsupported one is misuse.
    try:
        name = normalize_encoding(encoding)
    except RemoteProtocolError as exc:
        raise LocalProtocolError(exc.msg) from None
    if name is None:
        raise LocalProtocolError("compress_buffers needs 'gzip' or 'deflate', not identity")
    check_level(level)
    if isinstance(piece, bool) or not isinstance(piece, int) or piece <= 0:
        raise LocalProtocolError(f"piece must be a positive int, got {piece!r}")
    comp = zlib.compressobj(level, zlib.DEFLATED, _GZIP_WBITS if name == "gzip" else _ZLIB_WBITS)
    for buf in buffers:
        view = as_byte_view(buf)  # (any C-contiguous buffer; else LocalProtocolError)
        for start in range(0, len(view), piece):
            out = comp.compress(view[start : start + piece])
            if out:
                yield out
    tail = comp.flush()
    if tail:
        yield tail
