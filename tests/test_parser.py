"""The body parser: spec examples, every datatype, every chunking, every fault."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import binproto
from binproto import (
    NEED_DATA,
    HeaderParsed,
    Kind,
    Limits,
    LocalProtocolError,
    MessageComplete,
    Parser,
    ParserState,
    RemoteProtocolError,
    TensorChunk,
    TensorComplete,
)

from .bad_bodies import FAULTS, one
from .helpers import (
    assert_same_everywhere,
    bytes_tensor,
    chunkings,
    make_body,
    normalize,
    run,
    split,
)

# -- spec examples -----------------------------------------------------------------

TRITON_REQUEST = {
    "model_name": "mymodel",
    "inputs": [
        {"name": "input0", "shape": [2, 2], "datatype": "UINT32",
         "parameters": {"binary_data_size": 16}},
        {"name": "input1", "shape": [3], "datatype": "BOOL",
         "parameters": {"binary_data_size": 3}},
    ],
    "outputs": [{"name": "output0", "parameters": {"binary_data": True}}],
}  # fmt: skip

KSERVE_RESPONSE = {
    "outputs": [
        {"name": "output0", "shape": [3, 2], "datatype": "FP16",
         "parameters": {"binary_data_size": 12}},
        {"name": "output1", "shape": [2, 2], "datatype": "FP32",
         "data": [[1.203, 5.403], [3.434, 34.234]]},
    ]
}  # fmt: skip


def request_parser(hl: int | None, cl: int | None = None, **kw: Any) -> Any:
    return lambda: Parser("request", header_length=hl, content_length=cl, **kw)


def response_parser(hl: int | None, cl: int | None = None, **kw: Any) -> Any:
    return lambda: Parser("response", header_length=hl, content_length=cl, **kw)


def test_triton_spec_request_every_chunking() -> None:
    data0 = np.arange(4, dtype="<u4").tobytes()
    body, hl = make_body(TRITON_REQUEST, data0, b"\x01\x00\x01")
    for cl in (None, len(body)):
        out = assert_same_everywhere(request_parser(hl, cl), body)
        assert out.error is None
        assert out.events[1:] == (
            ("tensor", 0, "input0", data0),
            ("tensor", 1, "input1", b"\x01\x00\x01"),
            ("end",),
        )
    msg = binproto.decode_request(body, header_length=hl)
    assert msg.header.model_name == "mymodel"
    assert msg.header.requested_outputs == (binproto.RequestedOutput("output0", True, None),)
    np.testing.assert_array_equal(msg.tensors["input0"], [[0, 1], [2, 3]])
    np.testing.assert_array_equal(msg.tensors["input1"], [True, False, True])
    assert msg.tensors["input1"].dtype == np.bool_


def test_kserve_spec_response_mixed_json_and_binary() -> None:
    fp16 = np.array([[1.1, 2.22], [3.345, 4.34], [0, -1]], dtype="<f2")
    body, hl = make_body(KSERVE_RESPONSE, fp16.tobytes())
    out = assert_same_everywhere(response_parser(hl, len(body)), body)
    assert [e[0] for e in out.events] == ["header", "tensor", "tensor", "end"]
    assert out.events[2] == ("tensor", 1, "output1", b"")  # JSON data: no chunks
    msg = binproto.decode_response(body, header_length=hl)
    np.testing.assert_array_equal(msg.tensors["output0"], fp16)
    np.testing.assert_allclose(
        msg.tensors["output1"], np.array([[1.203, 5.403], [3.434, 34.234]], dtype=np.float32)
    )
    assert msg.tensors["output1"].dtype == np.float32


def test_plain_json_body() -> None:
    header = {
        "inputs": [{"name": "x", "shape": [2], "datatype": "INT64", "data": [1, -2]}],
        "parameters": {"binary_data_output": True},
        "id": "abc",
    }
    body = json.dumps(header).encode()
    for cl in (None, len(body)):
        out = assert_same_everywhere(request_parser(None, cl), body)
        assert out.error is None
    msg = binproto.decode_request(body, header_length=None)
    assert msg.header.binary_data_output is True
    assert msg.header.id == "abc"
    assert msg.tensors["x"].dtype == np.dtype("<i8")


# -- every datatype ----------------------------------------------------------------

SAMPLES: dict[str, np.ndarray[Any, Any]] = {
    "BOOL": np.array([[True, False], [False, True]]),
    "UINT8": np.array([0, 255, 7], dtype=np.uint8),
    "UINT16": np.array([0, 65535], dtype="<u2"),
    "UINT32": np.array([[1, 2], [3, 2**32 - 1]], dtype="<u4"),
    "UINT64": np.array([2**64 - 1, 0], dtype="<u8"),
    "INT8": np.array([-128, 127], dtype=np.int8),
    "INT16": np.array([-(2**15), 2**15 - 1], dtype="<i2"),
    "INT32": np.array([-(2**31), 5], dtype="<i4"),
    "INT64": np.array([[-(2**63)], [2**63 - 1]], dtype="<i8"),
    "FP16": np.array([1.5, -np.inf, 65504], dtype="<f2"),
    "FP32": np.array([[np.nan, 1e-30, -0.0]], dtype="<f4"),
    "FP64": np.array([np.pi, 1e300], dtype="<f8"),
    "BF16": np.array([0x3F80, 0xC000], dtype="<u2"),  # 1.0, -2.0 as raw bits
}


@pytest.mark.parametrize("datatype", sorted(SAMPLES))
@pytest.mark.parametrize("kind", ["request", "response"])
def test_every_fixed_datatype_binary(datatype: str, kind: Kind) -> None:
    arr = SAMPLES[datatype]
    raw = arr.tobytes()
    role = "inputs" if kind == "request" else "outputs"
    header = {role: [{"name": "t", "shape": list(arr.shape), "datatype": datatype,
                      "parameters": {"binary_data_size": len(raw)}}]}  # fmt: skip
    body, hl = make_body(header, raw)
    out = assert_same_everywhere(
        lambda: Parser(kind, header_length=hl, content_length=len(body)), body
    )
    assert out.events[1] == ("tensor", 0, "t", raw)
    decode = binproto.decode_request if kind == "request" else binproto.decode_response
    decoded = decode(body, header_length=hl).tensors["t"]
    assert decoded.shape == arr.shape
    assert decoded.dtype == binproto.DATATYPES[datatype].dtype
    assert decoded.tobytes() == raw
    assert decoded.dtype.byteorder in "<|=" and not decoded.flags.writeable


def test_bf16_decodes_to_ml_dtypes_when_installed() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    raw = np.array([1.0, -2.0, 0.5], dtype=ml_dtypes.bfloat16).tobytes()
    header = {"outputs": [{"name": "b", "shape": [3], "datatype": "BF16",
                           "parameters": {"binary_data_size": 6}}]}  # fmt: skip
    body, hl = make_body(header, raw)
    arr = binproto.decode_response(body, header_length=hl).tensors["b"]
    assert arr.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(arr.astype(np.float32), [1.0, -2.0, 0.5])


def test_bytes_binary_and_json() -> None:
    items = [b"", b"hello", b"\xff\xfe\x00", b"x" * 300]
    raw = bytes_tensor(items)
    header = {"inputs": [
        {"name": "b", "shape": [2, 2], "datatype": "BYTES",
         "parameters": {"binary_data_size": len(raw)}},
        {"name": "j", "shape": [2], "datatype": "BYTES", "data": ["héllo", ""]},
    ]}  # fmt: skip
    body, hl = make_body(header, raw)
    out = assert_same_everywhere(request_parser(hl, len(body)), body)
    assert out.error is None
    msg = binproto.decode_request(body, header_length=hl)
    assert msg.tensors["b"].shape == (2, 2)
    assert list(msg.tensors["b"].ravel()) == items
    assert list(msg.tensors["j"]) == ["héllo".encode(), b""]
    assert msg.header.tensor("j").nbytes == 4 + 6 + 4


@pytest.mark.parametrize(
    ("datatype", "data", "expected"),
    [
        ("INT32", [[1, 2], [3, 4]], np.array([[1, 2], [3, 4]], dtype="<i4")),
        ("INT32", [1, 2, 3, 4], np.array([[1, 2], [3, 4]], dtype="<i4")),
        ("UINT64", [0, 2**64 - 1, 1, 2], np.array([[0, 2**64 - 1], [1, 2]], dtype="<u8")),
        ("FP32", [1, 2.5, float("inf"), float("nan")],
         np.array([[1, 2.5], [np.inf, np.nan]], dtype="<f4")),
        ("BOOL", [[True, False], [False, False]], np.array([[1, 0], [0, 0]], dtype=bool)),
        ("FP16", [0.5, 1, 2, 3], np.array([[0.5, 1], [2, 3]], dtype="<f2")),
    ],
)  # fmt: skip
def test_json_data_nested_or_flat(datatype: str, data: Any, expected: Any) -> None:
    header = {"inputs": [{"name": "x", "shape": [2, 2], "datatype": datatype, "data": data}]}
    body = json.dumps(header).encode()
    arr = binproto.decode_request(body, header_length=None).tensors["x"]
    assert arr.dtype == expected.dtype
    np.testing.assert_array_equal(arr, expected)


def test_zero_size_tensors() -> None:
    header = {"outputs": [
        {"name": "a", "shape": [0, 3], "datatype": "FP32", "parameters": {"binary_data_size": 0}},
        {"name": "b", "shape": [0], "datatype": "BYTES", "parameters": {"binary_data_size": 0}},
        {"name": "c", "shape": [2], "datatype": "INT8", "parameters": {"binary_data_size": 2}},
        {"name": "d", "shape": [0], "datatype": "INT8", "data": []},
    ]}  # fmt: skip
    body, hl = make_body(header, b"\x01\x02")
    out = assert_same_everywhere(response_parser(hl), body)
    assert out.events[1:] == (
        ("tensor", 0, "a", b""),
        ("tensor", 1, "b", b""),
        ("tensor", 2, "c", b"\x01\x02"),
        ("tensor", 3, "d", b""),
        ("end",),
    )
    msg = binproto.decode_response(body, header_length=hl)
    assert msg.tensors["a"].shape == (0, 3)
    assert msg.tensors["b"].shape == (0,)
    assert msg.tensors["d"].shape == (0,)


def test_shared_memory_outputs_have_no_body_bytes() -> None:
    header = {"outputs": [
        {"name": "s", "shape": [4], "datatype": "FP32",
         "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 16}},
        {"name": "t", "shape": [1], "datatype": "INT8", "parameters": {"binary_data_size": 1}},
    ]}  # fmt: skip
    body, hl = make_body(header, b"\x05")
    msg = binproto.decode_response(body, header_length=hl)
    assert msg.shared_memory == ("s",)
    info = msg.header.tensor("s")
    assert info.binary_size is None and info.data is None and info.shared_memory
    assert list(msg.tensors) == ["t"]


def test_accepts_null_optional_fields_and_nan_tokens() -> None:
    text = (
        '{"model_name": "m", "model_version": null, "id": null, "parameters": null,'
        ' "outputs": [{"name": "o", "shape": [2], "datatype": "FP64", "parameters": null,'
        ' "data": [NaN, -Infinity]}]}'
    )
    msg = binproto.decode_response(text.encode(), header_length=None)
    assert msg.header.model_version is None
    assert msg.header.parameters == {}
    assert np.isnan(msg.tensors["o"][0]) and msg.tensors["o"][1] == -np.inf


# -- the event protocol ------------------------------------------------------------


def test_events_come_one_at_a_time_and_chunks_are_views() -> None:
    raw = np.arange(8, dtype=np.uint8).tobytes()
    header = {"inputs": [{"name": "x", "shape": [8], "datatype": "UINT8",
                          "parameters": {"binary_data_size": 8}}]}  # fmt: skip
    body, hl = make_body(header, raw)
    buf = bytearray(body)
    p = Parser("request", header_length=hl)
    assert p.next_event() is NEED_DATA
    p.receive_data(buf)
    ev = p.next_event()
    assert isinstance(ev, HeaderParsed) and p.state.value == "TENSORS"
    ev = p.next_event()
    assert isinstance(ev, TensorChunk)
    assert ev.data.obj is buf  # a view of the caller's buffer, not a copy
    assert (ev.index, ev.name, ev.offset, bytes(ev.data)) == (0, "x", 0, raw)
    assert isinstance(p.next_event(), TensorComplete)
    assert p.next_event() is NEED_DATA  # the end is not known yet
    p.receive_data(b"")
    assert isinstance(p.next_event(), MessageComplete)
    assert p.state is ParserState.DONE
    with pytest.raises(LocalProtocolError):
        p.next_event()
    with pytest.raises(LocalProtocolError):
        p.receive_data(b"more")


def test_events_drains_everything_queued() -> None:
    # Several receive_data calls before draining: events() goes on until
    # next_event() would say NEED_DATA, across the queued pieces.
    raw = bytes(range(12))
    header = {"inputs": [{"name": "x", "shape": [12], "datatype": "UINT8",
                          "parameters": {"binary_data_size": 12}}]}  # fmt: skip
    body, hl = make_body(header, raw)
    p = Parser("request", header_length=hl)
    p.receive_data(body[: hl + 2])
    assert [type(e).__name__ for e in p.events()] == ["HeaderParsed", "TensorChunk"]
    p.receive_data(body[hl + 2 : hl + 5])
    p.receive_data(body[hl + 5 : hl + 9])
    got = list(p.events())
    assert [(e.offset, bytes(e.data)) for e in got if isinstance(e, TensorChunk)] == [
        (2, raw[2:5]), (5, raw[5:9])]  # fmt: skip
    assert len(got) == 2 and p.next_event() is NEED_DATA
    p.receive_data(body[hl + 9 :])
    p.receive_data(b"")
    assert [type(e).__name__ for e in p.events()] == [
        "TensorChunk", "TensorComplete", "MessageComplete"]  # fmt: skip


def test_content_length_ends_without_eof_and_extra_bytes_after_done_raise() -> None:
    header = {"inputs": [{"name": "x", "shape": [1], "datatype": "INT8",
                          "parameters": {"binary_data_size": 1}}]}  # fmt: skip
    body, hl = make_body(header, b"\x07")
    p = Parser("request", header_length=hl, content_length=len(body))
    p.receive_data(body)
    assert [type(e).__name__ for e in p.events()] == [
        "HeaderParsed", "TensorChunk", "TensorComplete", "MessageComplete"]  # fmt: skip
    with pytest.raises(RemoteProtocolError) as info:
        p.receive_data(b"!")
    assert info.value.offset == len(body)
    assert p.state is ParserState.ERROR


def test_error_state_is_a_sink() -> None:
    p = Parser("request", header_length=4)
    p.receive_data(b"nope")
    with pytest.raises(RemoteProtocolError):
        p.next_event()
    assert p.state is ParserState.ERROR
    with pytest.raises(LocalProtocolError):
        p.next_event()
    with pytest.raises(LocalProtocolError):
        p.receive_data(b"{}")


def test_accepts_any_buffer() -> None:
    header = {"inputs": [{"name": "x", "shape": [2], "datatype": "INT16",
                          "parameters": {"binary_data_size": 4}}]}  # fmt: skip
    body, hl = make_body(header, b"\x01\x00\x02\x00")
    arr = np.frombuffer(body, dtype=np.uint8)
    for buf in (body, bytearray(body), memoryview(body), arr):
        msg = binproto.decode_request(buf, header_length=hl)
        np.testing.assert_array_equal(msg.tensors["x"], [1, 2])
    writable = binproto.decode_request(bytearray(body), header_length=hl).tensors["x"]
    assert writable.flags.writeable


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ({"kind": "both"}, "kind"),
        ({"kind": "request", "header_length": -1}, "header_length"),
        ({"kind": "request", "header_length": True}, "header_length"),
        ({"kind": "request", "content_length": 1.5}, "content_length"),
        ({"kind": "request", "limits": {}}, "limits must be a binproto.Limits"),
    ],
)
def test_api_misuse_is_local(args: dict[str, Any], match: str) -> None:
    kind = args.pop("kind")
    with pytest.raises(LocalProtocolError, match=match):
        Parser(kind, **args)


@pytest.mark.parametrize(
    "fields",
    [
        {"max_tensors": -1},
        {"max_header_bytes": 1.5},
        {"max_json_depth": True},
        {"max_decompression_ratio": 0},
        {"max_decompression_ratio": "100"},
    ],
)
def test_bad_limits_are_local_errors(fields: dict[str, Any]) -> None:
    with pytest.raises(LocalProtocolError, match=r"Limits\.max_"):
        Limits(**fields)


def test_non_buffer_is_local_error() -> None:
    p = Parser("request", header_length=2)
    with pytest.raises(LocalProtocolError):
        p.receive_data("text")


# -- faults ------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_fault_is_reported_the_same_in_every_chunking(name: str) -> None:
    (body, hl, cl), message, status, offset = FAULTS[name]
    out = assert_same_everywhere(request_parser(hl, cl), body, two_way_limit=300)
    assert out.error is not None, "the body must be rejected"
    kind, msg, got_status, got_offset = out.error
    assert kind == "RemoteProtocolError"
    assert re.search(message, msg), msg
    assert got_status == status
    assert got_offset is not None and 0 <= got_offset <= len(body)
    if offset == "last":
        assert got_offset == len(body) - 1
    elif offset == "tensor":
        assert got_offset == hl
    elif offset == "tensor+5":
        assert got_offset == hl + 5
    elif offset == "end":
        assert got_offset == len(body)
    elif isinstance(offset, int):
        assert got_offset == offset


def test_bool_check_can_be_switched_off() -> None:
    header = {"inputs": [{"name": "b", "shape": [2], "datatype": "BOOL",
                          "parameters": {"binary_data_size": 2}}]}  # fmt: skip
    body, hl = make_body(header, b"\x00\x07")
    with pytest.raises(RemoteProtocolError):
        binproto.decode_request(body, header_length=hl)
    arr = binproto.decode_request(body, header_length=hl, strict_bool=False).tensors["b"]
    assert arr.tolist() == [False, True]


# -- limits -------------------------------------------------------------------------


def test_limits_are_checked_on_claims_before_bytes_arrive() -> None:
    p = Parser("request", header_length=2**62, limits=Limits(max_header_bytes=1024))
    with pytest.raises(RemoteProtocolError) as info:
        p.next_event()
    assert info.value.status_hint == 413
    p = Parser("request", header_length=10, content_length=2**62)
    with pytest.raises(RemoteProtocolError) as info:
        p.next_event()
    assert info.value.status_hint == 413


@pytest.mark.parametrize(
    ("limits", "header", "match"),
    [
        (Limits(max_tensor_bytes=7), one(), "exceeds the limit of 7"),
        (
            Limits(max_tensors=1),
            {"inputs": one()["inputs"] + one("y")["inputs"]},
            "limit of 1",
        ),
        (Limits(max_body_bytes=20), one(), "over the limit of 20"),
        (Limits(max_header_bytes=20), one(), "exceeds the limit of 20"),
    ],
)
def test_size_limits_answer_413(limits: Limits, header: Any, match: str) -> None:
    body, hl = make_body(header, b"\0" * 8 * len(header["inputs"]))
    out = assert_same_everywhere(
        lambda: Parser("request", header_length=hl, limits=limits), body, two_way_limit=0
    )
    assert out.error is not None and out.error[2] == 413
    assert match in out.error[1]


def test_plain_json_over_header_limit_fails_at_the_limit_in_every_chunking() -> None:
    body = json.dumps({"inputs": [], "id": "x" * 200}).encode()
    out = assert_same_everywhere(
        lambda: Parser("request", limits=Limits(max_header_bytes=100)), body, two_way_limit=0
    )
    assert out.error is not None
    assert (out.error[2], out.error[3]) == (413, 100)


def test_json_depth_limit() -> None:
    # (a requested output's parameters are taken as sent, nested any way)
    deep = b'{"inputs": [], "outputs": [{"name": "y", "parameters": {"p": '
    deep += b"[" * 200 + b"]" * 200 + b"}}]}"
    with pytest.raises(RemoteProtocolError, match="deeper than the limit of 100"):
        binproto.decode_request(deep, header_length=None)
    fine = b'{"inputs": [], "outputs": [{"name": "y", "parameters": {"p": '
    fine += b"[" * 90 + b"]" * 90 + b"}}]}"
    assert binproto.decode_request(fine, header_length=None).header.tensors == ()
    # Brackets inside strings do not count.
    text = b'{"inputs": [], "id": "' + b"[" * 500 + b'"}'
    assert binproto.decode_request(text, header_length=None).header.id == "[" * 500


# -- hypothesis: arbitrary splits ---------------------------------------------------


def _mixed_body() -> tuple[bytes, int]:
    items = [b"a", b"", b"\x00\x01\x02\x03\x04"]
    header = {"inputs": [
        {"name": "f", "shape": [3], "datatype": "FP32", "parameters": {"binary_data_size": 12}},
        {"name": "j", "shape": [1], "datatype": "INT8", "data": [1]},
        {"name": "s", "shape": [3], "datatype": "BYTES",
         "parameters": {"binary_data_size": len(bytes_tensor(items))}},
        {"name": "b", "shape": [2], "datatype": "BOOL", "parameters": {"binary_data_size": 2}},
    ]}  # fmt: skip
    return make_body(header, np.array([1, 2, 3], "<f4").tobytes(), bytes_tensor(items), b"\x01\x00")


MIXED, MIXED_HL = _mixed_body()
MIXED_REFERENCE = run(request_parser(MIXED_HL), [MIXED])


@given(st.lists(st.integers(min_value=0, max_value=len(MIXED)), max_size=40))
@settings(max_examples=300, deadline=None)
def test_hypothesis_splits_give_the_same_events(points: list[int]) -> None:
    assert MIXED_REFERENCE.error is None
    assert run(request_parser(MIXED_HL), split(MIXED, points)) == MIXED_REFERENCE
    with_cl = run(request_parser(MIXED_HL, len(MIXED)), split(MIXED, points), end=False)
    assert with_cl == MIXED_REFERENCE


@given(
    st.lists(st.integers(min_value=0, max_value=len(MIXED)), max_size=10),
    st.integers(min_value=0, max_value=len(MIXED) - 1),
    st.integers(min_value=0, max_value=255),
)
@settings(max_examples=300, deadline=None)
def test_hypothesis_mutations_fail_the_same_in_every_split(
    points: list[int], where: int, value: int
) -> None:
    body = bytearray(MIXED)
    body[where] = value
    whole = run(request_parser(MIXED_HL), [bytes(body)])
    assert run(request_parser(MIXED_HL), split(bytes(body), points)) == whole
    if whole.error is not None:
        assert whole.error[0] == "RemoteProtocolError"


def test_strided_and_multidimensional_buffers() -> None:
    header = {"inputs": [{"name": "x", "shape": [4], "datatype": "UINT8",
                          "parameters": {"binary_data_size": 4}}]}  # fmt: skip
    body, hl = make_body(header, b"\x01\x02\x03\x04")
    p = Parser("request", header_length=hl)
    p.receive_data(body[:hl])
    assert isinstance(p.next_event(), HeaderParsed)
    strided = memoryview(b"\x01\x00\x02\x00\x03\x00\x04\x00")[::2]
    with pytest.raises(LocalProtocolError, match="C-contiguous"):
        p.receive_data(strided)
    # A 2-D buffer counts all its bytes, not its first dimension.
    square = np.array([[1, 2], [3, 4]], dtype=np.uint8).data
    p.receive_data(square)
    p.receive_data(b"")
    out = [e for e in p.events() if isinstance(e, TensorChunk)]
    assert b"".join(bytes(e.data) for e in out) == b"\x01\x02\x03\x04"


def test_arrays_of_any_dtype_are_taken_as_their_bytes() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    values = np.array([[1.5, -2.0], [0.25, 3.0]], dtype=ml_dtypes.bfloat16)
    header = {"inputs": [{"name": "x", "shape": [2, 2], "datatype": "BF16",
                          "parameters": {"binary_data_size": 8}}]}  # fmt: skip
    body, hl = make_body(header, values.tobytes())
    p = Parser("request", header_length=hl, content_length=len(body))
    p.receive_data(body[:hl])
    assert isinstance(p.next_event(), HeaderParsed)
    with pytest.raises(LocalProtocolError, match="C-contiguous"):
        p.receive_data(values.T)
    p.receive_data(values)  # bfloat16 has no buffer-protocol format
    chunk = p.next_event()
    assert isinstance(chunk, TensorChunk)
    assert np.shares_memory(np.frombuffer(chunk.data, np.uint8), values)  # a view, no copy
    assert bytes(chunk.data) == values.tobytes()


def test_error_in_a_later_chunk_is_a_sink_too() -> None:
    header = {"inputs": [{"name": "b", "shape": [4], "datatype": "BOOL",
                          "parameters": {"binary_data_size": 4}}]}  # fmt: skip
    body, hl = make_body(header, b"\x01\x00\x01\x05")
    p = Parser("request", header_length=hl)
    p.receive_data(body[: hl + 1])
    assert [type(e) for e in p.events()] == [HeaderParsed, TensorChunk]
    p.receive_data(memoryview(body)[hl + 1 :])
    with pytest.raises(RemoteProtocolError) as info:
        p.next_event()
    assert info.value.offset == len(body) - 1
    with pytest.raises(LocalProtocolError):
        p.receive_data(memoryview(b"\x00"))
    with pytest.raises(LocalProtocolError):
        p.next_event()


def test_bytes_after_the_end_say_the_same_whenever_they_arrive() -> None:
    header = {"inputs": [{"name": "x", "shape": [1], "datatype": "INT8",
                          "parameters": {"binary_data_size": 1}}]}  # fmt: skip
    body, hl = make_body(header, b"\x07")
    messages = set()
    for chunks in ([body + b"!"], [body, b"!"]):
        p = Parser("request", header_length=hl, content_length=len(body))
        with pytest.raises(RemoteProtocolError) as info:
            for chunk in chunks:
                p.receive_data(chunk)
                list(p.events())
            p.receive_data(b"")  # (the end: bytes that came with the body's last are raised)
        assert info.value.offset == len(body)
        messages.add(info.value.msg)
    assert messages == {"unexpected additional input data after the end of the message"}


@pytest.mark.parametrize("coding", [None, "gzip", "deflate"])
@pytest.mark.parametrize("extra", [b"!", b"!" * 40], ids=["one", "forty"])
def test_bytes_past_content_length_give_the_same_events_first_in_every_chunking(
    extra: bytes, coding: str | None
) -> None:
    # The body's events come out whole, its end included, then the fault:
    # as when the extra bytes arrive in a later receive_data, whatever the
    # chunking (a whole chunk once stopped short of MessageComplete).
    header = {"inputs": [
        {"name": "x", "shape": [3], "datatype": "INT8", "parameters": {"binary_data_size": 3}},
        {"name": "y", "shape": [2], "datatype": "INT8", "parameters": {"binary_data_size": 2}},
    ]}  # fmt: skip
    body, hl = make_body(header, b"\x01\x02\x03", b"\x04\x05")
    decoded = len(body)
    if coding is not None:  # (content_length is the compressed body's)
        body = b"".join(binproto.compress_buffers([body], coding))
    outcomes = set()
    for chunks in chunkings(body + extra):
        parser = Parser(
            "request", header_length=hl, content_length=len(body), content_encoding=coding
        )
        events: list[binproto.Event] = []
        with pytest.raises(RemoteProtocolError) as info:
            for chunk in chunks:
                parser.receive_data(chunk)
                events.extend(parser.events())
            parser.receive_data(b"")
        assert parser.state is binproto.ParserState.ERROR
        outcomes.add((normalize(events), info.value.msg, info.value.offset))
    assert len(outcomes) == 1
    ((events_seen, msg, offset),) = outcomes
    assert events_seen[-1] == ("end",) and len(events_seen) == 4
    assert msg == "unexpected additional input data after the end of the message"
    assert offset == decoded


def test_bytes_past_content_length_are_raised_by_the_next_call_after_the_end() -> None:
    header = {"inputs": [{"name": "x", "shape": [1], "datatype": "INT8",
                          "parameters": {"binary_data_size": 1}}]}  # fmt: skip
    body, hl = make_body(header, b"\x07")
    parser = Parser("request", header_length=hl, content_length=len(body))
    parser.receive_data(body + b"!")
    assert [type(e) for e in parser.events()][-1] is binproto.MessageComplete
    with pytest.raises(RemoteProtocolError, match="additional input data"):
        parser.next_event()
    with pytest.raises(LocalProtocolError):
        parser.receive_data(b"")


def test_json_errors_name_the_kind() -> None:
    with pytest.raises(RemoteProtocolError, match="failed to parse the response JSON"):
        binproto.decode_response(b"{oops", header_length=None)
    with pytest.raises(RemoteProtocolError, match="failed to parse the request JSON"):
        binproto.decode_request(b"{oops", header_length=None)


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        (b'{"a": "[[[", "b": [[1]]}', 3),
        (b'{"a": "\\"[[[", "b": [[1]]}', 3),  # an escaped quote does not end the string
        (b'{"a": "\\\\", "b": [[[1]]]}', 4),  # an escaped backslash before the end quote
        (b'{"a": "]]]]"}', 1),
        (b"[[[[]]]]", 4),
        (b'"x"', 0),
        (b'[{"a": [], "b": {}}, [[]], "", ""]', 3),
        (b'["", "[", ""]', 1),  # a bracket in a string next to empty strings
        (b"[[]", 2),  # unbalanced: measured by the full scan
        (b"[}", 1),
    ],
)
@pytest.mark.parametrize("limit", [0, 2, 100])
def test_depth_scan_ignores_strings(text: bytes, depth: int, limit: int) -> None:
    from binproto._json import _max_depth

    assert _max_depth(text, limit) == depth


# JSON-like text: nested arrays and objects holding strings that may contain
# brackets, quotes escaped or not, and now and then a stray bracket.
_TOKENS = st.sampled_from(['""', '"x"', '"["', '"]}"', '"\\""', '"\\\\"', "1"])
_NESTED = st.recursive(
    _TOKENS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(lambda xs: "[" + ",".join(xs) + "]"),
        st.lists(inner, max_size=3).map(lambda xs: "{" + ",".join(f'"k":{x}' for x in xs) + "}"),
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(
    text=st.lists(st.one_of(_NESTED, st.sampled_from(["[", "]", "}"])), min_size=1, max_size=3),
    limit=st.integers(0, 8),
)
def test_depth_quick_route_agrees_with_the_full_scan(text: list[str], limit: int) -> None:
    from binproto import _json

    raw = "".join(text).encode()
    assert _json._max_depth(raw, limit) == _full_depth(raw), raw


def _full_depth(raw: bytes) -> int:
    """The depth by a plain walk over the bytes (the reference for the scan)."""
    from binproto._json import _STRING

    if b"\\" in raw:
        raw = _STRING.sub(b'""', raw)
    depth = best = 0
    inside = False
    for c in raw:
        if c == 0x22:
            inside = not inside
        elif not inside and c in b"[{":
            depth += 1
            best = max(best, depth)
        elif not inside and c in b"]}":
            depth -= 1
    return best


def test_after_message_complete_events_yield_nothing_and_the_end_mark_is_harmless() -> None:
    body, hl = make_body(
        {"inputs": [{"name": "x", "datatype": "INT8", "shape": [2],
                     "parameters": {"binary_data_size": 2}}]},
        b"\x01\x02",
    )  # fmt: skip
    p = Parser("request", header_length=hl, content_length=len(body))
    p.receive_data(body)
    assert type(list(p.events())[-1]) is binproto.MessageComplete
    assert p.state is ParserState.DONE
    assert list(p.events()) == []
    p.receive_data(b"")  # a driver's final end mark, after Content-Length ended the body
    p.receive_data(b"")
    assert list(p.events()) == [] and p.state is ParserState.DONE
    with pytest.raises(binproto.RemoteProtocolError, match="after the end of the message"):
        p.receive_data(b"x")
    assert p.state.name == "ERROR"
    with pytest.raises(binproto.LocalProtocolError):
        list(p.events())
