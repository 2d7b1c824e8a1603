"""What binproto's HTTP/1.1 servers and clients read from and write to.

:class:`ByteStream` is a minimal async byte stream; the asyncio and trio
adapters wrap their sockets into one. A stream may offer more (receive into
a buffer, run work in threads, half-close, ...): the protocols here name
each such capability, and :func:`capabilities` says which a stream has.
:class:`Timeouts` bounds each phase of a request.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from binproto import LocalProtocolError

__all__ = [
    "CHUNK",
    "ByteStream",
    "Capabilities",
    "HalfCloses",
    "ProbesIdle",
    "ReadsAhead",
    "ReceivesInto",
    "Recycles",
    "RunsInThreads",
    "Timeouts",
    "Yields",
    "capabilities",
    "seconds_or_none",
]

#: Bytes asked of the stream per read when not receiving into a tensor.
CHUNK = 1 << 16


class ByteStream(Protocol):
    """What the server and client need from a connected byte stream.

    A stream may offer more, each declared by a protocol of its own, and
    then it is used (see :func:`capabilities`): :class:`ReceivesInto` (tensor
    bytes received in place), :class:`RunsInThreads` (response compression
    and big JSON headers off the event loop), :class:`Yields` (a compressed
    body yields to other tasks every :data:`YIELD_BYTES` of its tensor
    bytes), :class:`ReadsAhead` (larger reads of a body), :class:`ProbesIdle`
    (the client checks that the server has not closed an idle
    connection before reusing it) and
    :class:`Recycles` (memory a small body came in is received into again)
    and :class:`HalfCloses` (a refused body is drained after the answer
    before the connection closes).

    A stream has a settable ``timeout``: the seconds one wait for the peer
    may take, to receive its bytes or to have ours taken (None: no bound).
    Past it the wait raises :class:`TimeoutError`. :class:`V2Server` sets it
    before each phase of a request (see :class:`Timeouts`).
    """

    timeout: float | None

    async def receive_some(self, max_bytes: int) -> Any:
        """Up to ``max_bytes`` bytes (a bytes-like object); empty at end of stream."""

    async def send_all(self, buffers: Sequence[Any]) -> None:
        """Write every buffer, in order, without joining them."""

    async def aclose(self) -> None:
        """Close the stream."""


@runtime_checkable
class ReceivesInto(Protocol):
    """A :class:`ByteStream` that receives into the caller's memory."""

    async def receive_into(self, buf: memoryview) -> int:
        """Bytes written into ``buf``; 0 at end of stream."""


@runtime_checkable
class RunsInThreads(Protocol):
    """A :class:`ByteStream` that can run blocking work in a worker thread."""

    async def to_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` run in a worker thread; its result."""


@runtime_checkable
class Yields(Protocol):
    """A :class:`ByteStream` whose event loop other tasks can be let run on."""

    async def checkpoint(self) -> None:
        """Let other tasks run."""


@runtime_checkable
class ReadsAhead(Protocol):
    """A :class:`ByteStream` that buffers ahead, and prefers reads this large."""

    read_size: int


@runtime_checkable
class Recycles(Protocol):
    """A :class:`ByteStream` that can receive again into memory the caller
    is done with."""

    def recycle(self, data: Any) -> None:
        """The caller is done with ``data``, the rest of a piece
        ``receive_some`` returned, and with all before it: no view of that
        piece is used again, and its memory may receive later bytes."""


@runtime_checkable
class ProbesIdle(Protocol):
    """A :class:`ByteStream` that tells, without waiting, whether the peer
    has sent bytes or closed its side. The client asks before it sends a
    request on a connection that was idle: a server closes an idle
    connection after its keep-alive timeout, and a request sent on it would
    fail; the client opens a new connection instead."""

    def is_readable(self) -> bool:
        """True when bytes (or the end of the stream) are waiting to be read."""


@runtime_checkable
class HalfCloses(Protocol):
    """A :class:`ByteStream` that can end its sending side and still receive."""

    async def send_eof(self) -> None:
        """Send the end of the stream (a TCP FIN); receiving goes on."""


class Capabilities(NamedTuple):
    """Which of the optional protocols a stream's class implements."""

    receives_into: bool
    runs_in_threads: bool
    yields: bool
    read_size: int
    probes_idle: bool = False
    recycles: bool = False
    half_closes: bool = False


_CAPABILITIES: dict[type, Capabilities] = {}


def capabilities(stream: ByteStream) -> Capabilities:
    """What ``stream`` offers beyond :class:`ByteStream`: looked up once per
    stream class (a check against a protocol tests each of its members)."""
    kind = type(stream)
    found = _CAPABILITIES.get(kind)
    if found is None:
        found = _CAPABILITIES[kind] = Capabilities(
            isinstance(stream, ReceivesInto),
            isinstance(stream, RunsInThreads),
            isinstance(stream, Yields),
            stream.read_size if isinstance(stream, ReadsAhead) else CHUNK,
            isinstance(stream, ProbesIdle),
            isinstance(stream, Recycles),
            isinstance(stream, HalfCloses),
        )
    return found


def seconds_or_none(value: Any, what: str) -> float | None:
    """``value`` as a bound in seconds: None (no bound), or a positive number
    a float holds finitely (an int, a float or a numpy number; not a bool,
    not NaN, not an int too big for a float). Anything else is the caller's
    :class:`LocalProtocolError`, naming ``what``."""
    if value is None:
        return None
    try:
        real = isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
        seconds = float(value) if real else None
    except OverflowError:
        seconds = None
    if seconds is None or not 0 < seconds < math.inf:
        raise LocalProtocolError(
            f"{what} must be a positive number of seconds or None, got {value!r}"
        )
    return seconds


@dataclass(frozen=True, slots=True)
class Timeouts:
    """How long a server waits for a peer, in seconds (None: no bound).

    The defaults are those of production HTTP servers (uvicorn's keep-alive,
    hypercorn's and gunicorn's read timeouts). A request refused by a timeout
    is answered with 408 when an answer can still be sent, then the
    connection is closed.

    Attributes:
        keep_alive: idle time allowed before the first byte of a request (on
            a new connection, or after a response): then the connection is
            closed without an answer.
        head: a deadline for the whole request head, from its first byte (a
            head dripped a byte at a time is cut at it): 408.
        body: the longest wait for more of the request body (inactivity, not
            a deadline: a slow body that keeps moving is read): 408.
        write: the longest wait for the peer to take the response's bytes (a
            client that stops reading): the connection is closed.
    """

    keep_alive: float | None = 5.0
    head: float | None = 10.0
    body: float | None = 30.0
    write: float | None = 30.0

    def __post_init__(self) -> None:
        for name in ("keep_alive", "head", "body", "write"):
            value = getattr(self, name)
            seconds = seconds_or_none(value, f"timeout {name}")
            if type(value) not in (int, float):
                # A number of another kind (numpy's) kept as a float: the
                # server adds it to the clock (frozen: set directly).
                object.__setattr__(self, name, seconds)

    @classmethod
    def every(cls, seconds: float | None) -> Timeouts:
        """The same bound for every phase."""
        return cls(seconds, seconds, seconds, seconds)
