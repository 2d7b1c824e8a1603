"""Sample tensors with each datatype's edge values, and tritonclient inputs of them."""

from __future__ import annotations

from typing import Any

import numpy as np

import binproto

#: Every datatype of the protocol.
DATATYPES = sorted(binproto.DATATYPES)


def sample(datatype: str) -> np.ndarray[Any, Any]:
    """Four elements of ``datatype``: extremes, zero, NaN/inf, empty and non-UTF-8 BYTES."""
    if datatype == "BOOL":
        return np.array([True, False, True, True])
    if datatype == "BYTES":
        return np.array([b"\xff\xfe\x00", b"", "é".encode(), b"\x80"], dtype=np.object_)
    if datatype == "BF16":
        import ml_dtypes

        return np.array([1.0, -2.5, np.inf, 0.15625], dtype=ml_dtypes.bfloat16)
    dtype = binproto.DATATYPES[datatype].dtype
    if dtype.kind == "f":
        return np.array([0.5, -0.0, np.nan, -np.inf], dtype=dtype)
    info = np.iinfo(dtype)
    return np.array([info.min, info.max, 0, 1], dtype=dtype)


def utf8_bytes() -> np.ndarray[Any, Any]:
    """A BYTES sample every peer can carry as JSON too."""
    return np.array([b"ab", b"", "é".encode(), b"z"], dtype=np.object_)


def triton_input(name: str, arr: np.ndarray[Any, Any], datatype: str, binary: bool) -> Any:
    """A ``tritonclient.http.InferInput`` holding ``arr``."""
    import tritonclient.http as httpclient

    inp = httpclient.InferInput(name, list(arr.shape), datatype)
    inp.set_data_from_numpy(arr, binary_data=binary)
    return inp
