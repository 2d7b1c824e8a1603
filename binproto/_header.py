"""The JSON header of a request or response, validated into typed records."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

import numpy as np

from ._datatypes import DATATYPES, DTYPES, DataType, warn_bf16_bits
from ._errors import RemoteProtocolError
from ._json import json_data_to_array
from ._limits import Limits

__all__ = [
    "PARAMETER_TYPES",
    "InferenceHeader",
    "Kind",
    "RequestedOutput",
    "TensorInfo",
    "build_header",
]

Kind = Literal["request", "response"]

_U64 = 2**64

#: The types a parameter's value may have (the protocol's ``str | number |
#: bool``, as JSON decodes them): what a request's parameters are held to, and
#: what the encoder sends.
PARAMETER_TYPES = frozenset((str, int, float, bool))


def _bad_parameter(params: dict[str, Any]) -> RemoteProtocolError:
    """The error for the first of a request's parameters that is no scalar."""
    key, value = next((k, v) for k, v in params.items() if type(v) not in PARAMETER_TYPES)
    kind = "null" if value is None else "array" if isinstance(value, list) else "object"
    return _fail(
        f"parameter '{key}' has invalid type {kind}: the request's parameters are strings,"
        " numbers or booleans"
    )


class RequestedOutput(NamedTuple):
    """An entry of a request's ``outputs``: which output to return, and how.

    ``binary_data`` is the output's ``binary_data`` parameter (None when absent);
    ``parameters`` holds every other parameter the client sent.
    """

    name: str
    binary_data: bool | None = None
    parameters: Mapping[str, Any] | None = None


class TensorInfo(NamedTuple):
    """One input of a request or output of a response, as its header describes it.

    Attributes:
        index: position in the header's ``inputs`` / ``outputs``.
        name, datatype, shape, parameters: as sent (``parameters`` includes
            ``binary_data_size``).
        binary_size: bytes of this tensor in the body (``binary_data_size``), or
            None when it travels as JSON ``data`` or in shared memory.
        data: the JSON ``data`` as sent, or None.
        nbytes: size of the tensor's binary form (for BYTES sent as JSON, the
            length-prefixed size its elements would take).
        array: for a JSON-data tensor, the data as a numpy array of the
            tensor's dtype and shape; None otherwise.
        shared_memory: True when the tensor lives in a shared-memory region
            named by its parameters rather than in the body.
    """

    # A field called index hides tuple.index, as a named tuple allows.
    index: int  # type: ignore[assignment]
    name: str
    datatype: str
    shape: tuple[int, ...]
    parameters: Mapping[str, Any]
    binary_size: int | None
    data: Any
    nbytes: int
    array: np.ndarray[Any, Any] | None = None
    shared_memory: bool = False

    @property
    def elements(self) -> int:
        """Number of elements (product of ``shape``)."""
        return math.prod(self.shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        """The numpy dtype arrays of this tensor decode to."""
        return DTYPES[self.datatype]

    def __repr__(self) -> str:
        return (
            f"TensorInfo(index={self.index}, name={self.name!r}, datatype={self.datatype!r},"
            f" shape={list(self.shape)}, binary_size={self.binary_size})"
        )


class InferenceHeader(NamedTuple):
    """The validated JSON header of an inference request or response.

    Attributes:
        kind: ``"request"`` or ``"response"``.
        id, model_name, model_version: as sent, or None.
        parameters: the top-level ``parameters`` (empty when absent or null).
        tensors: the request's inputs or the response's outputs, in order.
        requested_outputs: a request's ``outputs`` (None when absent or
            empty, which both ask for every output, as Triton reads them; and
            for a response).
        raw: the decoded JSON object.
        header_length: length of the JSON header in bytes.
    """

    kind: Kind
    id: str | None
    model_name: str | None
    model_version: str | None
    parameters: Mapping[str, Any]
    tensors: tuple[TensorInfo, ...]
    requested_outputs: tuple[RequestedOutput, ...] | None
    raw: dict[str, Any]
    header_length: int

    def __repr__(self) -> str:  # without ``raw``, which repeats the rest
        return (
            f"InferenceHeader(kind={self.kind!r}, id={self.id!r}, model_name={self.model_name!r},"
            f" model_version={self.model_version!r}, tensors={list(self.tensors)!r})"
        )

    @property
    def binary_data_output(self) -> bool | None:
        """The request's ``binary_data_output`` parameter, or None when absent."""
        value = self.parameters.get("binary_data_output")
        return value if isinstance(value, bool) else None

    @property
    def binary_size(self) -> int:
        """Total bytes of binary tensor data following the header."""
        total = 0
        for t in self.tensors:
            total += t.binary_size or 0
        return total

    def tensor(self, name: str) -> TensorInfo:
        """The tensor called ``name`` (KeyError if there is none)."""
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)


def _fail(msg: str, status: int = 400) -> RemoteProtocolError:
    # Faults in the header's content point at the header's first byte.
    return RemoteProtocolError(msg, status_hint=status, offset=0)


def _not_a_string(key: str) -> RemoteProtocolError:
    return _fail(f"Unable to parse '{key}': expected a string")


def _parameters(obj: dict[str, Any], where: str) -> dict[str, Any]:
    value = obj.get("parameters")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail(f"Unable to parse 'parameters' of {where}: expected an object")
    return value


def _is_uint(value: object) -> bool:
    return type(value) is int and 0 <= value < _U64


def _max_dims() -> int:
    """Most dimensions a numpy array may have (64 from numpy 2, 32 before)."""
    try:
        np.empty((1,) * 64)
    except ValueError:
        return 32
    return 64


#: Most dimensions a tensor may have: numpy's limit.
MAX_DIMS = _max_dims()
# Largest array numpy can describe, in bytes: its size counts every non-zero
# dimension, even in an array with a zero dimension and so no elements.
MAX_ARRAY_BYTES = 2**63 - 1


def _shape(t: dict[str, Any], dt: DataType, role: str, name: str) -> tuple[int, ...]:
    shape = t.get("shape")
    if type(shape) is not list or len(shape) > MAX_DIMS:
        if type(shape) is list and all(_is_uint(d) for d in shape):
            raise _fail(
                f"shape of {role} '{name}' has {len(shape)} dimensions,"
                f" more than the {MAX_DIMS} supported"
            )
        raise _bad_shape(role, name)
    for d in shape:  # a few dimensions: a plain loop is the cheapest check
        if type(d) is not int or not 0 <= d < _U64:
            raise _bad_shape(role, name)
    # numpy must be able to describe the array even when it has no elements
    # (the size of a shape with elements is held to binary_data_size or data).
    if 0 in shape:
        span = math.prod(d for d in shape if d) * (dt.itemsize or dt.dtype.itemsize)
        if span > MAX_ARRAY_BYTES:
            raise _fail(f"shape {shape} of {role} '{name}' is too large for an array of {dt.name}")
    return tuple(shape)


def _bad_shape(role: str, name: str) -> RemoteProtocolError:
    return _fail(
        f"Unable to parse 'shape' of {role} '{name}': expected a list of non-negative integers"
    )


def _tensor(t: Any, index: int, role: str, limits: Limits, seen: set[str]) -> TensorInfo:
    """One tensor of the header."""
    if type(t) is not dict:
        raise _fail(f"Unable to parse '{role}s': element {index} is not an object")
    name = t.get("name")
    if type(name) is not str:
        raise _fail(f"Unable to parse 'name' of {role} {index}")
    if name in seen:
        raise _fail(f"duplicate {role} name '{name}'")
    seen.add(name)
    datatype = t.get("datatype")
    if type(datatype) is not str:
        raise _fail(f"Unable to parse 'datatype' of {role} '{name}'")
    dt = DATATYPES.get(datatype)
    if dt is None:
        raise _fail(f"invalid datatype '{datatype}' for {role} '{name}'")
    if datatype == "BF16":
        warn_bf16_bits(name)
    shape = _shape(t, dt, role, name)
    params = t.get("parameters")
    if params is None:
        params = {}
    elif type(params) is not dict:
        raise _fail(f"Unable to parse 'parameters' of {role} '{name}': expected an object")
    elements = math.prod(shape)

    size = params.get("binary_data_size")
    binary = size is not None or "binary_data_size" in params
    has_data = "data" in t
    shared = "shared_memory_region" in params
    if binary + has_data + shared != 1:
        raise _not_one_place(t, params, role, name)

    array: np.ndarray[Any, Any] | None = None
    data = t["data"] if has_data else None
    if binary:
        if type(size) is not int or size < 0:
            raise _fail(
                f"Unable to parse 'binary_data_size' of {role} '{name}':"
                " expected a non-negative integer"
            )
        if size > limits.max_tensor_bytes or size > MAX_ARRAY_BYTES:  # numpy's bound, too
            limit = min(limits.max_tensor_bytes, MAX_ARRAY_BYTES)
            raise _fail(
                f"binary_data_size {size} of {role} '{name}' exceeds the limit of {limit} bytes",
                413,
            )
        if dt.itemsize is None:
            _check_bytes_size(elements, size, role, name)
        elif size != elements * dt.itemsize:
            raise _fail(
                f"unexpected total byte size {size} for {role} '{name}', expecting"
                f" {elements * dt.itemsize} ({elements} {dt.name} elements)"
            )
        nbytes = size
    elif has_data:
        array = json_data_to_array(data, dt, shape, f"{role} '{name}'", elements)
        if dt.itemsize is not None:
            nbytes = elements * dt.itemsize
        else:  # BYTES as JSON strings: the size their binary form would take
            nbytes = 4 * array.size + sum(len(b) for b in array.flat)
    elif dt.itemsize is not None:  # in shared memory
        nbytes = elements * dt.itemsize
    else:  # BYTES in shared memory: the size the region is said to hold
        shm_size = params.get("shared_memory_byte_size")
        nbytes = shm_size if type(shm_size) is int and shm_size >= 0 else 0
    # Positional, in field order (a test pins it): keywords would cost the
    # call a dict for each tensor (docs/performance.md).
    return TensorInfo(index, name, datatype, shape, params, size, data, nbytes, array, shared)


def _not_one_place(
    t: dict[str, Any], params: dict[str, Any], role: str, name: str
) -> RemoteProtocolError:
    which = [
        field
        for field, on in (
            ("'data'", "data" in t),
            ("'binary_data_size'", "binary_data_size" in params),
            ("'shared_memory_region'", "shared_memory_region" in params),
        )
        if on
    ]
    but = " set " + " ".join(which) if which else " no field is set"
    return _fail(
        f"{role.capitalize()} '{name}' must set only one of the following fields: 'data',"
        " 'binary_data_size' in 'parameters', 'shared_memory_region' in 'parameters'."
        f" But{but}"
    )


def _check_bytes_size(elements: int, size: int, role: str, name: str) -> None:
    """A BYTES tensor's binary_data_size against its element count (its
    elements' lengths are checked as its bytes arrive)."""
    if size < 4 * elements:
        raise _fail(
            f"unexpected total byte size {size} for {role} '{name}': {elements} BYTES elements"
            f" need at least {4 * elements} bytes for their length prefixes"
        )
    elif elements == 0 and size != 0:
        raise _fail(
            f"unexpected total byte size {size} for {role} '{name}', expecting 0 (no elements)"
        )


def _requested_outputs(outputs: Any, limits: Limits) -> tuple[RequestedOutput, ...] | None:
    """A request's ``outputs`` (not None)."""
    if not isinstance(outputs, list):
        raise _fail("Unable to parse 'outputs': expected an array")
    if len(outputs) > limits.max_tensors:
        raise _fail(
            f"{len(outputs)} requested outputs exceed the limit of {limits.max_tensors}", 413
        )
    if not outputs:
        return None  # (none listed: every output)
    result = []
    seen: set[str] = set()
    for i, out in enumerate(outputs):
        if not isinstance(out, dict) or not isinstance(out.get("name"), str):
            raise _fail(f"Unable to parse 'name' of requested output {i}")
        name = out["name"]
        if name in seen:
            raise _fail(f"duplicate requested output name '{name}'")
        seen.add(name)
        params = _parameters(out, f"requested output '{name}'")
        binary = params.get("binary_data")
        if binary is not None and not isinstance(binary, bool):
            raise _fail(
                f"Unable to parse 'binary_data' of requested output '{name}': expected a bool"
            )
        rest = {k: v for k, v in params.items() if k != "binary_data"}
        result.append(RequestedOutput(name, binary, rest or None))
    return tuple(result)


def build_header(
    obj: Any, kind: Kind, limits: Limits, header_length: int
) -> tuple[InferenceHeader, int]:
    """Validate a decoded JSON header and describe it.

    Returns the header, and how many keys the objects of the JSON that the
    format defines hold (the header, its parameters, each tensor and its
    parameters, each requested output and its parameters), counted as they
    are validated: a parser that drops repeated keys checks the raw text
    against that count."""
    if not isinstance(obj, dict):
        raise _fail(f"the inference {kind} header is not a JSON object")
    role, listed, where = (
        ("input", "inputs", "the request")
        if kind == "request"
        else ("output", "outputs", "the response")
    )
    tensors_json = obj.get(listed)
    if not isinstance(tensors_json, list):
        raise _fail(f"Unable to parse '{listed}': expected an array")
    if len(tensors_json) > limits.max_tensors:
        raise _fail(f"{len(tensors_json)} {listed} exceed the limit of {limits.max_tensors}", 413)
    params = _parameters(obj, where)
    bdo = params.get("binary_data_output")
    if bdo is not None and not isinstance(bdo, bool):
        raise _fail("Unable to parse 'binary_data_output': expected a bool")
    if kind == "request":
        # A request's own parameters reach the model as they are: values the
        # protocol does not allow are refused, as Triton does (a tensor's and
        # a requested output's are taken as sent, as there).
        for value in params.values():
            if type(value) not in PARAMETER_TYPES:
                raise _bad_parameter(params)
    keys = len(obj) + len(params)
    seen: set[str] = set()
    infos = []
    strings = 0  # BYTES elements so far: each becomes a Python object
    for i, t in enumerate(tensors_json):
        info = _tensor(t, i, role, limits, seen)
        infos.append(info)
        keys += len(t) + len(info.parameters)
        if info.datatype == "BYTES":
            strings += info.elements
            if strings > limits.max_bytes_elements:
                raise _fail(
                    f"the {kind}'s BYTES tensors hold {strings} or more elements, more than"
                    f" the limit of {limits.max_bytes_elements} (max_bytes_elements)",
                    413,
                )
    # Checked where they are read: a call each cost more than the checks.
    id_ = obj.get("id")
    if id_ is not None and type(id_) is not str:
        raise _not_a_string("id")
    model_name = obj.get("model_name")
    if model_name is not None and type(model_name) is not str:
        raise _not_a_string("model_name")
    model_version = obj.get("model_version")
    if model_version is not None and type(model_version) is not str:
        raise _not_a_string("model_version")
    outputs = obj.get("outputs") if kind == "request" else None
    requested = None
    if outputs is not None:
        requested = _requested_outputs(outputs, limits)
        for out in outputs:  # objects, as validated
            out_params = out.get("parameters")
            keys += len(out) + (len(out_params) if out_params else 0)
    # Positional, in field order, as TensorInfo above.
    header = InferenceHeader(
        kind, id_, model_name, model_version, params, tuple(infos), requested, obj, header_length
    )
    return header, keys
