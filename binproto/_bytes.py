"""BYTES tensors: length-prefixed elements, checked as they stream, split and
joined at once."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from typing import Any, SupportsIndex

import numpy as np

from ._errors import LocalProtocolError, RemoteProtocolError
from ._header import TensorInfo
from ._util import as_byte_view, whole_number

__all__ = [
    "BytesDecoder",
    "BytesFramer",
    "join_bytes",
    "join_plain",
    "object_array",
    "split_bytes",
]

_U32 = struct.Struct("<I")


class BytesFramer:
    """Checks the framing of one BYTES tensor chunk by chunk.

    Works wherever chunk boundaries fall, including inside a 4-byte length
    prefix. Each element's length is checked against the bytes the tensor has
    left, so an overrun is reported at the prefix that claims it, at the same
    offset for every chunking. Only prefixes are looked at: element bytes are
    skipped, never copied, unless ``collect`` asks for the elements (see
    :meth:`take`): a collecting framer is fed ``bytes``, whose slices are the
    elements.
    """

    __slots__ = (
        "_count",
        "_label",
        "_out",
        "_partial",
        "_partial_at",
        "_piece",
        "_skip",
        "base",
        "elements",
        "size",
    )

    def __init__(
        self, label: str, elements: int, size: int, base: int, *, collect: bool = False
    ) -> None:
        self._label = label
        self.elements = elements
        self.size = size
        self.base = base  # body offset of the tensor's first byte
        self._count = 0  # elements whose prefix has been read
        self._skip = 0  # bytes of the current element still to pass over
        self._partial = b""  # a prefix split across chunks
        self._partial_at = 0
        # Slices of the bytes fed (a collecting framer is fed bytes).
        self._out: list[Any] | None = [] if collect else None
        self._piece: bytearray | None = None  # a collected element split across chunks

    def _element(self, length: int, at: int) -> None:
        """Count the prefix found at tensor offset ``at``; raise if the shape
        has no room for its element or the tensor none for its bytes."""
        self._count += 1
        if self._count > self.elements:
            raise RemoteProtocolError(
                f"unexpected number of string elements for {self._label}: more than"
                f" the {self.elements} its shape holds",
                offset=self.base + at,
            )
        left = self.size - at - 4
        if length > left:
            raise RemoteProtocolError(
                f"BYTES element {self._count - 1} of {self._label} claims {length} bytes"
                f" but only {left} remain in its binary_data_size",
                offset=self.base + at,
            )

    def _begin(self, data: memoryview | bytes, start: int, end: int) -> None:
        """An element of ``data[start:end]`` that goes on past ``data``'s end."""
        n = len(data)
        if self._out is not None:
            self._piece = bytearray(data[start:n])
        self._skip = end - n

    def feed(self, data: memoryview | bytes, offset: int) -> None:
        """Check ``data``, the tensor's bytes from tensor offset ``offset``
        (``bytes`` when collecting); bytes past the tensor's ``size`` are
        :class:`LocalProtocolError`."""
        n = len(data)
        if offset + n > self.size:
            raise LocalProtocolError(
                f"{n} bytes fed at offset {offset} of a {self.size}-byte BYTES tensor:"
                " more than the tensor's binary_data_size"
            )
        out = self._out
        i = 0
        if self._skip:  # the rest of an element begun in an earlier chunk
            i = min(self._skip, n)
            self._skip -= i
            if self._piece is not None:
                self._piece += data[:i]
                if not self._skip and out is not None:
                    out.append(bytes(self._piece))
                    self._piece = None
            if self._skip:
                return
        if self._partial:  # the rest of a length prefix begun in an earlier chunk
            take = min(4 - len(self._partial), n - i)
            self._partial += bytes(data[i : i + take])
            i += take
            if len(self._partial) < 4:
                return
            length = int.from_bytes(self._partial, "little")
            self._partial = b""
            self._element(length, self._partial_at)
            end = i + length
            if end > n:
                self._begin(data, i, end)
                return
            if out is not None:
                out.append(data[i:end])
            i = end
        # Whole elements: the walk over the prefixes, with both checks of
        # _element made inline (it is called only to raise).
        unpack = _U32.unpack_from
        append = out.append if out is not None else None
        tensor_end = self.size - offset  # where the tensor ends, in data
        last = n - 4  # where the last whole prefix of data starts
        count = self._count
        for count in range(self._count, self.elements):  # at most the elements left
            if i > last:
                break
            start = i + 4
            end = start + unpack(data, i)[0]
            if end > n:  # past this chunk, which holds no byte past the tensor
                if end > tensor_end:
                    self._count = count
                    self._element(end - start, offset + i)
                self._count = count + 1  # the element goes on in the next chunk
                self._begin(data, start, end)
                return
            if append is not None:
                append(data[start:end])
            i = end
        else:  # every element of the shape is read: a further prefix is one too many
            count = self.elements
            if i <= last:
                self._count = count
                self._element(unpack(data, i)[0], offset + i)
        self._count = count
        if i < n:
            self._partial = bytes(data[i:n])
            self._partial_at = offset + i

    def take(self) -> list[bytes]:
        """The elements completed since the last call (with ``collect`` only)."""
        out = self._out or []
        if self._out:
            self._out = []
        return out

    def finish(self) -> None:
        """Check the tensor ended on an element boundary with every element."""
        if self._partial or self._count != self.elements:
            raise RemoteProtocolError(
                f"unexpected number of string elements for {self._label}: its"
                f" binary_data_size holds {self._count}"
                f"{' and a partial length prefix' if self._partial else ''},"
                f" its shape {self.elements}",
                offset=self.base + self.size,
            )


def object_array(elements: list[bytes]) -> np.ndarray[Any, np.dtype[np.object_]]:
    """A 1-D object array holding ``elements``."""
    arr = np.empty(len(elements), dtype=object)
    arr[:] = elements
    return arr


class BytesDecoder:
    """Decode the elements of one BYTES tensor as its bytes stream in.

    Feed it the tensor's chunks (``TensorChunk.data``) in order; each call
    returns the elements completed by that chunk, wherever the chunk
    boundaries fall (inside a length prefix or an element). Framing faults
    raise :class:`RemoteProtocolError`, at the same offset for any chunking.

    Args:
        info_or_elements: the tensor's :class:`TensorInfo`, or its element count.
        size: the tensor's ``binary_data_size`` (taken from ``info`` when given).
        base: body offset of the tensor's first byte, for error offsets.
    """

    def __init__(self, info_or_elements: Any, size: int | None = None, *, base: int = 0) -> None:
        if not isinstance(info_or_elements, TensorInfo):
            if size is None:
                raise LocalProtocolError("BytesDecoder needs the tensor's binary_data_size")
            elements = whole_number(info_or_elements, "the element count")
            size, label = whole_number(size, "binary_data_size"), "BYTES tensor"
        else:
            info = info_or_elements
            if info.datatype != "BYTES" or info.binary_size is None:
                raise LocalProtocolError(f"'{info.name}' is not a binary BYTES tensor")
            elements, size, label = info.elements, info.binary_size, f"tensor '{info.name}'"
        self._framer = BytesFramer(label, elements, size, base, collect=True)
        self._offset = 0

    def feed(self, data: Any) -> list[bytes]:
        """Take the tensor's next bytes; return the elements they complete."""
        chunk = as_byte_view(data).tobytes()  # the elements are slices of it
        self._framer.feed(chunk, self._offset)  # (more bytes than the tensor's: refused)
        self._offset += len(chunk)
        return self._framer.take()

    def finish(self) -> None:
        """Check the tensor ended after its last element."""
        self._framer.finish()


def split_bytes(buf: Any, count: SupportsIndex) -> np.ndarray[Any, np.dtype[np.object_]]:
    """Split the BYTES framing of ``count`` elements filling ``buf`` into a 1-D
    object array of ``bytes``; bad framing is :class:`RemoteProtocolError`."""
    data = buf if isinstance(buf, bytes) else as_byte_view(buf).tobytes()
    framer = BytesFramer(
        "BYTES tensor", whole_number(count, "the element count"), len(data), 0, collect=True
    )
    framer.feed(data, 0)
    framer.finish()
    return object_array(framer.take())


def join_bytes(elements: Iterable[Any]) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """The BYTES wire form of ``elements``: each one prefixed by its uint32
    little-endian length, back to back, as a flat writable ``uint8`` array.

    ``elements`` is any iterable of bytes-like objects: ``bytes``,
    ``bytearray``, or any C-contiguous buffer (a ``memoryview``, a numpy
    array), each framed by its size in bytes, not its ``len()``. Anything
    else, a ``str`` included (encode it first), or an array of Python objects
    (its bytes are pointers), is :class:`LocalProtocolError`.

    The inverse of :func:`split_bytes`.
    """
    try:
        items = elements if isinstance(elements, list) else list(elements)
    except TypeError:
        raise LocalProtocolError(
            f"join_bytes takes an iterable of bytes-like elements, got {type(elements).__name__}"
        ) from None
    if not set(map(type, items)) <= _PLAIN:  # (a C-level pass over the types)
        items = list(_byte_views(items))
    return join_plain(items)


# Elements whose len() is their size in bytes, taken as they are.
_PLAIN = {bytes, bytearray}

# The blank each length prefix is written over (a bytearray: the joined
# wire form is writable).
_GAP = bytearray(4)


def join_plain(elements: list[bytes] | list[memoryview]) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """:func:`join_bytes` of elements already known to be ``bytes`` or
    ``bytearray``, or flat byte views (their ``len()`` is their size in
    bytes): what the encoder has made of a tensor.

    No per-element Python loop: one join lays the elements out with a 4-byte
    gap before each (the wire form with blank prefixes, one copy of the
    data), then numpy writes every prefix at once from the array of lengths.
    """
    n = len(elements)
    if not n:
        return np.empty(0, dtype=np.uint8)
    lengths = np.fromiter(map(len, elements), dtype=np.int64, count=n)
    if int(lengths.max()) > 0xFFFFFFFF:
        raise LocalProtocolError("a BYTES element is longer than 2**32 - 1 bytes")
    out = np.frombuffer(_GAP.join([b"", *elements]), dtype=np.uint8)
    sizes = lengths + 4
    starts = np.cumsum(sizes) - sizes
    prefixes = lengths.astype("<u4").view(np.uint8).reshape(n, 4)
    for k in range(4):  # byte k of every prefix
        out[starts + k] = prefixes[:, k]
    return out


def _byte_views(items: list[Any]) -> Iterator[memoryview]:
    """Each element's bytes; the first that is not a C-contiguous buffer is
    :class:`LocalProtocolError`."""
    for i, item in enumerate(items):
        if isinstance(item, str):  # (numpy's str_ exports its UCS-4 code points)
            raise LocalProtocolError(f"BYTES element {i}: expected bytes, got str: encode it")
        try:
            yield as_byte_view(item)
        except LocalProtocolError as exc:
            raise LocalProtocolError(f"BYTES element {i}: {exc.msg}") from None
