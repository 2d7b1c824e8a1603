"""BYTES framing: the streaming element decoder and the bulk splitter agree in
every chunking, and faults land at the same offset however the bytes arrive."""

from __future__ import annotations

import itertools
import struct
import tracemalloc
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from binproto import (
    BytesDecoder,
    LocalProtocolError,
    Parser,
    RemoteProtocolError,
    decode_request,
    join_bytes,
    split_bytes,
)
from binproto._bytes import BytesFramer

from .helpers import bytes_tensor, chunkings, make_body, run, split

ITEMS = [b"", b"a", b"\x00\x01\x02\x03", b"\xff" * 9, b"", b"xyz"]
RAW = bytes_tensor(ITEMS)


def _decode(chunks: list[bytes], elements: int, size: int) -> list[bytes] | tuple[str, int | None]:
    dec = BytesDecoder(elements, size)
    got: list[bytes] = []
    try:
        for c in chunks:
            got += dec.feed(c)
        dec.finish()
    except RemoteProtocolError as exc:
        return (exc.msg, exc.offset)
    return got


def test_every_chunking_gives_every_element() -> None:
    for chunks in chunkings(RAW):
        assert _decode(chunks, len(ITEMS), len(RAW)) == ITEMS
    assert list(split_bytes(RAW, len(ITEMS))) == ITEMS


@given(st.lists(st.binary(max_size=12), max_size=12), st.data())
@settings(max_examples=200, deadline=None)
def test_hypothesis_elements_and_splits(items: list[bytes], data: st.DataObject) -> None:
    raw = bytes_tensor(items)
    points = data.draw(st.lists(st.integers(0, max(len(raw), 1)), max_size=8))
    assert _decode(split(raw, points), len(items), len(raw)) == items
    assert list(split_bytes(raw, len(items))) == items


@pytest.mark.parametrize(
    ("raw", "elements", "message", "offset"),
    [
        (b"\x09\0\0\0abc", 1, "claims 9 bytes but only 3 remain", 0),
        (bytes_tensor([b"ab"]) + b"\0\0\0\0", 1, "more than the 1", 6),
        (bytes_tensor([b"ab"]), 2, "holds 1, its shape 2", 6),
        (bytes_tensor([b"ab"]) + b"\0\0", 2, "partial length prefix", 8),
    ],
)
def test_faults_at_the_same_offset_in_every_chunking(
    raw: bytes, elements: int, message: str, offset: int
) -> None:
    for chunks in chunkings(raw):
        got = _decode(chunks, elements, len(raw))
        assert isinstance(got, tuple), got
        assert message in got[0]
        assert got[1] == offset


@pytest.mark.parametrize(
    "call",
    [
        lambda: split_bytes(b"", -1),
        lambda: split_bytes(b"", "1"),  # type: ignore[arg-type]
        lambda: split_bytes(b"\0\0\0\0", True),
        lambda: split_bytes("abcd", 1),
        lambda: split_bytes(np.arange(8, dtype=np.uint8)[::2], 1),
        lambda: BytesDecoder(-1, 0),
        lambda: BytesDecoder(1, -4),
        lambda: BytesDecoder(None, 5),
        lambda: BytesDecoder(1, 5).feed("abcde"),
    ],
)
def test_a_count_or_buffer_of_the_wrong_kind_is_misuse(call: Callable[[], object]) -> None:
    with pytest.raises(LocalProtocolError):
        call()


def test_counts_of_any_integer_type_are_taken() -> None:
    assert split_bytes(b"\1\0\0\0a", np.int64(1)).tolist() == [b"a"]


def test_misuse() -> None:
    dec = BytesDecoder(1, 5)
    with pytest.raises(LocalProtocolError, match="more than the tensor's binary_data_size"):
        dec.feed(b"123456")
    with pytest.raises(LocalProtocolError):
        BytesDecoder(3)


BAD_BYTES = [
    (b"\x09\0\0\0abc", 1),
    (bytes_tensor([b"ab"]) + b"\0\0\0\0", 1),
    (bytes_tensor([b"ab"]) + b"\0\0", 2),
    (bytes_tensor([b"ab", b"c"]), 3),
]


@pytest.mark.parametrize(("raw", "elements"), BAD_BYTES)
def test_whole_body_decode_reports_bytes_faults_as_the_parser_does(
    raw: bytes, elements: int
) -> None:
    header = {"inputs": [{"name": "s", "shape": [elements], "datatype": "BYTES",
                          "parameters": {"binary_data_size": len(raw)}}]}  # fmt: skip
    body, hl = make_body(header, raw)
    streamed = run(lambda: Parser("request", header_length=hl), [body])
    assert streamed.error is not None
    with pytest.raises(RemoteProtocolError) as info:
        decode_request(body, header_length=hl)
    assert (info.value.msg, info.value.offset) == (streamed.error[1], streamed.error[3])


@pytest.mark.parametrize(("raw", "elements"), BAD_BYTES)
@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compressed_bytes_faults_too(raw: bytes, elements: int, encoding: str) -> None:
    from binproto import compress_buffers

    header = {"inputs": [{"name": "s", "shape": [elements], "datatype": "BYTES",
                          "parameters": {"binary_data_size": len(raw)}}]}  # fmt: skip
    body, hl = make_body(header, raw)
    packed = b"".join(compress_buffers([body], encoding))
    plain = run(lambda: Parser("request", header_length=hl), [body])
    assert plain.error is not None
    with pytest.raises(RemoteProtocolError) as info:
        decode_request(packed, header_length=hl, content_encoding=encoding)
    assert (info.value.msg, info.value.offset) == (plain.error[1], plain.error[3])


# -- BytesFramer ----------------------------------------------------------------

Outcome = tuple[str, int | None] | int


def _frame(lengths: list[int]) -> bytes:
    return b"".join(struct.pack("<I", n) + b"x" * n for n in lengths)


def _outcome(
    data: bytes, elements: int, size: int, cuts: list[int], collect: bool = False
) -> Outcome:
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
def test_a_framing_has_one_outcome_in_every_chunking(
    case: tuple[bytes, int, int, list[int]],
) -> None:
    data, elements, size, cuts = case
    assert _outcome(data, elements, size, cuts) == _outcome(data, elements, size, [])


@settings(max_examples=200, deadline=None)
@given(framings())
def test_collected_elements_are_the_framed_ones(case: tuple[bytes, int, int, list[int]]) -> None:
    data, elements, size, cuts = case
    framer = BytesFramer("input 't'", elements, size, 100, collect=True)
    bounds = [0, *sorted(c for c in cuts if 0 < c < len(data)), len(data)]
    got: list[bytes] = []
    try:
        for a, b in itertools.pairwise(bounds):
            framer.feed(data[a:b], a)
            got += framer.take()
        framer.finish()
    except RemoteProtocolError as exc:
        assert _outcome(data, elements, size, []) == (str(exc), exc.offset)
        return
    assert got == list(split_bytes(data, elements))


def test_split_bytes_refuses_bad_framing() -> None:
    with pytest.raises(RemoteProtocolError, match="claims 9 bytes"):
        split_bytes(struct.pack("<I", 9) + b"ab", 1)
    with pytest.raises(RemoteProtocolError, match="holds 1, its shape 2"):
        split_bytes(_frame([2]), 2)


def test_join_bytes_frames_each_element_by_its_byte_count() -> None:
    ints = np.array([1, 2], np.int32)  # len() 2, 8 bytes
    empty = np.zeros((3, 0), np.uint8)  # len() 3, no bytes
    elements = [ints.data, b"ab", bytearray(b"c"), empty, ints.reshape(1, 2)]
    joined = join_bytes(elements)
    expected = [ints.tobytes(), b"ab", b"c", b"", ints.tobytes()]
    assert split_bytes(joined, len(elements)).tolist() == expected


def test_join_bytes_takes_any_iterable() -> None:
    assert split_bytes(join_bytes(e for e in ITEMS), len(ITEMS)).tolist() == ITEMS
    assert split_bytes(join_bytes(tuple(ITEMS)), len(ITEMS)).tolist() == ITEMS
    assert join_bytes(iter([])).size == 0


@pytest.mark.parametrize(
    ("elements", "message"),
    [
        ([b"a", "b"], "BYTES element 1: expected bytes, got str: encode it"),
        ([b"a", np.str_("ab")], "BYTES element 1: expected bytes, got str"),
        ([np.array([b"a"], dtype=object)], "BYTES element 0: .*Python objects"),
        ([b"a", None], "BYTES element 1: expected a bytes-like object, got NoneType"),
        ([np.arange(4, dtype=np.uint8)[::2]], "BYTES element 0: .*C-contiguous"),
        (5, "join_bytes takes an iterable of bytes-like elements, got int"),
    ],
)
def test_join_bytes_refuses_what_is_not_bytes_like(elements: object, message: str) -> None:
    with pytest.raises(LocalProtocolError, match=message):
        join_bytes(elements)  # type: ignore[arg-type]


@pytest.mark.parametrize("chunk", [1, 3, 4, 5, 7, 64, 10_000])
def test_every_chunking_counts_every_element(chunk: int) -> None:
    lengths = [i % 17 for i in range(500)]
    data = _frame(lengths)
    cuts = list(range(chunk, len(data), chunk))
    assert _outcome(data, 500, len(data), cuts) == 500


def test_too_many_elements_raise_at_the_first_extra_prefix() -> None:
    data = _frame([1, 2, 3])
    msg, offset = _outcome(data, 2, len(data), [])  # type: ignore[misc]
    assert "more than the 2" in msg
    assert offset == 100 + 5 + 6  # base + the two elements the shape holds


def test_overrun_raises_at_the_prefix_that_claims_it() -> None:
    data = _frame([1, 2]) + struct.pack("<I", 50) + b"abc"
    msg, offset = _outcome(data, 3, len(data), [9])  # type: ignore[misc]
    assert "claims 50 bytes" in msg
    assert offset == 100 + 11


@pytest.mark.parametrize("collect", [False, True])
def test_a_framer_refuses_bytes_past_its_tensor(collect: bool) -> None:
    # An element that would end past the tensor inside the chunk fed is then
    # never taken for one the next chunk goes on with.
    data = _frame([1, 2])
    framer = BytesFramer("t", 2, len(data) - 1, 0, collect=collect)
    with pytest.raises(LocalProtocolError, match="3 bytes fed at offset 8"):
        framer.feed(data[8:], 8)
    framer.feed(data[:8], 0)
    with pytest.raises(LocalProtocolError):
        framer.feed(data[8:], 8)
    # The last element ends one byte past the tensor, inside the chunk.
    with pytest.raises(LocalProtocolError, match="11 bytes fed at offset 0"):
        BytesFramer("t", 2, len(data) - 1, 0, collect=collect).feed(data, 0)


def test_join_bytes_of_a_large_element_makes_one_copy() -> None:
    element = bytes(64 << 20)
    tracemalloc.start()
    try:
        joined = join_bytes([element])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert joined.size == len(element) + 4 and bytes(joined[:4]) == struct.pack("<I", len(element))
    assert peak < len(element) * 1.25  # the wire form itself, not a copy more
