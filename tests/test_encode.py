"""The encoder: round trips through the parser in every chunking, the response
output policy, zero copy, and bodies decoded by the real tritonclient and KServe."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import binproto
from binproto import LocalProtocolError, RequestedOutput, Tensor

from .helpers import arrays_equal, assert_same_everywhere, run, split

ml_dtypes = pytest.importorskip("ml_dtypes")


def sample(datatype: str) -> np.ndarray[Any, Any]:
    """Four elements of ``datatype``, edge values included, as a 2x2 array."""
    if datatype == "BOOL":
        arr: np.ndarray[Any, Any] = np.array([True, False, True, True])
    elif datatype == "BYTES":
        arr = np.array([b"\xff\xfe\x00", b"", "é".encode(), b"\x80"], dtype=np.object_)
    elif datatype == "BF16":
        arr = np.array([1.0, -2.5, np.inf, 0.15625], dtype=ml_dtypes.bfloat16)
    else:
        dtype = binproto.DATATYPES[datatype].dtype
        if dtype.kind == "f":
            arr = np.array([0.5, -0.0, np.nan, -np.inf], dtype=dtype)
        else:
            info = np.iinfo(dtype)
            arr = np.array([info.min, info.max, 0, 1], dtype=dtype)
    return arr.reshape(2, 2)


UTF8 = np.array([b"ab", b"", "é".encode(), "名".encode()], dtype=np.object_).reshape(2, 2)
DATATYPES = sorted(binproto.DATATYPES)
FINITE = {dt: sample(dt) for dt in DATATYPES}


def parser(kind: str, body: binproto.EncodedBody) -> binproto.Parser:
    return binproto.Parser(
        kind,  # type: ignore[arg-type]
        header_length=body.header_length,
        content_length=body.content_length,
    )


def decode(kind: str, body: binproto.EncodedBody) -> binproto.DecodedMessage:
    raw = bytes(body)
    assert len(raw) == body.content_length
    if kind == "request":
        return binproto.decode_request(raw, header_length=body.header_length)
    return binproto.decode_response(raw, header_length=body.header_length)


def encode(kind: str, tensors: Any, binary: Any = True) -> binproto.EncodedBody:
    if kind == "request":
        return binproto.encode_request(tensors, binary=binary)
    return binproto.encode_response(tensors, model_name="m", binary=binary)


def check_round_trip(
    kind: str, body: binproto.EncodedBody, expected: dict[str, np.ndarray[Any, Any]]
) -> binproto.DecodedMessage:
    """Every chunking gives one outcome; the decoded tensors equal ``expected``."""
    outcome = assert_same_everywhere(lambda: parser(kind, body), bytes(body))
    assert outcome.error is None
    msg = decode(kind, body)
    assert list(msg.tensors) == list(expected)
    for name, arr in expected.items():
        got = msg.tensors[name]
        assert got.shape == arr.shape, name
        assert arrays_equal(got, arr), name
    return msg


def binary_names(body: binproto.EncodedBody, kind: str = "request") -> list[str]:
    obj = json.loads(body.json)
    tensors = obj["inputs" if kind == "request" else "outputs"]
    return [t["name"] for t in tensors if "binary_data_size" in t.get("parameters", {})]


# -- round trips ---------------------------------------------------------------


@pytest.mark.parametrize("kind", ["request", "response"])
@pytest.mark.parametrize("datatype", DATATYPES)
def test_every_datatype_round_trips_binary(kind: str, datatype: str) -> None:
    arr = sample(datatype)
    body = encode(kind, {"t": arr})
    assert body.header_length == len(body.json)
    assert binary_names(body, kind) == ["t"]
    msg = check_round_trip(kind, body, {"t": arr})
    assert msg.header.tensors[0].datatype == datatype
    assert msg.tensors["t"].dtype == binproto.DATATYPES[datatype].dtype


@pytest.mark.parametrize("kind", ["request", "response"])
@pytest.mark.parametrize("datatype", DATATYPES)
def test_every_datatype_round_trips_as_json(kind: str, datatype: str) -> None:
    arr = UTF8 if datatype == "BYTES" else sample(datatype)
    body = encode(kind, {"t": arr}, binary=False)
    forced = datatype in ("FP16", "BF16")  # no JSON form: always binary
    assert binary_names(body, kind) == (["t"] if forced else [])
    assert body.header_length == (len(body.json) if forced else None)
    check_round_trip(kind, body, {"t": arr})


def test_bf16_from_raw_uint16_bits() -> None:
    bits = np.array([0x3F80, 0xC020, 0x7F80, 0x0000], dtype=np.uint16)
    body = binproto.encode_request([Tensor("b", bits, datatype="BF16")], binary=False)
    assert binary_names(body) == ["b"]  # BF16 is binary even with binary=False
    assert np.shares_memory(np.frombuffer(body.buffers[1], np.uint8), bits)
    msg = check_round_trip("request", body, {"b": bits.view(ml_dtypes.bfloat16)})
    assert msg.tensors["b"].view(np.uint16).tolist() == bits.tolist()
    # A big-endian raw-bits array is swapped into little-endian order.
    swapped = binproto.encode_request([Tensor("b", bits.astype(">u2"), datatype="BF16")])
    assert bytes(swapped.buffers[1]) == bits.tobytes()


def test_every_datatype_in_one_body_mixed_json_and_binary() -> None:
    arrays = {f"in_{dt}": sample(dt) for dt in DATATYPES}
    arrays["in_BYTES_utf8"] = UTF8
    json_names = {"in_INT8", "in_FP64", "in_BOOL", "in_BYTES_utf8", "in_FP16"}
    binary = set(arrays) - json_names
    body = binproto.encode_request(arrays, binary=binary, id="mixed", model_name="m")
    # FP16 was not in the binary set but has no JSON form.
    assert set(binary_names(body)) == binary | {"in_FP16"}
    assert len(body.buffers) == 1 + len(binary) + 1
    msg = check_round_trip("request", body, arrays)
    assert msg.header.id == "mixed" and msg.header.model_name == "m"


@pytest.mark.parametrize("datatype", DATATYPES)
def test_zero_size_tensors(datatype: str) -> None:
    dtype = binproto.DATATYPES[datatype].dtype
    arr = np.empty((0, 3), dtype=dtype)
    for binary in (True, False):
        body = binproto.encode_request({"z": arr, "one": np.ones(1, np.int8)}, binary=binary)
        check_round_trip("request", body, {"z": arr, "one": np.ones(1, np.int8)})
        if binary:
            assert len(body.buffers[1]) == 0


def test_scalar_shape() -> None:
    body = binproto.encode_request({"s": np.float32(2.5), "b": np.array(b"x", dtype=object)})
    msg = check_round_trip(
        "request", body, {"s": np.array(2.5, np.float32), "b": np.array(b"x", dtype=object)}
    )
    assert msg.header.tensors[0].shape == ()


@pytest.mark.slow
def test_large_tensor_round_trips_in_chunks() -> None:
    arr = (np.arange(2**20) % 251).astype(np.uint8)
    body = binproto.encode_request({"big": arr, "tail": np.arange(3, dtype=np.int16)})
    assert np.shares_memory(np.frombuffer(body.buffers[1], np.uint8), arr)
    raw = bytes(body)
    whole = run(lambda: parser("request", body), [raw])
    assert whole.error is None
    assert body.header_length is not None
    for points in ([body.header_length], [1, 77, 4096, 2**19 + 3, len(raw) - 1]):
        assert run(lambda: parser("request", body), split(raw, points)) == whole
    msg = decode("request", body)
    assert np.array_equal(msg.tensors["big"], arr)


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    datatypes=st.lists(st.sampled_from(DATATYPES), min_size=1, max_size=4),
    request=st.booleans(),
)
def test_hypothesis_tensors_binary_sets_and_splits(
    data: st.DataObject, datatypes: list[str], request: bool
) -> None:
    kind = "request" if request else "response"
    arrays: dict[str, np.ndarray[Any, Any]] = {}
    for i, dt in enumerate(datatypes):
        n = data.draw(st.integers(0, 4), label="elements")
        base = UTF8.ravel() if dt == "BYTES" else sample(dt).ravel()
        arrays[f"t{i}"] = np.resize(base, n) if n else base[:0]
    binary = data.draw(st.sets(st.sampled_from(sorted(arrays))), label="binary")
    body = encode(kind, arrays, binary=binary)
    raw = bytes(body)
    points = data.draw(st.lists(st.integers(0, len(raw)), max_size=8), label="splits")
    whole = run(lambda: parser(kind, body), [raw])
    assert whole.error is None
    assert run(lambda: parser(kind, body), split(raw, points)) == whole
    msg = decode(kind, body)
    for name, arr in arrays.items():
        assert arrays_equal(msg.tensors[name], arr), name


# -- inputs in every form --------------------------------------------------------


def test_python_lists_are_json_data_with_inferred_datatypes() -> None:
    body = binproto.encode_request(
        {
            "ints": [[1, 2], [3, 4]],
            "floats": [1, 2.5, float("nan")],
            "bools": [True, False],
            "text": ["a", "é"],  # a sequence of str: BYTES, sent binary
            "raw": (b"\x00", b""),
        }
    )
    obj = json.loads(body.json)
    types = {t["name"]: t["datatype"] for t in obj["inputs"]}
    assert types == {
        "ints": "INT64",
        "floats": "FP64",
        "bools": "BOOL",
        "text": "BYTES",
        "raw": "BYTES",
    }
    assert binary_names(body) == ["text", "raw"]
    assert obj["inputs"][0]["shape"] == [2, 2]
    msg = decode("request", body)
    assert msg.tensors["ints"].tolist() == [[1, 2], [3, 4]]
    assert msg.tensors["text"].tolist() == [b"a", "é".encode()]
    assert msg.tensors["raw"].tolist() == [b"\x00", b""]
    assert np.isnan(msg.tensors["floats"][2])


def test_list_with_explicit_datatype_and_binary_set() -> None:
    body = binproto.encode_request(
        [Tensor("a", [1, 2, 3], datatype="FP32"), Tensor("h", [0.5, 1], datatype="FP16")],
        binary={"a"},
    )
    assert binary_names(body) == ["a", "h"]
    msg = decode("request", body)
    assert msg.tensors["a"].dtype == np.float32 and msg.tensors["a"].tolist() == [1, 2, 3]
    assert msg.tensors["h"].dtype == np.float16


def test_safe_cast_override_copies_once() -> None:
    arr = np.arange(4, dtype=np.int32)
    body = binproto.encode_request([Tensor("x", arr, datatype="INT64")])
    msg = decode("request", body)
    assert msg.tensors["x"].dtype == np.int64 and msg.tensors["x"].tolist() == [0, 1, 2, 3]


def _nest(value: list[Any], depth: int) -> list[Any]:
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("tensors", "binary", "message"),
    [
        ({"b": np.array([b"\xff"], dtype=object)}, False, "not valid UTF-8"),
        ({"b": [b"ok", b"\xc3"]}, {"x"}, "not inputs being encoded"),
        ({"c": np.ones(2, np.complex64)}, True, "has no V2 datatype"),
        ([Tensor("f", np.ones(2), datatype="FP32")], True, "without losing information"),
        ([Tensor("f", np.ones(2, np.int32), datatype="BF16")], True, "BF16 data must be"),
        ([Tensor("f", np.ones(2), datatype="FP8")], True, "unknown datatype"),
        ([Tensor("f", np.ones(2), datatype="BYTES")], True, "cannot send dtype float64 as BYTES"),
        ([Tensor("s", np.array(["a"]), datatype="INT32")], True, "cannot send dtype <U1"),
        ([Tensor("a", [1]), Tensor("a", [2])], True, "duplicate input name"),
        ({"a": Tensor("b", [1])}, True, "is a Tensor named 'b'"),
        ({"r": [[1, 2], [3]]}, True, "not rectangular"),
        ({"m": [1, "a"]}, True, "cannot infer a datatype"),
        ({"m": [True, 1]}, True, "cannot infer a datatype"),
        ([Tensor("x", [300], datatype="UINT8")], True, "does not fit datatype UINT8"),
        ([Tensor("x", [1.5], datatype="INT32")], True, "does not fit datatype INT32"),
        ([Tensor("x", ["a"], datatype="INT32")], True, "can only be sent as BYTES"),
        ([Tensor("x", [1], datatype="BYTES")], True, "must be a sequence of bytes/str"),
        ({"o": np.array([1, b"a"], dtype=object)}, True, "must be bytes or str, got int"),
        ({"s": ["\ud800"]}, True, "not encodable as UTF-8"),
        ({"x": {"a": 1}}, True, "expected a numpy array"),  # (a Python scalar is a 0-d tensor)
        ([Tensor("p", [1], parameters={"binary_data_size": 4})], True, "set by the encoder"),
        ([Tensor("p", [1], parameters={"x": float("nan")})], True, "JSON cannot carry"),
        ([Tensor("p", [1], parameters={"x": [1]})], True, "string, number or bool"),
        ({"x": [1]}, "x", "binary must be True, False or a set"),
        ({"x": [1]}, [["x"]], "binary must be True, False or a set"),  # names, unhashable
        ({"x": [1]}, {1}, "binary must be True, False or a set"),
        # Nested past numpy's dimensions (64; 32 before numpy 2): a body no decoder
        # could take.
        ({"d": _nest([1.5], 65)}, True, "nested more than"),
        ({"d": _nest([b"a"], 65)}, True, "nested more than"),
        ({"d": _nest([b"a"], 3000)}, True, "nested more than"),
        ([Tensor("x", "abc", ["BYTES"])], True, "unknown datatype"),  # type: ignore[arg-type]
        ([Tensor(["x"], [1])], True, "names must be strings"),  # type: ignore[arg-type]
        ({"x": Tensor(np.array(["x", "y"]), [1])}, True, "is a Tensor named"),  # type: ignore[arg-type]
        ({"x": np.ma.masked_array([1, 99], mask=[False, True])}, True, "masked array"),  # type: ignore[no-untyped-call, unused-ignore]
    ],
)
def test_local_errors(tensors: Any, binary: Any, message: str) -> None:
    with pytest.raises(LocalProtocolError, match=message) as info:
        binproto.encode_request(tensors, binary=binary)
    assert info.value.status_hint == 500


def _bools(*values: int) -> np.ndarray[Any, Any]:
    """A bool array over arbitrary bytes, as ``view(bool)`` makes them."""
    return np.array(values, np.uint8).view(np.bool_)


SHM = {"shared_memory_region": "r"}


@pytest.mark.parametrize(
    ("encode", "message"),
    [
        (
            lambda: binproto.encode_request([Tensor("x", np.ones(2, np.float32), parameters=SHM)]),
            "'shared_memory_region' is for a tensor in shared memory",
        ),
        (
            lambda: binproto.encode_request([Tensor("x", [1, 2], parameters=SHM)]),
            "'shared_memory_region' is for a tensor in shared memory",
        ),
        (
            lambda: binproto.encode_response(
                [Tensor("y", np.ones(2, np.float32), parameters=SHM)], model_name="m"
            ),
            "output 'y': 'shared_memory_region'",
        ),
        (
            lambda: binproto.encode_request([Tensor("x", [1], parameters={"binary_data_size": 8})]),
            "'binary_data_size' is set by the encoder",
        ),
        (
            lambda: binproto.encode_request({"x": [1]}, parameters={"binary_data_output": 1}),
            "'binary_data_output' of the request must be a bool",
        ),
        (
            lambda: binproto.encode_request({"x": [1]}, parameters={"binary_data_output": "true"}),
            "'binary_data_output' of the request must be a bool",
        ),
        (
            lambda: binproto.encode_response(
                {"y": [1]}, model_name="m", parameters={"binary_data_output": 0}
            ),
            "'binary_data_output' of the response must be a bool",
        ),
        (lambda: binproto.encode_request({"x": _bools(0, 1, 2)}), "invalid BOOL value 2"),
        (
            lambda: binproto.encode_request({"x": _bools(1, 255)}, binary=False),
            "invalid BOOL value 255 for input 'x'",
        ),
        (
            lambda: binproto.encode_request({"x": _bools(1, 0, 7, 0)[::2]}),
            "invalid BOOL value 7",
        ),
        (
            lambda: binproto.encode_response({"y": _bools(3).reshape(())}, model_name="m"),
            "invalid BOOL value 3 for output 'y'",
        ),
    ],
)
def test_encoder_refuses_what_a_peer_refuses(encode: Any, message: str) -> None:
    with pytest.raises(LocalProtocolError, match=message):
        encode()


def test_bool_check_reads_the_array_without_copying_it() -> None:
    import tracemalloc

    arr = np.zeros(8 << 20, np.bool_)
    arr[::3] = True
    arr.flags.writeable = False  # only read
    tracemalloc.start()
    try:
        body = binproto.encode_request({"x": arr})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < arr.nbytes // 8
    assert np.shares_memory(np.frombuffer(body.buffers[1], np.uint8), arr)


def test_request_arguments() -> None:
    body = binproto.encode_request(
        {"x": np.ones(1, np.float32)},
        outputs=[
            RequestedOutput("a", binary_data=True),
            "b",
            RequestedOutput("c", False, {"k": 1}),
        ],
        binary_data_output=True,
        parameters={"priority": 2},
        id="r1",
        model_name="m",
    )
    msg = decode("request", body)
    h = msg.header
    assert (h.id, h.model_name, h.binary_data_output) == ("r1", "m", True)
    assert h.parameters["priority"] == 2
    assert h.requested_outputs == (
        RequestedOutput("a", True),
        RequestedOutput("b"),
        RequestedOutput("c", False, {"k": 1}),
    )
    with pytest.raises(LocalProtocolError, match="both as an argument"):
        binproto.encode_request(
            {}, binary_data_output=True, parameters={"binary_data_output": False}
        )
    with pytest.raises(LocalProtocolError, match="duplicate requested output"):
        binproto.encode_request({}, outputs=["a", "a"])
    with pytest.raises(LocalProtocolError, match="RequestedOutput"):
        binproto.encode_request({}, outputs=[RequestedOutput("a", None, {"binary_data": True})])


# -- the body and its headers ------------------------------------------------------


def test_headers_and_content_type() -> None:
    binary = binproto.encode_request({"x": np.arange(3, dtype=np.int32)})
    assert binary.headers == [
        ("Inference-Header-Content-Length", str(len(binary.json))),
        ("Content-Length", str(len(binary.json) + 12)),
        ("Content-Type", "application/octet-stream"),
    ]
    assert list(binary) == binary.buffers and bytes(binary) == b"".join(binary.buffers)
    plain = binproto.encode_request({"x": np.arange(3, dtype=np.int32)}, binary=False)
    assert plain.header_length is None
    assert plain.buffers == [plain.json]
    assert plain.headers == [
        ("Content-Length", str(len(plain.json))),
        ("Content-Type", "application/json"),
    ]


def test_header_length_counts_utf8_bytes() -> None:
    body = binproto.encode_request({"名前é": np.ones(2, np.uint8)}, model_name="модель")
    text = body.json.decode("utf-8")
    assert len(body.json) > len(text)
    assert body.header_length == len(body.json)
    assert dict(body.headers)["Inference-Header-Content-Length"] == str(len(body.json))
    assert list(decode("request", body).tensors) == ["名前é"]


def test_json_is_strict_except_non_finite_float_data() -> None:
    def no_constants(token: str) -> Any:
        raise AssertionError(f"non-strict JSON token {token}")

    finite = {dt: sample(dt) for dt in DATATYPES if dt not in ("FP16", "BF16", "FP32", "FP64")}
    finite["BYTES"] = UTF8
    finite["f"] = np.array([0.1, 1e300, -0.0], np.float64)
    body = binproto.encode_request(finite, binary=False, parameters={"s": "\u2028\"'\\"})
    json.loads(body.json, parse_constant=no_constants)
    # NaN and infinities travel as the tokens tritonclient writes and Triton reads.
    special = binproto.encode_request({"f": np.array([np.nan, np.inf, -np.inf])}, binary=False)
    assert b"[NaN,Infinity,-Infinity]" in special.json
    rapidjson = pytest.importorskip("rapidjson")
    assert b"[NaN,Infinity,-Infinity]" in rapidjson.dumps([np.nan, np.inf, -np.inf]).encode()


# -- zero copy -------------------------------------------------------------------


@pytest.mark.parametrize("datatype", [dt for dt in DATATYPES if dt != "BYTES"])
def test_buffers_share_memory_with_the_arrays(datatype: str) -> None:
    arr = sample(datatype)
    body = binproto.encode_request({"x": arr, "y": arr[:1]})
    for buf, source in zip(body.buffers[1:], (arr, arr[:1]), strict=True):
        assert isinstance(buf, memoryview)
        assert np.shares_memory(np.frombuffer(buf, np.uint8), source)
        assert buf.nbytes == source.nbytes


def test_non_contiguous_and_big_endian_arrays_are_copied_once() -> None:
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    strided = base[:, ::2]
    big = np.arange(5, dtype=">i4")
    fortran = np.asfortranarray(base)
    body = binproto.encode_request({"s": strided, "b": big, "f": fortran})
    for buf, src in zip(body.buffers[1:], (strided, big, fortran), strict=True):
        assert not np.shares_memory(np.frombuffer(buf, np.uint8), src)
    assert bytes(body.buffers[2]) == np.arange(5, dtype="<i4").tobytes()
    check_round_trip("request", body, {"s": strided, "b": big, "f": fortran})


# -- the response output policy --------------------------------------------------

OUTPUTS: dict[str, np.ndarray[Any, Any]] = {
    "a": np.array([1.5, 2.5], np.float32),
    "b": np.array([1, 2], np.int32),
    "h": np.array([0.5], np.float16),
    "s": np.array([b"x", "é".encode()], dtype=object),
}


def request_header(
    outputs: list[RequestedOutput] | None, binary_data_output: bool | None
) -> binproto.InferenceHeader:
    body = binproto.encode_request(
        {"in": np.zeros(1, np.uint8)},
        outputs=outputs,
        binary_data_output=binary_data_output,
        id="req-7",
    )
    return decode("request", body).header


RO = RequestedOutput
POLICY = [
    # (requested outputs, binary_data_output) -> outputs returned, and which are binary
    (None, None, "abhs", "h"),
    (None, False, "abhs", "h"),
    (None, True, "abhs", "abhs"),
    ([RO("a", True), RO("b")], None, "ab", "a"),
    ([RO("a", True), RO("b", False)], True, "ab", "a"),
    ([RO("a", False), RO("b")], True, "ab", "b"),  # spec: binary_data_output applies
    ([RO("a"), RO("h", False)], None, "ah", "h"),  # FP16 is always binary
    ([RO("s")], True, "s", "s"),
    ([RO("s", False)], True, "s", ""),
    ([RO("b", True), RO("a", False)], False, "ab", "b"),  # order of the outputs given
    ([], True, "abhs", "abhs"),  # an empty list asks for every output, as absent (Triton)
]


@pytest.mark.parametrize(("requested", "bdo", "returned", "binary"), POLICY)
def test_output_policy_table(
    requested: list[RequestedOutput] | None, bdo: bool | None, returned: str, binary: str
) -> None:
    request = request_header(requested, bdo)
    body = binproto.encode_response(OUTPUTS, model_name="m", request=request, binary=False)
    obj = json.loads(body.json)
    assert [o["name"] for o in obj["outputs"]] == list(returned)
    assert binary_names(body, "response") == list(binary)
    assert obj["id"] == "req-7"  # the request's id by default
    check_round_trip("response", body, {k: OUTPUTS[k] for k in returned})


def test_policy_errors_and_fallbacks() -> None:
    request = request_header([RO("a"), RO("missing")], None)
    with pytest.raises(LocalProtocolError, match="missing"):
        binproto.encode_response(OUTPUTS, model_name="m", request=request)
    # BYTES JSON cannot carry go binary whatever the request asked.
    raw = {"r": np.array([b"\xff"], dtype=object)}
    body = binproto.encode_response(raw, model_name="m", request=request_header(None, False))
    assert binary_names(body, "response") == ["r"]
    with pytest.raises(LocalProtocolError, match="not valid UTF-8"):
        binproto.encode_response(raw, model_name="m", binary=False)
    response = decode("response", binproto.encode_response(OUTPUTS, model_name="m")).header
    with pytest.raises(LocalProtocolError, match="InferenceHeader of a parsed request"):
        binproto.encode_response(OUTPUTS, model_name="m", request=response)


def test_response_fields() -> None:
    body = binproto.encode_response(
        {"o": [1, 2]}, model_name="m", model_version="3", id="x", parameters={"p": True}
    )
    h = decode("response", body).header
    assert (h.model_name, h.model_version, h.id, h.parameters) == ("m", "3", "x", {"p": True})
    assert binary_names(body, "response") == []  # lists are JSON data


# -- real peers ----------------------------------------------------------------


def triton_numpy(body: binproto.EncodedBody, name: str) -> np.ndarray[Any, Any]:
    httpclient = pytest.importorskip("tritonclient.http")
    result = httpclient.InferenceServerClient.parse_response_body(
        bytes(body), header_length=body.header_length
    )
    arr: np.ndarray[Any, Any] | None = result.as_numpy(name)
    assert arr is not None
    return arr


def as_bytes(arr: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Peers decode JSON BYTES to ``str``: compare as UTF-8 bytes."""
    if arr.dtype != object:
        return arr
    out = np.empty(arr.shape, dtype=object)
    out.ravel()[:] = [x.encode() if isinstance(x, str) else bytes(x) for x in arr.ravel()]
    return out


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("datatype", DATATYPES)
def test_tritonclient_decodes_responses(datatype: str, binary: bool) -> None:
    arr = UTF8 if datatype == "BYTES" and not binary else sample(datatype)
    body = binproto.encode_response(
        {"out": arr, "pad": np.arange(3)}, model_name="m", binary=binary
    )
    got = triton_numpy(body, "out")
    assert got.shape == arr.shape
    assert arrays_equal(as_bytes(got), arr)
    assert triton_numpy(body, "pad").tolist() == [0, 1, 2]


def test_tritonclient_decodes_zero_size_and_raw_bf16() -> None:
    bits = np.array([0x3F80, 0x4000], np.uint16)
    body = binproto.encode_response(
        [Tensor("z", np.empty((0, 3), np.float32)), Tensor("bf", bits, datatype="BF16")],
        model_name="m",
    )
    assert triton_numpy(body, "z").shape == (0, 3)
    assert triton_numpy(body, "bf").tolist() == [1.0, 2.0]


try:
    from kserve.errors import InferenceError as KServeInferenceError
    from kserve.errors import InvalidInput as KServeInvalidInput
except ImportError:  # pragma: no cover - the KServe tests skip
    KServeInferenceError = KServeInvalidInput = Exception

KSERVE_NO_BF16 = "KServe has no BF16 datatype (to_np_dtype returns None)"
KSERVE_NO_NAN = "KServe parses the JSON header with orjson, which rejects NaN/Infinity"
KSERVE_UTF8 = "KServe converts binary BYTES to JSON strings on receipt: non-UTF-8 fails"


def kserve_cases() -> list[Any]:
    """(sample, binary) for every datatype; KServe's limitations as strict xfails."""
    cases = []
    for datatype in DATATYPES:
        for binary in (True, False):
            arr = sample(datatype)
            reason, raises = None, KServeInvalidInput
            if datatype == "BF16":
                reason = KSERVE_NO_BF16
            elif datatype == "BYTES" and binary:
                reason, raises = KSERVE_UTF8, KServeInferenceError
            elif datatype == "BYTES":
                arr = UTF8
            elif datatype in ("FP32", "FP64") and not binary:
                reason = KSERVE_NO_NAN
            marks = [pytest.mark.xfail(reason=reason, raises=raises, strict=True)] if reason else []
            cases.append(pytest.param(arr, binary, id=f"{datatype}-{binary}", marks=marks))
    finite = np.array([[0.5, -0.0], [1e30, 3.0]])
    cases += [
        pytest.param(UTF8, True, id="BYTES-utf8-True"),
        pytest.param(finite.astype(np.float32), False, id="FP32-finite-False"),
        pytest.param(finite, False, id="FP64-finite-False"),
    ]
    return cases


@pytest.mark.parametrize(("arr", "binary"), kserve_cases())
def test_kserve_decodes_requests_and_responses(arr: np.ndarray[Any, Any], binary: bool) -> None:
    infer_type = pytest.importorskip("kserve.protocol.infer_type")
    request = binproto.encode_request({"in": arr, "pad": np.arange(2)}, binary=binary)
    raw = bytes(request)
    req = infer_type.InferRequest.from_bytes(raw, request.header_length or len(raw), "m")
    assert arrays_equal(as_bytes(req.inputs[0].as_numpy()), arr)
    assert req.inputs[1].as_numpy().tolist() == [0, 1]
    response = binproto.encode_response({"out": arr}, model_name="m", binary=binary)
    raw = bytes(response)
    res = infer_type.InferResponse.from_bytes(raw, response.header_length or len(raw))
    assert res.model_name == "m"
    assert arrays_equal(as_bytes(res.outputs[0].as_numpy()), arr)


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("datatype", DATATYPES)
def test_tritonclient_requests_reencode_to_equal_tensors(datatype: str, binary: bool) -> None:
    httpclient = pytest.importorskip("tritonclient.http")
    if not binary and datatype in ("FP16", "BF16"):
        pytest.skip("tritonclient sends FP16/BF16 only binary")
    arr = UTF8 if datatype == "BYTES" and not binary else sample(datatype)
    inputs = []
    for name, data, dt in (("x", arr, datatype), ("k", np.arange(4, dtype=np.int32), "INT32")):
        inp = httpclient.InferInput(name, list(data.shape), dt)
        inp.set_data_from_numpy(data, binary_data=binary)
        inputs.append(inp)
    outputs = [httpclient.InferRequestedOutput("y", binary_data=False)]
    raw, hl = httpclient.InferenceServerClient.generate_request_body(
        inputs, outputs=outputs, request_id="t"
    )
    first = binproto.decode_request(raw, header_length=hl)
    h = first.header
    again = binproto.encode_request(
        [Tensor(t.name, first.tensors[t.name], t.datatype) for t in h.tensors],
        outputs=h.requested_outputs,
        id=h.id,
        binary={t.name for t in h.tensors if t.binary_size is not None},
    )
    second = decode("request", again)
    assert binary_names(again) == [t.name for t in h.tensors if t.binary_size is not None]
    assert second.header.requested_outputs == h.requested_outputs
    for name, original in (("x", arr), ("k", np.arange(4, dtype=np.int32))):
        assert arrays_equal(second.tensors[name], first.tensors[name])
        assert arrays_equal(second.tensors[name], original)
