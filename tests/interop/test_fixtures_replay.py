"""Replay the bodies captured from real peers (tests/fixtures/) under every chunking.

Each fixture is parsed whole, one byte at a time, at every two-way split, and at
hypothesis-chosen splits, with Content-Length known and with the end of input as
the only framing (chunked transfer). Every chunking must give the fixture's
expected outcome: its tensors, or its error message, byte offset and status.
``tests/fixtures/capture.py`` made the fixtures and documents their format.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import binproto

from ..helpers import arrays_equal, split

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NAMES = sorted(p.stem for p in FIXTURES.glob("*.json"))
FRAMINGS = ("content-length", "end-of-input")


@dataclass(frozen=True)
class Fixture:
    name: str
    body: bytes
    meta: dict[str, Any]

    @property
    def header_length(self) -> int | None:
        value = self.meta["headers"].get("Inference-Header-Content-Length")
        return None if value is None else int(value)

    @property
    def content_encoding(self) -> str | None:
        value: str | None = self.meta["headers"].get("Content-Encoding")
        return value

    def parser(self, framing: str) -> binproto.Parser:
        kwargs: dict[str, Any] = {}
        if self.content_encoding is not None:
            kwargs["content_encoding"] = self.content_encoding
        return binproto.Parser(
            self.meta["kind"],
            header_length=self.header_length,
            content_length=len(self.body) if framing == "content-length" else None,
            **kwargs,
        )


def load(name: str) -> Fixture:
    meta = json.loads((FIXTURES / f"{name}.json").read_text())
    return Fixture(name, (FIXTURES / f"{name}.body").read_bytes(), meta)


def fixture_or_skip(name: str) -> Fixture:
    fx = load(name)
    if fx.content_encoding is not None and (
        "content_encoding" not in inspect.signature(binproto.Parser).parameters
    ):
        pytest.skip("binproto.Parser does not take content_encoding= yet")
    return fx


@dataclass(frozen=True)
class Result:
    header: binproto.InferenceHeader | None
    tensors: dict[str, np.ndarray[Any, Any]]
    error: binproto.RemoteProtocolError | None


def parse(fx: Fixture, framing: str, chunks: Sequence[bytes]) -> Result:
    """Feed ``chunks``, assemble every tensor, and report the outcome."""
    parser = fx.parser(framing)
    asm = binproto.TensorAssembler()
    done = False
    try:
        for chunk in chunks:
            parser.receive_data(chunk)
            for event in parser.events():
                asm.feed(event)
                done = isinstance(event, binproto.MessageComplete)
        if framing == "end-of-input":
            parser.receive_data(b"")
            for event in parser.events():
                asm.feed(event)
                done = isinstance(event, binproto.MessageComplete)
    except binproto.RemoteProtocolError as exc:
        return Result(asm.header, asm.tensors, exc)
    assert done, "the whole body was given: the message must be complete"
    return Result(asm.header, asm.tensors, None)


def expected_array(spec: dict[str, Any]) -> np.ndarray[Any, Any]:
    datatype = spec["datatype"]
    data = spec["data"]
    if datatype == "BYTES":
        arr = np.empty(len(data), dtype=np.object_)
        arr[:] = [bytes.fromhex(x) for x in data]
    elif datatype in ("FP16", "FP32", "FP64", "BF16"):
        arr = np.array([float(x) for x in data], dtype=np.float64)
        arr = arr.astype(binproto.DATATYPES[datatype].dtype)
    else:
        arr = np.array(data, dtype=binproto.DATATYPES[datatype].dtype)
    shaped: np.ndarray[Any, Any] = arr.reshape(spec["shape"])
    return shaped


def check(fx: Fixture, framing: str, result: Result) -> None:
    expected = fx.meta["expected"]
    if "errors" in expected:
        want = expected["errors"][framing]
        assert result.error is not None, f"{fx.name}: expected an error"
        assert want["message"] in result.error.msg
        assert result.error.offset == want["offset"]
        assert result.error.status_hint == want["status"]
        return
    assert result.error is None, f"{fx.name}: {result.error!r}"
    header = result.header
    assert header is not None
    tensors = expected["tensors"]
    assert list(result.tensors) == list(tensors)
    for name, spec in tensors.items():
        got = result.tensors[name]
        assert header.tensor(name).datatype == spec["datatype"]
        assert got.dtype == binproto.DATATYPES[spec["datatype"]].dtype, name
        assert arrays_equal(got, expected_array(spec)), name
    fields = expected.get("header", {})
    if "id" in fields:
        assert header.id == fields["id"]
    if "model_name" in fields:
        assert header.model_name == fields["model_name"]
    if "binary_data_output" in fields:
        assert header.binary_data_output == fields["binary_data_output"]
    if "parameters" in fields:
        for key, value in fields["parameters"].items():
            assert header.parameters[key] == value
    if "requested_outputs" in fields:
        assert header.requested_outputs is not None
        got_outputs = [[o.name, o.binary_data] for o in header.requested_outputs]
        assert got_outputs == fields["requested_outputs"]


def test_fixtures_exist_and_are_small() -> None:
    assert len(NAMES) >= 15
    for name in NAMES:
        assert (FIXTURES / f"{name}.body").exists(), name
    assert sum((FIXTURES / f"{n}.body").stat().st_size for n in NAMES) < 200_000


@pytest.mark.parametrize("framing", FRAMINGS)
@pytest.mark.parametrize("name", NAMES)
def test_whole_and_byte_by_byte(name: str, framing: str) -> None:
    fx = fixture_or_skip(name)
    check(fx, framing, parse(fx, framing, [fx.body]))
    check(fx, framing, parse(fx, framing, [fx.body[i : i + 1] for i in range(len(fx.body))]))


@pytest.mark.parametrize("name", NAMES)
def test_every_two_way_split(name: str) -> None:
    fx = fixture_or_skip(name)
    framing = "content-length" if len(fx.body) > 600 else None
    for i in range(1, len(fx.body)):
        chunks = [fx.body[:i], fx.body[i:]]
        for f in (framing,) if framing else FRAMINGS:
            check(fx, f, parse(fx, f, chunks))


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_hypothesis_splits(data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(NAMES))
    fx = load(name)
    if fx.content_encoding is not None and (
        "content_encoding" not in inspect.signature(binproto.Parser).parameters
    ):
        return
    framing = data.draw(st.sampled_from(FRAMINGS))
    points = data.draw(st.lists(st.integers(0, len(fx.body)), max_size=20))
    check(fx, framing, parse(fx, framing, split(fx.body, points)))
