"""binproto's clients, and tritonclient, against a real Triton Inference Server.

Triton serves an identity model per datatype (``tests/interop/triton_peer.py``):
each request's INPUTn comes back as OUTPUTn, so every test compares the arrays
that come back with the arrays sent. tritonclient runs the same cases against
Triton and against binproto's server with the same models, and both must give
the same arrays.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import binproto
from binproto.adapters.h11 import HTTPError

from ..helpers import arrays_equal
from .samples import sample, utf8_bytes
from .triton_clients import CLIENTS, COMPRESSING_CLIENTS, Arrays, infer
from .triton_peer import (
    DATATYPES,
    SINGLE_INPUT_MODEL,
    TritonPeer,
    TritonStartError,
    model_name,
    start_triton,
    triton_unavailable,
)

MiB = 1 << 20


def two_inputs(datatype: str, *, utf8: bool = False) -> Arrays:
    """INPUT0: the datatype's edge values; INPUT1: three more elements."""
    first = utf8_bytes() if utf8 and datatype == "BYTES" else sample(datatype)
    return {"INPUT0": first, "INPUT1": first[[2, 0, 1]]}


def assert_identity(sent: Arrays, got: Arrays) -> None:
    """Each INPUTn came back as OUTPUTn: same shape, dtype and values."""
    assert sorted(got) == sorted(n.replace("INPUT", "OUTPUT") for n in sent)
    for name, arr in sent.items():
        out = got[name.replace("INPUT", "OUTPUT")]
        assert out.dtype == arr.dtype, name
        assert arrays_equal(out, arr), (name, out, arr)


def _json_outputs_possible(datatype: str) -> bool:
    # Triton: "sending FP16 data via JSON is not supported".
    return datatype != "FP16"


@pytest.mark.parametrize("binary_out", [True, False], ids=["binary-out", "json-out"])
@pytest.mark.parametrize("kind", CLIENTS)
def test_every_datatype(triton: TritonPeer, kind: str, binary_out: bool) -> None:
    for datatype in DATATYPES:
        if not binary_out and not _json_outputs_possible(datatype):
            continue
        # Triton writes BYTES raw into JSON strings: only UTF-8 round-trips as JSON.
        sent = two_inputs(datatype, utf8=not binary_out)
        got = infer(kind, triton.port, model_name(datatype), sent, binary_data_output=binary_out)
        assert_identity(sent, got)


@pytest.mark.parametrize("kind", ["asyncio", "trio", "httpx"])
def test_json_inputs(triton: TritonPeer, kind: str) -> None:
    for datatype in DATATYPES:
        if datatype == "FP16":  # no JSON form for FP16 data either way
            continue
        sent = two_inputs(datatype, utf8=True)  # NaN and -inf as JSON NaN/-Infinity
        got = infer(kind, triton.port, model_name(datatype), sent, binary=False)
        assert_identity(sent, got)


@pytest.mark.parametrize("kind", CLIENTS)
def test_zero_size_tensors(triton: TritonPeer, kind: str) -> None:
    for datatype in DATATYPES:
        sent = {"INPUT0": sample(datatype)[:0], "INPUT1": sample(datatype)[:1]}
        got = infer(kind, triton.port, model_name(datatype), sent)
        assert_identity(sent, got)


@pytest.mark.parametrize("kind", ["asyncio", "trio", "httpx-async"])
def test_listed_outputs_binary_and_json(triton: TritonPeer, kind: str) -> None:
    sent = two_inputs("INT64")
    outputs: list[str | binproto.RequestedOutput] = [
        binproto.RequestedOutput("OUTPUT1", binary_data=False),
        binproto.RequestedOutput("OUTPUT0", binary_data=True),
    ]
    got = infer(kind, triton.port, model_name("INT64"), sent, outputs=outputs)
    assert_identity(sent, got)
    only = infer(kind, triton.port, model_name("INT64"), sent, outputs=["OUTPUT1"])
    assert list(only) == ["OUTPUT1"] and arrays_equal(only["OUTPUT1"], sent["INPUT1"])


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
@pytest.mark.parametrize("kind", COMPRESSING_CLIENTS)
def test_compressed_requests_and_responses(triton: TritonPeer, kind: str, coding: str) -> None:
    sent = {"INPUT0": np.arange(50_000, dtype=np.int32), "INPUT1": np.zeros(7, np.int32)}
    got = infer(
        kind,
        triton.port,
        model_name("INT32"),
        sent,
        accept_encoding=coding,
        request_encoding=coding,
    )
    assert_identity(sent, got)


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_triton_compresses_what_binproto_decodes(triton: TritonPeer, coding: str) -> None:
    sent = {"INPUT0": np.arange(50_000, dtype=np.int32)}
    body = binproto.encode_request(sent, binary_data_output=True)
    compress = gzip.compress if coding == "gzip" else zlib.compress
    with httpx.stream(
        "POST",
        f"{triton.url}/v2/models/{model_name('INT32')}/infer",
        content=compress(bytes(body)),
        headers={
            binproto.HEADER_LENGTH_NAME: str(body.header_length),
            "Content-Encoding": coding,
            "Accept-Encoding": coding,
        },
    ) as response:
        raw = b"".join(response.iter_raw())  # as sent: still compressed
    assert response.status_code == 200
    assert response.headers["content-encoding"] == coding
    message = binproto.decode_response(
        raw,
        header_length=binproto.header_length_from(list(response.headers.raw)),
        content_encoding=coding,
    )
    assert arrays_equal(message.tensors["OUTPUT0"], sent["INPUT0"])
    assert len(raw) < sent["INPUT0"].nbytes  # it was compressed


@pytest.mark.parametrize("kind", ["asyncio", "httpx", "h11-example"])
def test_64_mib_tensor(triton: TritonPeer, kind: str) -> None:
    big = np.random.default_rng(0).integers(0, 255, 64 * MiB, dtype=np.uint8)
    sent = {"INPUT0": big, "INPUT1": big[:3]}
    got = infer(kind, triton.port, model_name("UINT8"), sent)
    assert_identity(sent, got)


def test_raw_binary_request(triton: TritonPeer) -> None:
    # Inference-Header-Content-Length: 0, the body is INPUT0's bytes.
    arr = np.array([0.5, -1.25, 3.0], dtype=np.float32)
    response = httpx.post(
        f"{triton.url}/v2/models/{SINGLE_INPUT_MODEL}/infer",
        content=arr.tobytes(),
        headers={binproto.HEADER_LENGTH_NAME: "0", "Content-Type": "application/octet-stream"},
    )
    assert response.status_code == 200, response.text
    message = binproto.decode_response(
        response.content, header_length=binproto.header_length_from(list(response.headers.raw))
    )
    assert arrays_equal(message.tensors["OUTPUT0"], arr)
    # binproto reads that request as Triton does, given the input's datatype.
    spec = binproto.TensorSpec("INPUT0", "FP32", [-1])
    request = binproto.decode_request(arr.tobytes(), header_length=0, raw_input=spec)
    assert arrays_equal(request.tensors["INPUT0"], arr)


def test_raw_binary_request_to_a_two_input_model_is_refused(triton: TritonPeer) -> None:
    response = httpx.post(
        f"{triton.url}/v2/models/{model_name('FP32')}/infer",
        content=np.zeros(2, np.float32).tobytes(),
        headers={binproto.HEADER_LENGTH_NAME: "0"},
    )
    assert response.status_code == 400
    assert "Raw request must only have 1 input" in response.json()["error"]


def _triton_error(triton: TritonPeer, model: str, body: binproto.EncodedBody) -> tuple[int, str]:
    response = httpx.post(
        f"{triton.url}/v2/models/{model}/infer", content=bytes(body), headers=dict(body.headers)
    )
    assert response.status_code >= 400
    message: str = response.json()["error"]
    return response.status_code, message


ERROR_CASES: dict[str, tuple[str, Arrays]] = {
    "unknown-model": ("no_such_model", {"INPUT0": np.zeros(2, np.int32)}),
    "wrong-datatype": (model_name("INT32"), {"INPUT0": np.zeros(2, np.float32)}),
    "unknown-input": (model_name("INT32"), {"INPUT9": np.zeros(2, np.int32)}),
    "wrong-rank": (model_name("INT32"), {"INPUT0": np.zeros((2, 2), np.int32)}),
}


@pytest.mark.parametrize("case", sorted(ERROR_CASES))
@pytest.mark.parametrize("kind", CLIENTS)
def test_triton_errors_raise_http_error_with_its_message(
    triton: TritonPeer, kind: str, case: str
) -> None:
    model, sent = ERROR_CASES[case]
    status, message = _triton_error(
        triton, model, binproto.encode_request(sent, binary_data_output=True)
    )
    with pytest.raises(HTTPError) as raised:
        infer(kind, triton.port, model, sent)
    assert raised.value.status == status
    assert raised.value.message == message


def test_fp16_as_json_is_refused_with_triton_message(triton: TritonPeer) -> None:
    sent = {"INPUT0": sample("FP16")}
    with pytest.raises(HTTPError, match="sending FP16 data via JSON is not supported") as raised:
        infer("asyncio", triton.port, model_name("FP16"), sent, binary_data_output=False)
    assert raised.value.status == 400


# -- BYTES that are not UTF-8, asked for as JSON --------------------------------


def test_non_utf8_bytes_come_back_binary(triton: TritonPeer) -> None:
    sent = two_inputs("BYTES")  # b"\xff\xfe\x00", b"", "é", b"\x80"
    for kind in CLIENTS:
        assert_identity(sent, infer(kind, triton.port, model_name("BYTES"), sent))


def test_non_utf8_bytes_as_json_output_are_refused_at_their_offset(triton: TritonPeer) -> None:
    # Triton writes the bytes raw into the JSON string: the header is not UTF-8,
    # so not JSON. binproto refuses it at the first such byte and says what to do.
    sent = {"INPUT0": sample("BYTES")}
    body = binproto.encode_request(sent, binary_data_output=False)
    response = httpx.post(
        f"{triton.url}/v2/models/{model_name('BYTES')}/infer",
        content=bytes(body),
        headers=dict(body.headers),
    )
    assert response.status_code == 200
    raw = response.content
    assert b'"\xff\xfe\\u0000"' in raw  # raw bytes; the NUL escaped
    with pytest.raises(binproto.RemoteProtocolError, match="invalid UTF-8") as raised:
        binproto.decode_response(raw, header_length=None)
    assert raised.value.offset == raw.index(b"\xff")
    assert "binary_data_output" in str(raised.value)
    for kind in CLIENTS:
        with pytest.raises(binproto.RemoteProtocolError, match="invalid UTF-8"):
            infer(kind, triton.port, model_name("BYTES"), sent, binary_data_output=False)


def test_tritonclient_fails_on_non_utf8_bytes_as_json(triton: TritonPeer) -> None:
    client = httpclient.InferenceServerClient(triton.address)
    inp = httpclient.InferInput("INPUT0", [4], "BYTES")
    inp.set_data_from_numpy(sample("BYTES"), binary_data=True)
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)
    with pytest.raises((UnicodeDecodeError, InferenceServerException)):
        client.infer(model_name("BYTES"), [inp], outputs=[out])


# -- tritonclient against Triton and against binproto's server ------------------


def _tritonclient_infer(
    address: str, datatype: str, sent: Arrays, *, binary_in: bool, binary_out: bool
) -> Arrays:
    client = httpclient.InferenceServerClient(address, network_timeout=120)
    inputs = []
    for name, arr in sent.items():
        inp = httpclient.InferInput(name, list(arr.shape), datatype)
        inp.set_data_from_numpy(arr, binary_data=binary_in)
        inputs.append(inp)
    outputs = [
        httpclient.InferRequestedOutput(n.replace("INPUT", "OUTPUT"), binary_data=binary_out)
        for n in sent
    ]
    result = client.infer(model_name(datatype), inputs, outputs=outputs)
    got = {o.name(): result.as_numpy(o.name()) for o in outputs}
    client.close()
    return {n: a for n, a in got.items() if a is not None}


def _tritonclient_cases() -> list[tuple[str, bool, bool]]:
    cases = []
    for datatype in DATATYPES:
        for binary_in, binary_out in ((True, True), (False, False), (True, False)):
            json_somewhere = not (binary_in and binary_out)
            if datatype == "FP16" and json_somewhere:
                continue
            cases.append((datatype, binary_in, binary_out))
    return cases


def test_tritonclient_same_arrays_from_triton_and_binproto(
    triton: TritonPeer, binproto_identity: int
) -> None:
    for datatype, binary_in, binary_out in _tritonclient_cases():
        json_somewhere = not (binary_in and binary_out)
        sent = two_inputs(datatype, utf8=json_somewhere)
        from_triton = _tritonclient_infer(
            triton.address, datatype, sent, binary_in=binary_in, binary_out=binary_out
        )
        from_binproto = _tritonclient_infer(
            f"127.0.0.1:{binproto_identity}",
            datatype,
            sent,
            binary_in=binary_in,
            binary_out=binary_out,
        )
        case = (datatype, binary_in, binary_out)
        for name, arr in sent.items():
            out = name.replace("INPUT", "OUTPUT")
            if datatype == "BYTES":  # tritonclient gives JSON strings back as str
                t = _as_bytes(from_triton[out])
                b = _as_bytes(from_binproto[out])
            else:
                t, b = from_triton[out], from_binproto[out]
                assert t.dtype == b.dtype == arr.dtype, case
            assert arrays_equal(t, arr), case
            assert arrays_equal(b, arr), case


def _as_bytes(arr: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    out = np.empty(arr.shape, dtype=object)
    out[:] = [x.encode() if isinstance(x, str) else bytes(x) for x in arr.ravel()]
    return out


def test_tritonclient_zero_size_and_compressed_on_both(
    triton: TritonPeer, binproto_identity: int
) -> None:
    for address in (triton.address, f"127.0.0.1:{binproto_identity}"):
        client = httpclient.InferenceServerClient(address)
        for coding in (None, "gzip", "deflate"):
            inputs = []
            sent = {"INPUT0": np.arange(1000, dtype=np.int64), "INPUT1": np.zeros(0, np.int64)}
            for name, arr in sent.items():
                inp = httpclient.InferInput(name, list(arr.shape), "INT64")
                inp.set_data_from_numpy(arr)
                inputs.append(inp)
            result = client.infer(
                model_name("INT64"),
                inputs,
                request_compression_algorithm=coding,
                response_compression_algorithm=coding,
            )
            for name, arr in sent.items():
                got = result.as_numpy(name.replace("INPUT", "OUTPUT"))
                assert got is not None and arrays_equal(got, arr), (address, coding, name)
        client.close()


def test_a_triton_that_cannot_start_fails_with_its_log(tmp_path: Path) -> None:
    reason = triton_unavailable()
    if reason is not None:
        pytest.skip(reason)
    # A datatype Triton does not know: the model fails to load and Triton exits.
    with pytest.raises(TritonStartError) as raised:
        with start_triton(tmp_path, datatypes=["NOPE"], single_input=False, timeout=60):
            pass
    message = str(raised.value)
    assert "exited with" in message and "--- Triton log" in message
    assert "identity_nope" in message  # the log says which model failed
