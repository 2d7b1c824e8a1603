"""Tensors from what a user holds: buffers, DLPack producers, objects with
``__array__``; BF16 from float arrays; BF16 read without ml_dtypes."""

from __future__ import annotations

import array
import os
import subprocess
import sys
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import binproto
from binproto import LocalProtocolError, Tensor


def _sent(inputs: Any) -> tuple[binproto.EncodedBody, dict[str, np.ndarray[Any, Any]]]:
    """The encoded request and what a peer decodes from it."""
    body = binproto.encode_request(inputs)
    return body, binproto.decode_request(bytes(body), header_length=body.header_length).tensors


class _Producer:
    """A DLPack producer that is not a numpy array (as a torch CPU tensor is)."""

    def __init__(self, array: np.ndarray[Any, Any]) -> None:
        self._array = array

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._array.__dlpack_device__()


class _ArrayLike:
    def __init__(self, array: np.ndarray[Any, Any]) -> None:
        self._array = array

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray[Any, Any]:
        return self._array


def test_a_bytearray_is_uint8_and_sent_from_its_own_memory() -> None:
    data = bytearray(b"\x00\x01\x02\xff")
    body, decoded = _sent({"x": data})
    assert decoded["x"].dtype == np.uint8 and decoded["x"].tolist() == [0, 1, 2, 255]
    data[0] = 7  # no copy: the body changes with it
    assert (
        binproto.decode_request(bytes(body), header_length=body.header_length).tensors["x"][0] == 7
    )


def test_typed_buffers_keep_their_type_and_memory() -> None:
    floats = array.array("f", [1.5, -2.0, 3.25])
    body, decoded = _sent({"f": floats, "v": memoryview(floats)[::2]})
    assert decoded["f"].dtype == np.float32 and decoded["f"].tolist() == [1.5, -2.0, 3.25]
    assert decoded["v"].tolist() == [1.5, 3.25]  # (strided: one copy)
    floats[1] = 9.0
    assert (
        binproto.decode_request(bytes(body), header_length=body.header_length).tensors["f"][1]
        == 9.0
    )


def test_raw_bytes_read_as_the_datatype_given() -> None:
    data = bytearray(np.array([1.0, 2.0], np.float32).tobytes())
    _, decoded = _sent([Tensor("x", data, datatype="FP32")])
    assert decoded["x"].dtype == np.float32 and decoded["x"].tolist() == [1.0, 2.0]
    with pytest.raises(LocalProtocolError, match="7 bytes are not a whole number of FP32"):
        binproto.encode_request([Tensor("x", bytearray(7), datatype="FP32")])


def test_a_dlpack_producer_is_sent_without_a_copy() -> None:
    source = np.arange(12, dtype=np.int32).reshape(3, 4)
    body, decoded = _sent({"x": _Producer(source)})
    assert decoded["x"].dtype == np.int32 and np.array_equal(decoded["x"], source)
    (buffer,) = body.buffers[1:]
    assert np.shares_memory(np.frombuffer(buffer, np.uint8), source)


def test_an_object_with_array_is_sent_as_its_array() -> None:
    source = np.ones((2, 2), np.float64)
    body, decoded = _sent({"x": _ArrayLike(source)})
    assert np.array_equal(decoded["x"], source)
    assert np.shares_memory(np.frombuffer(body.buffers[1], np.uint8), source)


def test_what_cannot_be_a_tensor_is_still_refused() -> None:
    with pytest.raises(LocalProtocolError, match="a buffer, an object with __dlpack__"):
        binproto.encode_request({"x": object()})


def _bf16_values() -> np.ndarray[Any, Any]:
    """1,000 float32 values: random bits (every exponent), ties, NaN, infinities."""
    rng = np.random.default_rng(36)
    bits = rng.integers(0, 1 << 32, 960, dtype=np.uint64).astype(np.uint32)
    ties = (rng.integers(0, 1 << 16, 30, dtype=np.uint32) << 16) | 0x8000  # exactly halfway
    values = np.concatenate([bits.view(np.float32), ties.view(np.float32)])
    special = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1.5, 3.4e38, -3.4e38, 1e-45]
    return np.concatenate([values, np.array(special, np.float32)])


def test_bf16_from_float32_rounds_to_nearest_even_as_ml_dtypes_does() -> None:
    values = _bf16_values()
    assert len(values) == 1000
    body = binproto.encode_request([Tensor("x", values, datatype="BF16")])
    sent = np.frombuffer(body.buffers[1], "<u2")
    with np.errstate(invalid="ignore"):  # (NaN, cast)
        want = values.astype(ml_dtypes.bfloat16).view(np.uint16)
    finite = ~np.isnan(values)
    assert np.array_equal(sent[finite], want[finite])
    assert np.all(np.isnan(sent[~finite].view(ml_dtypes.bfloat16)))
    # The same bits as a list of the same numbers.
    listed = binproto.encode_request([Tensor("x", values.tolist(), datatype="BF16")], binary=True)
    assert np.array_equal(np.frombuffer(listed.buffers[1], "<u2"), sent)
    decoded = binproto.decode_request(bytes(body), header_length=body.header_length).tensors["x"]
    assert decoded.dtype == ml_dtypes.bfloat16 and decoded.shape == values.shape


def test_bf16_read_without_ml_dtypes_warns() -> None:
    # A fresh interpreter where ml_dtypes cannot be imported.
    code = """
import sys, warnings
sys.modules["ml_dtypes"] = None
import numpy as np
import binproto
body = binproto.encode_request([binproto.Tensor("x", np.array([1.5], np.float32), "BF16")])
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    x = binproto.decode_request(bytes(body), header_length=body.header_length).tensors["x"]
assert [w.category for w in caught] == [binproto.BF16BitsWarning], caught
assert "read as raw uint16 bits" in str(caught[0].message)
assert x.dtype == np.uint16 and x.tolist() == [16320]
with warnings.catch_warnings():
    warnings.simplefilter("error")
    warnings.simplefilter("ignore", binproto.BF16BitsWarning)
    binproto.decode_request(bytes(body), header_length=body.header_length)
print("ok")
"""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert result.stdout.strip() == "ok", result.stderr


def test_buffers_and_dlpack_inputs_round_trip_through_a_client() -> None:
    import asyncio

    from binproto.adapters.asyncio import Client, close_server, start_server

    floats = np.arange(1000, dtype=np.float32)

    async def main() -> dict[str, np.ndarray[Any, Any]]:
        srv = await start_server()
        try:
            async with Client("127.0.0.1", srv.sockets[0].getsockname()[1]) as c:
                return await c.infer(
                    "echo",
                    {
                        "raw": bytearray(b"abc"),
                        "typed": array.array("d", [0.5, 1.5]),
                        "dl": _Producer(floats),
                        "bf": Tensor("bf", floats, datatype="BF16"),
                    },
                )
        finally:
            await close_server(srv)

    out = asyncio.run(main())
    assert out["raw"].dtype == np.uint8 and bytes(out["raw"]) == b"abc"
    assert out["typed"].tolist() == [0.5, 1.5]
    assert np.array_equal(out["dl"], floats)
    assert out["bf"].dtype == ml_dtypes.bfloat16
    assert np.array_equal(out["bf"], floats.astype(ml_dtypes.bfloat16))


class _Dtype:
    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return f"torch.{self.name}"


class _FakeTorch:
    """What the encoder looks up of torch: its bfloat16 and int16 dtypes."""

    bfloat16 = _Dtype("bfloat16")
    int16 = _Dtype("int16")


class _Bfloat16Tensor:
    """A CPU bfloat16 tensor as torch has it: DLPack cannot export its dtype
    to numpy, and ``view(torch.int16)`` gives its bits."""

    dtype = _FakeTorch.bfloat16

    def __init__(self, bits: np.ndarray[Any, Any]) -> None:
        self._bits = bits

    def __dlpack__(self, **kwargs: Any) -> Any:
        raise BufferError("unsupported dtype bfloat16")

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)

    def view(self, dtype: Any) -> _Producer:
        assert dtype is _FakeTorch.int16
        return _Producer(self._bits)


def test_a_torch_bfloat16_tensor_is_sent_by_its_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", _FakeTorch)
    values = np.array([1.5, -2.0, 3.0], np.float32)
    bits = values.astype(ml_dtypes.bfloat16).view(np.int16)
    body, decoded = _sent({"x": _Bfloat16Tensor(bits)})
    assert b'"datatype":"BF16"' in body.json
    assert decoded["x"].dtype == ml_dtypes.bfloat16 and decoded["x"].tolist() == [1.5, -2.0, 3.0]
    assert np.shares_memory(np.frombuffer(body.buffers[1], np.uint8), bits)


def test_a_failed_dlpack_export_is_a_local_protocol_error() -> None:
    class OnTheGpu:
        def __dlpack__(self, **kwargs: Any) -> Any:
            raise BufferError("the tensor is on cuda:0")

    with pytest.raises(LocalProtocolError, match="moved to the CPU first"):
        binproto.encode_request({"x": OnTheGpu()})
