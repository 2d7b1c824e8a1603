"""tritonclient's real HTTP clients call binproto's servers over 127.0.0.1.

The sync ``InferenceServerClient`` (geventhttpclient) and the aio client
(aiohttp) against binproto's reference server with the echo model, on every
backend: asyncio with in-place receive, asyncio streams, and trio.

The adapters' own suites already drive these clients through every datatype
(BF16, non-UTF-8 and empty BYTES), zero-size tensors, JSON and binary in both
directions, metadata, health and errors: tests/test_app_tritonclient.py
(on every backend).
This file covers what they leave out: the compressed requests and responses
the real clients produce, listed outputs (subset, order, and the forms binproto
picks for FP16/BF16/non-UTF-8 asked as JSON) on every backend with both
clients, the response headers a client sees, and the output policy where
binproto follows the extension's text and Triton/KServe do not.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import binproto

from ..helpers import arrays_equal
from .samples import DATATYPES, sample, triton_input, utf8_bytes

httpclient = pytest.importorskip("tritonclient.http")
aioclient = pytest.importorskip("tritonclient.http.aio")

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
    status, headers, payload = raw_post(
        binproto_server[1],
        body,
        {"Inference-Header-Content-Length": str(hl), "Accept-Encoding": algorithm},
    )
    # What the client sees on the wire: the coding asked for, chunked framing,
    # and the header length of the uncompressed JSON.
    assert status == 200
    assert headers["content-encoding"] == algorithm
    assert headers["vary"] == "Accept-Encoding"
    assert headers["transfer-encoding"] == "chunked"
    assert "content-length" not in headers
    hl_out = int(headers["inference-header-content-length"])
    plain = zlib.decompress(payload, 31 if algorithm == "gzip" else 15)
    assert json.loads(plain[:hl_out])["model_name"] == "echo"
    msg = binproto.decode_response(payload, header_length=hl_out, content_encoding=algorithm)
    for name, arr in arrays.items():
        assert arrays_equal(msg.tensors[name], arr), name
    result = infer(
        client_kind,
        binproto_server[1],
        lambda: [triton_input(n, a, n[3:], True) for n, a in arrays.items()],
        response_compression_algorithm=algorithm,
    )
    for name, arr in arrays.items():
        assert arrays_equal(got(result, name), arr), name


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        ("gzip, deflate, br", "gzip"),  # what the aio client always sends
        ("deflate, gzip;q=0", "deflate"),
        ("br", None),
        ("identity, *", None),
    ],
)
def test_response_coding_follows_accept_encoding(
    binproto_server: tuple[str, int], accept: str, expected: str | None
) -> None:
    arr = np.arange(1000, dtype=np.int32)
    body, hl = httpclient.InferenceServerClient.generate_request_body(
        [triton_input("x", arr, "INT32", True)]
    )
    status, headers, payload = raw_post(
        binproto_server[1],
        body,
        {"Inference-Header-Content-Length": str(hl), "Accept-Encoding": accept},
    )
    assert status == 200
    assert headers.get("content-encoding") == expected
    if expected is None:
        assert int(headers["content-length"]) == len(payload)
    hl_out = int(headers["inference-header-content-length"])
    msg = binproto.decode_response(payload, header_length=hl_out, content_encoding=expected)
    assert arrays_equal(msg.tensors["x"], arr)


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


@pytest.mark.parametrize("content_type", [None, "application/octet-stream", "application/json"])
def test_request_content_type_is_not_needed(
    binproto_server: tuple[str, int], content_type: str | None
) -> None:
    """The header length, not the Content-Type, says what the body holds: tritonclient's
    sync client sends no Content-Type and its aio client sends application/octet-stream
    even for JSON-only bodies."""
    arr = np.arange(4, dtype=np.int32)
    headers = {} if content_type is None else {"Content-Type": content_type}
    for binary in (False, True):
        body, hl = httpclient.InferenceServerClient.generate_request_body(
            [triton_input("x", arr, "INT32", binary)]
        )
        extra = {} if hl is None else {"Inference-Header-Content-Length": str(hl)}
        status, reply_headers, payload = raw_post(binproto_server[1], body, headers | extra)
        assert status == 200, payload
        out_hl = reply_headers.get("inference-header-content-length")
        msg = binproto.decode_response(
            payload, header_length=None if out_hl is None else int(out_hl)
        )
        assert arrays_equal(msg.tensors["x"], arr)
