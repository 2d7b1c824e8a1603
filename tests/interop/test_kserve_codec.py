"""KServe's own codec (kserve.protocol.infer_type) against binproto, in process.

tests/test_encode.py (``test_kserve_decodes_requests_and_responses``) feeds
binproto's encoder output to KServe's ``from_bytes``. This file goes the other
way, KServe as the producer: bodies from ``InferRequest.to_rest`` and
``InferResponse.to_rest`` parsed by binproto, and how lenient KServe's
``from_bytes`` is with the faulty captured bodies binproto rejects.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import binproto

from ..helpers import arrays_equal
from .samples import DATATYPES, sample, utf8_bytes

infer_type = pytest.importorskip("kserve.protocol.infer_type")
orjson = pytest.importorskip("orjson")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SUPPORTED = [dt for dt in DATATYPES if dt != "BF16"]  # KServe has no BF16


def kserve_sample(datatype: str) -> np.ndarray[Any, Any]:
    return (utf8_bytes() if datatype == "BYTES" else sample(datatype)).reshape(2, 2)


def test_infer_response_to_rest_binary() -> None:
    arrays = {f"o_{dt}": (kserve_sample(dt), dt) for dt in SUPPORTED}
    outputs = [
        infer_type.InferOutput(name, list(arr.shape), dt, data=arr)
        for name, (arr, dt) in arrays.items()
    ]
    response = infer_type.InferResponse(
        response_id="r", model_name="m", infer_outputs=outputs, use_binary_outputs=True
    )
    body, hl = response.to_rest()
    assert isinstance(body, bytes) and hl is not None
    msg = binproto.decode_response(body, header_length=hl)
    assert msg.header.id == "r" and msg.header.model_name == "m"
    for name, (arr, dt) in arrays.items():
        assert msg.header.tensor(name).datatype == dt
        assert arrays_equal(msg.tensors[name], arr), name


def test_infer_response_to_rest_json() -> None:
    """KServe's JSON form (a dict, serialized by orjson on the wire)."""
    arrays = {
        f"o_{dt}": (kserve_sample(dt), dt) for dt in SUPPORTED if dt not in ("FP16", "FP32", "FP64")
    }
    arrays["finite"] = (np.array([[0.5, -0.0], [1e30, 3.0]]), "FP64")
    outputs = [
        infer_type.InferOutput(name, list(arr.shape), dt, data=arr)
        for name, (arr, dt) in arrays.items()
    ]
    response = infer_type.InferResponse(response_id="r", model_name="m", infer_outputs=outputs)
    obj, hl = response.to_rest()
    assert hl is None and isinstance(obj, dict)
    msg = binproto.decode_response(orjson.dumps(obj), header_length=None)
    for name, (arr, _) in arrays.items():
        assert arrays_equal(msg.tensors[name], arr), name


def test_infer_request_to_rest() -> None:
    arrays = {f"i_{dt}": (kserve_sample(dt), dt) for dt in SUPPORTED}
    inputs = []
    for name, (arr, dt) in arrays.items():
        inp = infer_type.InferInput(name, list(arr.shape), dt)
        inp.set_data_from_numpy(arr, binary_data=True)
        inputs.append(inp)
    body, hl = infer_type.InferRequest("m", inputs, request_id="q").to_rest()
    assert isinstance(body, bytes) and hl is not None
    msg = binproto.decode_request(body, header_length=hl)
    assert msg.header.id == "q" and msg.header.model_name == "m"
    for name, (arr, _) in arrays.items():
        assert arrays_equal(msg.tensors[name], arr), name


def fixture(name: str) -> tuple[bytes, int]:
    meta = json.loads((FIXTURES / f"{name}.json").read_text())
    body = (FIXTURES / f"{name}.body").read_bytes()
    return body, int(meta["headers"]["Inference-Header-Content-Length"])


def test_kserve_from_bytes_ignores_bytes_past_the_end() -> None:
    body, hl = fixture("tritonclient_extra_bytes")
    with pytest.raises(binproto.RemoteProtocolError, match="additional input data"):
        binproto.decode_request(body, header_length=hl)
    request = infer_type.InferRequest.from_bytes(body, hl, "m")
    assert [i.name for i in request.inputs] == ["s", "y"]
    assert request.inputs[1].as_numpy().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_kserve_from_bytes_takes_any_nonzero_bool_as_true() -> None:
    body, hl = fixture("bool_value_2")
    with pytest.raises(binproto.RemoteProtocolError, match="invalid BOOL value 2") as err:
        binproto.decode_request(body, header_length=hl)
    assert err.value.offset == hl + 1
    request = infer_type.InferRequest.from_bytes(body, hl, "m")
    assert request.inputs[0].as_numpy().tolist() == [True, True, False]


@pytest.mark.parametrize("name", ["tritonclient_truncated", "wrong_binary_data_size"])
def test_kserve_from_bytes_fails_without_a_protocol_error(name: str) -> None:
    """Where binproto reports the fault and its offset, KServe's codec fails inside numpy."""
    body, hl = fixture(name)
    with pytest.raises(binproto.RemoteProtocolError) as err:
        binproto.decode_request(body, header_length=hl)
    assert err.value.offset is not None
    with pytest.raises(ValueError):
        infer_type.InferRequest.from_bytes(body, hl, "m")
