"""The JSON header validated into records (named tuples: immutable,
compared by value)."""

from __future__ import annotations

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
