"""Events the parser hands out, and the NEED_DATA sentinel.

Events are named tuples: immutable, compared by value, and cheap to build
(a parser makes one per chunk of tensor bytes, so their cost is paid per
chunk; a frozen dataclass costs about three times as much to construct).
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Final, NamedTuple

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


class HeaderParsed(NamedTuple):
    """The JSON header is complete and valid; ``header`` describes every tensor."""

    header: InferenceHeader

    def __repr__(self) -> str:
        h = self.header
        return f"HeaderParsed(kind={h.kind!r}, tensors={[t.name for t in h.tensors]!r})"


class TensorChunk(NamedTuple):
    """Bytes ``[offset, offset + len(data))`` of binary tensor ``index``.

    ``data`` is a ``memoryview`` slice of the buffer passed to
    :meth:`Parser.receive_data` (or of binproto's own decompressed output for a
    compressed body, or, first, the 4-byte length prefix binproto supplies for
    the element of a raw BYTES request): nothing is copied. It is valid until the next call to
    ``receive_data``; keep it longer only if the caller's buffer lives longer.
    """

    # A field called index hides tuple.index, as a named tuple allows.
    index: int  # type: ignore[assignment]
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


class TensorComplete(NamedTuple):
    """Tensor ``index`` is complete: after its last chunk, or at once for a
    tensor sent as JSON data, in shared memory, or of zero size."""

    index: int  # type: ignore[assignment]
    name: str
    info: TensorInfo

    def __repr__(self) -> str:
        return f"TensorComplete(index={self.index}, name={self.name!r})"


class MessageComplete(NamedTuple):
    """The body ended exactly where the header said it would."""

    def __bool__(self) -> bool:  # an empty tuple would be false; every event is true
        return True


#: Any event the parser returns (``isinstance(x, Event)`` works with it).
Event = HeaderParsed | TensorChunk | TensorComplete | MessageComplete
