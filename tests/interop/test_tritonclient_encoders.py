"""tritonclient's encoders feed binproto's parser.

Complements ``tests/test_tritonclient_bodies.py`` (one tensor per body, each
datatype binary and JSON, BF16, mixed JSON/binary): here every datatype travels
in one body, back to back, under every chunking and hypothesis splits; zero-size
tensors of every datatype; the request's output policy as tritonclient writes
it; header lengths with non-ASCII names; and the compressed bodies tritonclient's
real ``infer`` puts on the wire.
"""

from __future__ import annotations

import gzip
import inspect
import zlib
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import binproto

from ..helpers import arrays_equal, assert_same_everywhere, run, split
from .recorder import recording_server
from .samples import DATATYPES, sample, triton_input

httpclient = pytest.importorskip("tritonclient.http")
ml_dtypes = pytest.importorskip("ml_dtypes")


# tritonclient refuses these as JSON data: FP16/BF16 have no JSON form, and
# the BYTES sample is not UTF-8.
NO_JSON = {"FP16", "BF16", "BYTES"}


def every_datatype_body() -> tuple[bytes, int, dict[str, np.ndarray[Any, Any]]]:
    """One binary request holding a 2x2 tensor of every datatype."""
    arrays = {f"in_{dt}": sample(dt).reshape(2, 2) for dt in DATATYPES}
    inputs = [triton_input(name, arr, name[3:], True) for name, arr in arrays.items()]
    body, hl = httpclient.InferenceServerClient.generate_request_body(inputs, request_id="all")
    assert hl is not None
    return body, hl, arrays


def check(msg: binproto.DecodedMessage, arrays: dict[str, np.ndarray[Any, Any]]) -> None:
    assert list(msg.tensors) == list(arrays)
    for name, arr in arrays.items():
        got = msg.tensors[name]
        assert got.dtype == binproto.DATATYPES[msg.header.tensor(name).datatype].dtype
        assert arrays_equal(got, arr), name


def test_every_datatype_in_one_body_under_every_chunking() -> None:
    body, hl, arrays = every_datatype_body()
    msg = binproto.decode_request(body, header_length=hl)
    assert msg.header.id == "all"
    check(msg, arrays)
    # tritonclient asks for every output in binary when it lists none.
    assert msg.header.binary_data_output is True
    assert msg.header.requested_outputs is None
    outcome = assert_same_everywhere(
        lambda: binproto.Parser("request", header_length=hl, content_length=len(body)),
        body,
        two_way_limit=len(body),
    )
    assert outcome.error is None
    # Without Content-Length (chunked transfer) the end of input ends the body.
    streamed = assert_same_everywhere(
        lambda: binproto.Parser("request", header_length=hl), body, two_way_limit=0
    )
    assert streamed == outcome


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_every_datatype_hypothesis_splits(data: st.DataObject) -> None:
    body, hl, _ = every_datatype_body()
    points = data.draw(st.lists(st.integers(0, len(body)), max_size=12))
    whole = run(lambda: binproto.Parser("request", header_length=hl), [body])
    got = run(lambda: binproto.Parser("request", header_length=hl), split(body, points))
    assert got == whole
    assert got.error is None


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("datatype", DATATYPES)
def test_zero_size_tensors(datatype: str, binary: bool) -> None:
    if not binary and datatype in {"FP16", "BF16"}:
        pytest.skip(f"tritonclient sends {datatype} only as binary")
    empty = sample(datatype)[:0].reshape(0, 3)
    inp = triton_input("z", empty, datatype, binary)
    body, hl = httpclient.InferenceServerClient.generate_request_body([inp])
    assert (hl is not None) == binary
    msg = binproto.decode_request(body, header_length=hl)
    info = msg.header.tensor("z")
    assert info.shape == (0, 3)
    assert info.binary_size == (0 if binary else None)
    got = msg.tensors["z"]
    assert got.shape == (0, 3)
    assert got.dtype == binproto.DATATYPES[datatype].dtype
    outcome = assert_same_everywhere(
        lambda: binproto.Parser("request", header_length=hl, content_length=len(body)), body
    )
    assert outcome.error is None


def test_zero_size_between_binary_tensors() -> None:
    """A zero-byte tensor in the middle does not shift the bytes after it."""
    a = np.arange(3, dtype=np.int32)
    z = np.zeros((2, 0), dtype=np.float64)
    b = np.array([b"x", b""], dtype=np.object_)
    inputs = [
        triton_input("a", a, "INT32", True),
        triton_input("z", z, "FP64", True),
        triton_input("b", b, "BYTES", True),
    ]
    body, hl = httpclient.InferenceServerClient.generate_request_body(inputs)
    msg = binproto.decode_request(body, header_length=hl)
    check(msg, {"a": a, "z": z, "b": b})


def test_bytes_all_empty_elements() -> None:
    arr = np.array([b""] * 5, dtype=np.object_).reshape(5, 1)
    body, hl = httpclient.InferenceServerClient.generate_request_body(
        [triton_input("e", arr, "BYTES", True)]
    )
    msg = binproto.decode_request(body, header_length=hl)
    assert msg.header.tensor("e").binary_size == 20
    check(msg, {"e": arr})


@pytest.mark.parametrize("datatype", sorted(set(DATATYPES) - NO_JSON))
def test_mixed_json_and_binary_every_datatype(datatype: str) -> None:
    arr = sample(datatype)
    if arr.dtype.kind == "f":
        arr = arr[np.isfinite(arr)]  # JSON has no NaN/Infinity
    inputs = [
        triton_input("j", arr, datatype, False),
        triton_input("b", arr, datatype, True),
        triton_input("j2", arr[::-1].copy(), datatype, False),
    ]
    body, hl = httpclient.InferenceServerClient.generate_request_body(inputs)
    msg = binproto.decode_request(body, header_length=hl)
    assert [t.binary_size is None for t in msg.header.tensors] == [True, False, True]
    check(msg, {"j": arr, "b": arr, "j2": arr[::-1]})


def test_requested_outputs_and_binary_data_output() -> None:
    inp = triton_input("x", np.arange(4, dtype=np.float32), "FP32", True)
    outputs = [
        httpclient.InferRequestedOutput("bin", binary_data=True),
        httpclient.InferRequestedOutput("json", binary_data=False),
        httpclient.InferRequestedOutput("cls", binary_data=True, class_count=2),
    ]
    body, hl = httpclient.InferenceServerClient.generate_request_body(
        [inp], outputs=outputs, sequence_id=7, sequence_start=True, priority=2
    )
    header = binproto.decode_request(body, header_length=hl).header
    # Listing outputs, tritonclient drops binary_data_output and says
    # binary_data on each output, True or False.
    assert header.binary_data_output is None
    assert header.requested_outputs == (
        binproto.RequestedOutput("bin", True, None),
        binproto.RequestedOutput("json", False, None),
        binproto.RequestedOutput("cls", True, {"classification": 2}),
    )
    assert header.parameters["sequence_id"] == 7
    assert header.parameters["sequence_start"] is True
    assert header.parameters["priority"] == 2


def test_header_length_of_non_ascii_names() -> None:
    """tritonclient counts characters of an ASCII-escaped header: still bytes."""
    inp = triton_input("entrée", np.array([1, 2], dtype=np.int16), "INT16", True)
    body, hl = httpclient.InferenceServerClient.generate_request_body([inp], request_id="identité")
    assert body[:hl].isascii()
    msg = binproto.decode_request(body, header_length=hl)
    assert msg.header.id == "identité"
    check(msg, {"entrée": np.array([1, 2], dtype=np.int16)})


def test_tritonclient_refuses_non_utf8_bytes_as_json() -> None:
    """Non-UTF-8 BYTES can only travel binary; tritonclient enforces it too."""
    with pytest.raises(Exception, match="UTF-8"):
        triton_input("s", sample("BYTES"), "BYTES", False)


def parser_takes_content_encoding() -> bool:
    return "content_encoding" in inspect.signature(binproto.Parser).parameters


def captured_compressed(algorithm: str) -> tuple[bytes, dict[str, str], bytes, int]:
    """What tritonclient's real ``infer`` sends with request compression."""
    body, hl, _ = every_datatype_body()
    inputs = [triton_input(f"in_{dt}", sample(dt).reshape(2, 2), dt, True) for dt in DATATYPES]
    with recording_server() as rec:
        client = httpclient.InferenceServerClient(rec.url)
        try:
            client.infer("echo", inputs, request_id="all", request_compression_algorithm=algorithm)
        finally:
            client.close()
    (req,) = rec.requests
    headers = {k.lower(): v for k, v in req.headers}
    return req.body, headers, body, hl


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_request_as_sent(algorithm: str) -> None:
    wire, headers, plain, hl = captured_compressed(algorithm)
    assert headers["content-encoding"] == algorithm
    # The header length counts the uncompressed JSON.
    assert int(headers["inference-header-content-length"]) == hl
    decompress = gzip.decompress if algorithm == "gzip" else zlib.decompress
    assert decompress(wire) == plain
    if not parser_takes_content_encoding():
        pytest.skip("binproto.Parser does not take content_encoding= yet")

    def make() -> binproto.Parser:
        return binproto.Parser(  # type: ignore[call-arg,unused-ignore]
            "request",
            header_length=hl,
            content_length=len(wire),
            content_encoding=algorithm,
        )

    reference = run(make, [wire])
    assert reference.error is None
    for chunks in ([wire[i : i + 1] for i in range(len(wire))], split(wire, [len(wire) // 2])):
        assert run(make, chunks) == reference
    assert reference == run(
        lambda: binproto.Parser("request", header_length=hl, content_length=len(plain)), [plain]
    )
