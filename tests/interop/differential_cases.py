"""The differential table: malformed and edge-case requests for Triton and binproto.

Each :class:`Case` is one HTTP request (model, body, headers) sent as is to
Triton and to binproto's reference server serving the same identity models.
``test_triton_differential.py`` checks that both accept it or both refuse it,
except for the cases in :data:`DIFFERENCES`, where they must disagree as listed
(each difference and its reason is in docs/interop.md).
"""

from __future__ import annotations

import gzip
import json
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

from .triton_peer import model_name

HL = "Inference-Header-Content-Length"


@dataclass(frozen=True)
class Case:
    """One request of the table."""

    id: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    model: str = model_name("FP32")


def _tensor(name: str = "INPUT0", datatype: str = "FP32", shape: Any = (2,), **extra: Any) -> Any:
    t: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(shape)}
    t.update(extra)
    return t


def _binary(size: int, **params: Any) -> dict[str, Any]:
    return {"parameters": {"binary_data_size": size, **params}}


def _json(header: Any) -> bytes:
    return json.dumps(header, separators=(",", ":")).encode()


def binary_case(
    case_id: str,
    tensors: list[dict[str, Any]],
    data: bytes,
    *,
    model: str = model_name("FP32"),
    hl_delta: int = 0,
    top: dict[str, Any] | None = None,
) -> Case:
    """A binary body: the JSON header of ``tensors`` then ``data``."""
    header = _json({"inputs": tensors, **(top or {})})
    return Case(case_id, header + data, {HL: str(len(header) + hl_delta)}, model)


def raw_header_case(case_id: str, header: bytes, data: bytes = b"", **kw: Any) -> Case:
    """A body whose JSON header is given as bytes (for faults json.dumps cannot make)."""
    return Case(case_id, header + data, {HL: str(len(header))}, **kw)


def json_case(
    case_id: str, tensors: list[dict[str, Any]], *, model: str = model_name("FP32")
) -> Case:
    """A plain JSON body (no Inference-Header-Content-Length)."""
    return Case(case_id, _json({"inputs": tensors}), {"Content-Type": "application/json"}, model)


def _bytes_elements(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(x)) + x for x in items)


F2 = struct.pack("<2f", 1.5, -2.0)  # two FP32 elements
FP32_OK = [_tensor(**_binary(8))]
OK_HEADER = _json({"inputs": FP32_OK})
OK_BODY = OK_HEADER + F2


def _coded(case_id: str, coding: str, body: bytes, header_length: int) -> Case:
    return Case(case_id, body, {HL: str(header_length), "Content-Encoding": coding})


I32, U8, I8, U64, I64 = (model_name(t) for t in ("INT32", "UINT8", "INT8", "UINT64", "INT64"))
F64, BOOL, BYTES = model_name("FP64"), model_name("BOOL"), model_name("BYTES")

CASES: list[Case] = [
    # -- the header length -------------------------------------------------------
    binary_case("valid-binary", FP32_OK, F2),
    binary_case("header-length-minus-1", FP32_OK, F2, hl_delta=-1),
    binary_case("header-length-plus-1", FP32_OK, F2, hl_delta=1),
    binary_case("header-length-beyond-body", FP32_OK, F2, hl_delta=100),
    Case("header-length-negative", OK_BODY, {HL: "-1"}),
    Case("header-length-not-a-number", OK_BODY, {HL: "abc"}),
    Case("header-length-zero-two-input-model", F2, {HL: "0"}),
    Case("header-length-whole-json-body", _json({"inputs": [_tensor(data=[1, 2])]}), {}),
    binary_case("header-length-whole-json-body-set", [_tensor(data=[1, 2])], b""),
    Case("binary-body-without-header-length", OK_BODY, {}),
    Case("header-length-plus-sign", OK_BODY, {HL: f"+{len(OK_HEADER)}"}),
    Case("header-length-leading-zeros", OK_BODY, {HL: "0" * 30 + str(len(OK_HEADER))}),
    Case("header-length-then-text", OK_BODY, {HL: f"{len(OK_HEADER)}abc"}),
    Case("header-length-a-float", OK_BODY, {HL: f"{len(OK_HEADER)}.0"}),
    # -- sizes -------------------------------------------------------------------------
    binary_case("binary-size-too-small", [_tensor(**_binary(4))], F2[:4]),
    binary_case("binary-size-too-large", [_tensor(**_binary(12))], F2 + F2[:4]),
    binary_case("body-shorter-than-binary-size", FP32_OK, F2[:6]),
    binary_case("bytes-after-the-last-tensor", FP32_OK, F2 + b"!"),
    binary_case("binary-size-negative", [_tensor(**_binary(-8))], F2),
    binary_case("binary-size-a-string", [_tensor(parameters={"binary_data_size": "8"})], F2),
    binary_case("binary-size-a-float", [_tensor(parameters={"binary_data_size": 8.0})], F2),
    binary_case("zero-size-binary", [_tensor(shape=[0], **_binary(0))], b""),
    binary_case(
        "two-inputs-binary",
        [_tensor(**_binary(8)), _tensor("INPUT1", shape=[1], **_binary(4))],
        F2 + F2[:4],
    ),
    # -- names and keys ----------------------------------------------------------------
    binary_case("duplicate-input-names", [_tensor(**_binary(8)), _tensor(**_binary(8))], F2 + F2),
    raw_header_case(
        "duplicate-key-inputs",
        b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[2],"data":[1,2]}],'
        b'"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[3],"data":[1,2,3]}]}',
    ),
    raw_header_case(
        "duplicate-key-datatype",
        b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[2],"datatype":"INT8",'
        b'"data":[1,2]}]}',
    ),
    binary_case("unknown-input-name", [_tensor("NOPE", **_binary(8))], F2),
    binary_case("empty-input-name", [_tensor("", **_binary(8))], F2),
    binary_case("no-inputs", [], b""),
    raw_header_case("inputs-not-a-list", b'{"inputs":{"name":"INPUT0"}}'),
    raw_header_case("header-is-a-json-array", b"[]"),
    raw_header_case(
        "input-without-name", _json({"inputs": [{"datatype": "FP32", "shape": [1], "data": [1]}]})
    ),
    # -- data beside binary ------------------------------------------------------------
    binary_case("data-and-binary-size", [_tensor(data=[1, 2], **_binary(8))], F2),
    binary_case("neither-data-nor-binary-size", [_tensor()], b""),
    binary_case(
        "unregistered-shared-memory-region",
        [_tensor(parameters={"shared_memory_region": "r", "shared_memory_byte_size": 8})],
        b"",
    ),
    # -- datatypes ---------------------------------------------------------------------
    binary_case("unknown-datatype", [_tensor(datatype="FP8", **_binary(2))], F2[:2]),
    binary_case("lower-case-datatype", [_tensor(datatype="fp32", **_binary(8))], F2),
    binary_case("datatype-not-the-models", [_tensor(datatype="FP64", shape=[1], **_binary(8))], F2),
    binary_case("bf16-to-an-fp32-model", [_tensor(datatype="BF16", shape=[4], **_binary(8))], F2),
    # -- shapes -------------------------------------------------------------------------
    binary_case("shape-negative", [_tensor(shape=[-1], **_binary(8))], F2),
    binary_case("shape-float", [_tensor(shape=[2.0], **_binary(8))], F2),
    raw_header_case(
        "shape-a-string",
        b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":"2","data":[1,2]}]}',
    ),
    binary_case("shape-missing", [{"name": "INPUT0", "datatype": "FP32", **_binary(8)}], F2),
    json_case("shape-scalar", [_tensor(shape=[], data=[1.0])]),
    binary_case("shape-rank-2", [_tensor(shape=[1, 2], **_binary(8))], F2),
    binary_case("shape-huge", [_tensor(shape=[1 << 40], **_binary(8))], F2),
    binary_case("shape-over-int64", [_tensor(shape=[1 << 64], **_binary(8))], F2),
    json_case("shape-count-not-data-count", [_tensor(shape=[3], data=[1, 2])]),
    # -- JSON data: ranges and types -------------------------------------------------------
    json_case("int8-128", [_tensor(datatype="INT8", shape=[1], data=[128])], model=I8),
    json_case("int8-minus-128", [_tensor(datatype="INT8", shape=[1], data=[-128])], model=I8),
    json_case("uint8-minus-1", [_tensor(datatype="UINT8", shape=[1], data=[-1])], model=U8),
    json_case("uint8-256", [_tensor(datatype="UINT8", shape=[1], data=[256])], model=U8),
    json_case("int32-2-pow-31", [_tensor(datatype="INT32", shape=[1], data=[1 << 31])], model=I32),
    json_case("int64-2-pow-63", [_tensor(datatype="INT64", shape=[1], data=[1 << 63])], model=I64),
    json_case(
        "uint64-max", [_tensor(datatype="UINT64", shape=[1], data=[(1 << 64) - 1])], model=U64
    ),
    json_case(
        "uint64-2-pow-64", [_tensor(datatype="UINT64", shape=[1], data=[1 << 64])], model=U64
    ),
    json_case("int32-a-float", [_tensor(datatype="INT32", shape=[1], data=[1.5])], model=I32),
    json_case("int32-a-float-1.0", [_tensor(datatype="INT32", shape=[1], data=[1.0])], model=I32),
    json_case("int32-a-string", [_tensor(datatype="INT32", shape=[1], data=["1"])], model=I32),
    json_case("int32-a-bool", [_tensor(datatype="INT32", shape=[1], data=[True])], model=I32),
    json_case("fp32-overflow-1e39", [_tensor(shape=[1], data=[1e39])]),
    json_case("fp32-an-integer", [_tensor(shape=[1], data=[3])]),
    json_case("fp64-a-string", [_tensor(datatype="FP64", shape=[1], data=["1.0"])], model=F64),
    json_case("fp32-null", [_tensor(shape=[1], data=[None])]),
    raw_header_case(
        "fp64-nan-token",
        b'{"inputs":[{"name":"INPUT0","datatype":"FP64","shape":[1],"data":[NaN]}]}',
        model=F64,
    ),
    json_case("bool-an-integer", [_tensor(datatype="BOOL", shape=[1], data=[1])], model=BOOL),
    json_case("bool-a-string", [_tensor(datatype="BOOL", shape=[1], data=["true"])], model=BOOL),
    json_case("bytes-a-number", [_tensor(datatype="BYTES", shape=[1], data=[1])], model=BYTES),
    json_case("data-not-a-list", [_tensor(shape=[1], data=1.0)]),
    # -- nesting ------------------------------------------------------------------------
    json_case(
        "data-nested-as-shape", [_tensor(datatype="INT32", shape=[2], data=[[1], [2]])], model=I32
    ),
    json_case(
        "data-nested-deeper", [_tensor(datatype="INT32", shape=[2], data=[[[1, 2]]])], model=I32
    ),
    json_case("data-ragged", [_tensor(datatype="INT32", shape=[3], data=[[1, 2], [3]])], model=I32),
    raw_header_case(
        "parameters-nested-100-deep",
        b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1],"data":[1]}],'
        b'"parameters":{"p":' + b"[" * 100 + b"]" * 100 + b"}}",
    ),
    # -- BOOL bytes ------------------------------------------------------------------------
    binary_case(
        "bool-bytes-0-and-1", [_tensor(datatype="BOOL", **_binary(2))], b"\x00\x01", model=BOOL
    ),
    binary_case("bool-byte-2", [_tensor(datatype="BOOL", **_binary(2))], b"\x00\x02", model=BOOL),
    binary_case("bool-byte-255", [_tensor(datatype="BOOL", **_binary(2))], b"\xff\x01", model=BOOL),
    # -- BYTES framing ---------------------------------------------------------------------
    binary_case(
        "bytes-valid",
        [_tensor(datatype="BYTES", **_binary(10))],
        _bytes_elements(b"ab", b""),
        model=BYTES,
    ),
    binary_case(
        "bytes-not-utf8",
        [_tensor(datatype="BYTES", **_binary(11))],
        _bytes_elements(b"\xff\xfe", b"\x80"),
        model=BYTES,
    ),
    binary_case(
        "bytes-length-overruns",
        [_tensor(datatype="BYTES", **_binary(10))],
        struct.pack("<I", 9) + b"ab" + _bytes_elements(b""),
        model=BYTES,
    ),
    binary_case(
        "bytes-fewer-elements-than-shape",
        [_tensor(datatype="BYTES", shape=[3], **_binary(10))],
        _bytes_elements(b"ab", b""),
        model=BYTES,
    ),
    binary_case(
        "bytes-more-elements-than-shape",
        [_tensor(datatype="BYTES", shape=[1], **_binary(10))],
        _bytes_elements(b"ab", b""),
        model=BYTES,
    ),
    binary_case(
        "bytes-truncated-length-prefix",
        [_tensor(datatype="BYTES", shape=[2], **_binary(9))],
        _bytes_elements(b"ab") + b"\x00\x00\x00",
        model=BYTES,
    ),
    # -- content encodings -----------------------------------------------------------------
    _coded("gzip-body", "gzip", gzip.compress(OK_BODY), len(OK_HEADER)),
    _coded("deflate-body", "deflate", zlib.compress(OK_BODY), len(OK_HEADER)),
    _coded("identity-coding", "identity", OK_BODY, len(OK_HEADER)),
    _coded("br-coding", "br", OK_BODY, len(OK_HEADER)),
    _coded("gzip-label-plain-body", "gzip", OK_BODY, len(OK_HEADER)),
    _coded("gzip-truncated", "gzip", gzip.compress(OK_BODY)[:-10], len(OK_HEADER)),
    _coded("deflate-raw-stream", "deflate", zlib.compress(OK_BODY)[2:-4], len(OK_HEADER)),
    _coded("gzip-upper-case", "GZIP", gzip.compress(OK_BODY), len(OK_HEADER)),
    _coded("x-gzip-coding", "x-gzip", gzip.compress(OK_BODY), len(OK_HEADER)),
    _coded("gzip-then-identity-coding", "gzip, identity", gzip.compress(OK_BODY), len(OK_HEADER)),
    _coded("empty-coding", "", OK_BODY, len(OK_HEADER)),
    _coded("gzip-then-bytes", "gzip", gzip.compress(OK_BODY) + b"xx", len(OK_HEADER)),
    # -- UTF-8 and JSON text faults ------------------------------------------------------
    raw_header_case("id-invalid-utf8", b'{"id":"\xff","inputs":' + _json(FP32_OK) + b"}", F2),
    raw_header_case("id-overlong-utf8", b'{"id":"\xc0\xaf","inputs":' + _json(FP32_OK) + b"}", F2),
    raw_header_case(
        "id-encoded-surrogate", b'{"id":"\xed\xa0\x80","inputs":' + _json(FP32_OK) + b"}", F2
    ),
    raw_header_case(
        "id-lone-surrogate-escape", b'{"id":"\\ud800","inputs":' + _json(FP32_OK) + b"}", F2
    ),
    raw_header_case(
        "id-surrogate-pair-escape", b'{"id":"\\ud83d\\ude00","inputs":' + _json(FP32_OK) + b"}", F2
    ),
    raw_header_case("id-raw-utf8", '{"id":"é中","inputs":'.encode() + _json(FP32_OK) + b"}", F2),
    raw_header_case("id-raw-nul", b'{"id":"a\x00b","inputs":' + _json(FP32_OK) + b"}", F2),
    raw_header_case("utf8-bom", b"\xef\xbb\xbf" + OK_HEADER, F2),
    raw_header_case("trailing-text-in-header", OK_HEADER[:-1] + b"} x", F2),
    raw_header_case("id-a-number", b'{"id":1,"inputs":' + _json(FP32_OK) + b"}", F2),
    # -- requested outputs and parameters --------------------------------------------------
    binary_case("unknown-requested-output", FP32_OK, F2, top={"outputs": [{"name": "NOPE"}]}),
    binary_case(
        "binary-data-output-a-string",
        FP32_OK,
        F2,
        top={"parameters": {"binary_data_output": "yes"}},
    ),
    binary_case(
        "requested-output-binary-data-a-string",
        FP32_OK,
        F2,
        top={"outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": "yes"}}]},
    ),
    binary_case(
        "binary-data-output-null", FP32_OK, F2, top={"parameters": {"binary_data_output": None}}
    ),
    binary_case("request-parameter-null", FP32_OK, F2, top={"parameters": {"p": None}}),
    binary_case("request-parameter-an-array", FP32_OK, F2, top={"parameters": {"p": [1]}}),
    binary_case("request-parameter-an-object", FP32_OK, F2, top={"parameters": {"p": {"a": 1}}}),
    binary_case("request-parameter-a-float", FP32_OK, F2, top={"parameters": {"p": 1.5}}),
    binary_case("input-parameter-an-array", [_tensor(**_binary(8, p=[1]))], F2),
    binary_case(
        "requested-output-parameter-null",
        FP32_OK,
        F2,
        top={"outputs": [{"name": "OUTPUT0", "parameters": {"p": None}}]},
    ),
    json_case("input-parameters-an-array", [_tensor(data=[1, 2], parameters=[1])]),
    binary_case("request-parameters-null", FP32_OK, F2, top={"parameters": None}),
    binary_case(
        "requested-output-parameters-an-array",
        FP32_OK,
        F2,
        top={"outputs": [{"name": "OUTPUT0", "parameters": []}]},
    ),
    # -- what follows the JSON, and JSON data of a tensor with no elements ----------------
    Case("json-body-then-nul-bytes", _json({"inputs": [_tensor(data=[1, 2])]}) + b"\0\0", {}),
    raw_header_case("header-padded-with-nul-bytes", OK_HEADER + b"\0\0", F2),
    raw_header_case("header-padded-with-spaces", OK_HEADER + b"  ", F2),
    json_case(
        "data-count-not-shape-0", [_tensor(datatype="FP64", shape=[0], data=[-1])], model=F64
    ),
    json_case(
        "data-not-a-list-shape-0", [_tensor(datatype="FP64", shape=[0], data=1.5)], model=F64
    ),
    json_case(
        "fp16-json-input",
        [_tensor(datatype="FP16", shape=[1], data=[1.0])],
        model=model_name("FP16"),
    ),
]

#: The cases where Triton and binproto disagree, and why (docs/interop.md
#: explains each). A case listed here must disagree; any other must agree.
DIFFERENCES: dict[str, str] = {
    **dict.fromkeys(
        ["duplicate-key-inputs", "duplicate-key-datatype"],
        "Triton accepts a repeated JSON key (the first one counts); binproto refuses it",
    ),
    **dict.fromkeys(
        [
            "unknown-input-name",
            "empty-input-name",
            "no-inputs",
            "datatype-not-the-models",
            "bf16-to-an-fp32-model",
            "shape-scalar",
            "shape-rank-2",
        ],
        "Triton refuses what its model configuration does not declare; binproto's"
        " server leaves that check to the model, and the test's identity models declare nothing",
    ),
    **dict.fromkeys(
        ["int8-128", "uint8-256", "int32-2-pow-31"],
        "Triton accepts JSON integers beyond a narrow type and wraps them (128 as INT8"
        " is -128); binproto refuses values that do not fit",
    ),
    **dict.fromkeys(
        ["data-nested-as-shape", "data-nested-deeper", "data-ragged"],
        "Triton accepts JSON data nested any way and flattens it; binproto takes it flat"
        " or nested exactly as the shape",
    ),
    **dict.fromkeys(
        ["bool-byte-2", "bool-byte-255"],
        "Triton accepts any BOOL byte; binproto refuses bytes other than 0 and 1"
        " unless strict_bool=False",
    ),
    "deflate-raw-stream": "Triton refuses; binproto accepts a raw deflate stream (no zlib"
    " wrapper) as Content-Encoding: deflate, as HTTP clients do",
    **dict.fromkeys(
        ["gzip-upper-case", "x-gzip-coding", "gzip-then-identity-coding", "empty-coding"],
        "Triton refuses (501) a Content-Encoding other than exactly gzip or deflate;"
        " binproto reads codings as HTTP defines them (any case, x-gzip as gzip,"
        " identity as none)",
    ),
    "gzip-then-bytes": "Triton accepts bytes after the gzip stream (and ignores them);"
    " binproto refuses them",
    **dict.fromkeys(
        ["header-length-then-text", "header-length-a-float"],
        "Triton accepts an Inference-Header-Content-Length that starts with digits (and"
        " reads those); binproto refuses one that is not a decimal integer",
    ),
    **dict.fromkeys(
        ["id-invalid-utf8", "id-overlong-utf8", "id-encoded-surrogate"],
        "Triton accepts a JSON header that is not UTF-8 (and echoes the bytes raw);"
        " binproto refuses it at the first invalid byte",
    ),
    "utf8-bom": "Triton accepts (and skips) a UTF-8 byte-order mark before the JSON;"
    " binproto refuses it, as JSON forbids it",
    **dict.fromkeys(
        ["requested-output-parameters-an-array", "input-parameters-an-array"],
        "Triton accepts (and ignores) the parameters of a requested output or of a JSON-data"
        " input that are not an object; binproto refuses them",
    ),
    "request-parameters-null": "Triton answers 500 to a request whose parameters are null;"
    " binproto takes them as absent",
    **dict.fromkeys(
        ["json-body-then-nul-bytes", "header-padded-with-nul-bytes"],
        "Triton accepts bytes after the JSON when a NUL byte comes first (it stops reading"
        " there); binproto refuses them, as JSON allows only whitespace after the text",
    ),
    **dict.fromkeys(
        ["data-count-not-shape-0", "data-not-a-list-shape-0"],
        "Triton accepts any data for a tensor with no elements (it does not read it);"
        " binproto refuses data that does not fit the shape",
    ),
    "fp16-json-input": "Triton refuses FP16 input as JSON data; binproto converts the JSON"
    " numbers to FP16",
}
