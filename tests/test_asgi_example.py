"""The FastAPI example (examples/fastapi_server.py) under uvicorn, called
by the real tritonclient (sync and aio) and binproto's clients; and
256 MiB each way with its memory bounded. (V2App on every backend:
test_app_*.py.)"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as triton_http
import tritonclient.http.aio as triton_aio
from tritonclient.utils import InferenceServerException

import binproto
from tests.example_server import Server, run_example_server
from tests.helpers import arrays_equal, make_body

MiB = 1 << 20


# -- the example app under uvicorn, called by tritonclient -----------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with run_example_server() as srv:
        yield srv


def triton_sample(datatype: str) -> np.ndarray[Any, Any]:
    if datatype == "BYTES":
        return np.array([b"abc", b"", b"\xff\xfe non-utf8"], dtype=np.object_).reshape(3, 1)
    if datatype == "BOOL":
        return np.array([[True, False], [False, True]])
    dtype = np.dtype(binproto.DATATYPES[datatype].dtype).newbyteorder("=")
    return (np.arange(6) * 3 - 5).astype(dtype).reshape(2, 3)


DATATYPES = ["BOOL", "UINT8", "INT16", "INT32", "INT64", "UINT64", "FP16", "FP32", "FP64", "BYTES"]


def host(server: Server) -> str:
    return server.url.removeprefix("http://")


# (tritonclient has no JSON form for FP16: it is only sent binary.)
CASES = [(dt, b) for dt in DATATYPES for b in (True, False) if b or dt != "FP16"]


@pytest.mark.parametrize(("datatype", "binary"), CASES)
def test_tritonclient_round_trip(server: Server, datatype: str, binary: bool) -> None:
    if datatype == "BYTES" and not binary:
        arr = np.array([b"abc", b"", b"text"], dtype=np.object_)
    else:
        arr = triton_sample(datatype)
    client = triton_http.InferenceServerClient(host(server))
    inp = triton_http.InferInput("x", list(arr.shape), datatype)
    inp.set_data_from_numpy(arr, binary_data=binary)
    out = triton_http.InferRequestedOutput("x", binary_data=binary)
    result = client.infer("echo", [inp], outputs=[out], request_id="r1")
    got = result.as_numpy("x")
    if datatype == "BYTES" and not binary:
        # tritonclient gives JSON BYTES data back as the strings it read.
        got = np.array([x.encode() for x in got.ravel()], dtype=np.object_)
    assert arrays_equal(got, arr)
    response = result.get_response()
    assert response["model_name"] == "echo" and response["id"] == "r1"
    params = response["outputs"][0].get("parameters", {})
    assert ("binary_data_size" in params) == (binary or datatype == "FP16")
    client.close()


def test_tritonclient_many_inputs_default_outputs(server: Server) -> None:
    client = triton_http.InferenceServerClient(host(server))
    inputs = []
    arrays = {f"t{i}": triton_sample(dt) for i, dt in enumerate(DATATYPES)}
    arrays["zero"] = np.zeros((0, 4), dtype=np.float32)
    for (name, arr), dt in zip(arrays.items(), [*DATATYPES, "FP32"], strict=True):
        inp = triton_http.InferInput(name, list(arr.shape), dt)
        inp.set_data_from_numpy(arr, binary_data=True)
        inputs.append(inp)
    result = client.infer("echo", inputs)  # no outputs: binary_data_output is true
    for name, arr in arrays.items():
        assert arrays_equal(result.as_numpy(name), arr), name
    client.close()


def test_tritonclient_server_and_model_endpoints(server: Server) -> None:
    client = triton_http.InferenceServerClient(host(server))
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("echo")
    assert not client.is_model_ready("nope")
    meta = client.get_server_metadata()
    assert "binary_tensor_data" in meta["extensions"]
    assert client.get_model_metadata("echo")["name"] == "echo"
    client.close()


def test_tritonclient_errors(server: Server) -> None:
    client = triton_http.InferenceServerClient(host(server))
    inp = triton_http.InferInput("x", [2], "FP32")
    inp.set_data_from_numpy(np.ones(2, dtype=np.float32))
    with pytest.raises(InferenceServerException, match="unknown model"):
        client.infer("nope", [inp])
    with pytest.raises(InferenceServerException, match="unexpected inference output 'y'"):
        client.infer("echo", [inp], outputs=[triton_http.InferRequestedOutput("y")])
    client.close()


def test_malformed_bodies_get_v2_errors(server: Server) -> None:
    header = {
        "inputs": [
            {"name": "x", "shape": [4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}
        ]
    }
    body, hl = make_body(header, b"\0" * 12)  # 4 bytes short of what the header says
    headers = {
        "Inference-Header-Content-Length": str(hl),
        "Content-Type": "application/octet-stream",
    }
    with httpx.Client(base_url=server.url) as client:
        r = client.post("/v2/models/echo/infer", content=body, headers=headers)
        assert r.status_code == 400
        assert "16 bytes of binary data" in r.json()["error"]
        r = client.post("/v2/models/echo/infer", content=b"{not json", headers={})
        assert r.status_code == 400 and "error" in r.json()
        r = client.post("/v2/models/echo/infer", content=b"{}", headers={"Content-Encoding": "br"})
        assert r.status_code == 415
        assert r.headers["accept-encoding"] == "gzip, deflate"
        # The server keeps serving.
        assert client.get("/v2/health/ready").status_code == 200


def test_client_that_stops_mid_body(server: Server) -> None:
    body = binproto.encode_request({"x": np.ones(1000, dtype=np.float32)})
    data = bytes(body)
    head = "POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in body.headers
    )
    port = int(server.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head.encode() + b"\r\n" + data[:100])
        sock.shutdown(socket.SHUT_WR)
        sock.recv(65536)  # the server closes (or answers); either way it must go on
    with httpx.Client(base_url=server.url) as client:
        r = client.post("/v2/models/echo/infer", content=data, headers=dict(body.headers))
    assert r.status_code == 200


@pytest.mark.parametrize("n", [0, 1, 300_000])
def test_tritonclient_streaming_model(server: Server, n: int) -> None:
    client = triton_http.InferenceServerClient(host(server))
    inp = triton_http.InferInput("n", [1], "INT64")
    inp.set_data_from_numpy(np.array([n], dtype=np.int64))
    result = client.infer("ramp", [inp], request_id="s")
    assert arrays_equal(result.as_numpy("ramp"), np.arange(n, dtype=np.float32))
    assert result.get_response()["id"] == "s"
    inp.set_data_from_numpy(np.array([-1], dtype=np.int64))
    with pytest.raises(InferenceServerException, match="must be in"):
        client.infer("ramp", [inp])
    client.close()


def test_tritonclient_gzip_request(server: Server) -> None:
    client = triton_http.InferenceServerClient(host(server))
    arr = np.arange(1000, dtype=np.float32)
    inp = triton_http.InferInput("x", [1000], "FP32")
    inp.set_data_from_numpy(arr)
    result = client.infer("echo", [inp], request_compression_algorithm="gzip")
    assert arrays_equal(result.as_numpy("x"), arr)
    client.close()


def test_tritonclient_aio(server: Server) -> None:
    async def go() -> None:
        client = triton_aio.InferenceServerClient(host(server))
        try:
            assert await client.is_server_ready()
            arrays = {dt: triton_sample(dt) for dt in ("FP32", "INT8", "BYTES", "BOOL")}
            arrays["INT8"] = np.array([[-1, 2]], dtype=np.int8)
            inputs = []
            for dt, arr in arrays.items():
                inp = triton_aio.InferInput(dt.lower(), list(arr.shape), dt)
                inp.set_data_from_numpy(arr, binary_data=dt != "INT8")
                inputs.append(inp)
            outputs = [
                triton_aio.InferRequestedOutput(dt.lower(), binary_data=dt != "BOOL")
                for dt in arrays
            ]
            result = await client.infer("echo", inputs, outputs=outputs)
            for dt, arr in arrays.items():
                assert arrays_equal(result.as_numpy(dt.lower()), arr), dt
            with pytest.raises(InferenceServerException, match="unknown model"):
                await client.infer("nope", inputs)
        finally:
            await client.close()

    asyncio.run(go())


@pytest.mark.parametrize(
    ("accept", "request_encoding", "expected"),
    [
        ("gzip, deflate", "gzip", "gzip"),
        ("deflate", "deflate", "deflate"),
        ("br", "gzip", None),
        (None, None, None),
    ],
)
def test_binproto_client_compression_against_the_example(
    server: Server, accept: str | None, request_encoding: str | None, expected: str | None
) -> None:
    from binproto.adapters.asyncio import Client

    rng = np.random.default_rng(3)
    x = rng.integers(0, 8, size=(200, 500), dtype=np.uint8)
    s = np.array([b"\xff", b"", b"text"], dtype=np.object_)
    address, port = host(server).rsplit(":", 1)

    async def go() -> None:
        async with Client(
            address, int(port), accept_encoding=accept, request_encoding=request_encoding
        ) as c:
            for _ in range(2):
                async with c.stream("echo", {"x": x, "s": s}, binary_data_output=True) as r:
                    headers = {k.decode(): v.decode() for k, v in r.http.headers}
                    assert headers.get("content-encoding") == expected
                    out = await r.tensors()
                assert arrays_equal(out["x"], x) and arrays_equal(out["s"], s)

    asyncio.run(go())


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_tritonclient_compressed_response(server: Server, algorithm: str) -> None:
    arrays = {dt: triton_sample(dt) for dt in ("FP32", "INT64", "BYTES", "BOOL")}
    inputs = []
    for dt, arr in arrays.items():
        inp = triton_http.InferInput(dt.lower(), list(arr.shape), dt)
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    client = triton_http.InferenceServerClient(host(server))
    try:
        result = client.infer("echo", inputs, response_compression_algorithm=algorithm)
    finally:
        client.close()
    for dt, arr in arrays.items():
        assert arrays_equal(result.as_numpy(dt.lower()), arr), dt


# -- 256 MiB each way, bounded server memory -------------------------------------------


@pytest.mark.slow
def test_256mib_each_way_server_memory_bounded() -> None:
    from binproto.adapters import httpx as bphttpx

    payload = 256 * MiB
    arr = np.empty(payload // 4, dtype=np.float32)
    arr[:] = 1.25
    arr[::1024] = np.arange(arr[::1024].size, dtype=np.float32)
    with run_example_server() as srv:
        baseline = srv.status("VmRSS")
        with httpx.Client(base_url=srv.url, timeout=120) as client:
            result = bphttpx.infer(client, "echo", {"x": arr})
        peak = srv.status("VmHWM")
    got = result.tensors["x"]
    assert got.shape == arr.shape and np.array_equal(got, arr)
    # The echo holds the tensor once (assembled from the chunks, then sent from
    # that memory); a second full copy anywhere would add another payload.
    assert peak - baseline <= 1.5 * payload, (peak - baseline) / payload
    assert peak <= 2.5 * payload, peak / payload
