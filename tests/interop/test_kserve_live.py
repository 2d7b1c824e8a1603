"""A live KServe server, called with raw HTTP bodies; its answers decoded by binproto.

Bodies are built by tritonclient's encoder or by hand and posted with
``http.client`` to the session's KServe echo server on 127.0.0.1. Every
response is decoded with ``binproto.decode_response`` using the response's own
Inference-Header-Content-Length, and re-parsed in every chunking with the end of
input as the only framing (KServe answers binary bodies with chunked transfer
encoding, without Content-Length).

What KServe itself does not do is an expected failure (strict): a KServe
release that fixes it makes the suite fail here, so docs/interop.md gets updated.
"""

from __future__ import annotations

import gzip
import json
import zlib
from typing import Any

import numpy as np
import pytest

import binproto

from ..helpers import arrays_equal, assert_same_everywhere
from .kserve_peer import KServePeer, Reply
from .samples import DATATYPES, sample, triton_input, utf8_bytes

httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

OCTET = "application/octet-stream"
JSON = "application/json"

# Datatypes KServe's echo path cannot carry, and why.
KSERVE_UNSUPPORTED = {
    "BF16": "KServe has no BF16 numpy mapping: 400 'invalid datatype None in the input'",
}


def request_headers(hl: int | None) -> dict[str, str]:
    if hl is None:
        return {"Content-Type": JSON}
    return {"Inference-Header-Content-Length": str(hl), "Content-Type": OCTET}


def decode(reply: Reply) -> binproto.DecodedMessage:
    """Decode a 200 response with binproto, and check every chunking agrees."""
    assert reply.status == 200, reply.body[:500]
    hl = binproto.header_length_from(reply.headers, content_length=len(reply.body))
    msg = binproto.decode_response(reply.body, header_length=hl)
    outcome = assert_same_everywhere(
        lambda: binproto.Parser("response", header_length=hl), reply.body, two_way_limit=0
    )
    assert outcome.error is None
    return msg


def post(peer: KServePeer, inputs: list[Any], outputs: list[Any] | None = None) -> Reply:
    body, hl = httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs)
    return peer.infer(body, request_headers(hl))


def datatype_param(datatype: str, sample_name: str = "") -> Any:
    marks = []
    if datatype in KSERVE_UNSUPPORTED:
        marks.append(pytest.mark.xfail(strict=True, reason=KSERVE_UNSUPPORTED[datatype]))
    return pytest.param(datatype, marks=marks, id=datatype + sample_name)


def kserve_sample(datatype: str) -> np.ndarray[Any, Any]:
    # Non-UTF-8 BYTES have their own test below.
    return utf8_bytes() if datatype == "BYTES" else sample(datatype)


@pytest.mark.parametrize("zero", [False, True], ids=["", "zero-size"])
@pytest.mark.parametrize("datatype", [datatype_param(dt) for dt in DATATYPES])
def test_binary_in_binary_out(kserve_server: KServePeer, datatype: str, zero: bool) -> None:
    arr = kserve_sample(datatype).reshape(2, 2)
    if zero:
        arr = arr[:0]
    reply = post(kserve_server, [triton_input("x", arr, datatype, True)])
    msg = decode(reply)
    info = msg.header.tensor("x")
    assert info.datatype == datatype
    assert info.binary_size is not None, "binary_data_output=true asks for binary outputs"
    assert arrays_equal(msg.tensors["x"], arr)


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="KServe turns binary BYTES into JSON strings internally: 500 'Failed to encode ... using"
    " UTF-8' for non-UTF-8 elements",
)
def test_binary_bytes_not_utf8(kserve_server: KServePeer) -> None:
    arr = sample("BYTES")
    reply = post(kserve_server, [triton_input("x", arr, "BYTES", True)])
    assert reply.status == 200, reply.body
    assert arrays_equal(decode(reply).tensors["x"], arr)


def test_every_supported_datatype_in_one_request(kserve_server: KServePeer) -> None:
    arrays = {
        f"in_{dt}": kserve_sample(dt).reshape(4, 1)
        for dt in DATATYPES
        if dt not in KSERVE_UNSUPPORTED
    }
    inputs = [triton_input(name, arr, name[3:], True) for name, arr in arrays.items()]
    msg = decode(post(kserve_server, inputs))
    assert list(msg.tensors) == list(arrays)
    for name, arr in arrays.items():
        assert arrays_equal(msg.tensors[name], arr), name


def test_mixed_json_and_binary(kserve_server: KServePeer) -> None:
    """Each requested output's binary_data decides its form, whatever the input's form."""
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    b = np.array([0.25, -1.0], dtype=np.float64)
    s = utf8_bytes()
    inputs = [
        triton_input("a", a, "INT32", False),
        triton_input("b", b, "FP64", True),
        triton_input("s", s, "BYTES", True),
    ]
    outputs = [
        httpclient.InferRequestedOutput("s", binary_data=False),
        httpclient.InferRequestedOutput("a", binary_data=True),
        httpclient.InferRequestedOutput("b", binary_data=False),
    ]
    msg = decode(post(kserve_server, inputs, outputs))
    # Outputs come back in the order they were requested.
    assert [t.name for t in msg.header.tensors] == ["s", "a", "b"]
    assert [t.binary_size is not None for t in msg.header.tensors] == [False, True, False]
    expected: dict[str, np.ndarray[Any, Any]] = {"a": a, "b": b, "s": s}
    for name, arr in expected.items():
        assert arrays_equal(msg.tensors[name], arr), name


def test_only_listed_outputs_return(kserve_server: KServePeer) -> None:
    inputs = [
        triton_input("a", np.array([1, 2], dtype=np.uint8), "UINT8", True),
        triton_input("b", np.array([3], dtype=np.uint8), "UINT8", True),
    ]
    outputs = [httpclient.InferRequestedOutput("b", binary_data=True)]
    msg = decode(post(kserve_server, inputs, outputs))
    assert list(msg.tensors) == ["b"]


def test_json_in_json_out(kserve_server: KServePeer) -> None:
    """A plain JSON exchange; KServe writes null for absent fields and raw UTF-8."""
    a = np.array([[1.5, 2.0], [3.0, -4.0]], dtype=np.float32)
    s = utf8_bytes()
    inputs = [triton_input("a", a, "FP32", False), triton_input("s", s, "BYTES", False)]
    outputs = [httpclient.InferRequestedOutput(n, binary_data=False) for n in ("a", "s")]
    reply = post(kserve_server, inputs, outputs)
    assert reply.header("inference-header-content-length") is None
    assert reply.header("content-type") == JSON
    raw = json.loads(reply.body)
    assert raw["model_version"] is None and raw["parameters"] is None
    assert "é".encode() in reply.body  # BYTES as JSON strings, not \u escapes
    msg = decode(reply)
    assert msg.header.model_version is None
    assert arrays_equal(msg.tensors["a"], a)
    assert arrays_equal(msg.tensors["s"], s)


def test_nested_json_data(kserve_server: KServePeer) -> None:
    body = b'{"inputs":[{"name":"n","shape":[2,2],"datatype":"INT64","data":[[1,2],[3,4]]}]}'
    msg = decode(kserve_server.infer(body, {"Content-Type": JSON}))
    assert arrays_equal(msg.tensors["n"], np.array([[1, 2], [3, 4]], dtype=np.int64))


def test_response_header_name_is_lowercase(kserve_server: KServePeer) -> None:
    """KServe sends inference-header-content-length in lower case; binproto reads any case."""
    reply = post(kserve_server, [triton_input("x", np.arange(3, dtype=np.int8), "INT8", True)])
    names = [k for k, _ in reply.headers]
    assert "inference-header-content-length" in names
    assert binproto.header_length_from(reply.headers) is not None
    assert binproto.header_length_from(
        [(k.upper(), v) for k, v in reply.headers]
    ) == binproto.header_length_from(reply.headers)


def test_request_header_name_in_lower_case(kserve_server: KServePeer) -> None:
    arr = np.arange(3, dtype=np.int8)
    body, hl = httpclient.InferenceServerClient.generate_request_body(
        [triton_input("x", arr, "INT8", True)]
    )
    reply = kserve_server.infer(body, {"inference-header-content-length": str(hl)})
    assert arrays_equal(decode(reply).tensors["x"], arr)


def test_binary_response_has_no_content_length(kserve_server: KServePeer) -> None:
    """KServe streams binary responses chunked; binproto ends them at the end of input."""
    reply = post(kserve_server, [triton_input("x", np.arange(3, dtype=np.int8), "INT8", True)])
    assert reply.header("content-length") is None
    assert reply.header("transfer-encoding") == "chunked"


@pytest.mark.xfail(
    strict=True, raises=AssertionError, reason="KServe sends no Content-Type on binary responses"
)
def test_binary_response_content_type(kserve_server: KServePeer) -> None:
    reply = post(kserve_server, [triton_input("x", np.arange(3, dtype=np.int8), "INT8", True)])
    assert reply.header("content-type") == OCTET


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="KServe reads a body without Inference-Header-Content-Length as JSON only when"
    " labelled application/json (400 'received byte inputs, but the"
    " 'inference-header-content-length' header is missing')",
)
@pytest.mark.parametrize("content_type", [None, "text/plain"])
def test_plain_json_without_json_content_type(
    kserve_server: KServePeer, content_type: str | None
) -> None:
    body = b'{"inputs":[{"name":"a","shape":[1],"datatype":"INT32","data":[7]}]}'
    headers = {} if content_type is None else {"Content-Type": content_type}
    reply = kserve_server.infer(body, headers)
    assert reply.status == 200, reply.body


def test_binary_body_labelled_json_is_refused(kserve_server: KServePeer) -> None:
    """KServe lets FastAPI parse an application/json body whole: binary tensors break it."""
    arr = np.arange(3, dtype=np.int8)
    body, hl = httpclient.InferenceServerClient.generate_request_body(
        [triton_input("x", arr, "INT8", True)]
    )
    reply = kserve_server.infer(
        body, {"Inference-Header-Content-Length": str(hl), "Content-Type": JSON}
    )
    # 400 when the tensor bytes are not UTF-8, 422 ("Extra data") when they are.
    assert reply.status in (400, 422)
    assert "detail" in json.loads(reply.body)
    # binproto goes by the header length, whatever the Content-Type.
    assert arrays_equal(binproto.decode_request(body, header_length=hl).tensors["x"], arr)


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="kserve#5907: KServe returns listed outputs without binary_data as JSON even when"
    " binary_data_output is true (the extension's text says binary)",
)
def test_listed_output_without_binary_data_follows_binary_data_output(
    kserve_server: KServePeer,
) -> None:
    arr = np.arange(4, dtype=np.float32)
    body, hl = httpclient.InferenceServerClient.generate_request_body(
        [triton_input("x", arr, "FP32", True)]
    )
    header = json.loads(body[:hl])
    header["outputs"] = [{"name": "x"}]
    header["parameters"] = {"binary_data_output": True}
    js = json.dumps(header).encode()
    reply = kserve_server.infer(js + body[hl:], request_headers(len(js)))
    msg = decode(reply)
    assert arrays_equal(msg.tensors["x"], arr)
    assert msg.header.tensor("x").binary_size == arr.nbytes


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="KServe refuses FP16 outputs the request asks as JSON (400 'Sending FP16 data via JSON"
    " is not supported'); FP16 has no JSON form, so binproto sends it binary",
)
def test_fp16_output_asked_as_json(kserve_server: KServePeer) -> None:
    arr = np.array([1.0, 0.5], dtype=np.float16)
    outputs = [httpclient.InferRequestedOutput("x", binary_data=False)]
    reply = post(kserve_server, [triton_input("x", arr, "FP16", True)], outputs)
    assert reply.status == 200, reply.body
    assert arrays_equal(decode(reply).tensors["x"], arr)


NAN_BODY = b'{"inputs":[{"name":"f","shape":[3],"datatype":"FP32","data":[NaN,Infinity,1.0]}]}'


def test_nan_in_json_becomes_null(kserve_server: KServePeer) -> None:
    """KServe writes NaN and Infinity as null in JSON: binproto reports it, no crash."""
    reply = kserve_server.infer(NAN_BODY, {"Content-Type": JSON})
    assert reply.status == 200
    assert json.loads(reply.body)["outputs"][0]["data"] == [None, None, 1.0]
    with pytest.raises(binproto.RemoteProtocolError, match="does not fit datatype FP32"):
        binproto.decode_response(reply.body, header_length=None)


@pytest.mark.xfail(
    strict=True,
    raises=(AssertionError, binproto.RemoteProtocolError),
    reason="KServe serializes NaN/Infinity in JSON data as null (orjson)",
)
def test_nan_round_trips_as_json(kserve_server: KServePeer) -> None:
    reply = kserve_server.infer(NAN_BODY, {"Content-Type": JSON})
    got = decode(reply).tensors["f"]
    assert arrays_equal(got, np.array([np.nan, np.inf, 1.0], dtype=np.float32))


def test_nan_in_json_request_binary_out(kserve_server: KServePeer) -> None:
    """NaN/Infinity tokens in a request survive when the answer is binary."""
    body = NAN_BODY.replace(b"]}]}", b']}],"parameters":{"binary_data_output":true}}')
    got = decode(kserve_server.infer(body, {"Content-Type": JSON})).tensors["f"]
    assert arrays_equal(got, np.array([np.nan, np.inf, 1.0], dtype=np.float32))


def test_bool_bytes_other_than_0_and_1(kserve_server: KServePeer) -> None:
    """KServe takes any non-zero BOOL byte as true; binproto's strict_bool rejects it."""
    js = (
        b'{"inputs":[{"name":"b","shape":[3],"datatype":"BOOL","parameters":'
        b'{"binary_data_size":3}}],"parameters":{"binary_data_output":true}}'
    )
    body = js + b"\x01\x02\x00"
    reply = kserve_server.infer(body, request_headers(len(js)))
    assert arrays_equal(decode(reply).tensors["b"], np.array([True, True, False]))
    with pytest.raises(binproto.RemoteProtocolError) as err:
        binproto.decode_request(body, header_length=len(js))
    assert err.value.offset == len(js) + 1
    lenient = binproto.decode_request(body, header_length=len(js), strict_bool=False)
    assert lenient.tensors["b"].view(np.uint8).tolist() == [1, 2, 0]


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="KServe does not decompress requests (400 'Unrecognized request format')",
)
@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_request(kserve_server: KServePeer, algorithm: str) -> None:
    arr = np.arange(8, dtype=np.int16)
    body, hl = httpclient.InferenceServerClient.generate_request_body(
        [triton_input("x", arr, "INT16", True)]
    )
    packed = gzip.compress(body) if algorithm == "gzip" else zlib.compress(body)
    headers = {**request_headers(hl), "Content-Encoding": algorithm}
    reply = kserve_server.infer(packed, headers)
    assert reply.status == 200, reply.body
    assert arrays_equal(decode(reply).tensors["x"], arr)


@pytest.mark.xfail(
    strict=True, raises=AssertionError, reason="KServe ignores Accept-Encoding: never compresses"
)
@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_response(kserve_server: KServePeer, algorithm: str) -> None:
    arr = np.arange(8, dtype=np.int16)
    body, hl = httpclient.InferenceServerClient.generate_request_body(
        [triton_input("x", arr, "INT16", True)]
    )
    reply = kserve_server.infer(body, {**request_headers(hl), "Accept-Encoding": algorithm})
    assert reply.status == 200
    assert reply.header("content-encoding") == algorithm


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="KServe does not take raw binary requests (Inference-Header-Content-Length: 0)",
)
def test_raw_binary_request(kserve_server: KServePeer) -> None:
    reply = kserve_server.infer(np.arange(4, dtype=np.float32).tobytes(), request_headers(0))
    assert reply.status == 200, reply.body


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="KServe's server metadata does not list binary_tensor_data, though it implements it",
)
def test_server_metadata_lists_the_extension(kserve_server: KServePeer) -> None:
    reply = kserve_server.request("GET", "/v2")
    assert reply.status == 200
    assert "binary_tensor_data" in json.loads(reply.body)["extensions"]


def faulty_bodies() -> dict[str, tuple[bytes, int]]:
    """Malformed requests: a short body, bytes past the end, a size the shape contradicts."""
    arr = np.arange(4, dtype=np.float32)
    body, hl = httpclient.InferenceServerClient.generate_request_body(
        [triton_input("x", utf8_bytes(), "BYTES", True), triton_input("y", arr, "FP32", True)]
    )
    assert hl is not None
    wrong_js = (
        b'{"inputs":[{"name":"a","shape":[2],"datatype":"FP32",'
        b'"parameters":{"binary_data_size":4}}]}'
    )
    return {
        "truncated": (body[:-3], hl),
        "extra_bytes": (body + b"xyz", hl),
        "wrong_size": (wrong_js + b"\0" * 4, len(wrong_js)),
    }


KSERVE_ON_FAULTS = {
    # what KServe answers (status, error substring), observed
    "truncated": (500, "buffer size must be a multiple of element size"),
    "extra_bytes": (200, None),
    "wrong_size": (500, "cannot reshape array"),
}


@pytest.mark.parametrize("fault", sorted(KSERVE_ON_FAULTS))
def test_malformed_requests(kserve_server: KServePeer, fault: str) -> None:
    """binproto answers 400 with an offset where KServe answers 500, or accepts."""
    body, hl = faulty_bodies()[fault]
    with pytest.raises(binproto.RemoteProtocolError) as err:
        binproto.decode_request(body, header_length=hl)
    assert err.value.status_hint == 400
    assert err.value.offset is not None
    reply = kserve_server.infer(body, request_headers(hl))
    status, message = KSERVE_ON_FAULTS[fault]
    assert reply.status == status, reply.body
    if message is not None:
        assert message in json.loads(reply.body)["error"]


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="KServe answers malformed bodies with 500 or 200, not 400",
)
@pytest.mark.parametrize("fault", sorted(KSERVE_ON_FAULTS))
def test_malformed_requests_get_400(kserve_server: KServePeer, fault: str) -> None:
    body, hl = faulty_bodies()[fault]
    assert kserve_server.infer(body, request_headers(hl)).status == 400


def test_error_body_shapes(kserve_server: KServePeer) -> None:
    """KServe's own errors are {"error": ...}; FastAPI's body errors are {"detail": ...}."""
    missing = kserve_server.request("POST", "/v2/models/nope/infer", b'{"inputs":[]}', {})
    assert missing.status == 404
    assert json.loads(missing.body) == {"error": "Model with name nope does not exist."}
    broken = kserve_server.infer(b'{"inputs":[', {"Content-Type": JSON})
    assert broken.status == 422
    assert isinstance(json.loads(broken.body)["detail"], list)
    version = kserve_server.request("POST", "/v2/models/echo/versions/1/infer", NAN_BODY, {})
    assert version.status == 501
    assert "error" in json.loads(version.body)


def triton_infer(kind: str, peer: KServePeer, inputs: list[Any]) -> Any:
    """``infer`` with tritonclient's real sync or aio client against KServe."""
    url = f"{peer.host}:{peer.port}"
    if kind == "sync":
        client = httpclient.InferenceServerClient(url)
        try:
            return client.infer(peer.model, inputs)
        finally:
            client.close()
    import asyncio

    import tritonclient.http.aio as aioclient

    async def go() -> Any:
        client = aioclient.InferenceServerClient(url)
        try:
            return await client.infer(peer.model, inputs)
        finally:
            await client.close()

    return asyncio.run(go())


@pytest.mark.parametrize("kind", ["sync", "aio"])
def test_tritonclient_binary_request_to_kserve(kserve_server: KServePeer, kind: str) -> None:
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    result = triton_infer(kind, kserve_server, [triton_input("x", arr, "FP32", True)])
    assert arrays_equal(result.as_numpy("x"), arr)


@pytest.mark.xfail(
    strict=True,
    raises=InferenceServerException,
    reason="tritonclient labels a JSON-only body with no Content-Type (sync) or"
    " application/octet-stream (aio); KServe then wants Inference-Header-Content-Length (400)",
)
@pytest.mark.parametrize("kind", ["sync", "aio"])
def test_tritonclient_json_request_to_kserve(kserve_server: KServePeer, kind: str) -> None:
    arr = np.arange(6, dtype=np.int32).reshape(2, 3)
    result = triton_infer(kind, kserve_server, [triton_input("x", arr, "INT32", False)])
    assert arrays_equal(result.as_numpy("x"), arr)


def test_non_ascii_names(kserve_server: KServePeer) -> None:
    """KServe writes raw UTF-8 in a binary response's header and counts its bytes."""
    arr = np.arange(3, dtype=np.uint32)
    body, hl = httpclient.InferenceServerClient.generate_request_body(
        [triton_input("entrée", arr, "UINT32", True)], request_id="identité"
    )
    reply = kserve_server.infer(body, request_headers(hl))
    hl_out = binproto.header_length_from(reply.headers)
    assert hl_out is not None
    assert "entrée".encode() in reply.body[:hl_out]
    msg = decode(reply)
    assert msg.header.id == "identité"
    assert arrays_equal(msg.tensors["entrée"], arr)
