"""BodyWriter: streaming bodies piece by piece, and every misuse it refuses."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import binproto
from binproto import BodyWriter, LocalProtocolError

from .helpers import arrays_equal, assert_same_everywhere

ARRAYS: dict[str, Any] = {
    "a": np.arange(6, dtype=np.float32).reshape(2, 3),
    "empty": np.empty((0, 2), np.int64),
    "j": [1, 2, 3],  # JSON data: not sent through the writer
    "s": np.array([b"xy", b"", b"\xff" * 5], dtype=object),
    "b": np.array([True, False]),
}


def encoded(kind: str = "response") -> binproto.EncodedBody:
    if kind == "request":
        return binproto.encode_request(ARRAYS)
    return binproto.encode_response(ARRAYS, model_name="m")


def header_dict(kind: str = "response") -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(encoded(kind).json)
    return obj


def stream(w: BodyWriter, pieces: list[tuple[int | str, Any]]) -> bytes:
    out = [w.start()]
    for tensor, data in pieces:
        out.append(bytes(w.send(tensor, data)))
    w.end()
    return b"".join(out)


def binary_pieces(body: binproto.EncodedBody, w: BodyWriter) -> list[tuple[int | str, Any]]:
    """The binary tensors' buffers, addressed by header index."""
    indices = [t.index for t in w.header.tensors if t.binary_size is not None]
    return list(zip(indices, body.buffers[1:], strict=True))


@pytest.mark.parametrize("kind", ["request", "response"])
@pytest.mark.parametrize("form", ["dict", "bytes", "encoded"])
def test_streams_the_same_body_as_the_encoder(kind: str, form: str) -> None:
    body = encoded(kind)
    headers: dict[str, Any] = {"dict": header_dict(kind), "bytes": body.json, "encoded": body}
    header = headers[form]
    w = BodyWriter(header)
    assert w.header.kind == kind
    assert (w.header_length, w.content_length, w.headers) == (
        body.header_length,
        body.content_length,
        body.headers,
    )
    assert stream(w, binary_pieces(body, w)) == bytes(body)
    assert w.bytes_sent == body.content_length


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_any_piece_sizes_by_name_or_index(data: st.DataObject) -> None:
    body = encoded()
    w = BodyWriter(body.json)
    pieces: list[tuple[int | str, Any]] = []
    for index, buf in binary_pieces(body, w):
        raw = memoryview(buf).cast("B")
        cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=4)))
        edges = [0, *cuts, len(raw)]
        name = w.header.tensors[int(index)].name
        key: int | str = index if data.draw(st.booleans()) else name
        pieces += [(key, raw[x:y]) for x, y in itertools.pairwise(edges)]
    raw_body = stream(w, pieces)
    assert raw_body == bytes(body)
    msg = binproto.decode_response(raw_body, header_length=w.header_length)
    assert arrays_equal(msg.tensors["s"], ARRAYS["s"])
    assert arrays_equal(msg.tensors["a"], ARRAYS["a"])


def test_send_passes_the_callers_buffer_through() -> None:
    arr = np.arange(4, dtype="<u4")
    w = BodyWriter(
        {
            "outputs": [
                {
                    "name": "o",
                    "datatype": "UINT32",
                    "shape": [4],
                    "parameters": {"binary_data_size": 16},
                }
            ]
        }
    )
    w.start()
    assert w.send("o", arr[:2]) is not None
    rest = arr[2:]
    assert w.send(0, rest) is rest
    w.end()


def test_send_takes_a_bfloat16_array_as_its_bytes() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    arr = np.array([[1.5, -2.0], [0.25, 3.0]], dtype=ml_dtypes.bfloat16)
    header = {
        "outputs": [
            {"name": "o", "datatype": "BF16", "shape": [4], "parameters": {"binary_data_size": 8}}
        ]
    }
    w = BodyWriter(header)
    head = w.start()
    assert w.send("o", arr[:1]) is not None
    w.send("o", arr[1])
    w.end()
    body = head + arr.tobytes()
    msg = binproto.decode_response(body, header_length=w.header_length)
    assert msg.tensors["o"].tobytes() == arr.tobytes()
    w = BodyWriter(header)
    w.start()
    with pytest.raises(LocalProtocolError, match="C-contiguous"):
        w.send("o", arr[:, ::1].T)  # a transposed view: not C-contiguous


def test_streamed_body_parses_in_every_chunking() -> None:
    header = {
        "model_name": "m",
        "outputs": [
            {"name": "x", "datatype": "INT16", "shape": [3], "parameters": {"binary_data_size": 6}},
            {
                "name": "t",
                "datatype": "BYTES",
                "shape": [2],
                "parameters": {"binary_data_size": 10},
            },
        ],
    }
    w = BodyWriter(header)
    body = stream(
        w,
        [
            ("x", np.arange(3, dtype="<i2")),
            ("t", b"\x01\x00"),
            ("t", b"\x00\x00a\x01\x00\x00"),
            ("t", b"\x00b"),
        ],
    )
    outcome = assert_same_everywhere(
        lambda: binproto.Parser("response", header_length=w.header_length), body
    )
    assert outcome.error is None
    msg = binproto.decode_response(body, header_length=w.header_length)
    assert msg.tensors["t"].tolist() == [b"a", b"b"]


def test_json_only_header() -> None:
    w = BodyWriter(
        {
            "model_name": "m",
            "outputs": [{"name": "o", "datatype": "INT8", "shape": [1], "data": [3]}],
        }
    )
    assert w.header_length is None
    assert w.headers[-1] == ("Content-Type", "application/json")
    assert "Inference-Header-Content-Length" not in dict(w.headers)
    start = w.start()
    assert w.content_length == len(start)
    w.end()
    again = BodyWriter(start)
    again.start()
    with pytest.raises(LocalProtocolError, match="not sent binary"):
        again.send("o", b"x")


def test_zero_size_tensors_and_empty_sends_need_nothing() -> None:
    header = {
        "inputs": [
            {"name": "z", "datatype": "FP32", "shape": [0], "parameters": {"binary_data_size": 0}},
            {
                "name": "zb",
                "datatype": "BYTES",
                "shape": [0],
                "parameters": {"binary_data_size": 0},
            },
            {"name": "x", "datatype": "UINT8", "shape": [2], "parameters": {"binary_data_size": 2}},
        ]
    }
    w = BodyWriter(header)
    assert w.header.kind == "request"
    w.start()
    w.send("z", b"")
    w.send("x", b"")
    w.send("x", b"ab")
    w.send("x", b"")
    w.end()


# -- misuse ----------------------------------------------------------------------

ONE = {
    "outputs": [
        {"name": "a", "datatype": "UINT8", "shape": [4], "parameters": {"binary_data_size": 4}},
        {"name": "j", "datatype": "UINT8", "shape": [1], "data": [1]},
        {"name": "s", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 6}},
    ]
}

Steps = Callable[[BodyWriter], Any]


def _start_twice(w: BodyWriter) -> None:
    w.start()
    w.start()


def _after_end(w: BodyWriter) -> None:
    w.start()
    w.send("a", b"1234")
    w.send("s", b"\x02\x00\x00\x00ok")
    w.end()
    w.send("a", b"")


def _short(w: BodyWriter) -> None:
    w.start()
    w.send("a", b"12")
    w.end()


def _too_many(w: BodyWriter) -> None:
    w.start()
    w.send("a", b"123")
    w.send("a", b"45")


def _out_of_order(w: BodyWriter) -> None:
    w.start()
    w.send("s", b"\x02\x00\x00\x00ok")


def _back_again(w: BodyWriter) -> None:
    w.start()
    w.send("a", b"1234")
    w.send("a", b"5")


def _past_the_end(w: BodyWriter) -> None:
    w.start()
    w.send("a", b"1234")
    w.send("s", b"\x02\x00\x00\x00ok")
    w.send("s", b"!")


def _bad_prefix(w: BodyWriter) -> None:
    w.start()
    w.send("a", b"1234")
    w.send("s", b"\x09\x00\x00\x00")


def _bad_element_count(w: BodyWriter) -> None:
    w.start()
    w.send("a", b"1234")
    w.send("s", b"\x00\x00\x00\x00\x00\x00")


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        (lambda w: w.send("a", b"1"), "before start"),
        (lambda w: w.end(), "before start"),
        (_start_twice, "already called"),
        (_after_end, "after end"),
        (_short, "has 2 of its 4 bytes"),
        (_too_many, "2 bytes for output 'a' exceed the 1 left"),
        (_out_of_order, "out of order: output 'a' still needs 4 bytes"),
        (_back_again, "'a' is already complete"),
        (_past_the_end, "every binary tensor has all its bytes"),
        (lambda w: (w.start(), w.send("j", b"1")), "not sent binary"),
        (lambda w: (w.start(), w.send("nope", b"1")), "no output named 'nope'"),
        (lambda w: (w.start(), w.send(7, b"1")), "no output with index 7"),
        (lambda w: (w.start(), w.send(True, b"1")), "no output with index True"),
        (lambda w: (w.start(), w.send("a", np.arange(4, dtype=">u1")[::2])), "C-contiguous"),
        (lambda w: (w.start(), w.send("a", np.arange(1, dtype=">u4"))), "little-endian"),
        # (a dtype memoryview cannot export: its byte order is read from the dtype)
        (lambda w: (w.start(), w.send("a", np.array([1], dtype=">M8[D]"))), "little-endian"),
        (lambda w: (w.start(), w.send("a", np.array([b"1"], dtype=object))), "Python objects"),
        (lambda w: (w.start(), w.send("a", "1234")), "bytes-like"),
        (_bad_prefix, "malformed BYTES data: BYTES element 0 .* claims 9 bytes"),
        (_bad_element_count, "malformed BYTES data: unexpected number of string elements"),
    ],
)
def test_misuse_raises_and_the_writer_stays_failed(steps: Steps, message: str) -> None:
    w = BodyWriter(ONE)
    with pytest.raises(LocalProtocolError, match=message):
        steps(w)
    # The writer is now unusable.
    with pytest.raises(LocalProtocolError):
        w.send("a", b"")
    with pytest.raises(LocalProtocolError):
        w.end()
    with pytest.raises(LocalProtocolError):
        w.start()


BOOLS = {
    "inputs": [
        {"name": "m", "datatype": "BOOL", "shape": [3], "parameters": {"binary_data_size": 3}}
    ]
}


def test_send_checks_bool_bytes_as_a_peer_would() -> None:
    w = BodyWriter(BOOLS)
    w.start()
    w.send("m", b"\x01")
    hl = w.header_length
    assert hl is not None
    with pytest.raises(LocalProtocolError, match=rf"invalid BOOL value 7 .*\(body byte {hl + 2}\)"):
        w.send("m", b"\x00\x07")
    with pytest.raises(LocalProtocolError, match="ERROR"):
        w.send("m", b"\x00")
    # A bool array over other bytes than 0 and 1 (``view(bool)``) is refused too.
    w = BodyWriter(BOOLS)
    w.start()
    with pytest.raises(LocalProtocolError, match="invalid BOOL value 2"):
        w.send("m", np.array([1, 0, 2], np.uint8).view(np.bool_))
    w = BodyWriter(BOOLS)
    wire = w.start() + bytes(w.send("m", np.array([True, False, True])))
    w.end()
    msg = binproto.decode_request(wire, header_length=w.header_length)
    assert msg.tensors["m"].tolist() == [True, False, True]


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (
            {
                "outputs": [
                    {
                        "name": "a",
                        "datatype": "FP32",
                        "shape": [2],
                        "parameters": {"binary_data_size": 4},
                    }
                ]
            },
            "expecting 8",
        ),
        (
            {"outputs": [{"name": "a", "datatype": "F", "shape": [1], "data": [1]}]},
            "invalid datatype",
        ),
        ({"outputs": "x"}, "Unable to parse 'outputs'"),
        (b"\xff", "invalid header: .*invalid UTF-8"),
        (b"{", "invalid header: failed to parse"),
        (42, "must be a mapping, JSON bytes or an EncodedBody"),
        ({"outputs": [], "parameters": {"x": float("nan")}}, "JSON cannot carry"),
        ({"outputs": [], "parameters": {"binary_data_output": 1}}, "expected a bool"),
        (
            {
                "outputs": [
                    {
                        "name": "a",
                        "datatype": "INT8",
                        "shape": [1],
                        "data": [1],
                        "parameters": {"shared_memory_region": "r"},
                    }
                ]
            },
            "must set only one of the following fields",
        ),
        (
            {
                "outputs": [
                    {
                        "name": "a",
                        "datatype": "INT8",
                        "shape": [1],
                        "data": [1],
                        "parameters": {"p": [1]},
                    }
                ]
            },
            "string, number or bool",
        ),
    ],
)
def test_invalid_headers(header: Any, message: str) -> None:
    with pytest.raises(LocalProtocolError, match=message):
        BodyWriter(header)


OUTPUT = b'[{"name":"o","datatype":"INT8","shape":[1],"data":[1]}]'


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (
            b'{"model_name":"m","outputs":' + OUTPUT + b',"model_name":"n"}',
            'duplicate key "model_name"',
        ),
        (b'{"outputs":[],"outputs":' + OUTPUT + b"}", 'duplicate key "outputs"'),
        (
            b'{"outputs":[{"name":"\\ud800","datatype":"INT8","shape":[1],"data":[1]}]}',
            "lone surrogate",
        ),
        ({"outputs": [], 1: "a", "1": "b"}, 'duplicate key "1"'),  # both keys written "1"
    ],
)
def test_headers_a_peer_refuses_are_refused(header: Any, message: str) -> None:
    with pytest.raises(LocalProtocolError, match=message):
        BodyWriter(header)
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    with pytest.raises(binproto.RemoteProtocolError, match=message):
        binproto.decode_response(raw, header_length=None)


def test_a_header_nested_too_deep_to_decode_is_refused() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(LocalProtocolError, match="too deep to decode"):
        BodyWriter(b'{"outputs":[],"parameters":{"a":' + deep + b"}}")
    # As a mapping: refused as it is serialized.
    nested: list[Any] = []
    inner = nested
    for _ in range(100_000):
        inner.append([])
        inner = inner[0]
    with pytest.raises(LocalProtocolError, match="nested too deep"):
        BodyWriter({"outputs": [], "parameters": {"a": nested}})


def test_a_header_given_as_bytes_is_sent_as_given() -> None:
    raw = b'{ "outputs" : [ ],\n "model_name": "m", "parameters": {"x": "\\u00e9"} }'
    w = BodyWriter(raw)
    assert w.start() == raw
    assert w.header.model_name == "m" and w.header.parameters == {"x": "\u00e9"}


def test_explicit_kind() -> None:
    with pytest.raises(LocalProtocolError, match="kind must be"):
        BodyWriter({"outputs": []}, kind="reply")  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError, match="invalid request header"):
        BodyWriter({"outputs": []}, kind="request")
    assert "BodyWriter(kind='response'" in repr(BodyWriter({"outputs": []}))


def test_header_from_the_encoder_applies_the_request_policy() -> None:
    """Stream outputs whose header encode_response chose from placeholder arrays."""
    req = binproto.encode_request(
        {"in": np.zeros(1, np.uint8)},
        outputs=[binproto.RequestedOutput("big", binary_data=True), "small"],
    )
    request = binproto.decode_request(bytes(req), header_length=req.header_length).header
    shapes = {"big": np.empty(1000, np.float32), "small": np.zeros(2, np.int8)}
    skipped = {"other": np.zeros(3)}
    w = BodyWriter(binproto.encode_response({**shapes, **skipped}, model_name="m", request=request))
    assert [t.name for t in w.header.tensors] == ["big", "small"]
    produced = np.arange(1000, dtype=np.float32)
    body = stream(w, [("big", produced[:500]), ("big", produced[500:])])
    msg = binproto.decode_response(body, header_length=w.header_length)
    assert np.array_equal(msg.tensors["big"], produced)
    assert msg.tensors["small"].tolist() == [0, 0]


def test_a_requested_outputs_parameters_are_as_strict_as_the_encoders() -> None:
    header = header_dict("request")
    header["outputs"] = [{"name": "o", "parameters": {"p": float("nan")}}]
    with pytest.raises(LocalProtocolError, match="requested output 'o'"):
        BodyWriter(header)
    header["outputs"] = [{"name": "o", "parameters": {"p": {"nested": 1}}}]
    with pytest.raises(LocalProtocolError, match="requested output 'o'"):
        BodyWriter(header)


def test_a_view_of_a_big_endian_array_is_refused_as_the_array_is() -> None:
    w = BodyWriter(encoded())
    w.start()
    big = np.arange(6, dtype=">f4").reshape(2, 3)
    with pytest.raises(LocalProtocolError, match="little-endian"):
        w.send("a", big.data)


def test_a_tensor_index_of_any_integer_type_is_taken() -> None:
    w = BodyWriter(encoded())
    w.start()
    index = np.int64(0)  # the index of "a" in the header
    assert w.send(index, ARRAYS["a"]) is ARRAYS["a"]  # type: ignore[arg-type, unused-ignore]
    other = BodyWriter(encoded())
    other.start()
    with pytest.raises(LocalProtocolError, match="with index True"):
        other.send(True, b"")
