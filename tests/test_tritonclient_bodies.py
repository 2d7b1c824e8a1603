"""Bodies built by the real tritonclient parse to the arrays it was given."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import binproto

from .helpers import arrays_equal, assert_same_everywhere

httpclient = pytest.importorskip("tritonclient.http")

CASES: dict[str, np.ndarray[Any, Any]] = {
    "BOOL": np.array([[True, False, True]]),
    "UINT8": np.arange(6, dtype=np.uint8).reshape(2, 3),
    "UINT16": np.array([1, 65535], dtype=np.uint16),
    "UINT32": np.array([7, 2**32 - 1], dtype=np.uint32),
    "UINT64": np.array([2**64 - 1], dtype=np.uint64),
    "INT8": np.array([-128, 127], dtype=np.int8),
    "INT16": np.array([-3, 3], dtype=np.int16),
    "INT32": np.arange(-4, 4, dtype=np.int32).reshape(2, 2, 2),
    "INT64": np.array([-(2**63), 2**63 - 1], dtype=np.int64),
    "FP16": np.array([0.5, -2.0, 65504.0], dtype=np.float16),
    "FP32": np.array([[1.5, np.nan], [-np.inf, 3.25]], dtype=np.float32),
    "FP64": np.array([np.pi, -0.0], dtype=np.float64),
    "BYTES": np.array([b"abc", b"", b"\xff\x00\xfe", "é".encode()], dtype=np.object_),
}

# FP16 has no JSON form in tritonclient; BYTES with non-UTF-8 cannot be JSON.
JSON_OK = set(CASES) - {"FP16", "BYTES"}


def _request(datatype: str, binary: bool) -> tuple[bytes, int | None, np.ndarray[Any, Any]]:
    arr = CASES[datatype]
    inp = httpclient.InferInput("x", list(arr.shape), datatype)
    inp.set_data_from_numpy(arr, binary_data=binary)
    out = httpclient.InferRequestedOutput("y", binary_data=True)
    body, json_size = httpclient.InferenceServerClient.generate_request_body(
        [inp], outputs=[out], request_id="r1"
    )
    return body, json_size, arr


@pytest.mark.parametrize("datatype", sorted(CASES))
def test_binary_inputs(datatype: str) -> None:
    body, hl, arr = _request(datatype, True)
    assert hl is not None
    msg = binproto.decode_request(body, header_length=hl)
    assert msg.header.id == "r1"
    assert msg.header.requested_outputs == (binproto.RequestedOutput("y", True, None),)
    got = msg.tensors["x"]
    assert got.dtype == binproto.DATATYPES[datatype].dtype
    assert arrays_equal(got, arr)
    out = assert_same_everywhere(
        lambda: binproto.Parser("request", header_length=hl, content_length=len(body)),
        body,
        two_way_limit=0,
    )
    assert out.error is None


@pytest.mark.parametrize("datatype", sorted(JSON_OK))
def test_json_inputs(datatype: str) -> None:
    body, hl, arr = _request(datatype, False)
    assert hl is None
    got = binproto.decode_request(body, header_length=hl).tensors["x"]
    assert got.dtype == binproto.DATATYPES[datatype].dtype
    assert arrays_equal(got, arr)


def test_json_bytes_of_utf8_strings() -> None:
    arr = np.array(["héllo", "", "z"], dtype=np.object_)
    inp = httpclient.InferInput("s", [3], "BYTES")
    inp.set_data_from_numpy(arr, binary_data=False)
    body, hl = httpclient.InferenceServerClient.generate_request_body([inp])
    got = binproto.decode_request(body, header_length=hl).tensors["s"]
    assert list(got) == [s.encode() for s in arr]


def test_bf16() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    values = np.array([1.0, -2.5, 0.15625], dtype=np.float32)  # exact in bfloat16
    inp = httpclient.InferInput("b", [3], "BF16")
    inp.set_data_from_numpy(values.astype(ml_dtypes.bfloat16), binary_data=True)
    body, hl = httpclient.InferenceServerClient.generate_request_body([inp])
    got = binproto.decode_request(body, header_length=hl).tensors["b"]
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got.astype(np.float32), values)


def test_many_inputs_mixed_binary_and_json() -> None:
    inputs = []
    for i, datatype in enumerate(sorted(JSON_OK)):
        arr = CASES[datatype]
        inp = httpclient.InferInput(f"in{i}", list(arr.shape), datatype)
        inp.set_data_from_numpy(arr, binary_data=bool(i % 2))
        inputs.append((inp, arr))
    outputs = [httpclient.InferRequestedOutput("o", binary_data=False)]
    body, hl = httpclient.InferenceServerClient.generate_request_body(
        [inp for inp, _ in inputs], outputs=outputs, parameters={"custom": 3}
    )
    msg = binproto.decode_request(body, header_length=hl)
    assert msg.header.parameters["custom"] == 3
    assert msg.header.requested_outputs == (binproto.RequestedOutput("o", False, None),)
    for i, (_, arr) in enumerate(inputs):
        assert arrays_equal(msg.tensors[f"in{i}"], arr)
