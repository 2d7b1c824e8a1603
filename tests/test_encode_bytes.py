"""How BYTES tensors are written (lengths, JSON or binary), and headers
written by orjson: the same bytes as the standard library's."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import binproto
from binproto import LocalProtocolError, RequestedOutput, Tensor
from binproto._encode import dumps_header

# -- BYTES serialization -----------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=200), max_size=40))
def test_join_bytes_is_the_wire_form(elements: list[bytes]) -> None:
    joined = binproto.join_bytes(elements)
    assert joined.dtype == np.uint8 and joined.ndim == 1
    expected = b"".join(len(e).to_bytes(4, "little") + e for e in elements)
    assert joined.tobytes() == expected
    assert binproto.split_bytes(joined, len(elements)).tolist() == elements


@pytest.mark.parametrize("length", [0, 1, 7, 64, 1000])
def test_join_bytes_matches_tritonclient(length: int) -> None:
    utils = pytest.importorskip("tritonclient.utils")
    arr = np.empty(50, dtype=object)
    arr[:] = [bytes([i]) * (length + i % 2) for i in range(50)]
    assert binproto.join_bytes(arr.tolist()).tobytes() == utils.serialize_byte_tensor(arr).item()


@pytest.mark.parametrize(
    ("value", "datatype", "expected"),
    [
        (1.5, "FP64", np.float64(1.5)),
        (-3, "INT64", np.int64(-3)),
        (True, "BOOL", np.True_),
        ("hé", "BYTES", "hé".encode()),
        (b"\xff", "BYTES", b"\xff"),
        # Trailing NULs are bytes like any other (a numpy bytes_ scalar drops them).
        (b"ab\x00", "BYTES", b"ab\x00"),
        ("a\x00", "BYTES", b"a\x00"),
        (b"\x00", "BYTES", b"\x00"),
    ],
    ids=["float", "int", "bool", "str", "bytes", "bytes NUL", "str NUL", "NUL"],
)
def test_python_scalars_are_0d_tensors(value: Any, datatype: str, expected: Any) -> None:
    request = binproto.encode_request({"x": value})
    response = binproto.encode_response({"x": value}, model_name="m")
    for body, decode in (
        (request, binproto.decode_request),
        (response, binproto.decode_response),
    ):
        decoded = decode(b"".join(bytes(b) for b in body.buffers), header_length=body.header_length)
        (info,) = decoded.header.tensors
        assert (info.datatype, info.shape) == (datatype, ())
        assert decoded.tensors["x"].shape == () and decoded.tensors["x"][()] == expected


def test_a_python_int_beyond_int64_is_refused() -> None:
    with pytest.raises(binproto.LocalProtocolError, match="does not fit in INT64"):
        binproto.encode_request({"x": 2**63})


@pytest.mark.slow
def test_json_data_of_an_array_is_written_a_slice_at_a_time() -> None:
    # The whole array as a Python list would hold ~32 bytes an element, several
    # times its text: the answer to a big JSON request must not need it.
    import tracemalloc

    values = np.round(np.random.default_rng(3).random(1 << 20), 2)
    values[[5, 77]] = [np.nan, -np.inf]
    tracemalloc.start()
    try:
        body = binproto.encode_response({"y": values}, model_name="m", binary=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    text = len(body.json)
    assert peak < 2.5 * text, (peak, text)  # the text in pieces, then joined
    # The same text as json writes for the whole list, NaN and Infinity included.
    want = json.dumps(values.tolist(), separators=(",", ":")).encode()
    assert body.json.count(want) == 1
    # (A header of a million values: past the default max_json_values.)
    many = binproto.Limits(max_json_values=2 << 20)
    decoded = binproto.decode_response(body.json, header_length=None, limits=many)
    np.testing.assert_array_equal(decoded.tensors["y"], values)


def test_a_parameter_cannot_pose_as_an_array_place() -> None:
    # Arrays' places in the text are marked with a string nobody could send.
    tricky = {"note": "\x000:0", "also": "\\u0000"}
    body = binproto.encode_response(
        {"y": np.arange(3, dtype=np.int32)}, model_name="m", binary=False, parameters=tricky
    )
    obj = json.loads(body.json)
    assert obj["parameters"] == tricky and obj["outputs"][0]["data"] == [0, 1, 2]


def test_fp32_json_data_is_the_shortest_text_that_reads_back_the_same() -> None:
    # (FP16 always travels binary.)
    dtype = np.float32
    info = np.finfo(dtype)
    special = [0.0, -0.0, np.nan, np.inf, -np.inf, info.max, -info.max, info.tiny,
               info.smallest_subnormal, info.eps, 0.1, 1 / 3, 1e-5, 123456.789]  # fmt: skip
    rng = np.random.default_rng(5)
    values = np.concatenate([np.array(special), rng.standard_normal(3000) * 1e3]).astype(dtype)
    body = binproto.encode_response({"y": values}, model_name="m", binary=False)
    text = body.json.decode()
    assert '"data":[0.0,-0.0,NaN,Infinity,-Infinity,' in text
    assert "0.1," in text  # not 0.10000000149011612
    got = binproto.decode_response(body.json, header_length=None).tensors["y"]
    assert got.dtype == np.dtype(dtype).newbyteorder("<") and '"FP32"' in text
    assert got.tobytes() == values.astype(np.dtype(dtype).newbyteorder("<")).tobytes()
    # Read as doubles by any JSON parser, the values narrow back to the same bits.
    data = json.loads(text)["outputs"][0]["data"]
    assert np.array(data, dtype=np.float64).astype(dtype).tobytes() == values.tobytes()


# -- orjson (the fast extra) writes plain headers: the same bytes ----------------------


# What a plain header may hold: no float, no tensor data. Strings cover
# surrogates (which no encoder writes), integers go past 64 bits (which
# orjson refuses), keys include a str subclass (which orjson refuses).
class _Key(str):
    pass


# Every code point, surrogates included (st.text() leaves them out).
_TEXT = st.text(alphabet=st.characters(exclude_categories=()))
_PLAIN_LEAVES = st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | _TEXT
_KEY_TEXT = st.text(alphabet=st.characters(exclude_categories=()), max_size=8)
_PLAIN_KEYS = _KEY_TEXT | _KEY_TEXT.map(_Key)
_PLAIN = st.recursive(
    _PLAIN_LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_PLAIN_KEYS, inner, max_size=4),
    max_leaves=20,
)


def _dumps_with(fast: Any, obj: Any) -> tuple[str, Any]:
    saved = binproto._json.FAST_DUMPS
    binproto._json.FAST_DUMPS = fast
    try:
        return ("ok", dumps_header(obj, arrays=False, plain=True))
    except LocalProtocolError as exc:
        return ("error", str(exc))
    finally:
        binproto._json.FAST_DUMPS = saved


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(_PLAIN)
# What orjson refuses, each at least once: the standard encoder decides.
@example({"id": "a\ud800b"})
@example({"\udc00": 1})
@example({_Key("k"): "v"})
@example({"n": [2**64, -(2**63) - 1]})
def test_plain_headers_come_out_the_same_with_orjson_or_without(obj: Any) -> None:
    orjson = pytest.importorskip("orjson")
    assert _dumps_with(orjson.dumps, obj) == _dumps_with(None, obj)


def _spy() -> tuple[list[Any], Any]:
    orjson = pytest.importorskip("orjson")
    written: list[Any] = []

    def spy(obj: Any) -> bytes:
        written.append(obj)
        out: bytes = orjson.dumps(obj)
        return out

    return written, spy


@pytest.mark.parametrize(
    ("encode", "plain"),
    [
        # Binary tensors, integer, string and bool parameters: plain.
        (lambda: binproto.encode_response({"y": np.ones(3, np.float32)}, model_name="m"), True),
        (
            lambda: binproto.encode_request(
                {"x": np.ones(2, np.int64)},
                parameters={"a": 1, "b": "s", "c": True},
                outputs=[RequestedOutput("y", True, {"n": 2})],
            ),
            True,
        ),
        # A float anywhere (orjson writes 1e-07 as 1e-7), or JSON data: not plain.
        (
            lambda: binproto.encode_response(
                {"y": np.ones(3, np.float32)}, model_name="m", parameters={"t": 1e-7}
            ),
            False,
        ),
        (
            lambda: binproto.encode_response(
                {"y": Tensor("y", np.ones(3, np.float32), parameters={"scale": 0.5})},
                model_name="m",
            ),
            False,
        ),
        (
            lambda: binproto.encode_request(
                {"x": np.ones(2, np.int64)}, outputs=[RequestedOutput("y", None, {"k": 0.1})]
            ),
            False,
        ),
        (lambda: binproto.encode_request({"x": [1, 2]}), False),
        (lambda: binproto.encode_request({"x": np.ones(2, np.int64)}, binary=False), False),
        (lambda: binproto.encode_request({"x": [b"a"]}, binary=False), False),
    ],
)
def test_orjson_writes_only_plain_headers_and_the_same_bytes(encode: Any, plain: bool) -> None:
    written, spy = _spy()
    saved = binproto._json.FAST_DUMPS
    binproto._json.FAST_DUMPS = spy
    try:
        fast = encode()
    finally:
        binproto._json.FAST_DUMPS = None
    try:
        standard = encode()
    finally:
        binproto._json.FAST_DUMPS = saved
    assert len(written) == (1 if plain else 0)
    assert fast.json == standard.json
    assert bytes(fast) == bytes(standard)


def test_parameters_are_checked_as_they_are_sent() -> None:
    class Lying(dict):  # type: ignore[type-arg]
        """A mapping whose items() hides what a copy of it holds."""

        def items(self) -> Any:
            return [("x", 1)]

    with pytest.raises(LocalProtocolError, match="parameter 'x'"):
        binproto.encode_request(
            {"a": np.zeros(1, np.float32)}, parameters=Lying(x=[1e16, float("nan")])
        )
