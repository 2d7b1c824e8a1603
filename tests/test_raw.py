"""Raw binary requests (Inference-Header-Content-Length: 0) described by a TensorSpec."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable, Sequence

import numpy as np
import pytest

import binproto
from binproto import (
    HeaderParsed,
    LocalProtocolError,
    Parser,
    ParserState,
    RemoteProtocolError,
    TensorAssembler,
    TensorSpec,
)
from tests.helpers import arrays_equal, assert_same_everywhere, bytes_tensor, run

ARR = np.arange(12, dtype=np.float32)


def make(
    spec: TensorSpec | None,
    content_length: int | None,
    encoding: str | None = None,
    limits: binproto.Limits | None = None,
) -> Callable[[], Parser]:
    return lambda: Parser(
        "request",
        header_length=0,
        content_length=content_length,
        raw_input=spec,
        content_encoding=encoding,
        limits=limits,
    )


def header_of(
    spec: TensorSpec, body: bytes, content_length: int | None
) -> binproto.InferenceHeader:
    parser = make(spec, content_length)()
    parser.receive_data(body)
    event = parser.next_event()
    assert isinstance(event, HeaderParsed)
    return event.header


@pytest.mark.parametrize(
    ("shape", "batched", "expected"),
    [
        ([12], False, (12,)),
        ([3, 4], False, (3, 4)),
        ([-1], False, (12,)),
        ([3, -1], False, (3, 4)),
        ([-1, 12], True, (1, 12)),
        ([-1, -1], True, (1, 12)),
        ([-1, 2, -1], True, (1, 2, 6)),
        ([8, 12], True, (1, 12)),  # the batch dimension becomes 1 whatever metadata says
    ],
)
def test_shape_from_spec_and_body(
    shape: Sequence[int], batched: bool, expected: tuple[int, ...]
) -> None:
    spec = TensorSpec("x", "FP32", shape, batched=batched)
    body = ARR.tobytes()
    out = assert_same_everywhere(make(spec, len(body)), body)
    assert out.error is None
    header = header_of(spec, body, len(body))
    (info,) = header.tensors
    assert info.shape == expected and info.name == "x" and info.datatype == "FP32"
    assert info.binary_size == len(body)
    assert header.binary_data_output is True  # every output of a raw request is binary
    assert header.header_length == 0
    assert header.raw["inputs"][0]["shape"] == list(expected)
    msg = binproto.decode_request(body, header_length=0, raw_input=spec)
    assert arrays_equal(msg.tensors["x"], ARR.reshape(expected))


def test_fixed_shape_needs_no_content_length() -> None:
    spec = TensorSpec("x", "FP32", [3, 4])
    body = ARR.tobytes()
    assert run(make(spec, None), [body]) == run(make(spec, len(body)), [body])
    assert run(make(spec, None), [body]).error is None


def test_fixed_shape_short_and_long_bodies() -> None:
    spec = TensorSpec("x", "FP32", [3, 4])
    short = assert_same_everywhere(make(spec, None), ARR.tobytes()[:-4])
    assert short.error is not None and "expecting 4 additional bytes" in short.error[1]
    long = assert_same_everywhere(make(spec, None), ARR.tobytes() + b"\x00")
    assert long.error is not None and "additional" in long.error[1]
    assert long.error[3] == 48


def test_byte_size_mismatch_with_content_length() -> None:
    spec = TensorSpec("x", "FP32", [3, 4])
    body = ARR.tobytes()[:40]
    out = assert_same_everywhere(make(spec, len(body)), body)
    assert out.error == (
        "RemoteProtocolError",
        "input byte size mismatch for input 'x'. Expected 48, got 40",
        400,
        0,
    )


def test_variable_dimension_must_divide_the_body() -> None:
    spec = TensorSpec("x", "FP32", [-1, 4])
    body = ARR.tobytes()[:20]
    out = run(make(spec, len(body)), [body])
    assert out.error is not None
    assert "expecting a multiple of 16" in out.error[1] and out.error[2] == 400


def test_more_than_one_variable_dimension_is_triton_error() -> None:
    spec = TensorSpec("x", "FP32", [-1, -1])
    body = ARR.tobytes()
    out = assert_same_everywhere(make(spec, len(body)), body)
    assert out.error == (
        "RemoteProtocolError",
        "The shape of the raw input 'x' can not be deduced because there are more than one"
        " variable-sized dimension",
        400,
        0,
    )


def test_variable_dimension_without_content_length_is_local_error() -> None:
    spec = TensorSpec("x", "FP32", [-1])
    with pytest.raises(LocalProtocolError, match="pass content_length"):
        Parser("request", header_length=0, raw_input=spec)
    with pytest.raises(LocalProtocolError, match="pass content_length"):
        Parser("request", header_length=0, raw_input=spec, content_encoding="identity")


LENGTH_SHAPED = [TensorSpec("x", "FP32", [-1]), TensorSpec("t", "BYTES", [-1, 1], batched=True)]


@pytest.mark.parametrize("spec", LENGTH_SHAPED)
@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
@pytest.mark.parametrize("content_length", [16, None])
def test_compressed_body_of_a_length_shaped_raw_input_is_415_from_next_event(
    spec: TensorSpec, encoding: str, content_length: int | None
) -> None:
    # The combination comes from the peer's headers: the peer's fault, reported
    # by next_event as an unsupported coding is, not by the constructor.
    parser = make(spec, content_length, encoding)()
    parser.receive_data(zlib.compress(bytes(16)))
    with pytest.raises(RemoteProtocolError, match=f"which a {encoding} body does not give") as e:
        parser.next_event()
    assert e.value.status_hint == 415
    assert f"raw input '{spec.name}' takes its shape or size from the body's length" in e.value.msg
    assert parser.state is ParserState.ERROR
    headers = {"Inference-Header-Content-Length": "0", "Content-Encoding": encoding}
    built = binproto.parser_from_headers("request", headers, raw_input=spec)
    with pytest.raises(RemoteProtocolError) as e:
        built.next_event()
    assert e.value.status_hint == 415


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
@pytest.mark.parametrize(
    ("spec", "plain"),
    [
        (TensorSpec("x", "FP32", [-1, 3]), ARR.tobytes()),
        (TensorSpec("t", "BYTES", [-1, 1], batched=True), b"\x00\xffsome text" * 50),
        (TensorSpec("t", "BYTES", [1]), b""),
    ],
)
def test_decode_request_decompresses_a_length_shaped_raw_body_first(
    spec: TensorSpec, plain: bytes, encoding: str
) -> None:
    packed = b"".join(binproto.compress_buffers([plain], encoding))
    msg = binproto.decode_request(
        packed, header_length=0, raw_input=spec, content_encoding=encoding
    )
    expected = binproto.decode_request(plain, header_length=0, raw_input=spec)
    assert msg.header.tensors == expected.header.tensors
    assert arrays_equal(msg.tensors[spec.name], expected.tensors[spec.name])


def _decode_raw_gzip(body: bytes, limits: binproto.Limits | None = None) -> str:
    with pytest.raises(RemoteProtocolError) as e:
        binproto.decode_request(
            body,
            header_length=0,
            raw_input=TensorSpec("x", "UINT8", [-1]),
            content_encoding="gzip",
            limits=limits,
        )
    return f"{e.value.status_hint} {e.value}"


def _parse_fixed_gzip(body: bytes, size: int, limits: binproto.Limits | None = None) -> str:
    out = run(make(TensorSpec("x", "UINT8", [size]), len(body), "gzip", limits), [body])
    assert out.error is not None
    _, msg, status, offset = out.error
    return f"{status} {msg} (at byte {offset})"


def test_decode_request_inflates_a_raw_body_within_the_limits() -> None:
    # The same decompressor and limits as the streaming parser: the same faults.
    zeros = gzip.compress(bytes(3 << 20))
    capped = binproto.Limits(max_decompressed_bytes=2 << 20)
    assert _decode_raw_gzip(zeros, capped).startswith("413 the decompressed body exceeds")
    assert _decode_raw_gzip(zeros, capped) == _parse_fixed_gzip(zeros, 3 << 20, capped)
    by_ratio = binproto.Limits(max_decompression_ratio=10)
    assert "expands more than 10 times" in _decode_raw_gzip(zeros, by_ratio)
    assert _decode_raw_gzip(zeros, by_ratio) == _parse_fixed_gzip(zeros, 3 << 20, by_ratio)
    short = gzip.compress(b"abcdef")[:-3]
    assert _decode_raw_gzip(short).startswith("400 the compressed body ended before the end")
    assert _decode_raw_gzip(short) == _parse_fixed_gzip(short, 6)
    assert _decode_raw_gzip(b"").startswith("400 the compressed body ended")


def test_compressed_raw_request_with_fixed_shape() -> None:
    spec = TensorSpec("x", "FP32", [3, 4])
    body = gzip.compress(ARR.tobytes())
    out = assert_same_everywhere(make(spec, len(body), "gzip"), body)
    assert out == run(make(spec, 48), [ARR.tobytes()])
    msg = binproto.decode_request(body, header_length=0, raw_input=spec, content_encoding="gzip")
    assert arrays_equal(msg.tensors["x"], ARR.reshape(3, 4))


@pytest.mark.parametrize(
    ("shape", "batched", "expected"), [([1], False, (1,)), ([-1, 1], True, (1, 1))]
)
@pytest.mark.parametrize("element", [b"hello world", b"", b"\x00\xff" * 100])
def test_bytes_input_is_the_element_without_prefix(
    shape: list[int], batched: bool, expected: tuple[int, ...], element: bytes
) -> None:
    spec = TensorSpec("text", "BYTES", shape, batched=batched)
    out = assert_same_everywhere(make(spec, len(element)), element)
    assert out.error is None
    # Consumers see the usual BYTES framing: the prefix is emitted first.
    assert out.events[1] == ("tensor", 0, "text", bytes_tensor([element]))
    msg = binproto.decode_request(element, header_length=0, raw_input=spec)
    assert msg.tensors["text"].shape == expected
    assert msg.tensors["text"].ravel()[0] == element
    parser = make(spec, len(element))()
    parser.receive_data(element)
    assembler = TensorAssembler()
    for event in parser.events():
        assembler.feed(event)
    assert assembler.tensors["text"].ravel().tolist() == [element]


@pytest.mark.parametrize(("shape", "batched"), [([2], False), ([-1], False), ([1, 1], False)])
def test_bytes_input_must_have_shape_one(shape: list[int], batched: bool) -> None:
    spec = TensorSpec("text", "BYTES", shape, batched=batched)
    out = run(make(spec, 5), [b"hello"])
    assert out.error == (
        "RemoteProtocolError",
        "For BYTE datatype raw input, the model must have input shape [1]",
        400,
        0,
    )


def test_bytes_input_needs_content_length() -> None:
    with pytest.raises(LocalProtocolError):
        Parser("request", header_length=0, raw_input=TensorSpec("t", "BYTES", [1]))


def test_raw_bool_is_checked() -> None:
    spec = TensorSpec("b", "BOOL", [4])
    out = assert_same_everywhere(make(spec, 4), b"\x01\x00\x02\x01")
    assert out.error is not None and "invalid BOOL value 2" in out.error[1]
    assert out.error[3] == 2


def test_raw_limits() -> None:
    spec = TensorSpec("x", "UINT8", [-1])
    limits = binproto.Limits(max_tensor_bytes=10)
    out = run(make(spec, 11, limits=limits), [bytes(11)])
    assert out.error is not None and out.error[2] == 413
    limits = binproto.Limits(max_body_bytes=10)
    out = run(make(TensorSpec("x", "UINT8", [11]), None, limits=limits), [bytes(11)])
    assert out.error is not None and out.error[2] == 413


def test_header_length_zero_without_raw_input_is_rejected() -> None:
    out = run(make(None, 48), [ARR.tobytes()])
    assert out.error is not None and "raw binary requests" in out.error[1]


def test_raw_input_is_ignored_when_the_body_has_a_header() -> None:
    body = b'{"inputs":[{"name":"j","datatype":"INT32","shape":[1],"data":[5]}]}'
    spec = TensorSpec("x", "FP32", [-1])
    msg = binproto.decode_request(body, header_length=None, raw_input=spec)
    assert msg.tensors["j"].tolist() == [5]


def test_raw_input_is_for_requests_only() -> None:
    with pytest.raises(LocalProtocolError):
        Parser("response", header_length=0, raw_input=TensorSpec("x", "FP32", [1]))
    with pytest.raises(LocalProtocolError):
        Parser("request", header_length=0, raw_input=("x", "FP32", [1]))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (("x", "FP33", [1]), {}),
        (("x", "FP32", [-2]), {}),
        (("x", "FP32", [1.0]), {}),
        (("x", "FP32", [True]), {}),
        ((1, "FP32", [1]), {}),
        (("x", "FP32", []), {"batched": True}),
        # Not a shape, not a datatype name: refused, not a TypeError.
        (("x", "FP32", 5), {}),
        (("x", ["FP32"], [1]), {}),
        # Shapes numpy cannot make an array of, whatever the body (65 dimensions:
        # numpy has at most 64, 32 before numpy 2).
        (("x", "FP32", [1] * 64 + [-1]), {}),
        (("x", "FP32", [-1, 2**63]), {}),
        (("x", "FP32", [0, 2**63]), {}),
        (("x", "FP64", [8, 2**61, -1]), {"batched": True}),
    ],
)
def test_tensor_spec_validation(args: tuple[object, ...], kwargs: dict[str, object]) -> None:
    with pytest.raises(LocalProtocolError):
        TensorSpec(*args, **kwargs)  # type: ignore[arg-type]


def test_a_huge_batch_dimension_is_not_a_huge_spec() -> None:
    # A raw request's batch is 1, whatever the model's largest batch.
    body = np.arange(2, dtype=np.float32).tobytes()
    spec = TensorSpec("x", "FP32", [2**62, 2], batched=True)
    assert binproto.decode_request(body, header_length=0, raw_input=spec).tensors["x"].shape == (
        1,
        2,
    )


def test_tensor_spec_is_an_immutable_value() -> None:
    a = TensorSpec("x", "FP32", [-1, 3], batched=True)
    b = TensorSpec("x", "FP32", (-1, 3), True)
    assert a == b and hash(a) == hash(b) and a.shape == (-1, 3)
    assert a != TensorSpec("x", "FP32", [-1, 3])
    assert repr(a) == "TensorSpec('x', 'FP32', [-1, 3], batched=True)"
    assert a.request_shape == (1, 3)
    with pytest.raises(AttributeError):
        a.name = "y"


def test_raw_bytes_element_too_long_for_a_prefix() -> None:
    spec = TensorSpec("t", "BYTES", [1])
    parser = Parser("request", header_length=0, content_length=2**32, raw_input=spec)
    parser.receive_data(b"abc")
    with pytest.raises(binproto.RemoteProtocolError) as exc:
        parser.next_event()
    assert exc.value.status_hint == 413 and "4-byte length prefix" in exc.value.msg


def test_variable_dimension_next_to_a_zero_dimension_cannot_be_deduced() -> None:
    spec = TensorSpec("x", "FP32", [0, -1])
    out = run(make(spec, 0), [])
    assert out.error is not None and "its other dimensions hold no elements" in out.error[1]
