"""The encoder, the parser's mirror: requests and responses as buffer lists.

Theory of operation
-------------------
Encoding a body is two steps. First every tensor is *prepared*: its datatype
is settled (from the numpy dtype, from a Python list's values, or from an
explicit :class:`Tensor` override) and its data put into wire form:

* a fixed-size tensor becomes a C-contiguous little-endian array — the
  caller's own array whenever it already is one, else one copy;
* a BYTES tensor becomes a list of ``bytes`` elements;
* a Python list is validated by the same code the parser uses for JSON data.

Then each tensor is placed either as JSON ``data`` in the header or as binary
data after it, by the policy the caller chose (or, for a response, the one the
request asked for). A binary fixed-size tensor contributes a ``memoryview`` of
its array to :attr:`EncodedBody.buffers`: nothing is copied, so encoding a
gigabyte costs what encoding a byte does. BYTES tensors are joined into one new
buffer by ``join_plain`` (:func:`join_bytes` without its checks: the
encoder has made every element ``bytes``; no per-element Python loop).

Only the JSON header is built in memory; callers send ``body.buffers`` with
``writelines`` / ``sendmsg``, or ``bytes(body)`` for small bodies.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import _json
from ._bytes import join_plain
from ._datatypes import DATATYPES, DataType, datatype_for_dtype
from ._errors import LocalProtocolError, RemoteProtocolError
from ._header import MAX_DIMS, PARAMETER_TYPES, InferenceHeader, RequestedOutput
from ._http import message_headers, raw_message_headers
from ._json import _bf16_bits, json_data_to_array
from ._limits import Limits
from ._util import as_byte_view, check_bool

__all__ = [
    "Binary",
    "EncodedBody",
    "Tensor",
    "check_parameters",
    "dumps_header",
    "encode_request",
    "encode_response",
    "json_output_elements",
]

#: Which tensors travel binary: all (True), none (False), or those named.
Binary = bool | Collection[str]

# Datatypes with no JSON form any peer accepts: always sent binary.
_ALWAYS_BINARY = frozenset({"FP16", "BF16"})
_RESERVED = "binary_data_size"
# A tensor travels one way only: a header naming a region beside data or
# binary_data_size is one the decoder refuses.
_SHARED_MEMORY = "shared_memory_region"


@dataclass(frozen=True, slots=True)
class Tensor:
    """A named tensor to encode, with an optional explicit datatype.

    ``array`` is a numpy array, a sequence of ``bytes``/``str`` (BYTES), or a
    (nested) Python list of numbers or booleans (JSON data). ``datatype``
    overrides the datatype the data implies:

    * ``"BF16"`` accepts ``ml_dtypes.bfloat16`` arrays and 2-byte integer
      arrays holding the raw bfloat16 bits (sent as they are, no copy), and
      lists of numbers (rounded to FP32, then to BF16, to nearest even);
    * any other datatype accepts arrays whose dtype numpy casts to it safely
      (e.g. ``int32`` data as ``"INT64"``: one copy), and lists whose values
      fit it.

    ``parameters`` are extra tensor parameters for the JSON header
    (``binary_data_size`` is set by the encoder and may not be given, nor
    ``shared_memory_region``: a tensor sent in the body is not in shared
    memory).
    """

    name: str
    array: Any
    datatype: str | None = None
    parameters: Mapping[str, Any] | None = None


@dataclass(slots=True)
class EncodedBody:
    """An encoded request or response body.

    Attributes:
        json: the JSON header, UTF-8 bytes.
        buffers: ``[json, tensor buffer, ...]``: the header then one buffer per
            binary tensor, in header order. Fixed-size tensors are
            ``memoryview``\\ s of the caller's arrays (not copies: changing an
            array before the body is sent changes the body).
        header_length: the Inference-Header-Content-Length, ``len(json)``; None
            when no tensor is binary (the body is plain JSON).
        content_length: total body length in bytes.

    ``bytes(body)`` joins the buffers (a copy: for small bodies and tests);
    iterating a body yields its buffers, so ``writer.writelines(body)`` works.
    Read its fields, do not change them: the lengths describe the buffers
    (a plain record, not a frozen one, as one is made for every message).
    """

    json: bytes
    buffers: list[bytes | memoryview] = field(repr=False)
    header_length: int | None
    content_length: int

    @property
    def headers(self) -> list[tuple[str, str]]:
        """The HTTP headers framing the body, as ``(name, value)`` pairs
        (:func:`message_headers`): Inference-Header-Content-Length (only when
        a tensor is binary), Content-Length, and Content-Type. A new list each
        time, made when asked for."""
        return message_headers(self.header_length, self.content_length)

    @property
    def raw_headers(self) -> list[tuple[bytes, bytes]]:
        """:attr:`headers` as ASGI servers and h11 take them
        (:func:`raw_message_headers`): lower-cased names, values as bytes."""
        return raw_message_headers(self.header_length, self.content_length)

    def __bytes__(self) -> bytes:
        return b"".join(self.buffers)

    def __iter__(self) -> Iterator[bytes | memoryview]:
        return iter(self.buffers)


# -- preparing tensors -----------------------------------------------------------


@dataclass(slots=True)
class _Prepared:
    """A tensor in wire form, before it is placed in JSON or in the body."""

    name: str
    datatype: str
    shape: list[int]
    parameters: dict[str, Any]
    array: np.ndarray[Any, Any] | None = None  # fixed-size: contiguous, little-endian
    elements: list[bytes] | None = None  # BYTES
    json_data: list[Any] | None = None  # a Python list as given, flattened
    from_list: bool = False  # given as a Python list of numbers (JSON data)


def _fail(msg: str) -> LocalProtocolError:
    return LocalProtocolError(msg)


def check_parameters(params: Any, where: str) -> dict[str, Any]:
    """Parameters as the protocol allows them: string keys; string, number or
    bool values; numbers finite (strict JSON)."""
    if params is None:
        return {}
    if not isinstance(params, Mapping):
        raise _fail(f"parameters of {where} must be a mapping, got {type(params).__name__}")
    checked = dict(params)  # what is checked is what is sent
    for key, value in checked.items():
        if not isinstance(key, str):
            raise _fail(f"parameter names of {where} must be strings, got {key!r}")
        if type(value) not in PARAMETER_TYPES:
            raise _fail(
                f"parameter '{key}' of {where} must be a string, number or bool,"
                f" got {type(value).__name__}"
            )
        if type(value) is float and not math.isfinite(value):
            raise _fail(f"parameter '{key}' of {where} is {value}, which JSON cannot carry")
    return checked


def _nested(data: Sequence[Any], label: str) -> tuple[list[int], list[Any]]:
    """Shape and row-major leaves of a rectangular nest of lists/tuples."""
    shape: list[int] = []
    level: list[Any] = list(data)
    probe: Any = data
    while isinstance(probe, (list, tuple)):
        shape.append(len(probe))
        if len(shape) > MAX_DIMS:
            raise _fail(
                f"{label} is nested more than {MAX_DIMS} deep: a tensor has at most"
                f" {MAX_DIMS} dimensions"
            )
        if not probe:
            break
        probe = probe[0]
    for depth, dim in enumerate(shape[1:], start=1):
        if not all(isinstance(x, (list, tuple)) and len(x) == dim for x in level):
            raise _fail(f"{label} is not rectangular: expected shape {shape} at depth {depth}")
        level = [y for x in level for y in x]
    if any(isinstance(x, (list, tuple)) for x in level):
        raise _fail(f"{label} is not rectangular: expected shape {shape}")
    return shape, level


def _list_datatype(leaves: list[Any], label: str) -> str:
    """The datatype a list's values imply (as numpy would pick it)."""
    kinds = set(map(type, leaves))
    if not kinds or kinds <= {float, int}:
        return "FP64" if float in kinds or not kinds else "INT64"
    if kinds == {bool}:
        return "BOOL"
    if all(issubclass(k, (bytes, str)) for k in kinds):
        return "BYTES"
    names = sorted(k.__name__ for k in kinds)
    raise _fail(
        f"{label}: cannot infer a datatype from values of types {names}; pass a numpy"
        " array or a binproto.Tensor with a datatype"
    )


def _to_bytes(x: Any, label: str) -> bytes:
    if isinstance(x, bytes):
        return x
    if isinstance(x, str):
        try:
            return x.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise _fail(
                f"{label}: a string element is not encodable as UTF-8 ({exc.reason})"
            ) from None
    if isinstance(x, (bytearray, memoryview)):
        return bytes(x)
    raise _fail(f"{label}: BYTES elements must be bytes or str, got {type(x).__name__}")


def _bytes_elements(items: list[Any], label: str) -> list[bytes]:
    if set(map(type, items)) <= {bytes}:
        return items  # the common case: nothing to convert
    return [_to_bytes(x, label) for x in items]


def _datatype(name: str, label: str) -> DataType:
    dt = DATATYPES.get(name) if isinstance(name, str) else None
    if dt is None:
        raise _fail(f"{label}: unknown datatype {name!r}")
    return dt


def _wire_array(
    arr: np.ndarray[Any, Any], dt: DataType, natural: DataType | None, label: str
) -> np.ndarray[Any, Any]:
    """``arr`` as a C-contiguous little-endian array of ``dt``'s element size;
    the same array when it already is one. ``natural`` is the datatype of
    ``arr``'s dtype."""
    src = arr.dtype
    target = dt.dtype
    if dt.name == "BF16" and (natural is None or natural.name != "BF16"):
        if src.kind == "f":
            # Rounded to FP32, then to nearest even, as a list of numbers is.
            bits: np.ndarray[Any, Any] = _bf16_bits(arr).reshape(arr.shape)
            return bits
        if src.kind not in "ui" or src.itemsize != 2:
            raise _fail(
                f"{label}: BF16 data must be a float array (rounded to BF16), an"
                " ml_dtypes.bfloat16 array, or a 2-byte integer array of raw bfloat16"
                f" bits, got dtype {src}"
            )
        target = src.newbyteorder("<")  # raw bits: keep the integer dtype
    elif natural is None or natural.name != dt.name:
        if not np.can_cast(src, target, "safe"):
            raise _fail(
                f"{label}: cannot send dtype {src} as {dt.name} without losing"
                " information; convert it with astype() first"
            )
    if src == target and arr.flags.c_contiguous:
        return arr
    # The one copy: a byte swap, a gather of strided data, or a safe cast.
    return arr.astype(target, order="C")


def _prepare(name: str, value: Any, datatype: str | None, params: Any, role: str) -> _Prepared:
    label = f"{role} '{name}'"
    parameters = check_parameters(params, label)
    if _RESERVED in parameters:
        raise _fail(f"{label}: '{_RESERVED}' is set by the encoder, not by the caller")
    if _SHARED_MEMORY in parameters:
        raise _fail(
            f"{label}: '{_SHARED_MEMORY}' is for a tensor in shared memory, not one sent"
            " with its data"
        )
    prep = _Prepared(name, "", [], parameters)

    # (an array, the common case, is not looked for among the scalar types)
    if type(value) is not np.ndarray and isinstance(value, (bool, int, float, str, bytes)):
        # A Python scalar is a 0-d tensor of the type numpy gives it (BOOL,
        # INT64, FP64, BYTES), as a numpy scalar would be.
        if isinstance(value, int) and not -(2**63) <= value < 2**63:
            raise _fail(f"{label}: {value!r} does not fit in INT64")
        if isinstance(value, (str, bytes)):
            if isinstance(datatype, str) and datatype in DATATYPES and datatype != "BYTES":
                raise _fail(f"{label}: cannot send a {type(value).__name__} as {datatype}")
            # (np.asarray would make it a fixed-width string: trailing NULs lost)
            scalar = np.empty((), dtype=object)
            scalar[()] = value
            value = scalar
        else:
            value = np.asarray(value)
    if isinstance(value, (np.ndarray, np.generic)):
        # (a plain array first: np.ma is looked up through numpy's module __getattr__)
        if type(value) is not np.ndarray and isinstance(value, np.ma.MaskedArray):
            raise _fail(
                f"{label}: a masked array has no V2 form (its mask would be dropped):"
                " fill it first (.filled())"
            )
        arr = value if type(value) is np.ndarray else np.asarray(value)
        natural = datatype_for_dtype(arr.dtype)
        dt = _datatype(datatype, label) if datatype is not None else natural
        if dt is None:
            raise _fail(f"{label}: numpy dtype {arr.dtype} has no V2 datatype")
        prep.datatype = dt.name
        prep.shape = list(arr.shape)
        if dt.name == "BYTES":
            if arr.dtype.kind not in "OSU":
                raise _fail(f"{label}: cannot send dtype {arr.dtype} as BYTES")
            prep.elements = _bytes_elements(arr.ravel().tolist(), label)
        else:
            if arr.dtype.kind in "OSU":
                raise _fail(f"{label}: cannot send dtype {arr.dtype} as {dt.name}")
            prep.array = _wire_array(arr, dt, natural, label)
            if dt.name == "BOOL":
                _check_bools(prep.array, label)
        return prep

    if isinstance(value, (list, tuple)):
        shape, leaves = _nested(value, label)
        implied = _list_datatype(leaves, label)
        dt = _datatype(datatype, label) if datatype is not None else DATATYPES[implied]
        prep.datatype = dt.name
        prep.shape = shape
        if dt.name == "BYTES":
            if leaves and implied != "BYTES":
                raise _fail(f"{label}: BYTES data must be a sequence of bytes/str")
            prep.elements = _bytes_elements(leaves, label)
            return prep
        if implied == "BYTES":
            raise _fail(f"{label}: a sequence of bytes/str can only be sent as BYTES")
        try:
            prep.array = json_data_to_array(leaves, dt, tuple(shape), label, len(leaves))
        except RemoteProtocolError as exc:
            raise _fail(exc.msg) from None
        prep.json_data = leaves
        prep.from_list = True
        return prep

    found = _foreign_array(value, datatype, label)
    if found is None:
        raise _fail(
            f"{label}: expected a numpy array, a buffer, an object with __dlpack__ or"
            " __array__, a sequence of bytes/str, a list or a binproto.Tensor, got"
            f" {type(value).__name__}"
        )
    foreign, foreign_datatype = found
    return _prepare(name, foreign, datatype or foreign_datatype, params, role)


_BYTE_FORMATS = frozenset({"B", "b", "c"})


def _foreign_array(
    value: Any, datatype: str | None, label: str
) -> tuple[np.ndarray[Any, Any], str | None] | None:
    """An array over the memory of ``value`` (no copy) and the datatype it
    implies beyond its dtype (BF16 bits), or None when ``value`` is none of:
    a DLPack producer (torch, jax, cupy on the CPU), a buffer (bytearray,
    memoryview, array.array), an object with ``__array__``."""
    if hasattr(value, "__dlpack__"):
        return _from_dlpack(value, label)
    try:
        view = memoryview(value)
    except TypeError:
        view = None
    if view is not None:
        if view.format in _BYTE_FORMATS and datatype is not None and datatype != "BYTES":
            # Raw bytes read as the datatype given (its element size must divide them).
            dt = _datatype(datatype, label)
            dtype = np.dtype(np.uint16) if dt.name == "BF16" else dt.dtype
            raw = np.asarray(view).reshape(-1)
            if len(raw) % dtype.itemsize:
                raise _fail(
                    f"{label}: {len(raw)} bytes are not a whole number of {dt.name} elements"
                )
            return np.ascontiguousarray(raw).view(dtype), None
        try:
            return np.asarray(view), None
        except (ValueError, TypeError) as exc:
            raise _fail(f"{label}: numpy cannot read this buffer ({exc})") from None
    if hasattr(value, "__array__"):
        arr = np.asarray(value)
        return (arr, None) if isinstance(arr, np.ndarray) else None
    return None


def _from_dlpack(value: Any, label: str) -> tuple[np.ndarray[Any, Any], str | None]:
    """``value``'s memory as an array through DLPack; a torch bfloat16
    tensor (no numpy dtype) by its bits, as BF16."""
    try:
        return np.from_dlpack(value), None
    except (AttributeError, BufferError, TypeError, ValueError, RuntimeError) as exc:
        if "bfloat16" in str(getattr(value, "dtype", "")) and hasattr(value, "view"):
            torch = sys.modules.get("torch")
            if torch is not None and value.dtype is torch.bfloat16:
                return np.from_dlpack(value.view(torch.int16)), "BF16"
        raise _fail(
            f"{label}: its DLPack export failed ({exc}); a tensor on another device"
            " must be moved to the CPU first"
        ) from None


def _check_bools(arr: np.ndarray[Any, Any], label: str) -> None:
    """Refuse a bool array holding bytes other than 0 and 1 (numpy makes them
    with ``view(bool)``), which a peer refuses: a read-only scan, no copy."""
    try:
        check_bool(arr.reshape(-1).view(np.uint8).data, label, 0)
    except RemoteProtocolError as exc:
        raise _fail(exc.msg) from None


def _message_parameters(params: Any, where: str) -> dict[str, Any]:
    """A request's or response's parameters: as :func:`check_parameters`, and
    ``binary_data_output``, when present, a bool."""
    checked = check_parameters(params, where)
    if "binary_data_output" in checked and type(checked["binary_data_output"]) is not bool:
        raise _fail(f"parameter 'binary_data_output' of {where} must be a bool")
    return checked


def _prepare_all(tensors: Any, role: str) -> list[_Prepared]:
    # (name, data, datatype, parameters) of each tensor
    items: list[tuple[Any, Any, str | None, Any]] = []
    if isinstance(tensors, (dict, Mapping)):  # (dict first: the ABC's check is slow)
        for key, value in tensors.items():
            if isinstance(value, Tensor):
                if not isinstance(value.name, str) or value.name != key:
                    raise _fail(f"{role} '{key}' is a Tensor named '{value.name}'")
                items.append((key, value.array, value.datatype, value.parameters))
            else:
                items.append((key, value, None, None))
    elif isinstance(tensors, (str, bytes)) or not isinstance(tensors, Sequence):
        raise _fail(f"{role}s must be a mapping of name to data, or a sequence of Tensor")
    else:
        for t in tensors:
            if not isinstance(t, Tensor):
                raise _fail(f"a sequence of {role}s must hold binproto.Tensor, got {t!r}")
            items.append((t.name, t.array, t.datatype, t.parameters))
    prepared: list[_Prepared] = []
    seen: set[str] = set()
    for name, data, datatype, params in items:
        if not isinstance(name, str):
            raise _fail(f"{role} names must be strings, got {name!r}")
        if name in seen:
            raise _fail(f"duplicate {role} name '{name}'")
        seen.add(name)
        prepared.append(_prepare(name, data, datatype, params, role))
    return prepared


# -- placing tensors -------------------------------------------------------------


def _json_strings(elements: list[bytes], label: str) -> list[str]:
    try:
        return [e.decode("utf-8") for e in elements]
    except UnicodeDecodeError:
        bad = next(i for i, e in enumerate(elements) if not _is_utf8(e))
        raise _fail(
            f"{label}: BYTES element {bad} is not valid UTF-8, so it cannot be JSON"
            " data; send this tensor binary"
        ) from None


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _floatless(params: Mapping[str, Any]) -> bool:
    """True when checked parameters hold no float (see dumps_header's ``plain``)."""
    return not params or float not in map(type, params.values())


def _place(
    prepared: list[_Prepared], binary: list[bool], role: str, *, utf8_fallback: bool = False
) -> tuple[list[dict[str, Any]], list[bytes | memoryview], bool, bool]:
    """The JSON objects of the tensors, the buffers of the binary ones,
    whether an array's JSON data is among the objects, and whether the
    objects are plain: no JSON data, no float parameter (see dumps_header).

    ``binary`` is the caller's choice per tensor; FP16 and BF16 always travel
    binary, and with ``utf8_fallback`` so do BYTES that JSON cannot carry."""
    objs: list[dict[str, Any]] = []
    buffers: list[bytes | memoryview] = []
    arrays = False
    plain = True
    for p, chosen in zip(prepared, binary, strict=True):
        as_binary = (
            chosen
            or p.datatype in _ALWAYS_BINARY
            or (utf8_fallback and p.elements is not None and not all(map(_is_utf8, p.elements)))
        )
        obj: dict[str, Any] = {"name": p.name, "datatype": p.datatype, "shape": p.shape}
        params = p.parameters
        if as_binary:
            if p.elements is not None:
                buf = join_plain(p.elements).data
            else:
                assert p.array is not None
                buf = as_byte_view(p.array)  # the (contiguous) array's bytes: no copy
            params = {**params, _RESERVED: buf.nbytes}
            buffers.append(buf)
        if params:
            obj["parameters"] = params
            plain = plain and _floatless(p.parameters)
        if not as_binary:
            plain = False
            if p.elements is not None:
                obj["data"] = _json_strings(p.elements, f"{role} '{p.name}'")
            elif p.json_data is not None:
                obj["data"] = p.json_data
            else:
                assert p.array is not None
                obj["data"] = _ArrayData(p.array.ravel())
                arrays = True
        objs.append(obj)
    return objs, buffers, arrays, plain


DEFAULT_LIMITS = Limits()

# Built once: json.dumps with arguments builds an encoder on every call.
_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))

# Elements of an array written as JSON data per slice.
_SLICE = 1 << 16


class _ArrayData:
    """A flat array to write as a tensor's JSON ``data``, a slice at a time:
    its Python list (about 32 bytes an element, several times its text) is
    never built whole."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray[Any, Any]) -> None:
        self.array = array

    def pieces(self) -> Iterator[bytes]:
        """The array's JSON text, ``[`` to ``]``."""
        yield b"["
        flat = self.array
        for start in range(0, flat.size, _SLICE):
            if start:
                yield b","
            yield _numbers(flat[start : start + _SLICE]).encode("utf-8")
        yield b"]"


def _numbers(part: np.ndarray[Any, Any]) -> str:
    """The elements of ``part`` as JSON values, comma separated.

    An FP32 value is written as the shortest decimal that reads back as the
    same value (numpy's repr of it): ``0.37``, where the double it widens to
    would be written ``0.3700000047683716``, three times the text.
    Not finite: ``NaN``, ``Infinity``, ``-Infinity``. Anything else as json
    writes its Python value.
    """
    if part.dtype.kind == "f" and part.dtype.itemsize == 4:
        text = ",".join(part.astype(str).tolist())
        if "n" in text:  # numpy's "nan", "inf" and "-inf"
            text = text.replace("nan", "NaN").replace("inf", "Infinity")
        return text
    # "[a,b,c]" without its brackets: the elements as json writes them.
    return _JSON.encode(part.tolist())[1:-1]


def dumps_header(obj: Any, *, arrays: bool = True, plain: bool = False) -> bytes:
    """Serialize a JSON header: compact UTF-8 JSON.

    Strict JSON except ``NaN`` / ``Infinity`` / ``-Infinity`` for non-finite
    float data, the tokens tritonclient emits and Triton and binproto accept.
    An array's JSON data (from the encoder) is written a slice at a time and
    put in its place in the text; ``arrays=False`` says there is none.

    ``plain`` says ``obj`` holds no float and no tensor data: only strings,
    integers, booleans, None, lists and objects, which every JSON encoder
    writes alike. Such a header is written by orjson when it is installed
    (the ``fast`` extra: :data:`binproto._json.FAST_DUMPS`), the same bytes in
    a fraction of the time; what orjson refuses (an integer past 64 bits, a
    string that is not valid UTF-8, a key of a str subclass) is left to the
    standard encoder, which writes it or says why not.
    """
    fast = _json.FAST_DUMPS
    if plain and fast is not None:
        try:
            return fast(obj)
        except TypeError:
            pass
    # Each array's place is held by a string no peer can have sent (random
    # per call), then the text around it is joined with the array's pieces.
    marks: dict[str, _ArrayData] = {}
    secret = ""  # drawn for the first array (a system call)
    for entries in obj.values() if arrays and isinstance(obj, dict) else ():
        for entry in entries if isinstance(entries, list) else ():
            if isinstance(entry, dict) and isinstance(entry.get("data"), _ArrayData):
                secret = secret or os.urandom(8).hex()
                mark = f"\x00{secret}:{len(marks)}"
                marks[_JSON.encode(mark)] = entry["data"]
                entry["data"] = mark
    try:
        text = _JSON.encode(obj)
        pieces: list[bytes] = []
        for quoted, data in marks.items():
            before, _, text = text.partition(quoted)
            pieces.append(before.encode("utf-8"))
            pieces.extend(data.pieces())
        pieces.append(text.encode("utf-8"))
    except (TypeError, ValueError) as exc:  # unserializable value, circular object
        raise _fail(f"the header cannot be serialized as JSON: {exc}") from None
    except RecursionError:  # nested past the stack (orjson refuses it as a TypeError)
        raise _fail("the header cannot be serialized as JSON: nested too deep") from None
    except UnicodeEncodeError as exc:  # lone surrogates
        raise _fail(f"the header holds a string that is not valid UTF-8: {exc.reason}") from None
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def _body(
    obj: dict[str, Any], buffers: list[bytes | memoryview], arrays: bool, plain: bool
) -> EncodedBody:
    header = dumps_header(obj, arrays=arrays, plain=plain)
    binary = bool(buffers)
    content_length = len(header)
    for b in buffers:
        content_length += b.nbytes if isinstance(b, memoryview) else len(b)
    header_length = len(header) if binary else None
    return EncodedBody(header, [header, *buffers], header_length, content_length)


def _binary_choice(binary: Any, prepared: list[_Prepared], role: str) -> list[bool]:
    """Apply the caller's ``binary`` argument: True/False, or a set of names."""
    if isinstance(binary, bool):
        # A Python list of numbers is JSON data unless named in a set.
        return [binary and not p.from_list for p in prepared]
    if isinstance(binary, (str, bytes)) or not isinstance(binary, Collection):
        raise _fail(f"binary must be True, False or a set of {role} names, got {binary!r}")
    names = {p.name for p in prepared}
    if not all(isinstance(n, str) for n in binary):
        raise _fail(f"binary must be True, False or a set of {role} names, got {binary!r}")
    unknown = sorted(n for n in binary if n not in names)
    if unknown:
        raise _fail(f"binary names {unknown} are not {role}s being encoded")
    return [p.name in binary for p in prepared]


def _put(obj: dict[str, Any], key: str, value: Any) -> None:
    if value is not None:
        if not isinstance(value, str):
            raise _fail(f"'{key}' must be a string, got {type(value).__name__}")
        obj[key] = value


def _requested_output(out: Any) -> dict[str, Any]:
    if isinstance(out, str):
        out = RequestedOutput(out)
    if not isinstance(out, RequestedOutput):
        raise _fail(f"outputs must hold RequestedOutput or str, got {out!r}")
    if not isinstance(out.name, str):
        raise _fail(f"requested output names must be strings, got {out.name!r}")
    where = f"requested output '{out.name}'"
    params = check_parameters(out.parameters, where)
    if "binary_data" in params:
        raise _fail(f"{where}: give binary_data as RequestedOutput(binary_data=...)")
    if out.binary_data is not None:
        if not isinstance(out.binary_data, bool):
            raise _fail(f"{where}: binary_data must be a bool or None")
        params["binary_data"] = out.binary_data
    obj: dict[str, Any] = {"name": out.name}
    if params:
        obj["parameters"] = params
    return obj


def encode_request(
    inputs: Mapping[str, Any] | Sequence[Tensor],
    *,
    outputs: Sequence[RequestedOutput | str] | None = None,
    binary_data_output: bool | None = None,
    parameters: Mapping[str, Any] | None = None,
    id: str | None = None,
    model_name: str | None = None,
    binary: Binary = True,
) -> EncodedBody:
    """Encode an inference request.

    Args:
        inputs: a mapping from input name to data, or a sequence of
            :class:`Tensor`. Data is a numpy array (datatype from its dtype;
            object, ``bytes_`` and ``str_`` arrays are BYTES; a ``bytes_`` array's
            elements lose trailing NUL bytes, as numpy stores them), a sequence of
            ``bytes``/``str`` (BYTES), a (nested) Python list of numbers or
            booleans (JSON data: INT64, FP64 or BOOL unless a :class:`Tensor`
            says otherwise), or a :class:`Tensor`.
        outputs: the outputs to ask for, as :class:`RequestedOutput` (or plain
            names); None to leave ``outputs`` out (every output).
        binary_data_output: the request's ``binary_data_output`` parameter
            (None: not sent).
        parameters: other request parameters (string, number or bool values).
        id, model_name: sent when given.
        binary: which inputs travel binary: True (every array and BYTES
            sequence; Python lists of numbers stay JSON data), False (none), or
            a set of input names (exactly those). FP16 and BF16 always travel
            binary.

    Arrays that are not C-contiguous or not little-endian are copied once into
    wire form; others are referenced, not copied. Raises
    :class:`LocalProtocolError` for data that cannot be encoded, e.g. BYTES
    that are not valid UTF-8 sent as JSON data.
    """
    prepared = _prepare_all(inputs, "input")
    choice = _binary_choice(binary, prepared, "input")
    tensors, buffers, arrays, plain = _place(prepared, choice, "input")
    params = _message_parameters(parameters, "the request")
    if binary_data_output is not None:
        if not isinstance(binary_data_output, bool):
            raise _fail("binary_data_output must be a bool or None")
        if "binary_data_output" in params:
            raise _fail("binary_data_output is given both as an argument and in parameters")
        params["binary_data_output"] = binary_data_output
    obj: dict[str, Any] = {}
    _put(obj, "id", id)
    _put(obj, "model_name", model_name)
    if params:
        obj["parameters"] = params
    obj["inputs"] = tensors
    if outputs is not None:
        if isinstance(outputs, (str, bytes)) or not isinstance(outputs, Sequence):
            raise _fail("outputs must be a sequence of RequestedOutput")
        requested = [_requested_output(o) for o in outputs]
        names = [o["name"] for o in requested]
        if len(set(names)) != len(names):
            raise _fail(f"duplicate requested output names in {names}")
        obj["outputs"] = requested
        plain = plain and all(_floatless(o.get("parameters", {})) for o in requested)
    return _body(obj, buffers, arrays, plain and _floatless(params))


def _policy(
    request: InferenceHeader, prepared: list[_Prepared]
) -> tuple[list[_Prepared], list[bool]]:
    """The outputs a request asked for, and whether each travels binary."""
    if not isinstance(request, InferenceHeader) or request.kind != "request":
        raise _fail("request must be the InferenceHeader of a parsed request")
    default, asked = _asked(request)
    if asked is None:
        return prepared, [default] * len(prepared)
    by_name = {p.name: p for p in prepared}
    missing = [name for name in asked if name not in by_name]
    if missing:
        raise _fail(f"the request asks for outputs {missing} that are not among the outputs given")
    kept = [p for p in prepared if p.name in asked]
    return kept, [_binary(asked[p.name], default) for p in kept]


def _asked(request: InferenceHeader) -> tuple[bool, dict[str, RequestedOutput] | None]:
    """A request's output policy: its default (``binary_data_output``), and
    the outputs it lists by name (None: every output, by the default)."""
    wanted = request.requested_outputs
    asked = None if wanted is None else {o.name: o for o in wanted}
    return request.binary_data_output is True, asked


def _binary(out: RequestedOutput, default: bool) -> bool:
    """Whether a listed output travels binary: its ``binary_data``, else the default."""
    return out.binary_data if out.binary_data is not None else default


def json_output_elements(outputs: Any, request: InferenceHeader) -> int:
    """The elements of ``outputs`` that ``encode_response(outputs,
    request=request)`` would write as JSON data, without preparing them: a
    server asks it whether encoding is worth a worker thread. An upper bound
    (FP16, BF16 and BYTES that are not UTF-8 still go binary); an output it
    cannot size counts 0."""
    default, asked = _asked(request)
    if isinstance(outputs, Mapping):
        pairs: Any = outputs.items()
    else:  # (Tensors; anything else the encoder refuses)
        pairs = ((getattr(t, "name", None), getattr(t, "array", None)) for t in outputs)
    total = 0
    for name, value in pairs:
        if asked is None:
            binary = default
        elif name in asked:
            binary = _binary(asked[name], default)
        else:
            continue  # not asked for: not sent
        if isinstance(value, Tensor):
            value = value.array
        size = getattr(value, "size", None)
        if not binary and type(size) is int:
            total += size
    return total


def _check_json_elements(prepared: list[_Prepared], binary: list[bool], most: int) -> None:
    """Refuse a response whose JSON outputs hold more than ``most`` elements."""
    count = 0
    for p, chosen in zip(prepared, binary, strict=True):
        if not chosen and p.datatype not in _ALWAYS_BINARY:
            count += math.prod(p.shape)
    if count > most:
        raise RemoteProtocolError(
            f"the response would write {count} elements as JSON data, more than the limit"
            f" of {most} (max_json_output_elements): ask for binary outputs"
            " (binary_data_output)",
            status_hint=413,
            offset=0,
        )


def encode_response(
    outputs: Mapping[str, Any] | Sequence[Tensor],
    *,
    model_name: str,
    model_version: str | None = None,
    id: str | None = None,
    parameters: Mapping[str, Any] | None = None,
    request: InferenceHeader | None = None,
    binary: Binary = True,
    max_json_elements: int | None = DEFAULT_LIMITS.max_json_output_elements,
) -> EncodedBody:
    """Encode an inference response.

    ``outputs`` takes the same forms as :func:`encode_request`'s ``inputs``.

    With ``request`` (the :class:`InferenceHeader` of the parsed request) the
    request's output policy decides how each output travels:

    * when the request lists ``outputs``, only those are returned (in the
      order of ``outputs`` here; a listed output missing from ``outputs``
      raises :class:`LocalProtocolError`), and a listed output's
      ``binary_data`` decides; without ``binary_data`` the request's
      ``binary_data_output`` decides, as the extension's text says ("If
      binary_data is specified on an output it overrides this setting").
      Triton and KServe differ here: they return such an output as JSON
      (kserve#5907);
    * when it lists none (no ``outputs``, or an empty list), every output is
      returned, binary if ``binary_data_output`` is true, else as JSON;
    * FP16 and BF16 always travel binary, and so do BYTES outputs that are not
      valid UTF-8 (JSON cannot carry them);
    * ``id`` defaults to the request's id.

    Without ``request``, ``binary`` decides as in :func:`encode_request` (BYTES
    that are not valid UTF-8 sent as JSON raise :class:`LocalProtocolError`).

    ``max_json_elements`` bounds the elements the request's policy may have
    written as JSON ``data`` (by default ``Limits().max_json_output_elements``;
    None sets no bound): past it, :class:`RemoteProtocolError` with status
    hint 413, before any is written.
    """
    prepared = _prepare_all(outputs, "output")
    if request is not None:
        # BYTES that JSON cannot carry travel binary whatever the request asked.
        prepared, choice = _policy(request, prepared)
        if id is None:
            id = request.id
        if max_json_elements is not None and not all(choice):
            _check_json_elements(prepared, choice, max_json_elements)
    else:
        choice = _binary_choice(binary, prepared, "output")
    tensors, buffers, arrays, plain = _place(
        prepared, choice, "output", utf8_fallback=request is not None
    )
    if not isinstance(model_name, str):
        raise _fail("model_name must be a string")
    obj: dict[str, Any] = {"model_name": model_name}
    _put(obj, "model_version", model_version)
    _put(obj, "id", id)
    params = _message_parameters(parameters, "the response")
    if params:
        obj["parameters"] = params
    obj["outputs"] = tensors
    return _body(obj, buffers, arrays, plain and _floatless(params))
