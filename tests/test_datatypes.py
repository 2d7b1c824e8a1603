"""The datatype table: wire names, element sizes, numpy dtypes, and the
mapping from numpy dtypes back to wire names."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import binproto
from binproto import DATATYPES, datatype_for_dtype, datatype_of
from binproto._datatypes import BF16_DTYPE, DTYPES, FIXED_ITEMSIZES, HAVE_ML_DTYPES

# Element size of each fixed-size datatype, and the numpy kind its name implies.
_FIXED = {
    **{"BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2},
    **{"UINT32": 4, "INT32": 4, "FP32": 4, "UINT64": 8, "INT64": 8, "FP64": 8},
}
_KIND = {"BOOL": "b", "UINT": "u", "INT": "i", "FP": "f"}


def test_every_v2_datatype_is_there() -> None:
    assert set(DATATYPES) == {*_FIXED, "BF16", "BYTES"}


@pytest.mark.parametrize("name", sorted(_FIXED))
def test_fixed_size_datatypes_are_little_endian(name: str) -> None:
    size = _FIXED[name]
    dt = DATATYPES[name]
    assert (dt.name, dt.itemsize, dt.dtype.itemsize) == (name, size, size)
    assert dt.dtype.kind == _KIND[name.rstrip("0123456789")]
    assert dt.dtype.str[0] in "<|"  # little-endian (or one byte), whatever the host
    assert DTYPES[name] == dt.dtype and FIXED_ITEMSIZES[name] == size


def test_bytes_and_bf16() -> None:
    assert DATATYPES["BYTES"].itemsize is None and DATATYPES["BYTES"].dtype == np.dtype(object)
    assert "BYTES" not in FIXED_ITEMSIZES
    bf16 = DATATYPES["BF16"]
    assert bf16.itemsize == 2 and bf16.dtype == BF16_DTYPE
    if not HAVE_ML_DTYPES:  # raw bits, as the docs say
        assert bf16.dtype == np.dtype("<u2")


def test_datatype_of() -> None:
    assert datatype_of("FP32") is DATATYPES["FP32"]
    assert datatype_of("fp32") is None  # wire names are upper case
    assert datatype_of("FLOAT") is None


@pytest.mark.parametrize("name", sorted(_FIXED))
def test_each_fixed_dtype_maps_back_to_its_datatype(name: str) -> None:
    assert datatype_for_dtype(DATATYPES[name].dtype) is DATATYPES[name]
    # Byte order does not change the datatype (the encoder swaps to the wire's).
    assert datatype_for_dtype(DATATYPES[name].dtype.newbyteorder(">")) is DATATYPES[name]


@pytest.mark.parametrize("dtype", [np.dtype(object), np.dtype("S3"), np.dtype("U2")])
def test_strings_and_objects_are_bytes(dtype: np.dtype[Any]) -> None:
    assert datatype_for_dtype(dtype) is DATATYPES["BYTES"]


@pytest.mark.parametrize(
    "dtype", [np.dtype("c8"), np.dtype("c16"), np.dtype("M8[s]"), np.dtype("V4")]
)
def test_dtypes_with_no_v2_datatype(dtype: np.dtype[Any]) -> None:
    assert datatype_for_dtype(dtype) is None


def test_raw_uint16_is_uint16_not_bf16() -> None:
    # BF16 is only inferred from ml_dtypes' own dtype; raw bits need datatype="BF16".
    assert datatype_for_dtype(np.dtype("<u2")) is DATATYPES["UINT16"]
    if HAVE_ML_DTYPES:
        assert datatype_for_dtype(BF16_DTYPE) is DATATYPES["BF16"]


def test_the_public_names() -> None:
    assert binproto.DATATYPES is DATATYPES
    assert binproto.datatype_of is datatype_of
    assert binproto.datatype_for_dtype is datatype_for_dtype


_RAW_BF16 = binproto.DataType("BF16", 2, np.dtype("<u2"))  # BF16 without ml_dtypes


@pytest.mark.parametrize("dt", [DATATYPES["BF16"], _RAW_BF16], ids=["installed", "raw bits"])
def test_bf16_json_data_is_rounded_to_the_same_bits_either_way(dt: Any) -> None:
    from binproto._json import json_data_to_array

    values = [2, 1.5, -0.0, 1 + 2**-8, 1 + 3 * 2**-8, 3.4e38, float("inf"), float("nan")]
    out = json_data_to_array(values, dt, (len(values),), "input 'x'", len(values))
    bits = out.view("<u2").tolist()
    # 2.0, 1.5, -0.0; ties to even (1 + 2**-8 down, 1 + 3 * 2**-8 up); past
    # BF16's largest: infinity; NaN a quiet NaN.
    assert bits == [0x4000, 0x3FC0, 0x8000, 0x3F80, 0x3F82, 0x7F80, 0x7F80, 0x7FC0]
    if HAVE_ML_DTYPES and dt is DATATYPES["BF16"]:
        rng = np.random.default_rng(7)
        wide = rng.standard_normal(1000) * 10.0 ** rng.integers(-40, 38, 1000)
        ours = json_data_to_array(wide.tolist(), dt, (1000,), "input 'x'", 1000)
        assert ours.view("<u2").tolist() == wide.astype(BF16_DTYPE).view("<u2").tolist()
