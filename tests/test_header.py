"""The JSON header validated into records: the common tensor, and records
and events that are named tuples (immutable, compared by value)."""

from __future__ import annotations

import numpy as np
import pytest

import binproto
from binproto._header import build_header


def test_a_fixed_size_binary_tensor_is_described() -> None:
    t = {"name": "x", "datatype": "FP32", "shape": [2, 3], "parameters": {"binary_data_size": 24}}
    header = build_header({"inputs": [t]}, "request", binproto.Limits(), 90)
    (info,) = header.tensors
    assert (info.index, info.name, info.datatype, info.shape) == (0, "x", "FP32", (2, 3))
    assert (info.binary_size, info.nbytes, info.data, info.array) == (24, 24, None, None)
    assert not info.shared_memory and header.header_length == 90


def test_a_tensor_info_is_an_immutable_named_tuple() -> None:
    params = {"binary_data_size": 8}
    t = {"name": "x", "datatype": "INT32", "shape": [2], "parameters": params}
    (built,) = build_header({"outputs": [t]}, "response", binproto.Limits(), 10).tensors
    made = binproto.TensorInfo(
        index=0, name="x", datatype="INT32", shape=(2,), parameters=params,
        binary_size=8, data=None, nbytes=8,
    )  # fmt: skip
    assert built == made and repr(built) == repr(made)
    assert built._asdict() == made._asdict() and built._fields[:2] == ("index", "name")
    with pytest.raises(AttributeError):
        built.name = "y"  # type: ignore[misc]


def test_whole_body_tensors_are_views_of_the_body() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([True, False])
    encoded = binproto.encode_response({"a": a, "b": b}, model_name="m")
    body, hl = bytes(encoded), encoded.header_length
    for buf in (body, bytearray(body)):
        msg = binproto.decode_response(buf, header_length=hl)
        whole = np.frombuffer(buf, dtype=np.uint8)
        for name, want in (("a", a), ("b", b)):
            got = msg.tensors[name]
            np.testing.assert_array_equal(got, want)
            assert got.dtype == want.dtype.newbyteorder("<") and got.shape == want.shape
            assert np.shares_memory(got, whole)
            assert got.flags.writeable == isinstance(buf, bytearray)


def test_parser_chunks_are_immutable_named_tuples() -> None:
    data = np.arange(4, dtype=np.int32)
    encoded = binproto.encode_response({"x": data}, model_name="m")
    body = bytes(encoded)
    p = binproto.Parser("response", header_length=encoded.header_length)
    p.receive_data(body)
    chunk = next(e for e in p.events() if isinstance(e, binproto.TensorChunk))
    assert type(chunk) is binproto.TensorChunk and isinstance(chunk, binproto.Event)
    made = binproto.TensorChunk(index=0, name="x", offset=0, data=chunk.data)
    assert chunk == made
    assert chunk._fields == ("index", "name", "offset", "data")
    for event in (chunk, made):
        with pytest.raises(AttributeError):
            event.offset = 1  # type: ignore[misc]
        with pytest.raises(AttributeError):
            event.extra = 1  # type: ignore[attr-defined]
