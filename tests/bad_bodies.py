"""Bad bodies every reader must refuse alike: each with the message,
status hint and byte offset of its fault."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["FAULTS", "one"]


def one(name: Any = "x", **fields: Any) -> dict[str, Any]:
    """A request header of one INT32 [2] binary tensor; ``fields`` override its own."""
    t = {"name": name, "shape": [2], "datatype": "INT32", "parameters": {"binary_data_size": 8}}
    t.update(fields)
    return {"inputs": [t]}


def _fault(header: Any, tensors: bytes = b"", *, hl: Any = "json", cl: Any = None) -> Any:
    js = header if isinstance(header, bytes) else json.dumps(header).encode()
    body = js + tensors
    return body, (len(js) if hl == "json" else hl), (len(body) if cl == "body" else cl)


def _truncated() -> Any:
    body, hl, cl = _fault(one(), b"\0" * 8, cl="body")
    return body[:-3], hl, cl


FAULTS = {
    "json invalid": (_fault(b'{"inputs": [}'), "failed to parse the request JSON", 400, 12),
    "json integer over the digit limit": (
        _fault(b'{"inputs": [], "id": ' + b"9" * 5000 + b"}"), "digits", 400, 0),
    "truncated with content length": (
        _truncated(), "expecting 3 additional bytes", 400, "end"),
    "json not an object": (_fault(b"[1, 2]"), "not a JSON object", 400, 0),
    "invalid utf-8": (_fault(b'{"inputs": [], "id": "\xff"}'), "invalid UTF-8", 400, 22),
    "inputs missing": (_fault({"outputs": []}), "Unable to parse 'inputs'", 400, 0),
    "name not a string": (_fault(one(name=5)), "Unable to parse 'name'", 400, 0),
    "unknown datatype": (_fault(one(datatype="FP8")), "invalid datatype 'FP8'", 400, 0),
    "shape negative": (_fault(one(shape=[-2])), "Unable to parse 'shape'", 400, 0),
    "shape float": (_fault(one(shape=[2.0])), "Unable to parse 'shape'", 400, 0),
    "shape bool": (_fault(one(shape=[True])), "Unable to parse 'shape'", 400, 0),
    "shape not a list": (_fault(one(shape=2)), "Unable to parse 'shape'", 400, 0),
    "data and binary": (
        _fault(one(data=[1, 2]), b"\0" * 8), "But set 'data' 'binary_data_size'", 400, 0),
    "neither data nor binary": (_fault(one(parameters={})), "no field is set", 400, 0),
    "binary size wrong": (
        _fault(one(parameters={"binary_data_size": 7}), b"\0" * 7),
        "unexpected total byte size 7 for input 'x', expecting 8", 400, 0),
    "binary size negative": (
        _fault(one(parameters={"binary_data_size": -8})), "binary_data_size", 400, 0),
    "binary size bool": (
        _fault(one(parameters={"binary_data_size": True})), "binary_data_size", 400, 0),
    "duplicate names": (
        _fault({"inputs": one()["inputs"] * 2}, b"\0" * 16), "duplicate input name 'x'", 400, 0),
    "parameters not an object": (_fault(one(parameters=[1])), "'parameters'", 400, 0),
    "binary_data not bool": (
        _fault({"inputs": [], "outputs": [{"name": "o", "parameters": {"binary_data": 1}}]}),
        "binary_data", 400, 0),
    "short body at end": (
        _fault(one(), b"\0" * 5),
        "unexpected size for input 'x', expecting 3 additional bytes", 400, None),
    "short body with content length": (
        _fault(one(), b"\0" * 5, cl="body"), "more than the 5 left in the body", 400, None),
    "content length beyond what is announced": (
        _fault(one(), b"\0" * 8, cl=999), "890 bytes beyond the 8 bytes", 400, None),
    "bytes after last tensor": (
        _fault(one(), b"\0" * 9), "unexpected additional input data", 400, None),
    "extra bytes with content length": (
        _fault(one(), b"\0" * 9, cl="body"), "unexpected additional input data", 400, None),
    "header longer than body": (
        _fault(one(), b"\0" * 8, hl=10_000), "expecting", 400, None),
    "header length over content length": (
        _fault(one(), b"\0" * 8, hl=10_000, cl="body"), "inference header size", 400, "end"),
    "binary without header length": (
        _fault(one(), hl=None), "must specify valid 'Inference-Header-Content-Length'", 400, None),
    "json count differs from shape": (
        _fault({"inputs": [{"name": "x", "shape": [3], "datatype": "INT8", "data": [1, 2]}]}),
        r"shape \[3\] holds 3, got 2", 400, 0),
    "json value out of range": (
        _fault({"inputs": [{"name": "x", "shape": [1], "datatype": "INT8", "data": [128]}]}),
        "does not fit datatype INT8", 400, 0),
    "json float for int": (
        _fault({"inputs": [{"name": "x", "shape": [1], "datatype": "INT8", "data": [1.5]}]}),
        "does not fit", 400, 0),
    "json string for bool": (
        _fault({"inputs": [{"name": "x", "shape": [1], "datatype": "BOOL", "data": ["y"]}]}),
        "does not fit", 400, 0),
    "json ragged nesting": (
        _fault({"inputs": [{"name": "x", "shape": [2, 2], "datatype": "INT8",
                            "data": [[1, 2], [3]]}]}),
        "neither flat nor nested", 400, 0),
    "bool byte not 0 or 1": (
        _fault({"inputs": [{"name": "b", "shape": [3], "datatype": "BOOL",
                            "parameters": {"binary_data_size": 3}}]}, b"\x01\x00\x02"),
        "invalid BOOL value 2", 400, "last"),
    "bytes prefix overruns": (
        _fault({"inputs": [{"name": "s", "shape": [1], "datatype": "BYTES",
                            "parameters": {"binary_data_size": 6}}]}, b"\x05\0\0\0ab"),
        "claims 5 bytes but only 2 remain", 400, "tensor"),
    "bytes too many elements": (
        _fault({"inputs": [{"name": "s", "shape": [1], "datatype": "BYTES",
                            "parameters": {"binary_data_size": 9}}]}, b"\x01\0\0\0a\0\0\0\0"),
        "more than the 1 its shape holds", 400, "tensor+5"),
    "bytes too few elements": (
        _fault({"inputs": [{"name": "s", "shape": [2], "datatype": "BYTES",
                            "parameters": {"binary_data_size": 8}}]}, b"\x04\0\0\0abcd"),
        "binary_data_size holds 1", 400, "end"),
    "bytes partial prefix": (
        _fault({"inputs": [{"name": "s", "shape": [2], "datatype": "BYTES",
                            "parameters": {"binary_data_size": 8}}]}, b"\x01\0\0\0ab\0\0"),
        "more than the|partial", 400, None),
    "bytes size below prefixes": (
        _fault({"inputs": [{"name": "s", "shape": [3], "datatype": "BYTES",
                            "parameters": {"binary_data_size": 8}}]}, b"\0" * 8),
        "need at least 12 bytes", 400, 0),
}  # fmt: skip
