"""TensorAssembler: one copy per byte, into its own memory or the caller's."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import binproto
from binproto import LocalProtocolError, Parser, TensorAssembler

from .helpers import arrays_equal, bytes_tensor, chunkings, make_body


def _body() -> tuple[bytes, int, dict[str, np.ndarray[Any, Any]]]:
    f = np.linspace(-1, 1, 24, dtype="<f4").reshape(2, 3, 4)
    b = np.array([True, False, True])
    s = [b"x", b"", b"\xff" * 7]
    raw_s = bytes_tensor(s)
    header = {"outputs": [
        {"name": "f", "shape": [2, 3, 4], "datatype": "FP32",
         "parameters": {"binary_data_size": f.nbytes}},
        {"name": "j", "shape": [2], "datatype": "INT64", "data": [5, 6]},
        {"name": "b", "shape": [3], "datatype": "BOOL", "parameters": {"binary_data_size": 3}},
        {"name": "s", "shape": [3], "datatype": "BYTES",
         "parameters": {"binary_data_size": len(raw_s)}},
        {"name": "z", "shape": [0], "datatype": "FP64", "parameters": {"binary_data_size": 0}},
    ]}  # fmt: skip
    body, hl = make_body(header, f.tobytes(), b.tobytes(), raw_s)
    expected = {
        "f": f,
        "j": np.array([5, 6], dtype="<i8"),
        "b": b,
        "s": np.array(s, dtype=object),
        "z": np.zeros(0),
    }
    return body, hl, expected


def _assemble(body: bytes, hl: int, chunks: list[Any], asm: TensorAssembler) -> None:
    p = Parser("response", header_length=hl, content_length=len(body))
    for c in chunks:
        p.receive_data(c)
        for ev in p.events():
            asm.feed(ev)
    assert p.state is binproto.ParserState.DONE


def test_assembles_every_chunking_to_the_decoded_arrays() -> None:
    body, hl, expected = _body()
    decoded = binproto.decode_response(body, header_length=hl).tensors
    for chunks in chunkings(body, two_way_limit=0):
        asm = TensorAssembler()
        _assemble(body, hl, chunks, asm)
        assert set(asm.tensors) == set(expected)
        for name, arr in expected.items():
            assert arrays_equal(asm.tensors[name], arr), name
            assert arrays_equal(asm.tensors[name], decoded[name]), name
            assert asm.tensors[name].dtype == decoded[name].dtype


def test_arrays_own_their_memory_not_the_chunks() -> None:
    body, hl, _ = _body()
    buf = bytearray(body)
    asm = TensorAssembler()
    _assemble(body, hl, [buf], asm)
    f = asm.tensors["f"]
    assert f.flags.writeable
    buf[hl : hl + 4] = b"\0\0\0\0"  # the caller reuses its buffer
    assert f.ravel()[0] == np.float32(-1)


def test_into_caller_destinations() -> None:
    body, hl, expected = _body()
    dest = np.empty((2, 3, 4), dtype=np.float32)
    asm = TensorAssembler({"f": dest})
    _assemble(body, hl, [body[:100], body[100:]], asm)
    assert asm.tensors["f"] is dest
    np.testing.assert_array_equal(dest, expected["f"])

    seen: list[str] = []

    def choose(info: binproto.TensorInfo) -> np.ndarray[Any, Any] | None:
        seen.append(info.name)
        return np.empty(info.binary_size or 0, dtype=np.uint8) if info.name == "b" else None

    asm = TensorAssembler(choose)
    _assemble(body, hl, [body], asm)
    assert asm.tensors["b"].tobytes() == b"\x01\x00\x01"
    assert asm.tensors["f"].dtype == np.float32  # None: the assembler allocated
    assert "s" not in seen  # BYTES always uses the assembler's memory


@pytest.mark.parametrize(
    "bad",
    [
        np.empty(5, dtype=np.float32),  # wrong size
        np.empty((4, 6), dtype=np.float32)[:, ::2],  # not contiguous
        np.empty(24, dtype=np.float32).copy(),  # fine size but made read-only below
        np.empty(24, dtype=">f4"),  # big-endian: the body's values are little-endian
    ],
)
def test_bad_destinations_are_local_errors(bad: np.ndarray[Any, Any]) -> None:
    body, hl, _ = _body()
    if bad.size == 24 and bad.flags.c_contiguous:
        bad.flags.writeable = False
    with pytest.raises(LocalProtocolError):
        _assemble(body, hl, [body], TensorAssembler({"f": bad}))


@pytest.mark.parametrize("overlap", [True, False])
def test_overlapping_destinations_are_a_local_error(overlap: bool) -> None:
    """Two tensors in one memory would overwrite each other: refused, whichever
    way the destinations are given; side by side in one buffer is fine."""
    body, hl, expected = _body()
    memory = np.zeros(128, dtype=np.uint8)
    f = memory[:96].view("<f4").reshape(2, 3, 4)
    b = memory[95:98] if overlap else memory[96:99]
    for destinations in (
        {"f": f, "b": b},
        lambda info: {"f": f, "b": b}.get(info.name),
    ):
        asm = TensorAssembler(destinations)
        if overlap:
            with pytest.raises(LocalProtocolError, match="'b' overlaps the destination of 'f'"):
                _assemble(body, hl, [body], asm)
        else:
            _assemble(body, hl, [body], asm)
            assert asm.tensors["f"] is f and asm.tensors["b"] is b
            np.testing.assert_array_equal(f, expected["f"])
            np.testing.assert_array_equal(b.view(bool), expected["b"])


@pytest.mark.parametrize("stray", [None, 300, 999])
def test_many_destinations_side_by_side_and_one_astray(stray: int | None) -> None:
    """A thousand tensors into one buffer, each beside the last (in shuffled
    order of address): accepted; one of them moved half over another's bytes:
    refused, naming the tensor it overlaps."""
    count = 1000
    header = {"outputs": [
        {"name": f"t{k}", "shape": [1], "datatype": "FP32", "parameters": {"binary_data_size": 4}}
        for k in range(count)
    ]}  # fmt: skip
    values = np.arange(count, dtype="<f4")
    body, hl = make_body(header, values.tobytes())
    memory = np.zeros(count + 1, dtype="<f4")
    slots = np.random.default_rng(5).permutation(count)  # where each tensor goes

    def place(info: binproto.TensorInfo) -> np.ndarray[Any, Any]:
        if info.index == stray:
            # Two bytes into the slot of tensor 0 (last: so the others are taken).
            start = int(slots[0]) * 4 + 2
            return memory.view(np.uint8)[start : start + 4].view("<f4")
        return memory[slots[info.index] : slots[info.index] + 1]

    asm = TensorAssembler(place)
    if stray is None:
        _assemble(body, hl, [body], asm)
        np.testing.assert_array_equal(memory[slots], values)
    else:
        with pytest.raises(
            LocalProtocolError, match=f"'t{stray}' overlaps the destination of 't0'"
        ):
            _assemble(body, hl, [body], asm)


@pytest.mark.parametrize("bad", [[1, 2], "f", 3])
def test_destinations_of_another_kind_are_a_local_error(bad: Any) -> None:
    with pytest.raises(LocalProtocolError, match="destinations must be a mapping"):
        TensorAssembler(bad)


def test_chunk_before_header_is_local_error() -> None:
    ev = binproto.TensorChunk(index=0, name="x", offset=0, data=memoryview(b"a"))
    with pytest.raises(LocalProtocolError):
        TensorAssembler().feed(ev)


def test_message_bundles_header_and_tensors() -> None:
    body, hl, expected = _body()
    asm = TensorAssembler()
    with pytest.raises(LocalProtocolError):
        asm.message()
    _assemble(body, hl, [body], asm)
    msg = asm.message()
    assert isinstance(msg, binproto.DecodedMessage)
    assert msg.header is asm.header and set(msg.tensors) == set(expected)


def test_a_size_the_system_cannot_grant_is_a_413_not_a_memory_error() -> None:
    # With no Content-Length, a claim within the limits is all the assembler
    # has to go by: 1 PiB is more than any machine here will reserve.
    size = 2**50
    limits = binproto.Limits(max_tensor_bytes=size, max_body_bytes=2 * size)
    body, hl = make_body(
        {"inputs": [{"name": "x", "datatype": "UINT8", "shape": [size],
                     "parameters": {"binary_data_size": size}}]},
        b"\0",
    )  # fmt: skip
    p = Parser("request", header_length=hl, limits=limits)
    asm = TensorAssembler()
    p.receive_data(body)
    with pytest.raises(binproto.RemoteProtocolError) as exc:
        for event in p.events():
            asm.feed(event)
    assert exc.value.status_hint == 413
    assert f"cannot allocate {size} bytes for tensor 'x'" in exc.value.msg


# -- chunks received in place ------------------------------------------------------


def _in_place_setup() -> tuple[bytes, int, np.ndarray[tuple[int], np.dtype[np.float32]]]:
    x = np.arange(4096, dtype="<f4")
    header = {
        "outputs": [
            {
                "name": "x",
                "shape": [4096],
                "datatype": "FP32",
                "parameters": {"binary_data_size": x.nbytes},
            }
        ]
    }
    body, hl = make_body(header, x.tobytes())
    return body, hl, x


def _drain(p: Parser, asm: TensorAssembler) -> None:
    for ev in p.events():
        asm.feed(ev)


def test_slices_of_the_target_are_not_copied() -> None:
    body, hl, x = _in_place_setup()
    p = Parser("response", header_length=hl, content_length=len(body))
    asm = TensorAssembler()
    p.receive_data(body[:hl])
    _drain(p, asm)
    payload = memoryview(body)[hl:]
    off = 0
    while (region := p.next_tensor_region()) is not None:
        index, offset, count = region
        view = asm.target(index)[offset : offset + min(count, 5000)]
        view[:] = payload[off : off + len(view)]  # as recv_into would
        off += len(view)
        p.receive_data(view)
        _drain(p, asm)
    assert asm.bytes_in_place == x.nbytes and asm.bytes_copied == 0
    np.testing.assert_array_equal(asm.tensors["x"], x)


def test_writable_chunks_of_other_buffers_are_copied() -> None:
    body, hl, x = _in_place_setup()
    p = Parser("response", header_length=hl, content_length=len(body))
    asm = TensorAssembler()
    scratch = bytearray(body)  # writable, but not the assembler's memory
    view = memoryview(scratch)
    for a in range(0, len(scratch), 3000):
        p.receive_data(view[a : a + 3000])
        _drain(p, asm)
    assert asm.bytes_copied == x.nbytes and asm.bytes_in_place == 0
    np.testing.assert_array_equal(asm.tensors["x"], x)


def test_a_destination_array_receives_in_place_too() -> None:
    body, hl, x = _in_place_setup()
    dest = np.zeros(4096, dtype="<f4")
    p = Parser("response", header_length=hl, content_length=len(body))
    asm = TensorAssembler({"x": dest})
    p.receive_data(body[:hl])
    _drain(p, asm)
    region = p.next_tensor_region()
    assert region is not None
    index, offset, count = region
    view = asm.target(index)[offset : offset + count]
    view[:] = body[hl:]
    p.receive_data(view)
    _drain(p, asm)
    assert asm.tensors["x"] is dest and asm.bytes_in_place == x.nbytes
    np.testing.assert_array_equal(dest, x)


def _events() -> list[binproto.Event]:
    body, hl, _ = _body()
    p = Parser("response", header_length=hl)
    p.receive_data(body[: hl + 50])  # the first tensor in two chunks
    events = list(p.events())
    p.receive_data(body[hl + 50 :])
    p.receive_data(b"")
    return events + list(p.events())


def _misfed(events: list[binproto.Event]) -> None:
    asm = TensorAssembler()
    for event in events:
        asm.feed(event)


@pytest.mark.parametrize(
    "misfeed",
    [
        # A tensor complete without its bytes, or part of them: no
        # uninitialized memory handed out as a tensor.
        lambda evs: [e for e in evs if type(e) is not binproto.TensorChunk],
        lambda evs: [e for i, e in enumerate(evs) if i != 1],
        # Chunks out of order; a tensor completed twice.
        lambda evs: [evs[0], evs[2], evs[1], *evs[3:]],
        lambda evs: [*evs, evs[-2]],
        # A TensorComplete of another message's header.
        lambda evs: [*evs[:-1], _other_complete(), evs[-1]],
        # The JSON-data tensor's completion twice, or another message's.
        lambda evs: [*evs[:5], evs[4], *evs[5:]],
        lambda evs: [*evs[:-1], _other_complete(1), evs[-1]],
    ],
    ids=[
        "no chunks",
        "a chunk missing",
        "out of order",
        "complete twice",
        "another message",
        "JSON data twice",
        "JSON data of another message",
    ],
)
def test_events_no_parser_sends_are_refused(misfeed: Any) -> None:
    events = _events()
    assert [type(e).__name__ for e in events[:4]] == [
        "HeaderParsed",
        "TensorChunk",
        "TensorChunk",
        "TensorComplete",
    ]
    _misfed(events)  # as the parser sent them: fine
    with pytest.raises(LocalProtocolError):
        _misfed(misfeed(events))


def _other_complete(which: int = 0) -> binproto.TensorComplete:
    completes = [e for e in _events() if type(e) is binproto.TensorComplete]
    return completes[which]


@pytest.mark.parametrize("index", [-1, 5, 1], ids=["negative", "past the end", "JSON data"])
def test_target_of_a_tensor_without_binary_bytes_is_refused(index: int) -> None:
    asm = TensorAssembler()
    asm.feed(_events()[0])  # its HeaderParsed
    with pytest.raises(LocalProtocolError):
        asm.target(index)


def test_a_destination_of_objects_is_refused() -> None:
    body, hl, _ = _body()
    p = Parser("response", header_length=hl)
    p.receive_data(body)
    asm = TensorAssembler({"f": np.empty(3, dtype=[("p", object)])})
    with pytest.raises(LocalProtocolError, match="plain values"):
        for event in p.events():
            asm.feed(event)


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_a_matrix_destination_receives_its_tensor() -> None:
    body, hl, expected = _body()
    p = Parser("response", header_length=hl)
    p.receive_data(body)
    dest = np.asmatrix(np.zeros((4, 6), dtype="<f4"))  # 2-D whatever it is reshaped to
    asm = TensorAssembler({"f": dest})
    for event in p.events():
        asm.feed(event)
    assert asm.tensors["f"] is dest
    assert np.array_equal(np.asarray(dest).reshape(2, 3, 4), expected["f"])


def test_a_second_header_is_refused() -> None:
    asm = TensorAssembler()
    asm.feed(_events()[0])
    with pytest.raises(LocalProtocolError, match="one message"):
        asm.feed(_events()[0])  # another message's HeaderParsed


def test_a_numpy_integer_index_is_taken() -> None:
    asm = TensorAssembler()
    asm.feed(_events()[0])
    assert len(asm.target(np.int64(0))) == 24 * 4  # type: ignore[arg-type, unused-ignore]


@pytest.mark.parametrize("datatype", sorted(set(binproto.DATATYPES) - {"BYTES"}))
def test_each_datatype_is_assembled_into_an_array_of_its_own_dtype_and_shape(
    datatype: str,
) -> None:
    dtype = binproto.DATATYPES[datatype].dtype
    # (BOOL: 1s only, as strict_bool wants)
    raw = b"\x01" * 12 if datatype == "BOOL" else bytes(range(1, 1 + 12 * dtype.itemsize))
    header = {"outputs": [
        {"name": "t", "shape": [3, 4], "datatype": datatype,
         "parameters": {"binary_data_size": len(raw)}},
        {"name": "empty", "shape": [0, 2], "datatype": datatype,
         "parameters": {"binary_data_size": 0}},
    ]}  # fmt: skip
    body, hl = make_body(header, raw)
    for chunks in chunkings(body, two_way_limit=0):
        asm = TensorAssembler()
        _assemble(body, hl, chunks, asm)
        t, empty = asm.tensors["t"], asm.tensors["empty"]
        assert t.dtype == dtype and t.shape == (3, 4) and t.tobytes() == raw
        assert t.flags.writeable and t.flags.c_contiguous and t.flags.aligned
        assert empty.dtype == dtype and empty.shape == (0, 2) and empty.flags.writeable
    # Each target is its array's bytes, flat and writable: memoryview's cast
    # for most, as_byte_view where it cannot (no elements; bfloat16).
    asm = TensorAssembler()
    p = Parser("response", header_length=hl)
    p.receive_data(body)
    asm.feed(next(p.events()))
    for index, size in ((0, len(raw)), (1, 0)):
        target = asm.target(index)
        assert (target.format, target.ndim, target.nbytes, target.readonly) == ("B", 1, size, False)


def test_the_target_of_a_tensor_without_elements_is_empty_and_writable() -> None:
    asm = TensorAssembler()
    body, hl, _ = _body()
    p = Parser("response", header_length=hl)
    p.receive_data(body)
    asm.feed(next(p.events()))
    target = asm.target(4)  # "z": FP64 of shape [0]
    assert len(target) == 0 and not target.readonly
