"""Parser.next_tensor_region: where the next body bytes belong, for
receiving them in place."""

from __future__ import annotations

import gzip
from typing import Any

import numpy as np
import pytest

import binproto
from binproto import (
    NEED_DATA,
    LocalProtocolError,
    Parser,
    RemoteProtocolError,
    TensorAssembler,
    TensorComplete,
)

# -- spec examples -----------------------------------------------------------------


# -- next_tensor_region: where the next body bytes belong --------------------------


def _region_body(**kw: Any) -> binproto.EncodedBody:
    inputs = {
        "a": np.arange(10, dtype=np.int32),
        "j": [1, 2, 3],
        "b": np.array([True, False, True]),
    }
    return binproto.encode_request(inputs, **kw)


def _region_parser(body: binproto.EncodedBody) -> Parser:
    return Parser("request", header_length=body.header_length, content_length=body.content_length)


def _region_take(p: Parser, asm: TensorAssembler) -> None:
    for event in p.events():
        asm.feed(event)


def test_regions_walk_the_binary_tensors_in_body_order() -> None:
    body = _region_body()
    p = _region_parser(body)
    assert p.next_tensor_region() is None  # still in the JSON header
    p.receive_data(body.json)
    asm = TensorAssembler()
    assert p.next_tensor_region() is None  # the header is buffered, not parsed
    _region_take(p, asm)
    assert p.next_tensor_region() == (0, 0, 40)
    data = bytes(body)[len(body.json) :]
    # Fill tensor "a" in two receives straight into its memory.
    view = asm.target(0)[0:15]
    view[:] = data[:15]
    p.receive_data(view)
    _region_take(p, asm)
    assert p.next_tensor_region() == (0, 15, 25)
    view = asm.target(0)[15:40]
    view[:] = data[15:40]
    p.receive_data(view)
    _region_take(p, asm)
    # "j" is JSON data: its TensorComplete needed no bytes; next comes "b" (index 2).
    assert p.next_tensor_region() == (2, 0, 3)
    view = asm.target(2)[0:3]
    view[:] = data[40:43]
    p.receive_data(view)
    _region_take(p, asm)
    assert p.next_tensor_region() is None  # the message is complete
    assert p.state is binproto.ParserState.DONE
    assert asm.bytes_in_place == 43 and asm.bytes_copied == 0
    np.testing.assert_array_equal(asm.tensors["a"], np.arange(10, dtype=np.int32))
    np.testing.assert_array_equal(asm.tensors["b"], [True, False, True])


def test_no_region_while_bytes_wait_in_the_parser() -> None:
    body = _region_body()
    p = _region_parser(body)
    p.receive_data(bytes(body)[: len(body.json) + 4])
    event = p.next_event()
    assert type(event) is binproto.HeaderParsed
    assert p.next_tensor_region() is None  # 4 bytes of "a" are queued
    assert type(p.next_event()) is binproto.TensorChunk
    assert p.next_tensor_region() == (0, 4, 36)


def test_no_region_when_the_next_event_needs_no_bytes() -> None:
    body = binproto.encode_request({"z": np.zeros((0, 3), dtype=np.float32), "j": [1]})
    p = _region_parser(body)
    p.receive_data(bytes(body))
    assert type(p.next_event()) is binproto.HeaderParsed
    assert p.next_tensor_region() is None  # zero-size: complete at once
    assert type(p.next_event()) is TensorComplete


def test_no_region_for_a_compressed_body() -> None:
    noise = np.random.default_rng(0).integers(0, 2**31, 1 << 16, dtype=np.int32)
    body = binproto.encode_request({"a": noise})
    packed = gzip.compress(bytes(body))
    p = Parser(
        "request",
        header_length=body.header_length,
        content_length=len(packed),
        content_encoding="gzip",
    )
    p.receive_data(packed[: len(packed) // 2])
    assert type(p.next_event()) is binproto.HeaderParsed
    while p.next_event() is not NEED_DATA:
        pass
    assert p.state is binproto.ParserState.TENSORS  # in the middle of "a"
    assert p.next_tensor_region() is None  # its bytes come out of the inflater


def test_bytes_received_in_place_are_still_checked() -> None:
    body = _region_body()
    p = _region_parser(body)
    asm = TensorAssembler()
    p.receive_data(body.json)
    _region_take(p, asm)
    view = asm.target(0)[0:40]
    view[:] = bytes(40)
    p.receive_data(view)
    _region_take(p, asm)
    assert p.next_tensor_region() == (2, 0, 3)
    bad = asm.target(2)[0:3]
    bad[:] = b"\x00\x07\x01"  # BOOL must be 0 or 1
    p.receive_data(bad)
    with pytest.raises(RemoteProtocolError, match="invalid BOOL value 7") as info:
        _region_take(p, asm)
    assert info.value.offset == len(body.json) + 40 + 1
    assert p.next_tensor_region() is None


@pytest.mark.parametrize("name", ["header_length", "content_length"])
@pytest.mark.parametrize("bad", [-1, 1.0, "3", True, np.int64(3)])
def test_lengths_that_are_not_non_negative_ints_are_the_callers_error(
    name: str, bad: object
) -> None:
    with pytest.raises(LocalProtocolError, match=f"{name} must be None or a non-negative int"):
        Parser("request", **{name: bad})  # type: ignore[arg-type]
    if name == "header_length":
        with pytest.raises(LocalProtocolError, match="header_length must be"):
            binproto.decode_request(b"{}", header_length=bad)  # type: ignore[arg-type]
