"""tritonclient (sync and aio) calls the V2 application on every backend.

The ``server`` fixture serves tests/models.py's models on each backend of
the ``backend`` matrix (conftest.py). Each test holds every backend to
what tritonclient sends and reads: every datatype, binary and JSON,
compression, metadata, health, and errors.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient
from tritonclient.utils import InferenceServerException

import binproto
from binproto.adapters._server import V2Server

from .models import (
    BINARY_ONLY,
    NON_UTF8,
    NUMERIC,
    UTF8,
    as_bytes,
    binary_expected,
    same,
    server_models,
)
from .servers import Running, serving

Array = np.ndarray[Any, Any]


@pytest.fixture(scope="module")
def server(backend: str) -> Iterator[Running]:
    yield from serving(backend, V2Server(server_models()), timeout=10)


@pytest.fixture(scope="module")
def port(server: Running) -> int:
    return server.port


def _triton(port: int) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(f"127.0.0.1:{port}", connection_timeout=30)


def _inputs(client: Any, items: list[tuple[str, str, Array, bool]]) -> list[Any]:
    """tritonclient inputs of ``client`` (tritonclient.http or its aio
    module) from ``(name, datatype, array, binary)``."""
    inputs = []
    for name, datatype, arr, binary in items:
        inp = client.InferInput(name, list(arr.shape), datatype)
        inp.set_data_from_numpy(arr, binary_data=binary)
        inputs.append(inp)
    return inputs


def _triton_echo(
    port: int,
    items: list[tuple[str, str, np.ndarray[Any, Any]]],
    *,
    binary_in: bool,
    binary_out: bool,
) -> httpclient.InferResult:
    binary = [binary_in or datatype in ("FP16", "BF16") for _, datatype, _ in items]
    inputs = _inputs(httpclient, [(*item, b) for item, b in zip(items, binary, strict=True)])
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary_out) for n, _, _ in items]
    client = _triton(port)
    try:
        return client.infer("echo", inputs, outputs=outputs)
    finally:
        client.close()


@pytest.mark.parametrize("binary_in", [True, False], ids=["bin_in", "json_in"])
@pytest.mark.parametrize("binary_out", [True, False], ids=["bin_out", "json_out"])
def test_tritonclient_every_datatype(server: Running, binary_in: bool, binary_out: bool) -> None:
    items = [(f"t_{dt}", dt, arr) for dt, arr in NUMERIC + BINARY_ONLY]
    items.append(("t_bytes", "BYTES", UTF8))
    result = _triton_echo(server.port, items, binary_in=binary_in, binary_out=binary_out)
    for name, datatype, arr in items:
        got = result.as_numpy(name)
        if datatype == "BYTES":
            assert as_bytes(got) == as_bytes(arr)
        else:
            assert got.shape == arr.shape
            np.testing.assert_array_equal(got.astype(arr.dtype), arr)
        output = result.get_output(name)
        assert output["datatype"] == datatype
        binary = "binary_data_size" in output.get("parameters", {})
        assert binary == (binary_out or datatype in ("FP16", "BF16"))


def test_tritonclient_non_utf8_bytes(server: Running) -> None:
    # Asked for as JSON, BYTES that are not UTF-8 still come back binary.
    for binary_out in (True, False):
        result = _triton_echo(
            server.port, [("s", "BYTES", NON_UTF8)], binary_in=True, binary_out=binary_out
        )
        assert as_bytes(result.as_numpy("s")) == list(NON_UTF8)


@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_zero_size(server: Running, binary: bool) -> None:
    items: list[tuple[str, str, np.ndarray[Any, Any]]] = [
        ("f", "FP32", np.zeros((0,), dtype=np.float32)),
        ("i", "INT64", np.zeros((2, 0), dtype=np.int64)),
        ("b", "BOOL", np.zeros((0, 3), dtype=np.bool_)),
        ("s", "BYTES", np.zeros((0,), dtype=np.object_)),
        ("h", "FP16", np.zeros((0, 2), dtype=np.float16)),
    ]
    result = _triton_echo(server.port, items, binary_in=binary, binary_out=binary)
    for name, _, arr in items:
        assert result.as_numpy(name).shape == arr.shape


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_tritonclient_compressed_request(server: Running, algorithm: str) -> None:
    x = np.arange(10_000, dtype=np.int64)
    inp = httpclient.InferInput("x", list(x.shape), "INT64")
    inp.set_data_from_numpy(x)
    client = _triton(server.port)
    try:
        result = client.infer(
            "echo",
            [inp],
            outputs=[httpclient.InferRequestedOutput("x", binary_data=True)],
            request_compression_algorithm=algorithm,
            response_compression_algorithm=algorithm,  # may be ignored: identity is valid
        )
    finally:
        client.close()
    np.testing.assert_array_equal(result.as_numpy("x"), x)


def test_tritonclient_metadata_and_health(server: Running) -> None:
    client = _triton(server.port)
    try:
        assert client.is_server_live()
        assert client.is_server_ready()
        assert client.is_model_ready("echo")
        meta = client.get_server_metadata()
        assert "binary_tensor_data" in meta["extensions"]
        assert client.get_model_metadata("echo")["name"] == "echo"
        assert client.get_model_metadata("events", model_version="2")["versions"] == ["1", "2"]
        with pytest.raises(InferenceServerException, match="unknown model"):
            client.get_model_metadata("nope")
    finally:
        client.close()


def test_tritonclient_errors(server: Running) -> None:
    client = _triton(server.port)
    try:
        inp = httpclient.InferInput("x", [2], "FP32")
        inp.set_data_from_numpy(np.zeros(2, dtype=np.float32))
        inp._datatype = "FP8"  # no V2 datatype: the server must say so
        with pytest.raises(InferenceServerException) as info:
            client.infer("echo", [inp])
        assert info.value.status() == "400"
        assert "invalid datatype 'FP8'" in info.value.message()

        inp = httpclient.InferInput("x", [2], "FP32")
        inp.set_data_from_numpy(np.zeros(2, dtype=np.float32))
        with pytest.raises(InferenceServerException, match="unexpected inference output"):
            client.infer("echo", [inp], outputs=[httpclient.InferRequestedOutput("y")])
        with pytest.raises(InferenceServerException, match="unknown model"):
            client.infer("nope", [inp])
        # Refused before its body was read, a large request still gets the answer.
        big = httpclient.InferInput("x", [1 << 21], "FP32")
        big.set_data_from_numpy(np.zeros(1 << 21, dtype=np.float32))
        with pytest.raises(InferenceServerException, match="unknown model"):
            client.infer("nope", [big])
        # The same client goes on working after errors.
        result = client.infer("echo", [inp])
        np.testing.assert_array_equal(result.as_numpy("x"), np.zeros(2, dtype=np.float32))
    finally:
        client.close()


def test_tritonclient_aio(server: Running) -> None:
    async def main() -> None:
        client = aioclient.InferenceServerClient(f"127.0.0.1:{server.port}")
        try:
            assert await client.is_server_live()
            meta = await client.get_server_metadata()
            assert "binary_tensor_data" in meta["extensions"]
            for binary in (True, False):
                items = [(dt, dt, arr, binary) for dt, arr in [*NUMERIC, ("BYTES", UTF8)]]
                inputs = _inputs(aioclient, [*items, ("raw", "BYTES", NON_UTF8, True)])
                outputs = [aioclient.InferRequestedOutput(i.name(), binary) for i in inputs]
                result = await client.infer("echo", inputs, outputs=outputs)
                for dt, arr in NUMERIC:
                    np.testing.assert_array_equal(result.as_numpy(dt).astype(arr.dtype), arr)
                assert as_bytes(result.as_numpy("BYTES")) == as_bytes(UTF8)
                assert as_bytes(result.as_numpy("raw")) == list(NON_UTF8)
            bad = aioclient.InferInput("x", [1], "INT32")
            bad.set_data_from_numpy(np.zeros(1, dtype=np.int32))
            bad._datatype = "INT4"
            with pytest.raises(InferenceServerException, match="invalid datatype"):
                await client.infer("echo", [bad])
        finally:
            await client.close()

    asyncio.run(main())


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_tritonclient_compressed_response(server: Running, algorithm: str) -> None:
    items = [(dt, dt, arr, True) for dt, arr in NUMERIC] + [("raw", "BYTES", NON_UTF8, True)]
    inputs = _inputs(httpclient, items)
    client = _triton(server.port)
    try:
        result = client.infer("echo", inputs, response_compression_algorithm=algorithm)
    finally:
        client.close()
    for dt, arr in NUMERIC:
        np.testing.assert_array_equal(result.as_numpy(dt), arr)
    assert as_bytes(result.as_numpy("raw")) == list(NON_UTF8)


TRITON_TYPES = ["BOOL", "UINT8", "INT16", "INT32", "INT64", "UINT64", "FP16", "FP32", "FP64"]


def triton_sample(datatype: str) -> Array:
    dtype = binproto.DATATYPES[datatype].dtype
    if datatype == "BOOL":
        return np.array([[True, False, True], [False, False, True]])
    return (np.arange(6) * 3 + 1).astype(dtype).reshape(2, 3)


# tritonclient has no JSON form for FP16: it is only sent binary.
TRITON_CASES = [(dt, b) for dt in TRITON_TYPES for b in (True, False) if b or dt != "FP16"]


@pytest.mark.parametrize(("datatype", "binary"), TRITON_CASES)
def test_tritonclient_round_trip(port: int, datatype: str, binary: bool) -> None:
    arr = triton_sample(datatype)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        inp = httpclient.InferInput("x", list(arr.shape), datatype)
        inp.set_data_from_numpy(arr, binary_data=binary)
        out = httpclient.InferRequestedOutput("x", binary_data=binary)
        result = client.infer("echo", [inp], outputs=[out], request_id="t1")
        assert same(result.as_numpy("x"), arr)
        response = result.get_response()
        assert response["id"] == "t1" and response["model_name"] == "echo"
        params = response["outputs"][0].get("parameters", {})
        assert ("binary_data_size" in params) == binary_expected(datatype, binary)
    finally:
        client.close()


def test_tritonclient_bytes_binary_data_output_and_zero_size(port: int) -> None:
    text = np.array([[b"\xff\xfe"], [b""], [b"\x80 not utf-8"]], dtype=np.object_)
    words = np.array([b"plain", b"\xc3\xa9"], dtype=np.object_)
    empty = np.zeros((0, 5), dtype=np.float32)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        inputs = _inputs(
            httpclient,
            [
                ("text", "BYTES", text, True),
                ("words", "BYTES", words, False),
                ("empty", "FP32", empty, True),
            ],
        )
        # No outputs named: tritonclient asks for binary_data_output.
        result = client.infer("echo", inputs)
        assert same(result.as_numpy("text"), text)
        assert same(result.as_numpy("words"), words)
        assert same(result.as_numpy("empty"), empty)
        assert all("binary_data_size" in o["parameters"] for o in result.get_response()["outputs"])
        # JSON asked for every output: the non-UTF-8 BYTES still come back binary.
        outputs = [httpclient.InferRequestedOutput(n, binary_data=False) for n in ("text", "words")]
        result = client.infer("echo", inputs, outputs=outputs)
        assert same(result.as_numpy("text"), text)
        by_name = {o["name"]: o for o in result.get_response()["outputs"]}
        assert "binary_data_size" in by_name["text"]["parameters"]
        assert by_name["words"]["data"] == ["plain", "é"]
    finally:
        client.close()


def test_tritonclient_endpoints_and_errors(port: int) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("echo") and not client.is_model_ready("nope")
        assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
        inp = httpclient.InferInput("x", [2], "FP32")
        inp.set_data_from_numpy(np.ones(2, dtype=np.float32))
        with pytest.raises(InferenceServerException, match="unknown model") as info:
            client.infer("nope", [inp])
        assert info.value.status() == "404"
        with pytest.raises(InferenceServerException, match="refuses this input") as info:
            client.infer("fail", [inp])
        assert info.value.status() == "422"
        with pytest.raises(InferenceServerException, match="unexpected inference output"):
            client.infer("echo", [inp], outputs=[httpclient.InferRequestedOutput("y")])
        assert same(client.infer("echo", [inp]).as_numpy("x"), np.ones(2, dtype=np.float32))
    finally:
        client.close()


def test_tritonclient_aio_binary_chosen_per_output(port: int) -> None:
    arrays: dict[str, Array] = {
        "f": np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4),
        "i": np.array([[-(2**40), 2**40]], dtype=np.int64),
        "s": np.array([b"\xff\x00", b"ok"], dtype=np.object_),
        "b": np.array([True, False]),
        "e": np.zeros((0,), dtype=np.uint16),
    }
    types = {"f": "FP32", "i": "INT64", "s": "BYTES", "b": "BOOL", "e": "UINT16"}

    async def go() -> None:
        client = aioclient.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            assert await client.is_server_ready()
            items = [(name, types[name], arr, name != "b") for name, arr in arrays.items()]
            inputs = _inputs(aioclient, items)
            outputs = [aioclient.InferRequestedOutput(n, binary_data=n != "i") for n in arrays]
            result = await client.infer("echo", inputs, outputs=outputs)
            for name, arr in arrays.items():
                assert same(result.as_numpy(name), arr), name
            params = {o["name"]: o.get("parameters", {}) for o in result.get_response()["outputs"]}
            assert "binary_data_size" not in params["i"] and "binary_data_size" in params["f"]
            with pytest.raises(InferenceServerException, match="unknown model"):
                await client.infer("nope", inputs)
        finally:
            await client.close()

    asyncio.run(go())


def test_server_compresses_for_tritonclient(port: int) -> None:
    """The sync client asks for a coding; the aio client always sends
    ``Accept-Encoding: gzip, deflate, br`` and gets gzip."""
    arrays = {dt: triton_sample(dt) for dt in ("FP32", "INT64", "BOOL")}
    arrays["BYTES"] = np.array([[b"\xff\x00"], [b""], [b"abc"]], dtype=np.object_)
    for algorithm in ("gzip", "deflate"):
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            inputs = _inputs(httpclient, [(dt.lower(), dt, a, True) for dt, a in arrays.items()])
            result = client.infer("echo", inputs, response_compression_algorithm=algorithm)
            for dt, arr in arrays.items():
                assert same(result.as_numpy(dt.lower()), arr), (algorithm, dt)
        finally:
            client.close()

    async def aio() -> None:
        client = aioclient.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            inputs = _inputs(aioclient, [(dt.lower(), dt, a, True) for dt, a in arrays.items()])
            result = await client.infer("echo", inputs)
            for dt, arr in arrays.items():
                assert same(result.as_numpy(dt.lower()), arr), dt
        finally:
            await client.close()

    asyncio.run(aio())
