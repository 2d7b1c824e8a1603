"""The battery of ``binproto check``: each case one request, a clause and an outcome.

A :class:`Case` builds its request from what the server's metadata says
(:class:`Context`), or says why it does not apply. Its ``expect`` is one of:

- ``accept``: a 200 whose body decodes (and, with ``--echo``, holds the inputs);
- ``refuse``: a 4xx, before the deadline;
- ``refuse-or-close``: a 4xx, or the connection closed without an answer;
- ``coding``: a 200 as for accept; a 4xx makes it n/a (the coding is not taken);
- ``status:N``: exactly status N;
- ``listed``: a 200 whose JSON lists ``binary_tensor_data`` in ``extensions``.

Clauses name where the rule comes from: ``ext`` (the binary tensor data
extension), ``V2`` (the Open Inference Protocol), ``RFC 9110`` / ``RFC 9112``
(HTTP), ``RFC 8259`` (JSON).
"""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Callable
from typing import Any

from .._datatypes import DATATYPES
from .._http import HEADER_LENGTH_NAME as HL
from ._plan import BINARY_ONLY, Builder, Case, Context, ModelInfo, Plan, Verifier, sample, wire
from ._wire import Request

__all__ = ["CASES", "Case", "Context", "ModelInfo"]


NO_MODEL = "no model given (--model)"
CASES: list[Case] = []


def case(
    id: str,
    family: str,
    clause: str,
    expect: str,
    summary: str,
    *,
    level: str = "MUST",
    verify: Verifier | None = None,
) -> Callable[[Builder], Builder]:
    """Register the decorated builder as a case."""

    def add(build: Builder) -> Builder:
        CASES.append(Case(id, family, clause, level, expect, summary, build, verify))
        return build

    return add


def with_model(
    build: Callable[[Plan], Request | str], datatype: str = "FP32", **plan_kw: Any
) -> Builder:
    """A builder over a :class:`Plan` of a model taking ``datatype``."""

    def builder(ctx: Context) -> Request | str:
        model = ctx.pick(datatype) if datatype != "any" else ctx.first()
        if model is None:
            return NO_MODEL if not ctx.models else f"no model takes {datatype}"
        return build(Plan.make(model, datatype if datatype != "any" else "FP32", **plan_kw))

    return builder


def register(
    id: str,
    family: str,
    clause: str,
    expect: str,
    summary: str,
    build: Callable[[Plan], Request | str],
    *,
    datatype: str = "any",
    level: str = "MUST",
    verify: Verifier | None = None,
    **plan_kw: Any,
) -> None:
    """Register a case built on a model's plan."""
    b = with_model(build, datatype, **plan_kw)
    CASES.append(Case(id, family, clause, level, expect, summary, b, verify))


def _edit(fn: Callable[[Plan], Any], **kw: Any) -> Callable[[Plan], Request]:
    """A builder that changes the plan with ``fn``, then sends it binary."""

    def build(plan: Plan) -> Request:
        fn(plan)
        return plan.request(**kw)

    return build


def _as_is(plan: Plan) -> None:
    """No change: the plan as made."""


# -- the header length ------------------------------------------------------------------
EXT_HL = "ext: Inference-Header-Content-Length gives the JSON's length"
register("valid-binary", "header-length", EXT_HL, "accept", "a valid binary request", _edit(_as_is))
for _delta in (-1, 1):
    register(
        f"header-length-{'minus' if _delta < 0 else 'plus'}-1",
        "header-length",
        EXT_HL,
        "refuse",
        f"the header length {_delta:+d}",
        _edit(_as_is, hl_delta=_delta),
    )
register(
    "header-length-beyond-body",
    "header-length",
    EXT_HL,
    "refuse",
    "a header length past the end of the body",
    _edit(_as_is, hl_delta=1000),
)


def _hl_value(value: str) -> Callable[[Plan], Request]:
    def build(plan: Plan) -> Request:
        req = plan.request()
        headers = tuple((k, value if k == HL else v) for k, v in req.headers)
        return Request(req.path, headers, req.body)

    return build


for _id, _value in (("negative", "-1"), ("not-a-number", "abc"), ("huge", str(1 << 62))):
    register(
        f"header-length-{_id}",
        "header-length",
        EXT_HL,
        "refuse",
        f"Inference-Header-Content-Length: {_value if len(_value) < 8 else '2**62'}",
        _hl_value(_value),
    )


def _whole_json(plan: Plan) -> Request:
    js = plan.header()
    return Request(plan.path(), ((HL, str(len(js))),), js)


register(
    "header-length-whole-json-body",
    "header-length",
    EXT_HL,
    "accept",
    "a JSON-only body with a header length that covers all of it",
    _whole_json,
    binary=False,
)


def _no_hl(plan: Plan) -> Request:
    req = plan.request()
    return Request(req.path, (("Content-Type", "application/octet-stream"),), req.body)


register(
    "binary-body-without-header-length",
    "header-length",
    "ext: without the header the body is JSON",
    "refuse",
    "a binary body sent without Inference-Header-Content-Length",
    _no_hl,
)

# -- sizes against shapes and the body ------------------------------------------------
EXT_SIZE = "ext: binary_data_size is the tensor's byte count"
register(
    "binary-size-short-of-shape",
    "sizes",
    EXT_SIZE,
    "refuse",
    "binary_data_size and bytes less than the shape holds",
    _edit(lambda p: p.set_payload(p.payloads[0][:-4])),
)
register(
    "binary-size-beyond-shape",
    "sizes",
    EXT_SIZE,
    "refuse",
    "binary_data_size and bytes more than the shape holds",
    _edit(lambda p: p.set_payload(p.payloads[0] + b"\0\0\0\0")),
)
register(
    "body-shorter-than-sizes",
    "sizes",
    "RFC 9112 §6.3: Content-Length ends the body",
    "refuse",
    "sizes claim 4 bytes more than the body has (the connection stays open)",
    _edit(lambda p: p.set_payload(p.payloads[0][:-4], len(p.payloads[0]))),
)
register(
    "bytes-after-the-last-tensor",
    "sizes",
    EXT_SIZE,
    "refuse",
    "stray bytes after the last tensor (an overlong body)",
    _edit(lambda p: p.payloads.append(b"!!!!")),
)
register(
    "binary-size-negative",
    "sizes",
    EXT_SIZE,
    "refuse",
    "binary_data_size -8",
    _edit(lambda p: p.set_payload(p.payloads[0], -8)),
)
register(
    "binary-size-a-string",
    "sizes",
    EXT_SIZE,
    "refuse",
    'binary_data_size "8" (a string)',
    _edit(lambda p: p.set_payload(p.payloads[0], str(len(p.payloads[0])))),
)


def _zero(plan: Plan) -> Request | str:
    if (
        plan.model.inputs
        and 0 not in plan.model.inputs[0].shape
        and -1 not in plan.model.inputs[0].shape
    ):
        return "the model's input has no variable dimension"
    return Plan.make(plan.model, plan.subject["datatype"], side=0).request()


register(
    "zero-size-tensor",
    "sizes",
    "V2: a dimension may be 0",
    "accept",
    "a tensor with no elements (binary_data_size 0)",
    _zero,
)

# -- oversized claims ------------------------------------------------------------------
OVER = "ext: a size the body cannot hold is the client's error"
register(
    "shape-huge",
    "oversized",
    OVER,
    "refuse",
    "shape [2**40] with 8 bytes",
    _edit(lambda p: p.subject.update(shape=[1 << 40])),
)
register(
    "shape-over-uint64",
    "oversized",
    "V2: dimensions fit an unsigned 64-bit integer",
    "refuse",
    "shape [2**64]",
    _edit(lambda p: p.subject.update(shape=[1 << 64])),
)
register(
    "binary-size-huge",
    "oversized",
    OVER,
    "refuse",
    "binary_data_size 2**62 in a small body",
    _edit(lambda p: p.set_payload(p.payloads[0], 1 << 62)),
)


def _huge_cl(plan: Plan) -> Request:
    req = plan.request()
    return Request(req.path, (*req.headers, ("Content-Length", str(1 << 50))), req.body)


register(
    "content-length-huge",
    "oversized",
    "RFC 9110 §15.5.14: 413 Content Too Large",
    "refuse",
    "Content-Length: 2**50 and a small body (the connection stays open)",
    _huge_cl,
    level="SHOULD",
)

# -- datatypes ------------------------------------------------------------------------


def _datatype_build(datatype: str, binary: bool) -> Builder:
    def build(ctx: Context) -> Request | str:
        model = ctx.pick(datatype)
        if model is None:
            return NO_MODEL if not ctx.models else f"no model takes {datatype}"
        plan = Plan.make(model, datatype, binary=binary)
        if not binary:
            return plan.json_request()
        # Binary both ways: FP16 and BF16 outputs have no JSON form to ask for.
        plan.top["parameters"] = {"binary_data_output": True}
        return plan.request()

    return build


for _dt in DATATYPES:
    CASES.append(
        Case(
            f"datatype-{_dt.lower()}-binary",
            "datatypes",
            # (BF16 is Triton's addition to the protocol's datatypes)
            "Triton: BF16 is a datatype"
            if _dt == "BF16"
            else "ext: every datatype has a binary form",
            "SHOULD" if _dt == "BF16" else "MUST",
            "accept",
            f"{_dt} input and outputs, binary",
            _datatype_build(_dt, True),
        )
    )
    if _dt not in BINARY_ONLY:
        CASES.append(
            Case(
                f"datatype-{_dt.lower()}-json",
                "datatypes",
                "V2: tensor data as JSON",
                "MUST",
                "accept",
                f"{_dt} input, JSON data",
                _datatype_build(_dt, False),
            )
        )
register(
    "datatype-unknown",
    "datatypes",
    "V2: datatypes are the listed ones",
    "refuse",
    'datatype "FP33"',
    _edit(lambda p: p.subject.update(datatype="FP33")),
)
register(
    "datatype-lower-case",
    "datatypes",
    "V2: strings are case-sensitive",
    "refuse",
    'datatype "fp32"',
    _edit(lambda p: p.subject.update(datatype="fp32")),
    datatype="FP32",
)

# -- BYTES framing ----------------------------------------------------------------------
EXT_BYTES = "ext: a BYTES element is a uint32 little-endian length, then its bytes"


def _elements(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(x)) + x for x in items)


def _bytes_payload(data: bytes, count: int = 2) -> Callable[[Plan], None]:
    def change(p: Plan) -> None:
        p.subject["shape"] = [count]
        p.set_payload(data)

    return change


for _id, _summary, _data, _count in (
    (
        "bytes-length-overruns",
        "an element's length runs past the tensor",
        struct.pack("<I", 9) + b"ab" + _elements(b""),
        2,
    ),
    ("bytes-fewer-elements-than-shape", "2 elements for shape [3]", _elements(b"ab", b""), 3),
    ("bytes-more-elements-than-shape", "2 elements for shape [1]", _elements(b"ab", b""), 1),
    ("bytes-truncated-length-prefix", "a length prefix cut short", _elements(b"ab") + b"\0\0\0", 2),
):
    register(
        _id,
        "bytes",
        EXT_BYTES,
        "refuse",
        _summary,
        _edit(_bytes_payload(_data, _count)),
        datatype="BYTES",
    )


def _binary_out(plan: Plan) -> Request:
    plan.top["parameters"] = {"binary_data_output": True}
    return plan.request()


def _all_binary(answer: Any, request: Request) -> str | None:
    outputs = answer.header.tensors
    json_ones = [o.name for o in outputs if o.binary_size is None]
    return f"outputs sent as JSON, binary asked: {json_ones}" if json_ones else None


register(
    "bytes-binary-both-ways",
    "bytes",
    EXT_BYTES,
    "accept",
    "BYTES elements in, binary output asked (its framing is checked)",
    _binary_out,
    datatype="BYTES",
    verify=_all_binary,
)

# -- BOOL bytes ------------------------------------------------------------------------
EXT_BOOL = "ext: BOOL true is the byte 1, false the byte 0"
for _id, _data, _expect in (
    ("bool-bytes-0-and-1", b"\x00\x01", "accept"),
    ("bool-byte-2", b"\x00\x02", "refuse"),
    ("bool-byte-255", b"\xff\x01", "refuse"),
):
    register(
        _id,
        "bool",
        EXT_BOOL,
        _expect,
        f"BOOL bytes {_data.hex(' ')}",
        _edit(_bytes_payload(_data)),
        datatype="BOOL",
    )

# -- raw binary requests -----------------------------------------------------------


def _raw(single: bool) -> Builder:
    def build(ctx: Context) -> Request | str:
        for m in ctx.models:
            if (len(m.inputs) == 1) == single and m.inputs and m.inputs[0].datatype != "BYTES":
                spec = m.inputs[0]
                if spec.shape.count(-1) > 1:
                    continue
                shape = [2 if d < 0 else d for d in spec.shape]
                data = wire(spec.datatype, sample(spec.datatype, shape))
                return Request(f"/v2/models/{m.name}/infer", ((HL, "0"),), data)
        return "no model declares " + ("a single input" if single else "several inputs")

    return build


EXT_RAW = "ext: Inference-Header-Content-Length: 0 is a raw request"
CASES.append(
    Case(
        "raw-single-input",
        "raw",
        EXT_RAW,
        "MUST",
        "accept",
        "a raw body for a model with one input (all outputs come back binary)",
        _raw(True),
        _all_binary,
    )
)
CASES.append(
    Case(
        "raw-several-inputs",
        "raw",
        EXT_RAW,
        "MUST",
        "refuse",
        "a raw body for a model with several inputs",
        _raw(False),
    )
)

# -- content codings -----------------------------------------------------------------
CODING = "RFC 9110 §8.4: Content-Encoding"


def _coded(coding: str, transform: Callable[[bytes], bytes]) -> Callable[[Plan], Request]:
    def build(plan: Plan) -> Request:
        req = plan.request()
        return Request(req.path, (*req.headers, ("Content-Encoding", coding)), transform(req.body))

    return build


register("gzip-request", "coding", CODING, "coding", "a gzip body", _coded("gzip", gzip.compress))
register(
    "deflate-request",
    "coding",
    CODING,
    "coding",
    "a deflate (zlib) body",
    _coded("deflate", zlib.compress),
)
register(
    "gzip-truncated",
    "coding",
    CODING,
    "refuse",
    "a gzip stream cut short",
    _coded("gzip", lambda b: gzip.compress(b)[:-10]),
)
register(
    "gzip-label-plain-body",
    "coding",
    CODING,
    "refuse",
    "Content-Encoding: gzip on a body that is not gzip",
    _coded("gzip", lambda b: b),
)
register(
    "unknown-coding",
    "coding",
    "RFC 9110 §15.5.16: 415 for a coding not supported",
    "refuse",
    "Content-Encoding: br-x (unknown)",
    _coded("br-x", lambda b: b),
    level="SHOULD",
)


def _accepting(coding: str) -> Callable[[Plan], Request]:
    def build(plan: Plan) -> Request:
        plan.top["parameters"] = {"binary_data_output": True}
        return plan.request(extra=[("Accept-Encoding", coding)])

    return build


for _coding in ("gzip", "deflate"):
    register(
        f"{_coding}-response",
        "coding",
        "RFC 9110 §12.5.3: Accept-Encoding",
        "accept",
        f"Accept-Encoding: {_coding} (a coded answer must decode)",
        _accepting(_coding),
    )
register(
    "identity-response",
    "coding",
    "RFC 9110 §12.5.3: Accept-Encoding",
    "accept",
    "Accept-Encoding: identity (the answer must not be coded)",
    _accepting("identity"),
)

# -- output policy -------------------------------------------------------------------
EXT_OUT = "ext: binary_data_output and binary_data choose each output's form"


def _policy(bdo: bool | None, binary_data: bool | None) -> Callable[[Plan], Request]:
    def build(plan: Plan) -> Request:
        if bdo is not None:
            plan.top["parameters"] = {"binary_data_output": bdo}
        if binary_data is not None:
            plan.top["outputs"] = [
                {"name": n, "parameters": {"binary_data": binary_data}} for n in plan.outputs()
            ]
        return plan.request()

    return build


def _all_json(answer: Any, request: Request) -> str | None:
    binary = [
        o.name
        for o in answer.header.tensors
        if o.binary_size is not None and o.datatype not in BINARY_ONLY
    ]
    return f"outputs sent binary, JSON asked: {binary}" if binary else None


register(
    "binary-data-output-true",
    "outputs",
    EXT_OUT,
    "accept",
    "binary_data_output true: every output binary",
    _policy(True, None),
    verify=_all_binary,
    datatype="FP32",
)
register(
    "binary-data-output-false",
    "outputs",
    EXT_OUT,
    "accept",
    "binary_data_output false: every output JSON",
    _policy(False, None),
    verify=_all_json,
    datatype="FP32",
)
register(
    "output-binary-data-true",
    "outputs",
    EXT_OUT,
    "accept",
    "a requested output with binary_data true comes binary",
    _policy(None, True),
    verify=_all_binary,
    datatype="FP32",
)
register(
    "output-binary-data-overrides",
    "outputs",
    EXT_OUT,
    "accept",
    "binary_data false overrides binary_data_output true",
    _policy(True, False),
    verify=_all_json,
    datatype="FP32",
)

# -- truncated bodies --------------------------------------------------------------


def _cut_then_eof(plan: Plan) -> Request:
    req = plan.request()
    headers = (*req.headers, ("Content-Length", str(len(req.body))))
    return Request(req.path, headers, req.body[: len(req.body) // 2], end_input=True)


register(
    "truncated-body-then-eof",
    "truncated",
    "RFC 9112 §8: an incomplete message",
    "refuse-or-close",
    "half the body, then the client ends its side",
    _cut_then_eof,
)

# -- malformed JSON --------------------------------------------------------------------
JSON = "RFC 8259: JSON text"


def _raw_header(change: Callable[[bytes], bytes]) -> Callable[[Plan], Request]:
    def build(plan: Plan) -> Request:
        body, length = plan.body()
        js = change(body[:length])
        return Request(plan.path(), ((HL, str(len(js))),), js + body[length:])

    return build


for _id, _summary, _change, _clause in (
    ("json-truncated", "the JSON header cut short", lambda js: js[:-3], JSON),
    ("json-trailing-text", "text after the JSON object", lambda js: js + b" x", JSON),
    (
        "json-invalid-utf8",
        "a byte 0xFF inside a JSON string",
        lambda js: b'{"id":"\xff",' + js[1:],
        "RFC 8259 §8.1: JSON text is UTF-8",
    ),
    (
        "json-not-an-object",
        "the header is a JSON array",
        lambda js: b"[" + js + b"]",
        "V2: the request is an object",
    ),
    (
        "json-inputs-not-a-list",
        '"inputs" is an object',
        lambda js: b'{"inputs":{"name":"INPUT0"}}',
        "V2: inputs is an array",
    ),
    (
        "json-nested-deep",
        "an id nested 100000 arrays deep",
        lambda js: b'{"id":' + b"[" * 100000 + b"]" * 100000 + b"," + js[1:],
        JSON,
    ),
):
    register(_id, "json", _clause, "refuse", _summary, _raw_header(_change))


def _plain_cut(plan: Plan) -> Request:
    return plan.json_request(plan.header()[:-2])


register(
    "json-body-truncated",
    "json",
    JSON,
    "refuse",
    "a plain JSON body cut short",
    _plain_cut,
    binary=False,
)

# -- HTTP framing --------------------------------------------------------------------
register(
    "chunked-request",
    "http",
    "RFC 9112 §7.1: a recipient MUST parse chunked",
    "accept",
    "the body in chunked transfer coding (3 chunks)",
    lambda p: Request(
        p.request().path, p.request().headers, p.request().body, segments=(5, 40), chunked=True
    ),
)
register(
    "segmented-request",
    "http",
    "RFC 9112 §6: framing is independent of segments",
    "accept",
    "the body written 1, 2, 3... bytes at a time",
    lambda p: Request(
        p.request().path, p.request().headers, p.request().body, segments=tuple(range(1, 40))
    ),
)
register(
    "content-length-not-a-number",
    "http",
    "RFC 9112 §6.3: an invalid Content-Length",
    "status:400",
    "Content-Length: abc",
    lambda p: Request(
        p.request().path, (*p.request().headers, ("Content-Length", "abc")), p.request().body
    ),
)


@case(
    "unknown-model",
    "v2",
    "V2: an error status for an unknown model",
    "refuse",
    "infer on a model that does not exist",
)
def _unknown_model(ctx: Context) -> Request:
    body = b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1],"data":[1]}]}'
    return Request(
        "/v2/models/binproto-check-no-such-model/infer",
        (("Content-Type", "application/json"),),
        body,
    )


@case(
    "server-metadata",
    "v2",
    "V2: GET /v2 lists the extensions",
    "listed",
    "the server metadata lists binary_tensor_data",
    level="SHOULD",
)
def _server_metadata(ctx: Context) -> Request:
    return Request("/v2", method="GET")
