"""The parser's pieces: the chunk queue and the readers, driven directly."""

from __future__ import annotations

import gzip
import json

import pytest

import binproto
from binproto._bytes import BytesFramer
from binproto._compression import Inflater
from binproto._datatypes import DATATYPES
from binproto._readers import (
    TENSOR_CHECKS,
    ChunkQueue,
    TensorReader,
    read_end,
    read_header,
)

from .helpers import make_body


def test_take_slices_one_chunk_and_never_joins() -> None:
    queue = ChunkQueue()
    first, second = memoryview(b"abcdef"), memoryview(b"gh")
    queue.append(first)
    queue.append(second)
    got = queue.take(4)
    assert got is not None and bytes(got) == b"abcd" and got.obj is first.obj
    rest = queue.take(100)
    assert rest is not None and bytes(rest) == b"ef"  # the rest of the first chunk only
    assert bytes(queue.take(100) or b"") == b"gh"
    assert queue.take(1) is None and not queue.ended
    queue.end()
    assert queue.ended and queue.input_ended


def test_clear_drops_what_is_queued() -> None:
    queue = ChunkQueue()
    queue.append(memoryview(b"abc"))
    queue.clear()
    assert queue.take(3) is None and not queue.waiting


def test_a_source_refills_the_queue_when_it_runs_dry() -> None:
    data = bytes(range(256)) * 4
    queue = ChunkQueue(Inflater("gzip", binproto.Limits(), None))
    queue.append(memoryview(gzip.compress(data)))
    assert not queue.waiting  # compressed bytes wait in the source
    queue.end()
    got = bytearray()
    while (piece := queue.take(100)) is not None:
        assert len(piece) <= 100
        got += piece
    assert bytes(got) == data and queue.ended


def test_read_header_waits_for_the_whole_header() -> None:
    body, hl = make_body({"inputs": [{"name": "x", "datatype": "INT8", "shape": [1], "data": [1]}]})
    buffer, limits = bytearray(), binproto.Limits()
    queue = ChunkQueue()
    queue.append(memoryview(body[:5]))
    assert read_header(queue, buffer, hl, "request", limits) is binproto.NEED_DATA
    assert bytes(buffer) == body[:5]
    queue.append(memoryview(body[5:]))
    header = read_header(queue, buffer, hl, "request", limits)
    assert isinstance(header, binproto.InferenceHeader) and header.tensors[0].name == "x"
    assert not buffer  # the header's copy is all the parser keeps


def test_a_header_in_one_byte_chunks_is_appended_in_place() -> None:
    id_ = "a" * (1 << 20)
    header = json.dumps({"id": id_, "inputs": []}).encode()
    buffer, limits = bytearray(), binproto.Limits()  # the one buffer the parser owns
    queue = ChunkQueue()
    view = memoryview(header)
    for i in range(len(header) - 1):
        queue.append(view[i : i + 1])
        assert read_header(queue, buffer, len(header), "request", limits) is binproto.NEED_DATA
    # One byte per call, appended in place.
    assert len(buffer) == len(header) - 1
    queue.append(view[-1:])
    parsed = read_header(queue, buffer, len(header), "request", limits)
    assert isinstance(parsed, binproto.InferenceHeader) and parsed.id == id_


def test_tensor_reader_emits_chunks_then_completion_then_none() -> None:
    body, hl = make_body(_bools(3), b"\x01\x00\x01")
    header = read_header(_queued(body[:hl]), bytearray(), hl, "request", binproto.Limits())
    assert isinstance(header, binproto.InferenceHeader)
    reader = TensorReader(header, strict_bool=True)
    queue = _queued(body[hl : hl + 2], body[hl + 2 :])
    assert reader.region() == (0, 0, 3)
    first = reader.read(queue)
    assert isinstance(first, binproto.TensorChunk) and bytes(first.data) == b"\x01\x00"
    assert reader.region() == (0, 2, 1) and reader.position == hl + 2
    assert isinstance(reader.read(queue), binproto.TensorChunk)
    assert isinstance(reader.read(queue), binproto.TensorComplete)
    assert reader.read(queue) is None
    queue.end()
    assert isinstance(read_end(queue, reader.position, None), binproto.MessageComplete)


def test_tensor_reader_checks_bool_bytes() -> None:
    body, hl = make_body(_bools(2), b"\x01\x07")
    header = read_header(_queued(body[:hl]), bytearray(), hl, "request", binproto.Limits())
    assert isinstance(header, binproto.InferenceHeader)
    reader = TensorReader(header, strict_bool=True)
    with pytest.raises(binproto.RemoteProtocolError) as err:
        reader.read(_queued(body[hl:]))
    assert err.value.offset == hl + 1
    lenient = TensorReader(header, strict_bool=False)
    assert isinstance(lenient.read(_queued(body[hl:])), binproto.TensorChunk)


@pytest.mark.parametrize("strict_bool", [True, False])
def test_tensor_checks_by_datatype(strict_bool: bool) -> None:
    # BYTES framing always, BOOL values when strict; no other datatype has a check.
    assert set(TENSOR_CHECKS) == {"BYTES", "BOOL"} and set(TENSOR_CHECKS) <= set(DATATYPES)
    info = binproto.TensorInfo(0, "x", "BYTES", (1,), {}, 8, None, 8)
    framing = TENSOR_CHECKS["BYTES"](info, "input", 10, strict_bool, False)
    assert isinstance(framing, BytesFramer)
    with pytest.raises(binproto.RemoteProtocolError, match="input 'x'") as err:
        framing.feed(memoryview(b"\x09\x00\x00\x00abcd"), 0)
        framing.finish()
    assert err.value.offset is not None and err.value.offset >= 10
    info = binproto.TensorInfo(0, "b", "BOOL", (2,), {}, 2, None, 2)
    values = TENSOR_CHECKS["BOOL"](info, "output", 0, strict_bool, False)
    assert (values is not None) == strict_bool


def test_read_end_refuses_bytes_after_the_message() -> None:
    with pytest.raises(binproto.RemoteProtocolError, match="additional input") as err:
        read_end(_queued(b"x"), 10, None)
    assert err.value.offset == 10
    assert read_end(ChunkQueue(), 10, 11) is binproto.NEED_DATA
    assert isinstance(read_end(ChunkQueue(), 10, 10), binproto.MessageComplete)


def _queued(*pieces: bytes) -> ChunkQueue:
    queue = ChunkQueue()
    for piece in pieces:
        queue.append(memoryview(piece))
    return queue


def _bools(count: int) -> dict[str, object]:
    tensor = {"name": "b", "datatype": "BOOL", "shape": [count]}
    return {"inputs": [{**tensor, "parameters": {"binary_data_size": count}}]}
