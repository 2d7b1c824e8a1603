"""Limits on what a message becomes, not only on its bytes: JSON values, BYTES
elements, JSON output elements, and the decompressed size.

Each is checked before the objects it bounds are made, on every path: the
parser, whole-body decoding, and the encoder of responses.
"""

from __future__ import annotations

import gzip
import json
import re
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import binproto
from binproto import Limits, RemoteProtocolError
from binproto._encode import json_output_elements
from binproto._json import _values_outside_strings

from .helpers import assert_same_everywhere, claiming_header, gzip_then_zeros


def _request(header: dict[str, Any], tensors: bytes = b"") -> tuple[bytes, int]:
    raw = json.dumps(header).encode()
    return raw + tensors, len(raw)


def _decode(body: bytes, hl: int | None, limits: Limits, **kw: Any) -> binproto.DecodedMessage:
    return binproto.decode_request(body, header_length=hl, limits=limits, **kw)


def _parse(body: bytes, hl: int | None, limits: Limits, **kw: Any) -> None:
    parser = binproto.Parser(
        "request", header_length=hl, content_length=len(body), limits=limits, **kw
    )
    parser.receive_data(body)
    parser.receive_data(b"")
    while type(parser.next_event()) is not binproto.MessageComplete:
        pass


# -- JSON values --------------------------------------------------------------


def _json_data(values: int) -> dict[str, Any]:
    return {"inputs": [{"name": "x", "datatype": "INT32", "shape": [values], "data": [0] * values}]}


@pytest.mark.parametrize("decode", [_decode, _parse])
def test_a_header_of_more_json_values_than_the_limit_is_413_before_it_is_parsed(
    decode: Any,
) -> None:
    body, _ = _request(_json_data(1000))
    # 1008 values: the header, its list of inputs, the tensor, its name,
    # datatype, shape (a list and its one number), and data (a list of 1000).
    decode(body, None, Limits(max_json_values=1008))
    with pytest.raises(RemoteProtocolError, match=r"up to 1008 values.*limit of 1007") as info:
        decode(body, None, Limits(max_json_values=1007))
    assert info.value.status_hint == 413
    assert "max_json_values" in str(info.value)


def test_json_values_are_counted_outside_strings() -> None:
    # A BYTES element full of commas and brackets is one value.
    data = ["[,{" * 5000]
    body, _ = _request({"inputs": [{"name": "s", "datatype": "BYTES", "shape": [1], "data": data}]})
    decoded = _decode(body, None, Limits(max_json_values=20))
    assert decoded.tensors["s"].tolist() == [data[0].encode()]
    # An escaped quote does not end a string early.
    data = ['\\",' * 100]
    body, _ = _request({"inputs": [{"name": "s", "datatype": "BYTES", "shape": [1], "data": data}]})
    assert _decode(body, None, Limits(max_json_values=20)).tensors["s"][0] == data[0].encode()


def test_many_empty_lists_in_parameters_are_refused_by_count() -> None:
    # The shape of the attack: tiny values, each a Python object, in a
    # tensor's parameters (which binproto keeps as sent).
    header = _json_data(1)
    header["inputs"][0]["parameters"] = {"junk": [[]] * 50_000}
    body, _ = _request(header)
    with pytest.raises(RemoteProtocolError, match="max_json_values") as info:
        _decode(body, None, Limits(max_json_values=10_000))
    assert info.value.status_hint == 413 and info.value.offset == 0


@pytest.mark.parametrize("framed", [False, True])
def test_the_value_limit_holds_for_every_chunking(framed: bool) -> None:
    body, hl = _request(_json_data(40))
    limits = Limits(max_json_values=30)
    outcome = assert_same_everywhere(
        lambda: binproto.Parser(
            "request",
            header_length=hl if framed else None,
            content_length=len(body),
            limits=limits,
        ),
        body,
    )
    assert outcome.error is not None and "max_json_values" in outcome.error[1]


def test_a_compressed_header_is_counted_inflated() -> None:
    body, _ = _request(_json_data(5000))
    packed = gzip.compress(body)
    parser = binproto.Parser(
        "request",
        content_length=len(packed),
        content_encoding="gzip",
        limits=Limits(max_json_values=1000),
    )
    parser.receive_data(packed)
    parser.receive_data(b"")
    with pytest.raises(RemoteProtocolError, match="max_json_values"):
        parser.next_event()


# -- BYTES elements -----------------------------------------------------------


def _bytes_request(elements: int, tensors: int = 1) -> tuple[bytes, int]:
    blob = b"\0\0\0\0" * elements
    header = {
        "inputs": [
            {
                "name": f"s{i}",
                "datatype": "BYTES",
                "shape": [elements],
                "parameters": {"binary_data_size": len(blob)},
            }
            for i in range(tensors)
        ]
    }
    return _request(header, blob * tensors)


@pytest.mark.parametrize("decode", [_decode, _parse])
def test_bytes_elements_over_the_limit_are_413_at_the_header(decode: Any) -> None:
    body, hl = _bytes_request(100, tensors=3)
    decode(body, hl, Limits(max_bytes_elements=300))
    with pytest.raises(RemoteProtocolError, match="BYTES tensors hold 300 or more") as info:
        decode(body, hl, Limits(max_bytes_elements=299))
    assert info.value.status_hint == 413
    assert "max_bytes_elements" in str(info.value)


def test_a_gzip_bomb_of_empty_bytes_elements_is_refused_before_any_is_made() -> None:
    # 40 M empty elements: 160 MB of prefixes, 150 KiB on the wire.
    elements = 40_000_000
    header = claiming_header("BYTES", elements, 4 * elements)
    packed = gzip_then_zeros(header, 4 * elements)
    assert len(packed) < 200_000
    parser = binproto.Parser(
        "request",
        header_length=len(header),
        content_length=len(packed),
        content_encoding="gzip",
    )
    parser.receive_data(packed)
    with pytest.raises(RemoteProtocolError, match="max_bytes_elements") as info:
        parser.next_event()
    assert info.value.status_hint == 413


# -- the decompressed size ----------------------------------------------------


def test_a_claim_past_the_decompressed_limit_is_413_at_the_header() -> None:
    # A gzip body whose header claims 3 GiB: refused when its header is read,
    # whatever its trailer says.
    size = 3 << 30
    header = claiming_header("UINT8", size, size)
    # A body of 7 MB on the wire: its ratio would allow 7.7 GB.
    noise = np.random.default_rng(0).bytes(7_000_000)
    packed = gzip.compress(header + noise, compresslevel=1)
    parser = binproto.Parser(
        "request", header_length=len(header), content_length=len(packed), content_encoding="gzip"
    )
    parser.receive_data(packed)
    with pytest.raises(RemoteProtocolError, match="more than the 536870912 bytes") as info:
        parser.next_event()
    assert info.value.status_hint == 413


# -- JSON outputs -------------------------------------------------------------


def _parsed_request(binary_output: bool | None) -> binproto.InferenceHeader:
    header: dict[str, Any] = {"inputs": []}
    if binary_output is not None:
        header["parameters"] = {"binary_data_output": binary_output}
    body = json.dumps(header).encode()
    return binproto.decode_request(body, header_length=None).header


def test_json_outputs_over_the_limit_are_413_before_any_is_written() -> None:
    outputs = {"a": np.zeros(600, np.float32), "b": np.zeros(500, np.bool_)}
    request = _parsed_request(None)
    encoded = binproto.encode_response(
        outputs, model_name="m", request=request, max_json_elements=1100
    )
    assert b'"data"' in encoded.json
    with pytest.raises(RemoteProtocolError, match="1100 elements as JSON data") as info:
        binproto.encode_response(outputs, model_name="m", request=request, max_json_elements=1099)
    assert info.value.status_hint == 413
    assert "binary_data_output" in str(info.value)


def test_binary_outputs_do_not_count_against_the_json_output_limit() -> None:
    outputs = {"a": np.zeros(10_000, np.float32), "h": np.zeros(10_000, np.float16)}
    encoded = binproto.encode_response(
        outputs, model_name="m", request=_parsed_request(True), max_json_elements=0
    )
    assert b'"data"' not in encoded.json
    # FP16 always travels binary: only the FP32 output would be JSON.
    with pytest.raises(RemoteProtocolError, match="10000 elements"):
        binproto.encode_response(
            outputs, model_name="m", request=_parsed_request(None), max_json_elements=9_999
        )


_TEXT = st.text(alphabet=st.sampled_from(list('a,[{}]"\\:é \n')), max_size=12)
_JSON = st.recursive(
    st.none() | st.integers() | _TEXT,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(_TEXT, inner, max_size=6),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(_JSON, st.booleans())
def test_values_are_counted_outside_strings_as_a_json_parser_sees_them(
    obj: Any, ascii_only: bool
) -> None:
    # Against a second count: strings blanked by a regular expression of
    # JSON's string token, then every comma and opener counted.
    raw = json.dumps(obj, ensure_ascii=ascii_only).encode()
    blanked = re.sub(rb'"[^"\\]*(?:\\.[^"\\]*)*"', b'""', raw, flags=re.DOTALL)
    expected = 1 + sum(blanked.count(c) for c in (b",", b"[", b"{"))
    assert _values_outside_strings(raw) == expected


def test_values_are_counted_across_pieces_that_end_inside_a_string() -> None:
    # Strings longer than the piece the count takes at a time, with escaped
    # quotes and backslashes at and around the piece boundaries.
    parts = ["a," * (1 << 20), [1, 2], 'x\\"' * 400_000, {"a": [3]}, "\\" * 1_000_001]
    raw = json.dumps(parts).encode()
    # The outer list and its four commas, [1, 2], and {"a": [3]}.
    assert _values_outside_strings(raw) == 1 + 5 + 2 + 2


_POLICIES = [
    {},
    {"parameters": {"binary_data_output": True}},
    {"parameters": {"binary_data_output": False}},
    {"outputs": [{"name": "a"}]},
    {"outputs": [{"name": "a", "parameters": {"binary_data": True}}, {"name": "b"}]},
    {
        "parameters": {"binary_data_output": True},
        "outputs": [{"name": "b", "parameters": {"binary_data": False}}],
    },
]


@pytest.mark.parametrize("policy", _POLICIES)
@pytest.mark.parametrize("as_tensors", [False, True])
def test_json_output_elements_is_what_the_encoder_writes_as_json(
    policy: dict[str, Any], as_tensors: bool
) -> None:
    # What a server reads before encoding (is a worker thread worth it?) is
    # the count the encoder's limit then holds the response to.
    request = binproto.decode_request(
        json.dumps({"inputs": [], **policy}).encode(), header_length=None
    ).header
    arrays = {"a": np.zeros(300, np.float32), "b": np.zeros(50, np.int32)}
    outputs: Any = arrays
    if as_tensors:  # (a list of Tensors, or Tensors by name as the echo model gives)
        outputs = [binproto.Tensor(k, v) for k, v in arrays.items()]
        if policy:
            outputs = {t.name: t for t in outputs}
    count = json_output_elements(outputs, request)
    binproto.encode_response(outputs, model_name="m", request=request, max_json_elements=count)
    if count:
        with pytest.raises(RemoteProtocolError, match="max_json_output_elements"):
            binproto.encode_response(
                outputs, model_name="m", request=request, max_json_elements=count - 1
            )
    assert count in (0, 50, 300, 350)
