"""Events the parser hands out, and the NEED_DATA sentinel."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from ._header import InferenceHeader, TensorInfo

__all__ = [
    "NEED_DATA",
    "Event",
    "HeaderParsed",
    "MessageComplete",
    "NeedData",
    "TensorChunk",
    "TensorComplete",
]


class NeedData(enum.Enum):
    """Type of :data:`NEED_DATA` (an enum member, so ``is`` narrows it for mypy)."""

    NEED_DATA = "NEED_DATA"

    def __repr__(self) -> str:
        return "NEED_DATA"


#: Returned by :meth:`Parser.next_event` when it cannot go on without more bytes.
NEED_DATA: Final = NeedData.NEED_DATA


class Event:
    """Base class of every parser event.

    Every event is a frozen, slotted dataclass: assigning to a field raises
    :class:`dataclasses.FrozenInstanceError`.
    """

    __slots__ = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class HeaderParsed(Event):
    """The JSON header is complete and valid; ``header`` describes every tensor."""

    header: InferenceHeader

    def __repr__(self) -> str:
        h = self.header
        return f"HeaderParsed(kind={h.kind!r}, tensors={[t.name for t in h.tensors]!r})"


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorChunk(Event):
    """Bytes ``[offset, offset + len(data))`` of binary tensor ``index``.

    ``data`` is a ``memoryview`` slice of the buffer passed to
    :meth:`Parser.receive_data` (or of binproto's own decompressed output for a
    compressed body, or, first, the 4-byte length prefix binproto supplies for
    the element of a raw BYTES request): nothing is copied. It is valid until the next call to
    ``receive_data``; keep it longer only if the caller's buffer lives longer.
    """

    index: int
    name: str
    offset: int
    data: memoryview

    def __repr__(self) -> str:
        head = bytes(self.data[:8]).hex()
        more = "…" if len(self.data) > 8 else ""
        return (
            f"TensorChunk(index={self.index}, name={self.name!r}, offset={self.offset},"
            f" len={len(self.data)}, data=<{head}{more}>)"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorComplete(Event):
    """Tensor ``index`` is complete: after its last chunk, or at once for a
    tensor sent as JSON data, in shared memory, or of zero size."""

    index: int
    name: str
    info: TensorInfo

    def __repr__(self) -> str:
        return f"TensorComplete(index={self.index}, name={self.name!r})"


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageComplete(Event):
    """The body ended exactly where the header said it would."""
