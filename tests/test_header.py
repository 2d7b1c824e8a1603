"""The JSON header validated into records (named tuples: immutable,
compared by value)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import binproto
from binproto._header import MAX_DIMS, Kind, build_header


def test_a_fixed_size_binary_tensor_is_described() -> None:
    t = {"name": "x", "datatype": "FP32", "shape": [2, 3], "parameters": {"binary_data_size": 24}}
    header, _ = build_header({"inputs": [t]}, "request", binproto.Limits(), 90)
    (info,) = header.tensors
    assert (info.index, info.name, info.datatype, info.shape) == (0, "x", "FP32", (2, 3))
    assert (info.binary_size, info.nbytes, info.data, info.array) == (24, 24, None, None)
    assert not info.shared_memory and header.header_length == 90


# build_header makes its records positionally (keywords cost a dict a call):
# the records must be the ones the field names say, in every place a tensor
# can be, and the field order (how a named tuple unpacks) must not move.
TENSOR_PLACES: list[dict[str, Any]] = [
    {"name": "b", "datatype": "INT32", "shape": [2], "parameters": {"binary_data_size": 8}},
    {"name": "j", "datatype": "FP64", "shape": [1, 2], "data": [1.5, 2]},
    {"name": "s", "datatype": "BOOL", "shape": [3], "parameters": {"shared_memory_region": "r"}},
]


def test_built_records_are_the_ones_their_field_names_say() -> None:
    obj: dict[str, Any] = {"id": "7", "model_name": "m", "model_version": "2"}
    obj |= {"parameters": {"p": 1}, "inputs": TENSOR_PLACES, "outputs": [{"name": "b"}]}
    header, _ = build_header(obj, "request", binproto.Limits(), 321)
    b, j, s = header.tensors
    assert b == binproto.TensorInfo(
        index=0, name="b", datatype="INT32", shape=(2,), parameters={"binary_data_size": 8},
        binary_size=8, data=None, nbytes=8, array=None, shared_memory=False,
    )  # fmt: skip
    assert j[:8] == binproto.TensorInfo(
        index=1, name="j", datatype="FP64", shape=(1, 2), parameters={}, binary_size=None,
        data=[1.5, 2], nbytes=16,
    )[:8]  # fmt: skip
    assert j.array is not None and j.array.tolist() == [[1.5, 2.0]] and not j.shared_memory
    assert s == binproto.TensorInfo(
        index=2, name="s", datatype="BOOL", shape=(3,), parameters={"shared_memory_region": "r"},
        binary_size=None, data=None, nbytes=3, array=None, shared_memory=True,
    )  # fmt: skip
    assert header == binproto.InferenceHeader(
        kind="request", id="7", model_name="m", model_version="2", parameters={"p": 1},
        tensors=(b, j, s), requested_outputs=(binproto.RequestedOutput("b"),), raw=obj,
        header_length=321,
    )  # fmt: skip


def test_record_fields_keep_their_order() -> None:
    assert binproto.TensorInfo._fields == (
        "index", "name", "datatype", "shape", "parameters", "binary_size", "data", "nbytes",
        "array", "shared_memory",
    )  # fmt: skip
    assert binproto.InferenceHeader._fields == (
        "kind", "id", "model_name", "model_version", "parameters", "tensors",
        "requested_outputs", "raw", "header_length",
    )  # fmt: skip
    assert binproto.DecodedMessage._fields == ("header", "tensors", "shared_memory")
    assert binproto.HeaderParsed._fields == ("header",)
    assert binproto.TensorComplete._fields == ("index", "name", "info")


def test_a_tensor_info_is_an_immutable_named_tuple() -> None:
    params = {"binary_data_size": 8}
    t = {"name": "x", "datatype": "INT32", "shape": [2], "parameters": params}
    (built,) = build_header({"outputs": [t]}, "response", binproto.Limits(), 10)[0].tensors
    made = binproto.TensorInfo(
        index=0, name="x", datatype="INT32", shape=(2,), parameters=params,
        binary_size=8, data=None, nbytes=8,
    )  # fmt: skip
    assert built == made and repr(built) == repr(made)
    assert built._asdict() == made._asdict() and built._fields[:2] == ("index", "name")
    with pytest.raises(AttributeError):
        built.name = "y"  # type: ignore[misc]


def test_an_empty_outputs_list_asks_for_every_output() -> None:
    # As Triton reads it: [] is no selection, not a request for nothing.
    obj: dict[str, Any] = {"inputs": [], "outputs": []}
    header, _ = build_header(obj, "request", binproto.Limits(), 30)
    assert header.requested_outputs is None


@pytest.mark.parametrize(
    ("kind", "fields", "message"),
    [
        ("request", {"id": 7}, "Unable to parse 'id': expected a string"),
        ("request", {"model_name": ["m"]}, "Unable to parse 'model_name': expected a string"),
        ("response", {"model_version": 2}, "Unable to parse 'model_version': expected a string"),
        ("request", {"parameters": []}, "'parameters' of the request: expected an object"),
        ("response", {"parameters": 1}, "'parameters' of the response: expected an object"),
        ("request", {"outputs": {}}, "Unable to parse 'outputs': expected an array"),
        # Several faults: the first one met in the header's order of checks.
        ("request", {"model_version": 2, "id": 7, "outputs": 1}, "'id'"),
        ("request", {"model_version": 2, "model_name": 1}, "'model_name'"),
        ("request", {"model_version": 2, "outputs": 1}, "'model_version'"),
        ("request", {"id": 7, "parameters": 1}, "'parameters' of the request"),
        ("request", {"id": 7, "inputs": [{"name": 1}]}, "'name' of input 0"),
    ],
)
def test_the_headers_own_fields_are_checked_in_order(
    kind: Kind, fields: dict[str, Any], message: str
) -> None:
    obj: dict[str, Any] = {("inputs" if kind == "request" else "outputs"): [], **fields}
    with pytest.raises(binproto.RemoteProtocolError, match=message) as err:
        build_header(obj, kind, binproto.Limits(), 30)
    assert (err.value.status_hint, err.value.offset) == (400, 0)


@pytest.mark.parametrize(
    ("value", "json_type"), [(None, "null"), ([1], "array"), ({"a": 1}, "object")]
)
def test_a_request_parameter_that_is_no_scalar_is_refused(value: Any, json_type: str) -> None:
    """A request's own parameters are strings, numbers or booleans (the
    protocol's ``$parameters``; Triton refuses the others too)."""
    obj: dict[str, Any] = {"inputs": [], "parameters": {"ok": 1, "p": value}}
    with pytest.raises(
        binproto.RemoteProtocolError, match=f"parameter 'p' has invalid type {json_type}"
    ) as err:
        build_header(obj, "request", binproto.Limits(), 30)
    assert (err.value.status_hint, err.value.offset) == (400, 0)


@pytest.mark.parametrize("value", ["s", 1, -(2**70), 1.5, True, False])
def test_scalar_request_parameters_are_taken_as_sent(value: Any) -> None:
    obj: dict[str, Any] = {"inputs": [], "parameters": {"p": value}}
    header, _ = build_header(obj, "request", binproto.Limits(), 30)
    assert header.parameters["p"] == value and type(header.parameters["p"]) is type(value)


def test_parameters_of_tensors_outputs_and_responses_are_taken_as_sent() -> None:
    """Where Triton takes any value (a tensor's, a requested output's), and
    in a response (a client takes what its server sends), so does binproto."""
    tensor = {"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}
    odd = {"p": None, "q": [1], "r": {"a": 1}}
    request: dict[str, Any] = {
        "inputs": [{**tensor, "parameters": odd}],
        "outputs": [{"name": "y", "parameters": odd}],
    }
    header, _ = build_header(request, "request", binproto.Limits(), 30)
    assert header.tensors[0].parameters == odd
    assert header.requested_outputs is not None
    assert header.requested_outputs[0].parameters == odd
    response: dict[str, Any] = {"outputs": [tensor], "parameters": odd}
    header, _ = build_header(response, "response", binproto.Limits(), 30)
    assert header.parameters == odd


def test_a_shape_may_have_as_many_dimensions_as_numpy_allows() -> None:
    # numpy allows 64 dimensions from numpy 2, 32 before: the limit follows it.
    limit = 64 if int(np.__version__.split(".")[0]) >= 2 else 32
    assert MAX_DIMS == limit
    for ndim, refused in ((limit, False), (limit + 1, True)):
        t = {"name": "x", "datatype": "FP32", "shape": [1] * ndim, "data": [1.0]}
        if refused:
            with pytest.raises(binproto.RemoteProtocolError, match=f"more than the {limit}"):
                build_header({"inputs": [t]}, "request", binproto.Limits(), 0)
        else:
            header, _ = build_header({"inputs": [t]}, "request", binproto.Limits(), 0)
            assert header.tensors[0].shape == (1,) * ndim
