"""tritonclient's real HTTP clients call binproto's servers over 127.0.0.1.

The sync ``InferenceServerClient`` (geventhttpclient) and the aio client
(aiohttp) against binproto's reference server with the echo model, on every
backend: asyncio with in-place receive, asyncio streams, and trio. Every
datatype (BF16 via ml_dtypes, BYTES with non-UTF-8 and empty elements, NaN),
zero-size tensors, JSON and binary in both directions, binary_data_output,
listed outputs, request compression, errors and metadata.
"""

from __future__ import annotations

import asyncio
import http.client
import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import binproto

from ..helpers import arrays_equal
from .samples import DATATYPES, sample, triton_input, utf8_bytes

httpclient = pytest.importorskip("tritonclient.http")
aioclient = pytest.importorskip("tritonclient.http.aio")
from tritonclient.utils import InferenceServerException  # noqa: E402

CLIENTS = ("sync", "aio")
Inputs = Callable[[], list[Any]]


def infer(
    kind: str, port: int, make_inputs: Inputs, outputs: list[Any] | None = None, **kwargs: Any
) -> Any:
    """One ``infer`` call of the echo model with the ``kind`` client; the InferResult."""
    url = f"127.0.0.1:{port}"
    if kind == "sync":
        client = httpclient.InferenceServerClient(url)
        try:
            return client.infer("echo", make_inputs(), outputs=outputs, **kwargs)
        finally:
            client.close()

    async def go() -> Any:
        client = aioclient.InferenceServerClient(url)
        try:
            return await client.infer("echo", make_inputs(), outputs=outputs, **kwargs)
        finally:
            await client.close()

    return asyncio.run(go())


def got(result: Any, name: str) -> np.ndarray[Any, Any]:
    """``got(result, name)``; tritonclient gives JSON BYTES as ``str``: back to bytes."""
    arr: np.ndarray[Any, Any] = result.as_numpy(name)
    if arr.dtype == object:
        flat = [x.encode() if isinstance(x, str) else x for x in arr.ravel()]
        out = np.empty(len(flat), dtype=object)
        out[:] = flat
        arr = out.reshape(arr.shape)
    return arr


def outputs_of(result: Any) -> dict[str, dict[str, Any]]:
    return {o["name"]: o for o in result.get_response()["outputs"]}


@pytest.fixture(params=CLIENTS)
def client_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


def test_every_datatype_binary(binproto_server: tuple[str, int], client_kind: str) -> None:
    arrays = {f"in_{dt}": sample(dt).reshape(2, 2) for dt in DATATYPES}
    result = infer(
        client_kind,
        binproto_server[1],
        lambda: [triton_input(n, a, n[3:], True) for n, a in arrays.items()],
    )
    outs = outputs_of(result)
    assert list(outs) == list(arrays)
    for name, arr in arrays.items():
        assert "binary_data_size" in outs[name]["parameters"], name
        out = got(result, name)
        assert out.dtype == arr.dtype or arr.dtype == object, name
        assert arrays_equal(out, arr), name


def test_zero_size_every_datatype(binproto_server: tuple[str, int], client_kind: str) -> None:
    arrays = {f"z_{dt}": sample(dt)[:0].reshape(0, 2, 0) for dt in DATATYPES}
    arrays["after"] = np.array([7, 8], dtype=np.int32)
    types = {n: n[2:] for n in arrays} | {"after": "INT32"}
    result = infer(
        client_kind,
        binproto_server[1],
        lambda: [triton_input(n, a, types[n], True) for n, a in arrays.items()],
    )
    for name, arr in arrays.items():
        out = got(result, name)
        assert out.shape == arr.shape, name
        assert arrays_equal(out, arr), name


def test_json_inputs_and_outputs(binproto_server: tuple[str, int], client_kind: str) -> None:
    arrays = {}
    for dt in DATATYPES:
        if dt in ("FP16", "BF16"):
            continue
        arr = utf8_bytes() if dt == "BYTES" else sample(dt)
        arrays[f"in_{dt}"] = arr[np.isfinite(arr)] if arr.dtype.kind == "f" else arr
    outputs = [httpclient.InferRequestedOutput(n, binary_data=False) for n in arrays]
    result = infer(
        client_kind,
        binproto_server[1],
        lambda: [triton_input(n, a, n[3:], False) for n, a in arrays.items()],
        outputs,
    )
    outs = outputs_of(result)
    for name, arr in arrays.items():
        assert "data" in outs[name], name
        assert arrays_equal(got(result, name), arr), name


def test_mixed_and_listed_outputs(binproto_server: tuple[str, int], client_kind: str) -> None:
    """Listed outputs come back in the order asked, each in the form asked;
    FP16, BF16 and non-UTF-8 BYTES asked as JSON come back binary."""
    arrays = {
        "i": (np.arange(6, dtype=np.int64).reshape(3, 2), "INT64", False),
        "h": (sample("FP16"), "FP16", True),
        "b": (sample("BF16"), "BF16", True),
        "s": (sample("BYTES"), "BYTES", True),
        "u": (utf8_bytes(), "BYTES", False),
        "unused": (np.ones(3, dtype=np.uint8), "UINT8", True),
    }
    asked = {"u": True, "s": False, "h": False, "b": False, "i": True}
    outputs = [httpclient.InferRequestedOutput(n, binary_data=v) for n, v in asked.items()]
    result = infer(
        client_kind,
        binproto_server[1],
        lambda: [triton_input(n, a, dt, b) for n, (a, dt, b) in arrays.items()],
        outputs,
    )
    outs = outputs_of(result)
    assert list(outs) == list(asked)
    binary = {n: "binary_data_size" in (o.get("parameters") or {}) for n, o in outs.items()}
    assert binary == {"u": True, "s": True, "h": True, "b": True, "i": True}
    for name in asked:
        assert arrays_equal(got(result, name), arrays[name][0]), name


def test_json_output_when_asked(binproto_server: tuple[str, int], client_kind: str) -> None:
    arr = np.array([[1.5, -2.0]], dtype=np.float32)
    outputs = [httpclient.InferRequestedOutput("x", binary_data=False)]
    result = infer(
        client_kind, binproto_server[1], lambda: [triton_input("x", arr, "FP32", True)], outputs
    )
    assert outputs_of(result)["x"]["data"] == [1.5, -2.0]
    assert arrays_equal(got(result, "x"), arr)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests(
    binproto_server: tuple[str, int], client_kind: str, algorithm: str
) -> None:
    arrays = {f"in_{dt}": sample(dt) for dt in DATATYPES}
    result = infer(
        client_kind,
        binproto_server[1],
        lambda: [triton_input(n, a, n[3:], True) for n, a in arrays.items()],
        request_compression_algorithm=algorithm,
    )
    for name, arr in arrays.items():
        assert arrays_equal(got(result, name), arr), name


def raw_post(port: int, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/v2/models/echo/infer", body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_responses(
    binproto_server: tuple[str, int], client_kind: str, algorithm: str
) -> None:
    arrays = {f"in_{dt}": sample(dt) for dt in DATATYPES}
    body, hl = httpclient.InferenceServerClient.generate_request_body(
        [triton_input(n, a, n[3:], True) for n, a in arrays.items()]
    )
    _, headers, _ = raw_post(
        binproto_server[1],
        body,
        {"Inference-Header-Content-Length": str(hl), "Accept-Encoding": algorithm},
    )
    if headers.get("content-encoding") != algorithm:
        pytest.skip(f"binproto's server does not compress responses ({algorithm}) yet")
    result = infer(
        client_kind,
        binproto_server[1],
        lambda: [triton_input(n, a, n[3:], True) for n, a in arrays.items()],
        response_compression_algorithm=algorithm,
    )
    for name, arr in arrays.items():
        assert arrays_equal(got(result, name), arr), name


def test_errors_reach_the_client(binproto_server: tuple[str, int], client_kind: str) -> None:
    inputs: Inputs = lambda: [triton_input("x", np.ones(2, np.int8), "INT8", True)]  # noqa: E731
    outputs = [httpclient.InferRequestedOutput("nope")]
    with pytest.raises(InferenceServerException, match="unexpected inference output 'nope'"):
        infer(client_kind, binproto_server[1], inputs, outputs)


def test_malformed_body_is_a_400(binproto_server: tuple[str, int]) -> None:
    """A body shorter than its header claims: 400 with a V2 error body."""
    body, hl = httpclient.InferenceServerClient.generate_request_body(
        [triton_input("x", np.arange(4, dtype=np.float32), "FP32", True)]
    )
    status, headers, payload = raw_post(
        binproto_server[1], body[:-3], {"Inference-Header-Content-Length": str(hl)}
    )
    assert status == 400
    assert headers["content-type"] == "application/json"
    assert set(json.loads(payload)) == {"error"}


def test_metadata_and_health(binproto_server: tuple[str, int]) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{binproto_server[1]}")
    try:
        assert client.is_server_live()
        assert client.is_server_ready()
        assert client.is_model_ready("echo")
        assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
        assert client.get_model_metadata("echo")["name"] == "echo"
    finally:
        client.close()


def test_binary_response_headers(binproto_server: tuple[str, int]) -> None:
    """binproto labels binary bodies application/octet-stream and frames them with
    Content-Length; the header length name is sent as the extension spells it."""
    body, hl = httpclient.InferenceServerClient.generate_request_body(
        [triton_input("x", np.arange(3, dtype=np.int16), "INT16", True)]
    )
    conn = http.client.HTTPConnection("127.0.0.1", binproto_server[1], timeout=30)
    try:
        conn.request(
            "POST", "/v2/models/echo/infer", body, {"Inference-Header-Content-Length": str(hl)}
        )
        resp = conn.getresponse()
        raw_names = [k for k, _ in resp.getheaders()]
        payload = resp.read()
    finally:
        conn.close()
    headers = dict(resp.getheaders())
    assert resp.status == 200
    assert headers["Content-Type"] == "application/octet-stream"
    assert int(headers["Content-Length"]) == len(payload)
    assert "Inference-Header-Content-Length" in raw_names
    msg = binproto.decode_response(payload, header_length=int(headers[binproto.HEADER_LENGTH_NAME]))
    assert arrays_equal(msg.tensors["x"], np.arange(3, dtype=np.int16))


def test_listed_output_without_binary_data_follows_binary_data_output(
    binproto_server: tuple[str, int],
) -> None:
    """The extension's rule (binary), where Triton and KServe answer JSON (kserve#5907)."""
    header = {
        "inputs": [{"name": "x", "shape": [2], "datatype": "INT32", "data": [1, 2]}],
        "outputs": [{"name": "x"}],
        "parameters": {"binary_data_output": True},
    }
    status, headers, payload = raw_post(
        binproto_server[1], json.dumps(header).encode(), {"Content-Type": "application/json"}
    )
    assert status == 200
    hl = int(headers["inference-header-content-length"])
    msg = binproto.decode_response(payload, header_length=hl)
    assert msg.header.tensor("x").binary_size == 8
    assert arrays_equal(msg.tensors["x"], np.array([1, 2], dtype=np.int32))
