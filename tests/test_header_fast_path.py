"""The quick checks for common tensors agree with the full header validation,
and instances built without the frozen ``__init__`` are ordinary ones."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import binproto
from binproto._header import _binary_info, _fast_tensor, _tensor
from binproto._twin import twin

DATATYPE_NAMES = sorted(binproto.DATATYPES)
ODD_VALUES = st.one_of(
    st.none(), st.booleans(), st.floats(allow_nan=False), st.text(max_size=3),
    st.integers(-(2**70), 2**70), st.lists(st.integers(0, 3), max_size=2), st.just({}),
)  # fmt: skip


@st.composite
def tensor_json(draw: st.DrawFn) -> Any:
    """A tensor entry of a header: mostly well formed, often with one field off."""
    datatype = draw(st.sampled_from(DATATYPE_NAMES))
    shape = draw(st.lists(st.integers(0, 5), max_size=3))
    itemsize = binproto.DATATYPES[datatype].itemsize or 4
    elements = int(np.prod(shape)) if shape else 1
    t: dict[str, Any] = {
        "name": draw(st.sampled_from(["a", "b", "c"])),
        "datatype": datatype,
        "shape": shape,
        "parameters": {"binary_data_size": elements * itemsize},
    }
    for _ in range(draw(st.integers(0, 2))):
        where = draw(st.sampled_from(["top", "parameters", "shape", "drop", "drop-param"]))
        if where == "top":
            t[draw(st.sampled_from(["name", "datatype", "shape", "parameters", "data"]))] = draw(
                ODD_VALUES
            )
        elif where == "parameters" and isinstance(t.get("parameters"), dict):
            key = draw(st.sampled_from(["binary_data_size", "shared_memory_region", "x"]))
            t["parameters"][key] = draw(ODD_VALUES)
        elif where == "shape" and isinstance(t.get("shape"), list):
            t["shape"] = [*t["shape"], draw(ODD_VALUES)]
        elif where == "drop" and t:
            del t[draw(st.sampled_from(sorted(t)))]
        elif where == "drop-param" and isinstance(t.get("parameters"), dict):
            t["parameters"].clear()
    return t if draw(st.integers(0, 20)) else draw(ODD_VALUES)


@settings(max_examples=500, deadline=None)
@given(
    t=tensor_json(),
    seen=st.sets(st.sampled_from(["a", "b"])),
    max_tensor_bytes=st.sampled_from([2**35, 8]),
)
def test_quick_check_accepts_only_what_the_full_check_accepts_alike(
    t: Any, seen: set[str], max_tensor_bytes: int
) -> None:
    limits = binproto.Limits(max_tensor_bytes=max_tensor_bytes)
    quick_seen, full_seen = set(seen), set(seen)
    quick = _fast_tensor(t, 3, limits, quick_seen)
    try:
        full = _tensor(t, 3, "input", limits, full_seen)
    except binproto.RemoteProtocolError:
        assert quick is None
        return
    if quick is not None:
        assert quick == full and repr(quick) == repr(full)
        assert quick_seen == full_seen


def test_the_quick_check_takes_the_common_case() -> None:
    t = {"name": "x", "datatype": "FP32", "shape": [2, 3], "parameters": {"binary_data_size": 24}}
    info = _fast_tensor(t, 0, binproto.Limits(), set())
    assert info is not None and info.shape == (2, 3) and info.binary_size == 24


def test_twin_built_info_is_an_ordinary_frozen_instance() -> None:
    params = {"binary_data_size": 8}
    built = _binary_info(1, "x", "INT32", (2,), params, 8)
    made = binproto.TensorInfo(
        index=1, name="x", datatype="INT32", shape=(2,), parameters=params,
        binary_size=8, data=None, nbytes=8,
    )  # fmt: skip
    assert type(built) is binproto.TensorInfo
    assert built == made and repr(built) == repr(made)
    assert dataclasses.asdict(built) == dataclasses.asdict(made)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.name = "y"  # type: ignore[misc]


def test_twin_refuses_classes_it_cannot_mirror() -> None:
    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        x: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class FrozenBase:
        pass

    @dataclasses.dataclass(frozen=True, slots=True)
    class OnFrozenBase(FrozenBase):
        x: int

    for cls in (NoSlots, OnFrozenBase):
        with pytest.raises(TypeError):
            twin(cls)


def test_whole_body_tensors_are_views_of_the_body() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([True, False])
    encoded = binproto.encode_response({"a": a, "b": b}, model_name="m")
    body, hl = bytes(encoded), encoded.header_length
    for buf in (body, bytearray(body)):
        msg = binproto.decode_response(buf, header_length=hl)
        whole = np.frombuffer(buf, dtype=np.uint8)
        for name, want in (("a", a), ("b", b)):
            got = msg.tensors[name]
            np.testing.assert_array_equal(got, want)
            assert got.dtype == want.dtype.newbyteorder("<") and got.shape == want.shape
            assert np.shares_memory(got, whole)
            assert got.flags.writeable == isinstance(buf, bytearray)


def test_parser_chunks_are_ordinary_frozen_events() -> None:
    data = np.arange(4, dtype=np.int32)
    encoded = binproto.encode_response({"x": data}, model_name="m")
    body = bytes(encoded)
    p = binproto.Parser("response", header_length=encoded.header_length)
    p.receive_data(body)
    chunk = next(e for e in p.events() if isinstance(e, binproto.TensorChunk))
    assert type(chunk) is binproto.TensorChunk and isinstance(chunk, binproto.Event)
    made = binproto.TensorChunk(index=0, name="x", offset=0, data=chunk.data)
    assert chunk == made
    assert [f.name for f in dataclasses.fields(chunk)] == ["index", "name", "offset", "data"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        chunk.offset = 1  # type: ignore[misc]
    # A new attribute fails as on any frozen slotted dataclass (the error's
    # type differs across Python versions).
    for event in (chunk, made):
        with pytest.raises((AttributeError, TypeError)):
            event.extra = 1  # type: ignore[attr-defined]
