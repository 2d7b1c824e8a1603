"""Property-based fuzzing in the normal suite (bounded): generated valid and
invalid bodies, random bytes, in hypothesis-chosen chunkings."""

from __future__ import annotations

import gzip
import os
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

import binproto
from binproto.testing import (
    Body,
    chunkings,
    invalid_bodies,
    request_bodies,
    response_bodies,
    tensors,
)
from tests.helpers import run

# 200 examples per test in the suite; set BINPROTO_FUZZ_EXAMPLES for a longer run.
FUZZ = settings(
    max_examples=int(os.environ.get("BINPROTO_FUZZ_EXAMPLES", "200")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

VALID = st.one_of(
    request_bodies(encodings=(None, "gzip", "deflate")),
    response_bodies(encodings=(None, "gzip", "deflate")),
)


def decode(case: Body) -> binproto.DecodedMessage:
    fn = binproto.decode_request if case.kind == "request" else binproto.decode_response
    return fn(case.body, header_length=case.header_length, content_encoding=case.content_encoding)


@FUZZ
@given(case=VALID, data=st.data())
def test_valid_bodies_decode_the_same_in_any_chunking(case: Body, data: Any) -> None:
    assert case.tensors_equal(decode(case).tensors)
    known = data.draw(st.booleans())
    whole = run(lambda: case.parser(content_length=known), [case.body])
    assert whole.error is None
    chunks = data.draw(chunkings(case.body))
    assert run(lambda: case.parser(content_length=known), chunks) == whole
    # The assembler builds the same arrays from the chunked events.
    parser = case.parser(content_length=known)
    assembler = binproto.TensorAssembler()
    for chunk in chunks:
        parser.receive_data(chunk)
        for event in parser.events():
            assembler.feed(event)
    if parser.state is not binproto.ParserState.DONE:
        parser.receive_data(b"")
        for event in parser.events():
            assembler.feed(event)
    assert case.tensors_equal(assembler.tensors)


@FUZZ
@given(case=invalid_bodies(VALID), data=st.data())
def test_invalid_bodies_fail_the_same_in_any_chunking(case: Body, data: Any) -> None:
    known = data.draw(st.booleans())
    whole = run(lambda: case.parser(content_length=known), [case.body])
    assert whole.error is not None and whole.error[0] == "RemoteProtocolError", case.mutation
    chunks = data.draw(chunkings(case.body))
    assert run(lambda: case.parser(content_length=known), chunks) == whole
    # Whole-body decoding reports the same fault.
    if known:
        try:
            decode(case)
        except binproto.RemoteProtocolError as exc:
            assert (exc.msg, exc.offset) == (whole.error[1], whole.error[3]), case.mutation
        else:
            raise AssertionError(f"decode accepted an invalid body: {case.mutation}")


@FUZZ
@given(
    body=st.binary(max_size=300),
    kind=st.sampled_from(["request", "response"]),
    header_length=st.none() | st.integers(0, 320),
    compress=st.sampled_from([None, "gzip", "stream"]),
    known=st.booleans(),
    data=st.data(),
)
def test_random_bytes_only_raise_remote_errors(
    body: bytes,
    kind: binproto.Kind,
    header_length: int | None,
    compress: str | None,
    known: bool,
    data: Any,
) -> None:
    # "gzip" compresses the random body; "stream" takes it as the gzip stream.
    wire = gzip.compress(body) if compress == "gzip" else body

    def make() -> binproto.Parser:
        return binproto.Parser(
            kind,
            header_length=header_length,
            content_length=len(wire) if known else None,
            content_encoding="gzip" if compress else None,
        )

    whole = run(make, [wire])
    assert whole.error is None or whole.error[0] == "RemoteProtocolError"
    assert run(make, data.draw(chunkings(wire))) == whole


@FUZZ
@given(pair=tensors(), batched=st.booleans(), data=st.data())
def test_raw_requests_in_any_chunking(
    pair: tuple[str, np.ndarray[Any, Any]], batched: bool, data: Any
) -> None:
    datatype, arr = pair
    known = True
    if datatype == "BYTES":
        element = data.draw(st.binary(max_size=40))
        shape: tuple[int, ...] = (1,)
        body = element
        expected: np.ndarray[Any, Any] = np.empty(1, dtype=object)
        expected[:] = [element]
    else:
        shape = arr.shape
        body = arr.tobytes()
        expected = arr
        known = data.draw(st.booleans())
        if known and shape and all(shape) and data.draw(st.booleans()):
            at = data.draw(st.integers(0, len(shape) - 1))
            shape = (*shape[:at], -1, *shape[at + 1 :])  # deduced from the length
    spec_shape = (data.draw(st.integers(-1, 8)), *shape) if batched else shape
    spec = binproto.TensorSpec("raw", datatype, spec_shape, batched=batched)
    expected = expected.reshape((1, *expected.shape) if batched else expected.shape)

    def make() -> binproto.Parser:
        return binproto.Parser(
            "request", header_length=0, content_length=len(body) if known else None, raw_input=spec
        )

    whole = run(make, [body])
    assert whole.error is None, whole.error
    assert run(make, data.draw(chunkings(body))) == whole
    msg = binproto.decode_request(body, header_length=0, raw_input=spec)
    got = msg.tensors["raw"]
    assert got.shape == expected.shape
    if datatype == "BYTES":
        assert got.ravel().tolist() == expected.ravel().tolist()
    else:
        assert got.tobytes() == expected.tobytes()


TIGHT_LIMITS = st.builds(
    binproto.Limits,
    max_header_bytes=st.integers(0, 2000),
    max_tensors=st.integers(0, 5),
    max_tensor_bytes=st.integers(0, 300),
    max_body_bytes=st.integers(0, 3000),
    max_json_depth=st.integers(0, 6),
    max_decompressed_bytes=st.integers(0, 3000),
)


@FUZZ
@given(case=VALID, limits=TIGHT_LIMITS, data=st.data())
def test_limits_trip_the_same_in_any_chunking(
    case: Body, limits: binproto.Limits, data: Any
) -> None:
    known = data.draw(st.booleans())
    whole = run(lambda: case.parser(limits=limits, content_length=known), [case.body])
    assert whole.error is None or whole.error[0] == "RemoteProtocolError"
    chunks = data.draw(chunkings(case.body))
    assert run(lambda: case.parser(limits=limits, content_length=known), chunks) == whole


def test_a_mutated_header_length_is_never_zero() -> None:
    # Inference-Header-Content-Length 0 is a raw binary request, which a model
    # of one input may well accept: not an invalid body.
    header = b'{"inputs":[]}'
    base = Body("request", header, len(header), None, {}, {"inputs": []})
    with pytest.raises(NoSuchExample):
        find(
            invalid_bodies(st.just(base)),
            lambda case: case.header_length == 0,
            settings=settings(max_examples=500, database=None),
        )
