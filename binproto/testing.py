"""Hypothesis strategies for fuzzing servers and clients of the extension.

Generate valid request and response bodies of the binary tensor data
extension, each with the tensors it carries, and mutated bodies that are
certainly invalid, then feed them to your own handler::

    from hypothesis import given
    from binproto.testing import request_bodies, invalid_bodies

    @given(request_bodies())
    def test_my_server(case):
        status, tensors = my_handler(case.body, case.headers())
        assert status == 200 and case.tensors_equal(tensors)

This module needs hypothesis, an optional dependency:
``pip install "binproto[testing]"``. Importing ``binproto`` itself never
imports hypothesis. See docs/testing.md.
"""

from __future__ import annotations

import gzip
import itertools
import json
import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

try:
    import hypothesis.extra.numpy as hnp
    import hypothesis.strategies as st
except ImportError as exc:  # pragma: no cover - exercised only without hypothesis
    raise ImportError("binproto.testing needs hypothesis: pip install 'binproto[testing]'") from exc

from ._datatypes import DATATYPES
from ._header import Kind
from ._http import HEADER_LENGTH_NAME
from ._limits import Limits
from ._parser import Parser
from ._raw import TensorSpec

__all__ = [
    "ALL_DATATYPES",
    "Body",
    "chunkings",
    "invalid_bodies",
    "invalid_model_requests",
    "model_inputs",
    "model_requests",
    "request_bodies",
    "response_bodies",
    "tensors",
]

#: Every datatype of the extension.
ALL_DATATYPES: tuple[str, ...] = tuple(DATATYPES)
# FP16 and BF16 have no JSON form: they are always sent binary.
_BINARY_ONLY = frozenset({"FP16", "BF16"})
_FLOAT_WIDTHS: dict[int, Literal[16, 32, 64]] = {2: 16, 4: 32, 8: 64}


@dataclass(frozen=True)
class Body:
    """A generated body and what it stands for.

    Attributes:
        kind: ``"request"`` or ``"response"``.
        body: the bytes on the wire (compressed when ``content_encoding`` is set).
        header_length: the Inference-Header-Content-Length to send, or None
            for a plain JSON body.
        content_encoding: ``"gzip"``, ``"deflate"`` or None.
        tensors: the tensors the body carries, by name (empty for an invalid body).
        header: the JSON header object.
        binary: the binary tensor bytes after the JSON header, uncompressed.
        valid: False for a mutated body that a correct peer must reject.
        mutation: how an invalid body was made from a valid one.
    """

    kind: Kind
    body: bytes
    header_length: int | None
    content_encoding: str | None
    tensors: Mapping[str, np.ndarray[Any, Any]] = field(repr=False)
    header: dict[str, Any] = field(repr=False)
    binary: bytes = field(default=b"", repr=False)
    valid: bool = True
    mutation: str | None = None

    def headers(self) -> list[tuple[str, str]]:
        """The HTTP headers that go with the body."""
        out = []
        if self.header_length is not None:
            out.append((HEADER_LENGTH_NAME, str(self.header_length)))
        out.append(("Content-Length", str(len(self.body))))
        if self.content_encoding is not None:
            out.append(("Content-Encoding", self.content_encoding))
        binary = self.header_length is not None
        out.append(("Content-Type", "application/octet-stream" if binary else "application/json"))
        return out

    def parser(self, *, limits: Limits | None = None, content_length: bool = True) -> Parser:
        """A :class:`~binproto.Parser` configured for this body."""
        return Parser(
            self.kind,
            header_length=self.header_length,
            content_length=len(self.body) if content_length else None,
            content_encoding=self.content_encoding,
            limits=limits,
        )

    def tensors_equal(self, actual: Mapping[str, np.ndarray[Any, Any]]) -> bool:
        """True when ``actual`` holds exactly this body's tensors: same names,
        shapes, dtypes and values (NaN equal to NaN; BF16 compared bit for bit)."""
        if set(actual) != set(self.tensors):
            return False
        return all(_same_array(self.tensors[k], np.asarray(actual[k])) for k in self.tensors)


def _same_array(want: np.ndarray[Any, Any], got: np.ndarray[Any, Any]) -> bool:
    if want.shape != got.shape or want.dtype != got.dtype:
        return False
    if want.dtype == object:
        return [bytes(x) for x in want.ravel()] == [bytes(x) for x in got.ravel()]
    if want.dtype.kind == "f":
        return bool(np.array_equal(want, got, equal_nan=True))
    if want.dtype.kind in "biu":
        return bool(np.array_equal(want, got))
    return want.tobytes() == got.tobytes()  # BF16 and other extension types


def _names(max_size: int) -> st.SearchStrategy[list[str]]:
    return st.lists(st.text(min_size=1, max_size=8), max_size=max_size, unique=True)


@st.composite
def tensors(
    draw: st.DrawFn,
    datatypes: Sequence[str] = ALL_DATATYPES,
    *,
    max_dims: int = 3,
    max_side: int = 4,
    allow_nan: bool = True,
) -> tuple[str, np.ndarray[Any, Any]]:
    """A ``(datatype, array)`` pair: an array of that datatype's dtype.

    Shapes have up to ``max_dims`` dimensions of 0 to ``max_side``; BYTES
    arrays hold ``bytes`` of any content.
    """
    datatype = draw(st.sampled_from(list(datatypes)))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=max_dims, min_side=0, max_side=max_side))
    return datatype, draw(_arrays(datatype, shape, allow_nan))


@st.composite
def _arrays(
    draw: st.DrawFn, datatype: str, shape: tuple[int, ...], allow_nan: bool, utf8: bool = False
) -> np.ndarray[Any, Any]:
    """An array of ``datatype`` and ``shape`` (BYTES elements UTF-8 with ``utf8``)."""
    dt = DATATYPES[datatype]
    if datatype == "BYTES":
        element = st.text(max_size=6).map(str.encode) if utf8 else st.binary(max_size=12)
        items = draw(
            st.lists(
                element,
                min_size=int(np.prod(shape, dtype=np.int64)),
                max_size=int(np.prod(shape, dtype=np.int64)),
            )
        )
        arr = np.empty(len(items), dtype=object)
        arr[:] = items
        return arr.reshape(shape)
    if datatype == "BF16" or dt.dtype.kind not in "biuf":
        bits = draw(hnp.arrays(np.dtype("<u2"), shape))
        return bits.view(dt.dtype)
    elements = None
    if dt.dtype.kind == "f":
        elements = st.floats(
            allow_nan=allow_nan, allow_infinity=allow_nan, width=_FLOAT_WIDTHS[dt.dtype.itemsize]
        )
    return draw(hnp.arrays(dt.dtype, shape, elements=elements))


def _wire_bytes(datatype: str, arr: np.ndarray[Any, Any]) -> bytes:
    """The binary form of a tensor."""
    if datatype == "BYTES":
        return b"".join(len(x).to_bytes(4, "little") + bytes(x) for x in arr.ravel())
    return np.ascontiguousarray(arr).tobytes()


def _json_data(datatype: str, arr: np.ndarray[Any, Any], nested: bool) -> Any:
    """The JSON ``data`` of a tensor (BYTES elements must be UTF-8)."""
    if datatype == "BYTES":
        flat: list[Any] = [bytes(x).decode("utf-8") for x in arr.ravel()]
    else:
        flat = arr.ravel().tolist()
    if not nested or arr.ndim < 2 or arr.size == 0:
        return flat
    return np.array(flat, dtype=object).reshape(arr.shape).tolist()


def _compress(data: bytes, encoding: str | None) -> bytes:
    if encoding == "gzip":
        return gzip.compress(data, compresslevel=1)
    if encoding == "deflate":
        return zlib.compress(data, 1)
    return data


def _assemble(
    kind: Kind,
    header: dict[str, Any],
    binary: bytes,
    any_binary: bool,
    plain_json: bool,
    encoding: str | None,
    expected: Mapping[str, np.ndarray[Any, Any]],
) -> Body:
    js = json.dumps(header).encode()
    header_length = None if plain_json and not any_binary else len(js)
    return Body(
        kind=kind,
        body=_compress(js + binary, encoding),
        header_length=header_length,
        content_encoding=encoding,
        tensors=dict(expected),
        header=header,
        binary=binary,
    )


@st.composite
def _bodies(
    draw: st.DrawFn,
    kind: Kind,
    datatypes: Sequence[str],
    max_tensors: int,
    encodings: Sequence[str | None],
    allow_nan: bool,
) -> Body:
    role = "inputs" if kind == "request" else "outputs"
    names = draw(_names(max_tensors))
    entries: list[dict[str, Any]] = []
    expected: dict[str, np.ndarray[Any, Any]] = {}
    binary = bytearray()
    any_binary = False
    for name in names:
        datatype, arr = draw(tensors(datatypes, allow_nan=allow_nan))
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(arr.shape)}
        json_ok = datatype not in _BINARY_ONLY and (
            datatype != "BYTES" or all(_is_utf8(x) for x in arr.ravel())
        )
        if not json_ok or draw(st.booleans()):
            data = _wire_bytes(datatype, arr)
            entry["parameters"] = {"binary_data_size": len(data)}
            binary += data
            any_binary = True
        else:
            entry["data"] = _json_data(datatype, arr, draw(st.booleans()))
        entries.append(entry)
        expected[name] = arr
    header: dict[str, Any] = {role: entries}
    if kind == "request":
        if draw(st.booleans()):
            header["id"] = draw(st.text(max_size=6))
        if draw(st.booleans()):
            header["parameters"] = {"binary_data_output": draw(st.booleans())}
        outputs = draw(_names(3))
        if outputs:
            header["outputs"] = [
                {"name": o, "parameters": {"binary_data": draw(st.booleans())}} for o in outputs
            ]
    else:
        header["model_name"] = draw(st.text(min_size=1, max_size=6))
        if draw(st.booleans()):
            header["model_version"] = "1"
    encoding = draw(st.sampled_from(list(encodings)))
    plain_json = draw(st.booleans())
    return _assemble(kind, header, bytes(binary), any_binary, plain_json, encoding, expected)


def _is_utf8(value: bytes) -> bool:
    try:
        bytes(value).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def request_bodies(
    *,
    datatypes: Sequence[str] = ALL_DATATYPES,
    max_tensors: int = 4,
    encodings: Sequence[str | None] = (None,),
    allow_nan: bool = True,
) -> st.SearchStrategy[Body]:
    """Valid inference request bodies (:class:`Body`) with their input tensors.

    Each input is sent binary or as JSON ``data`` (flat or nested) at random;
    FP16 and BF16 always binary. ``encodings`` lists the content encodings to
    pick from (``None``, ``"gzip"``, ``"deflate"``). A body with no binary
    tensor may be a plain JSON body (``header_length`` None).
    """
    return _bodies("request", datatypes, max_tensors, encodings, allow_nan)


def response_bodies(
    *,
    datatypes: Sequence[str] = ALL_DATATYPES,
    max_tensors: int = 4,
    encodings: Sequence[str | None] = (None,),
    allow_nan: bool = True,
) -> st.SearchStrategy[Body]:
    """Valid inference response bodies with their output tensors; see
    :func:`request_bodies`."""
    return _bodies("response", datatypes, max_tensors, encodings, allow_nan)


_MUTATIONS = ("truncate", "append", "header_length", "utf8", "datatype", "shape")


@st.composite
def invalid_bodies(draw: st.DrawFn, bodies: st.SearchStrategy[Body] | None = None) -> Body:
    """Bodies a correct peer must reject: a valid body, mutated.

    Each mutation makes the body certainly invalid: cut short, followed by
    stray bytes, a wrong Inference-Header-Content-Length, invalid UTF-8 in the
    JSON, an unknown datatype, or a negative dimension. ``mutation`` on the
    result says which.
    """
    base = draw(bodies if bodies is not None else st.one_of(request_bodies(), response_bodies()))
    kinds = list(_MUTATIONS)
    role = "inputs" if base.kind == "request" else "outputs"
    if not base.header[role]:
        kinds = [k for k in kinds if k not in ("datatype", "shape")]
    if base.header_length is None:
        kinds.remove("header_length")
    how = draw(st.sampled_from(kinds))
    if how == "truncate":
        cut = draw(st.integers(0, len(base.body) - 1))
        return _invalid(base, how, body=base.body[:cut])
    if how == "append":
        junk = b"\xff" + draw(st.binary(max_size=8))
        return _invalid(base, how, body=base.body + junk)
    if how == "header_length":
        assert base.header_length is not None
        delta = draw(st.integers(1, 64))
        if draw(st.booleans()) and base.header_length > delta:  # (0 is a raw request)
            delta = -delta
        return _invalid(base, how, header_length=base.header_length + delta)
    js = json.dumps(base.header).encode()
    if how == "utf8":
        at = draw(st.integers(0, len(js) - 1))
        js = js[:at] + b"\xff" + js[at + 1 :]
    else:
        header = json.loads(js)
        entry = header[role][draw(st.integers(0, len(header[role]) - 1))]
        if how == "datatype":
            entry["datatype"] = draw(st.sampled_from(["FP33", "fp32", "", "STRING"]))
        else:
            entry["shape"] = [*entry["shape"], -draw(st.integers(1, 3))]
        js = json.dumps(header).encode()
    hl = None if base.header_length is None else len(js)
    body = _compress(js + base.binary, base.content_encoding)
    return _invalid(base, how, body=body, header_length=hl)


def _invalid(base: Body, how: str, **changes: Any) -> Body:
    return replace(base, valid=False, mutation=how, tensors={}, **changes)


def chunkings(body: bytes, *, max_cuts: int = 8) -> st.SearchStrategy[list[bytes]]:
    """Ways to cut ``body`` into chunks (lists of non-empty ``bytes``)."""

    def cut(points: list[int]) -> list[bytes]:
        edges = [0, *sorted({p for p in points if 0 < p < len(body)}), len(body)]
        return [body[a:b] for a, b in itertools.pairwise(edges) if b > a]

    return st.lists(st.integers(0, max(len(body), 1)), max_size=max_cuts).map(cut)


# -- strategies for one model ------------------------------------------------------------


def model_inputs(model: Any) -> list[TensorSpec]:
    """A model's inputs as :class:`~binproto.TensorSpec` objects.

    ``model`` is the model metadata (``GET /v2/models/{m}``) as a dict or as
    JSON text, or a sequence of ``TensorSpec`` or of ``{"name", "datatype",
    "shape"}`` dicts. A ``-1`` dimension is variable.
    """
    if isinstance(model, (str, bytes)):
        model = json.loads(model)
    if isinstance(model, Mapping):
        model = model.get("inputs") or []
    specs = []
    for item in model:
        if isinstance(item, TensorSpec):
            specs.append(item)
        else:
            specs.append(TensorSpec(item["name"], item["datatype"], item["shape"]))
    return specs


@st.composite
def model_requests(
    draw: st.DrawFn,
    inputs: Any,
    *,
    encodings: Sequence[str | None] = (None,),
    max_side: int = 4,
    binary: bool | None = None,
    allow_nan: bool = True,
    binary_output: bool | None = None,
) -> Body:
    """Valid requests for one model: each input of ``inputs`` with its datatype
    and a shape that fits its own (a ``-1`` dimension drawn from 0 to
    ``max_side``).

    ``inputs`` is anything :func:`model_inputs` takes. ``binary`` sends every
    input binary (True), as JSON where it can (False), or each at random
    (None); FP16 and BF16 always go binary. NaN and infinities appear only in
    binary tensors (JSON has no token for them). ``binary_output`` sets the
    request's ``binary_data_output`` parameter (None: absent or random). The
    result's ``tensors`` are the inputs, by name.
    """
    specs = model_inputs(inputs)
    entries: list[dict[str, Any]] = []
    expected: dict[str, np.ndarray[Any, Any]] = {}
    payload = bytearray()
    for spec in specs:
        shape = tuple(d if d >= 0 else draw(st.integers(0, max_side)) for d in spec.shape)
        as_binary = spec.datatype in _BINARY_ONLY or (
            draw(st.booleans()) if binary is None else binary
        )
        arr = draw(_arrays(spec.datatype, shape, allow_nan and as_binary, utf8=not as_binary))
        entry: dict[str, Any] = {"name": spec.name, "datatype": spec.datatype, "shape": list(shape)}
        if as_binary:
            data = _wire_bytes(spec.datatype, arr)
            entry["parameters"] = {"binary_data_size": len(data)}
            payload += data
        else:
            entry["data"] = _json_data(spec.datatype, arr, draw(st.booleans()))
        entries.append(entry)
        expected[spec.name] = arr
    header: dict[str, Any] = {"inputs": entries}
    if draw(st.booleans()):
        header["id"] = draw(st.text(max_size=6))
    if binary_output is None and draw(st.booleans()):
        header["parameters"] = {"binary_data_output": draw(st.booleans())}
    elif binary_output is not None:
        header["parameters"] = {"binary_data_output": binary_output}
    encoding = draw(st.sampled_from(list(encodings)))
    plain_json = draw(st.booleans())
    return _assemble(
        "request", header, bytes(payload), bool(payload), plain_json, encoding, expected
    )


#: The mutations of :func:`invalid_model_requests`.
MODEL_MUTATIONS = (
    "truncate",
    "append",
    "header_length",
    "binary_size",
    "shape",
    "negative_dim",
    "datatype",
    "bool_byte",
    "bytes_prefix",
)


@st.composite
def invalid_model_requests(
    draw: st.DrawFn,
    inputs: Any,
    *,
    encodings: Sequence[str | None] = (None,),
    mutations: Sequence[str] = MODEL_MUTATIONS,
) -> Body:
    """Requests for one model that a correct server must refuse (4xx): a
    request of :func:`model_requests`, mutated.

    Each mutation makes the body certainly invalid: cut short, stray bytes
    after it, a wrong Inference-Header-Content-Length or ``binary_data_size``,
    a shape whose element count is not the data's, a negative dimension, an
    unknown datatype, a BOOL byte other than 0 or 1, or a BYTES length prefix
    that runs past its tensor. Compressed bodies are mutated before they are
    compressed. ``mutation`` on the result says which; a mutation that does
    not fit the drawn request (no binary tensor to resize) falls back to
    cutting the body short.
    """
    base: Body = draw(model_requests(inputs, encodings=encodings))
    how = draw(st.sampled_from(list(mutations)))
    header = json.loads(json.dumps(base.header))
    binary = bytearray(base.binary)
    header_length = base.header_length
    binaries = _binary_entries(header)
    changed = True
    if how == "truncate" or not header["inputs"]:
        how, changed = "truncate", False
    elif how == "append":
        binary += b"\xff" + draw(st.binary(max_size=8))
    elif how == "header_length" and header_length is not None:
        js_len = len(json.dumps(header).encode())
        delta = draw(st.integers(1, 64))
        if draw(st.booleans()) and js_len > delta:
            delta = -delta  # (never 0: that is a raw request)
        return _finish(base, how, header, binary, js_len + delta)
    elif how == "binary_size" and binaries:
        entry, _ = draw(st.sampled_from(binaries))
        size = entry["parameters"]["binary_data_size"]
        delta = draw(st.integers(1, 8))
        entry["parameters"]["binary_data_size"] = size - delta if size >= delta else size + delta
    elif how == "shape":
        entry = draw(st.sampled_from(header["inputs"]))
        entry["shape"] = [math.prod(entry["shape"]) + 1]
        if "data" in entry:
            entry["data"] = _flat(entry["data"])
    elif how == "negative_dim":
        entry = draw(st.sampled_from(header["inputs"]))
        entry["shape"] = [*entry["shape"], -draw(st.integers(1, 3))]
    elif how == "datatype":
        entry = draw(st.sampled_from(header["inputs"]))
        entry["datatype"] = draw(st.sampled_from(["FP33", "fp32", "", "STRING"]))
    elif how == "bool_byte" and (spots := _spans(binaries, "BOOL")):
        start, size = draw(st.sampled_from(spots))
        binary[start + draw(st.integers(0, size - 1))] = draw(st.integers(2, 255))
    elif how == "bytes_prefix" and (spots := _spans(binaries, "BYTES")):
        start, size = draw(st.sampled_from(spots))
        last = _last_prefix(bytes(binary[start : start + size]))
        at = start + last
        length = int.from_bytes(binary[at : at + 4], "little")
        # The last element ends where its tensor ends: a longer one runs past it.
        binary[at : at + 4] = (length + draw(st.integers(1, 1000))).to_bytes(4, "little")
    else:
        how, changed = "truncate", False
    if not changed:  # cut the body short, after compression
        cut = draw(st.integers(0, len(base.body) - 1)) if base.body else 0
        return _invalid(base, how, body=base.body[:cut])
    js_len = len(json.dumps(header).encode())
    return _finish(base, how, header, binary, None if header_length is None else js_len)


def _binary_entries(header: dict[str, Any]) -> list[tuple[dict[str, Any], int]]:
    """The inputs sent binary, each with the offset of its bytes."""
    out, offset = [], 0
    for entry in header["inputs"]:
        size = (entry.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            out.append((entry, offset))
            offset += size
    return out


def _spans(entries: list[tuple[dict[str, Any], int]], datatype: str) -> list[tuple[int, int]]:
    """(offset, size) of the non-empty binary tensors of ``datatype``."""
    return [
        (offset, e["parameters"]["binary_data_size"])
        for e, offset in entries
        if e["datatype"] == datatype and e["parameters"]["binary_data_size"] > 0
    ]


def _last_prefix(data: bytes) -> int:
    """The offset of the last element's length prefix in a BYTES tensor."""
    at = last = 0
    while at < len(data):
        last = at
        at += 4 + int.from_bytes(data[at : at + 4], "little")
    return last


def _flat(data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    return [x for item in data for x in _flat(item)]


def _finish(
    base: Body, how: str, header: dict[str, Any], binary: bytearray, header_length: int | None
) -> Body:
    js = json.dumps(header).encode()
    body = _compress(js + bytes(binary), base.content_encoding)
    return replace(
        base,
        body=body,
        header_length=header_length,
        header=header,
        binary=bytes(binary),
        valid=False,
        mutation=how,
        tensors={},
    )
