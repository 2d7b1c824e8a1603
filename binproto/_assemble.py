"""Build numpy arrays from parser events with one copy per byte."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from operator import itemgetter
from typing import Any, NamedTuple

import numpy as np

from ._bytes import split_bytes
from ._datatypes import DTYPES
from ._errors import LocalProtocolError, RemoteProtocolError
from ._events import Event, HeaderParsed, TensorChunk, TensorComplete
from ._header import InferenceHeader, TensorInfo
from ._util import as_byte_view, index_below

__all__ = ["DecodedMessage", "Destinations", "TensorAssembler", "array_from_bytes"]

#: Where a TensorAssembler puts tensors: by name, or chosen per tensor.
Destinations = (
    Mapping[str, np.ndarray[Any, Any]] | Callable[[TensorInfo], np.ndarray[Any, Any] | None] | None
)


class DecodedMessage(NamedTuple):
    """A complete request or response: its header and its tensors as arrays.

    ``tensors`` maps each tensor in the body or in JSON to an array; tensors in
    shared memory have no array and are named in ``shared_memory``.
    """

    header: InferenceHeader
    tensors: dict[str, np.ndarray[Any, Any]]
    shared_memory: tuple[str, ...] = ()

    def __repr__(self) -> str:  # names, not arrays
        return (
            f"DecodedMessage(header={self.header!r}, tensors={list(self.tensors)!r},"
            f" shared_memory={self.shared_memory!r})"
        )


_OBJECT = DTYPES["BYTES"]
_LOW = itemgetter(0)  # a taken range's first address
_BYTE = np.dtype(np.uint8)


class _Building:
    """A binary tensor begun and not complete."""

    __slots__ = ("array", "base", "received", "target")

    def __init__(self, target: memoryview, array: np.ndarray[Any, Any]) -> None:
        self.target = target  # the bytes chunks are copied into
        # The array they make: the destination, or over memory the assembler
        # allocated (for BYTES, the framed bytes themselves: split when complete).
        self.array = array
        self.received = 0  # bytes of it so far: the next chunk's offset
        # The address of the target's first byte, looked up (a costly call)
        # only when a chunk may be the target itself.
        self.base: int | None = None

    def address(self) -> int:
        """The address of the target's first byte."""
        if self.base is None:
            self.base = _address(self.target)
        return self.base


def array_from_bytes(info: TensorInfo, buf: Any, offset: int = 0) -> np.ndarray[Any, Any]:
    """The array the tensor's complete binary bytes, from ``offset`` in ``buf``,
    stand for (no copy, except BYTES, whose elements become ``bytes`` objects)."""
    dtype = DTYPES[info.datatype]
    if dtype is _OBJECT:  # BYTES
        return split_bytes(memoryview(buf)[offset:], info.elements).reshape(info.shape)
    # One call makes the view with its dtype (BOOL is numpy's bool) and shape.
    arr: np.ndarray[Any, Any] = np.ndarray(info.shape, dtype, buf, offset)
    return arr


def _address(view: memoryview) -> int:
    """Address of the first byte of a (non-empty or empty) byte view."""
    return int(np.frombuffer(view, dtype=np.uint8).__array_interface__["data"][0])


class TensorAssembler:
    """Consume parser events and build each tensor's numpy array.

    Binary tensor bytes are copied exactly once, from the chunk into memory
    allocated for the tensor from its validated ``binary_data_size`` when its
    first byte arrives, or into a destination array the caller provides.

    Args:
        destinations: where to put tensors: a mapping from tensor name to an
            array, or a callable that gets each binary tensor's
            :class:`TensorInfo` and returns an array or None (None: let the
            assembler allocate). A destination must be writable, C-contiguous,
            and exactly ``binary_size`` bytes; its dtype is the caller's
            choice (one of plain values: no Python objects). Destinations of
            one message may not overlap. BYTES tensors always use the
            assembler's own memory.

    After :class:`TensorComplete`, ``tensors[name]`` holds the tensor: the
    destination array itself when one was given, else a new array of the
    tensor's dtype and shape. JSON-data tensors come from the header; tensors
    in shared memory have no bytes in the body and are listed in
    ``shared_memory`` instead.
    """

    def __init__(self, destinations: Destinations = None) -> None:
        if not (
            destinations is None or isinstance(destinations, Mapping) or callable(destinations)
        ):
            raise LocalProtocolError(
                "destinations must be a mapping of name to array, a callable or None,"
                f" got {type(destinations).__name__}"
            )
        self._destinations = destinations
        self.header: InferenceHeader | None = None
        #: Complete tensors by name.
        self.tensors: dict[str, np.ndarray[Any, Any]] = {}
        #: Names of tensors that live in shared memory.
        self.shared_memory: list[str] = []
        # Tensors begun and not complete, by index.
        self._open: dict[int, _Building] = {}
        # The byte ranges of the caller's arrays taken so far, with their
        # tensors' names, sorted by address: no two may overlap. (Made with the
        # first: nothing is made for an assembler that takes none.)
        self._taken: list[tuple[int, int, str]] | None = None
        #: Tensor bytes copied from chunks into tensor memory.
        self.bytes_copied = 0
        #: Tensor bytes that arrived already in place (see :meth:`target`): not copied.
        self.bytes_in_place = 0

    def __call__(self, event: Event) -> None:
        """Same as :meth:`feed`."""
        self.feed(event)

    def feed(self, event: Event) -> None:
        """Take one event from the parser."""
        if type(event) is TensorChunk:
            index, name, offset, data = event
            tensor = self._open.get(index)
            if tensor is None:
                tensor = self._allocate(index)
            target = tensor.target
            n = len(data)
            if offset != tensor.received:
                # A parser's chunks follow each other: these are not its.
                raise LocalProtocolError(
                    f"TensorChunk of '{name}' at offset {offset} does not follow the"
                    f" {tensor.received} bytes received: events out of order, or from"
                    " another message"
                )
            if offset + n > len(target):
                raise LocalProtocolError(
                    f"TensorChunk of '{name}' at offset {offset} runs past its"
                    f" {len(target)} bytes: an event of another message"
                )
            tensor.received = offset + n
            # A writable chunk may be the target itself, filled by the caller's
            # recv_into (see target()); then there is nothing to copy. Only a
            # view of the target's own array can be: the identity test keeps
            # the costly address lookup off every other chunk.
            if (
                data.obj is target.obj
                and not data.readonly
                and n
                and _address(data) == tensor.address() + offset
            ):
                self.bytes_in_place += n
                return
            target[offset : offset + n] = data
            self.bytes_copied += n
        elif type(event) is HeaderParsed:
            if self.header is not None:
                raise LocalProtocolError("a TensorAssembler assembles one message: a second header")
            self.header = event.header
        elif type(event) is TensorComplete:
            self._complete(event.info)

    def target(self, index: int) -> memoryview:
        """The writable bytes where binary tensor ``index`` is assembled.

        Allocates the tensor's memory (or takes its destination array) if its
        first chunk has not arrived yet. An adapter can receive body bytes
        straight into a slice of it (see :meth:`Parser.next_tensor_region`) and
        give that slice to the parser: when the resulting chunk is fed back,
        the assembler sees the bytes are already in place and copies nothing.
        Only slices of the returned ``memoryview`` are recognized; a chunk
        from any other object is copied.
        """
        tensor = self._open.get(index)
        return (tensor if tensor is not None else self._allocate(index)).target

    def _allocate(self, index: int) -> _Building:
        header = self.header
        if header is None:
            raise LocalProtocolError("a tensor's bytes before HeaderParsed")
        position = index_below(index, len(header.tensors))
        if position is None:
            raise LocalProtocolError(f"no tensor {index!r} in the header")
        info = header.tensors[position]
        if info.binary_size is None:
            raise LocalProtocolError(f"tensor '{info.name}' has no binary data")
        if info.name in self.tensors:
            raise LocalProtocolError(f"tensor '{info.name}' is complete already")
        array = self._destination(info) if self._destinations is not None else None
        if array is None:
            # The tensor's own array (its size is the validated binary_size);
            # BYTES stays bytes until complete (then split).
            shape: tuple[int, ...]
            if info.datatype == "BYTES":
                shape, dtype = (info.binary_size or 0,), _BYTE
            else:
                shape, dtype = info.shape, DTYPES[info.datatype]
            try:
                array = np.empty(shape, dtype)
            except MemoryError:
                # A size within the limits, but more memory than the system
                # grants (possible when the body's length is not known up front).
                raise RemoteProtocolError(
                    f"cannot allocate {info.binary_size} bytes for tensor '{info.name}'",
                    status_hint=413,
                    offset=None,
                ) from None
            # Its own array is C-contiguous plain values: its buffer casts to
            # bytes without as_byte_view's checks (half the allocation's cost),
            # unless it is bfloat16 (no buffer format) or has a zero in a shape
            # of more than one dimension (memoryview cannot cast that).
            try:
                target = array.data.cast("B")
            except (TypeError, ValueError):
                target = as_byte_view(array)
        else:
            target = as_byte_view(array)
        tensor = _Building(target, array)
        self._open[position] = tensor
        return tensor

    def _destination(self, info: TensorInfo) -> np.ndarray[Any, Any] | None:
        dest = self._destinations
        if dest is None or info.datatype == "BYTES":
            return None
        array = dest.get(info.name) if isinstance(dest, Mapping) else dest(info)
        if array is None:
            return None
        if not isinstance(array, np.ndarray) or array.dtype.hasobject:
            raise LocalProtocolError(
                f"destination for '{info.name}' is not a numpy array of plain values"
            )
        if array.dtype.byteorder == ">":
            raise LocalProtocolError(
                f"destination for '{info.name}' is big-endian ({array.dtype}): the body's"
                " values are little-endian"
            )
        if not (array.flags.c_contiguous and array.flags.writeable):
            raise LocalProtocolError(
                f"destination for '{info.name}' must be writable and C-contiguous"
            )
        if array.nbytes != info.binary_size:
            raise LocalProtocolError(
                f"destination for '{info.name}' holds {array.nbytes} bytes,"
                f" the tensor has {info.binary_size}"
            )
        if array.nbytes:  # (an empty array holds no byte another could)
            low: int = array.ctypes.data
            self._take(info.name, low, low + array.nbytes)
        return array

    def _take(self, name: str, low: int, high: int) -> None:
        """Note that tensor ``name`` goes to bytes ``[low, high)``, refusing them
        if another destination of the message covers any: two tensors in one
        memory would overwrite each other, silently. (The ranges are kept in
        address order, so each check looks at two neighbours: a peer that sends
        thousands of tensors does not make it quadratic.)"""
        taken = self._taken
        if taken is None:
            taken = self._taken = []
        i = bisect.bisect_left(taken, low, key=_LOW)
        for other in taken[max(i - 1, 0) : i + 1]:
            if other[0] < high and low < other[1]:
                raise LocalProtocolError(
                    f"destination for '{name}' overlaps the destination of '{other[2]}'"
                )
        taken.insert(i, (low, high, name))

    def message(self) -> DecodedMessage:
        """The message assembled so far: its header and the complete tensors.

        Raises :class:`LocalProtocolError` before :class:`HeaderParsed`.
        """
        if self.header is None:
            raise LocalProtocolError("no message yet: the header has not been parsed")
        return DecodedMessage(
            header=self.header,
            tensors=self.tensors,
            shared_memory=tuple(self.shared_memory),
        )

    def _complete(self, info: TensorInfo) -> None:
        index = info.index
        header = self.header
        if header is None or not index < len(header.tensors) or header.tensors[index] is not info:
            raise LocalProtocolError(f"TensorComplete of '{info.name}' is not of this message")
        if info.binary_size is None:
            if info.name in self.tensors or info.name in self.shared_memory:
                raise LocalProtocolError(f"tensor '{info.name}' is complete already")
            if info.shared_memory:
                self.shared_memory.append(info.name)
            elif info.array is not None:
                self.tensors[info.name] = info.array
            return
        # A binary tensor open is not complete: its allocation refused one that was.
        tensor = self._open.get(index)
        if tensor is None:
            tensor = self._allocate(index)  # (a zero-size tensor has no chunks)
        if tensor.received != info.binary_size:
            raise LocalProtocolError(
                f"TensorComplete of '{info.name}' after {tensor.received} of its"
                f" {info.binary_size} bytes"
            )
        del self._open[index]
        array = tensor.array
        if info.datatype == "BYTES":  # the framed bytes, split into elements now
            array = array_from_bytes(info, array)
        self.tensors[info.name] = array
