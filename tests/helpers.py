"""Test helpers: feed a body in any chunking and normalize what comes out."""

from __future__ import annotations

import itertools
import json
import re
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import binproto
from binproto import (
    HeaderParsed,
    MessageComplete,
    Parser,
    ProtocolError,
    TensorChunk,
    TensorComplete,
)

Normalized = tuple[Any, ...]


@dataclass(frozen=True)
class Outcome:
    """What a parser made of a body: normalized events, or the error it raised."""

    events: tuple[Normalized, ...]
    error: tuple[str, str, int, int | None] | None  # (type, message, status, offset)


def split(body: bytes, points: Iterable[int]) -> list[bytes]:
    """Cut ``body`` at the given offsets (sorted, de-duplicated)."""
    cuts = sorted({p for p in points if 0 < p < len(body)})
    edges = [0, *cuts, len(body)]
    return [body[a:b] for a, b in itertools.pairwise(edges)]


def chunkings(body: bytes, *, two_way_limit: int = 400) -> Iterator[list[bytes]]:
    """Whole, one byte at a time, and (for small bodies) every two-way split."""
    yield [body]
    yield [body[i : i + 1] for i in range(len(body))]
    if len(body) <= two_way_limit:
        for i in range(1, len(body)):
            yield [body[:i], body[i:]]


def normalize(events: Iterable[binproto.Event]) -> tuple[Normalized, ...]:
    """Events with chunk boundaries erased: each tensor's bytes merged."""
    out: list[Normalized] = []
    pending: dict[int, bytearray] = {}
    for ev in events:
        if isinstance(ev, HeaderParsed):
            out.append(("header", json.dumps(ev.header.raw, sort_keys=True, default=str)))
        elif isinstance(ev, TensorChunk):
            buf = pending.setdefault(ev.index, bytearray())
            assert ev.offset == len(buf), "chunks must arrive in order, back to back"
            buf += ev.data
        elif isinstance(ev, TensorComplete):
            out.append(("tensor", ev.index, ev.name, bytes(pending.pop(ev.index, b""))))
        elif isinstance(ev, MessageComplete):
            out.append(("end",))
        else:  # pragma: no cover - a new event type must be added here
            raise AssertionError(f"unexpected event {ev!r}")
    assert not pending, "every chunked tensor must complete"
    return tuple(out)


def run(make_parser: Callable[[], Parser], chunks: Sequence[bytes], *, end: bool = True) -> Outcome:
    """Feed ``chunks`` (then the end, if ``end``) and drain every event."""
    parser = make_parser()
    events: list[binproto.Event] = []
    try:
        for chunk in chunks:
            parser.receive_data(chunk)
            events.extend(parser.events())
        if end:
            # (after MessageComplete too: bytes past content_length that came
            # with the body's last ones are refused by the call after it)
            parser.receive_data(b"")
            events.extend(parser.events())
    except ProtocolError as exc:
        assert parser.state is binproto.ParserState.ERROR
        return Outcome((), (type(exc).__name__, exc.msg, exc.status_hint, exc.offset))
    return Outcome(normalize(events), None)


def assert_same_everywhere(
    make_parser: Callable[[], Parser], body: bytes, *, two_way_limit: int = 400
) -> Outcome:
    """Parse ``body`` in every chunking; all must give the whole-body outcome."""
    outcomes = iter(chunkings(body, two_way_limit=two_way_limit))
    reference = run(make_parser, next(outcomes))
    for chunks in outcomes:
        got = run(make_parser, chunks)
        assert got == reference, f"chunking {[len(c) for c in chunks][:20]} differs"
    return reference


def make_body(header: dict[str, Any], *tensors: bytes) -> tuple[bytes, int]:
    """A body from a JSON header and raw tensor bytes; returns (body, header_length)."""
    js = json.dumps(header).encode()
    return js + b"".join(tensors), len(js)


def bytes_tensor(items: Sequence[bytes]) -> bytes:
    """BYTES wire form: each element with its uint32 little-endian length."""
    return b"".join(len(x).to_bytes(4, "little") + x for x in items)


def arrays_equal(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> bool:
    """Equal shape, dtype kind and values (NaN equal to NaN)."""
    if a.shape != b.shape:
        return False
    if a.dtype.kind == "f" or b.dtype.kind == "f":
        return bool(np.array_equal(a.astype(np.float64), b.astype(np.float64), equal_nan=True))
    if a.dtype == object or b.dtype == object:
        return [bytes(x) for x in a.ravel()] == [bytes(x) for x in b.ravel()]
    return bool(np.array_equal(a, b))


def claiming_header(datatype: str, elements: int, size: int, name: str = "x") -> bytes:
    """The JSON header of a request whose one binary input ``name`` claims
    ``elements`` elements of ``datatype`` in ``size`` bytes."""
    tensor = {
        "name": name,
        "datatype": datatype,
        "shape": [elements],
        "parameters": {"binary_data_size": size},
    }
    return json.dumps({"inputs": [tensor]}).encode()


def gzip_then_zeros(header: bytes, zeros: int) -> bytes:
    """A gzip body of ``header`` then ``zeros`` zero bytes, a MiB at a time."""
    stream = zlib.compressobj(9, zlib.DEFLATED, 31)
    pieces = [stream.compress(header)]
    block = bytes(1 << 20)
    for _ in range(zeros >> 20):
        pieces.append(stream.compress(block))
    pieces.append(stream.compress(bytes(zeros & ((1 << 20) - 1))))
    pieces.append(stream.flush())
    return b"".join(pieces)


def proc_status(pid: int, key: str) -> int:
    """A size from ``/proc/PID/status`` (``VmRSS``, ``VmHWM``), in bytes."""
    with open(f"/proc/{pid}/status") as f:
        match = re.search(rf"^{key}:\s+(\d+) kB", f.read(), re.M)
    assert match, key
    return int(match.group(1)) * 1024
