"""BytesFramer's fast path (skimming prefixes) agrees with its checked path.

A framer that only checks (``collect=False``) skims whole elements in one
tight loop and checks the count and the tensor's end after it; a collecting
framer checks every element as it goes. For the same bytes in the same
chunking both must accept, or raise the same error at the same offset.
"""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from binproto import RemoteProtocolError
from binproto._bytes import BytesFramer, split_bytes

Outcome = tuple[str, int | None] | int


def _frame(lengths: list[int]) -> bytes:
    return b"".join(struct.pack("<I", n) + b"x" * n for n in lengths)


def _outcome(data: bytes, elements: int, size: int, cuts: list[int], collect: bool) -> Outcome:
    framer = BytesFramer("input 't'", elements, size, 100, collect=collect)
    bounds = [0, *sorted(c for c in cuts if 0 < c < len(data)), len(data)]
    try:
        for a, b in itertools.pairwise(bounds):
            framer.feed(memoryview(data)[a:b], a)
        framer.finish()
    except RemoteProtocolError as exc:
        return (str(exc), exc.offset)
    return framer._count


@st.composite
def framings(draw: st.DrawFn) -> tuple[bytes, int, int, list[int]]:
    lengths = draw(st.lists(st.integers(0, 12), max_size=40))
    data = bytearray(_frame(lengths))
    if data and draw(st.booleans()):
        # Corrupt one byte: may make a prefix claim too much, or split differently.
        at = draw(st.integers(0, len(data) - 1))
        data[at] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        data += bytes(draw(st.integers(1, 5)))  # trailing bytes the count does not cover
    elements = max(0, len(lengths) + draw(st.integers(-3, 3)))
    cuts = draw(st.lists(st.integers(0, len(data)), max_size=6))
    return bytes(data), elements, len(data), cuts


@settings(max_examples=400, deadline=None)
@given(framings())
def test_skimming_and_checking_agree(case: tuple[bytes, int, int, list[int]]) -> None:
    data, elements, size, cuts = case
    assert _outcome(data, elements, size, cuts, False) == _outcome(data, elements, size, cuts, True)


@pytest.mark.parametrize("chunk", [1, 3, 4, 5, 7, 64, 10_000])
def test_every_chunking_counts_every_element(chunk: int) -> None:
    lengths = [i % 17 for i in range(500)]
    data = _frame(lengths)
    cuts = list(range(chunk, len(data), chunk))
    assert _outcome(data, 500, len(data), cuts, False) == 500


def test_too_many_elements_raise_at_the_first_extra_prefix() -> None:
    data = _frame([1, 2, 3])
    msg, offset = _outcome(data, 2, len(data), [], False)  # type: ignore[misc]
    assert "more than the 2" in msg
    assert offset == 100 + 5 + 6  # base + the two elements the shape holds


def test_overrun_raises_at_the_prefix_that_claims_it() -> None:
    data = _frame([1, 2]) + struct.pack("<I", 50) + b"abc"
    msg, offset = _outcome(data, 3, len(data), [9], False)  # type: ignore[misc]
    assert "claims 50 bytes" in msg
    assert offset == 100 + 11


def _split_outcome(data: bytes, elements: int, size: int) -> Outcome | list[bytes]:
    framer = BytesFramer("input 't'", elements, size, 100)
    try:
        arr = framer.split(data)
    except RemoteProtocolError as exc:
        return (str(exc), exc.offset)
    assert arr.dtype == object and arr.shape == (elements,)
    return list(arr)


@settings(max_examples=400, deadline=None)
@given(framings())
def test_split_checks_like_feed_and_finish(case: tuple[bytes, int, int, list[int]]) -> None:
    data, elements, size, _ = case
    whole = _outcome(data, elements, size, [], True)
    got = _split_outcome(data, elements, size)
    if isinstance(whole, int):  # valid: the same elements as split_bytes
        assert got == list(split_bytes(data, elements))
    else:
        assert got == whole


def test_split_returns_the_elements() -> None:
    items = [b"", b"a", b"\xff" * 9, b"xyz"]
    data = b"".join(struct.pack("<I", len(x)) + x for x in items)
    assert _split_outcome(data, 4, len(data)) == items
    assert _split_outcome(memoryview(data), 4, len(data)) == items  # type: ignore[arg-type]
