"""BYTES framing: the streaming element decoder and the bulk splitter agree in
every chunking, and faults land at the same offset however the bytes arrive."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from binproto import (
    BytesDecoder,
    LocalProtocolError,
    Parser,
    RemoteProtocolError,
    decode_request,
    split_bytes,
)

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


def test_misuse() -> None:
    dec = BytesDecoder(1, 5)
    with pytest.raises(LocalProtocolError):
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
