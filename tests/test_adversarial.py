"""Hostile and odd peers: absurd claims, deep or huge JSON, bad framing.

Every case must end in events or a RemoteProtocolError (never another
exception), the same for every chunking, and memory must follow what was
received, never what was claimed.
"""

from __future__ import annotations

import json
import random
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import binproto
from binproto import Limits, Parser, RemoteProtocolError
from tests.helpers import Outcome, assert_same_everywhere, bytes_tensor, make_body, run, split

MiB = 1024 * 1024


def request(
    hl: int | None, cl: int | None = None, limits: Limits | None = None
) -> Callable[[], Parser]:
    return lambda: Parser("request", header_length=hl, content_length=cl, limits=limits)


def one_input(**fields: Any) -> dict[str, Any]:
    tensor = {"name": "x", "datatype": "UINT8", "shape": [4]}
    tensor.update(fields)
    return {"inputs": [tensor]}


def sampled_chunkings(body: bytes, seed: int = 0) -> Iterator[list[bytes]]:
    """Whole, small pieces, and random splits: for bodies too big for every split."""
    yield [body]
    yield [body[i : i + 3] for i in range(0, len(body), 3)]
    rng = random.Random(seed)
    for _ in range(5):
        yield split(body, [rng.randrange(len(body)) for _ in range(rng.randrange(1, 40))])


def same_everywhere_sampled(make: Callable[[], Parser], body: bytes) -> Outcome:
    outcomes = {run(make, chunks) for chunks in sampled_chunkings(body)}
    assert len(outcomes) == 1, outcomes
    return outcomes.pop()


@contextmanager
def peak_memory() -> Iterator[list[int]]:
    """Measure the peak of Python allocations inside the block (into ``box[0]``)."""
    box = [0]
    tracemalloc.start()
    try:
        yield box
        box[0] = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def error_of(out: Outcome) -> tuple[str, str, int, int | None]:
    assert out.error is not None, out
    assert out.error[0] == "RemoteProtocolError"
    return out.error


# -- absurd claims -------------------------------------------------------------


def test_header_length_claim_of_2_62() -> None:
    with peak_memory() as peak:
        parser = Parser("request", header_length=2**62)
        parser.receive_data(b'{"inputs": []}')
        with pytest.raises(RemoteProtocolError) as exc:
            parser.next_event()
    assert exc.value.status_hint == 413 and exc.value.offset == 0
    assert peak[0] < 256 * 1024
    with pytest.raises(RemoteProtocolError) as exc:
        binproto.header_length_from({"Inference-Header-Content-Length": str(2**62)})
    assert exc.value.status_hint == 413


def test_content_length_claim_of_2_62() -> None:
    out = run(request(10, 2**62), [b"{}"])
    assert error_of(out)[2] == 413


def test_binary_data_size_claim_of_2_62_over_the_limit() -> None:
    body, hl = make_body(one_input(shape=[2**62], parameters={"binary_data_size": 2**62}))
    _, msg, status, offset = error_of(assert_same_everywhere(request(hl), body))
    assert status == 413 and "exceeds the limit" in msg and offset == 0


def test_binary_data_size_claim_of_2_62_within_limits_allocates_nothing() -> None:
    limits = Limits(max_tensor_bytes=2**63, max_body_bytes=2**63)
    body, hl = make_body(
        one_input(shape=[2**62], parameters={"binary_data_size": 2**62}), b"\x07" * 100
    )
    with peak_memory() as peak:
        out = run(request(hl, limits=limits), [body[i : i + 10] for i in range(0, len(body), 10)])
    _, msg, _, offset = error_of(out)
    assert f"expecting {2**62 - 100} additional bytes" in msg and offset == len(body)
    assert peak[0] < 512 * 1024  # nothing sized by the claim


def test_shape_whose_element_count_overflows() -> None:
    body, hl = make_body(
        one_input(datatype="FP64", shape=[2**32, 2**32, 2**32], parameters={"binary_data_size": 8})
    )
    _, msg, status, _ = error_of(assert_same_everywhere(request(hl), body))
    assert status == 400 and "unexpected total byte size 8" in msg


def test_sizes_that_exceed_content_length_are_rejected_before_waiting() -> None:
    body, hl = make_body(one_input(shape=[2**30], parameters={"binary_data_size": 2**30}))
    out = assert_same_everywhere(request(hl, len(body) + 10), body + bytes(10))
    _, msg, status, offset = error_of(out)
    assert "more than the 10 left in the body" in msg and offset == hl and status == 400


# -- many tensors ---------------------------------------------------------------


def many_tensors(n: int) -> tuple[bytes, int]:
    header = {
        "inputs": [
            {
                "name": f"t{i}",
                "datatype": "UINT8",
                "shape": [1],
                "parameters": {"binary_data_size": 1},
            }
            for i in range(n)
        ]
    }
    return make_body(header, bytes(n))


def test_thousands_of_tensors_at_the_limit() -> None:
    body, hl = many_tensors(4096)
    out = same_everywhere_sampled(request(hl), body)
    assert out.error is None
    assert len([e for e in out.events if e[0] == "tensor"]) == 4096


def test_thousands_of_tensors_over_the_limit() -> None:
    body, hl = many_tensors(4097)
    _, msg, status, offset = error_of(same_everywhere_sampled(request(hl), body))
    assert status == 413 and "4097 inputs exceed the limit of 4096" in msg and offset == 0


def test_thousands_of_requested_outputs_over_the_limit() -> None:
    header = one_input(data=[1, 2, 3, 4])
    header["outputs"] = [{"name": f"o{i}"} for i in range(5000)]
    body = json.dumps(header).encode()
    _, msg, status, _ = error_of(run(request(None), [body]))
    assert status == 413 and "5000 requested outputs" in msg


# -- deep and large JSON ---------------------------------------------------------


def deep_body(depth: int) -> bytes:
    nested = "[" * depth + "]" * depth
    return ('{"inputs": [], "parameters": {"deep": ' + nested + "}}").encode()


def test_json_nested_10000_deep() -> None:
    body = deep_body(10_000)
    out = same_everywhere_sampled(request(len(body)), body)
    _, msg, status, offset = error_of(out)
    assert status == 400 and "deeper than the limit of 100" in msg and offset == 0
    assert run(request(len(body)), [body[i : i + 1] for i in range(len(body))]) == out


def test_json_nested_10000_deep_with_the_depth_limit_lifted() -> None:
    # Python's own JSON recursion limit still stops it: as a protocol error.
    body = deep_body(100_000)
    out = run(request(len(body), limits=Limits(max_json_depth=10**6)), [body])
    assert error_of(out)[2] == 400


def big_header(size: int) -> bytes:
    """A valid request header of exactly ``size`` bytes (one long id)."""
    empty = json.dumps({"id": "", "inputs": []}).encode()
    return json.dumps({"id": "a" * (size - len(empty)), "inputs": []}).encode()


@pytest.mark.slow
@pytest.mark.parametrize("known", [True, False])
def test_64_mib_header_in_64_kib_chunks_stays_linear(known: bool) -> None:
    size = 64 * MiB - 1
    header = big_header(size)
    hl = len(header) if known else None
    view = memoryview(header)
    with peak_memory() as peak:
        parser = Parser("request", header_length=hl)
        events: list[binproto.Event] = []
        for start in range(0, size, 65536):
            parser.receive_data(view[start : start + 65536])
            events.extend(parser.events())
        parser.receive_data(b"")
        events.extend(parser.events())
    assert isinstance(events[0], binproto.HeaderParsed)
    assert isinstance(events[-1], binproto.MessageComplete)
    # The buffer, then its bytes copy, the decoded text and the parsed string:
    # a few times the size, never a sum over the chunks.
    assert peak[0] < 3.5 * size, peak[0] / size


def test_json_header_over_the_limit_without_a_known_length() -> None:
    header = big_header(5000)
    limits = Limits(max_header_bytes=4096)
    out = same_everywhere_sampled(request(None, limits=limits), header)
    _, msg, status, offset = error_of(out)
    assert status == 413 and offset == 4096 and "exceeds the header limit of 4096" in msg


# -- framing ------------------------------------------------------------------


def test_bytes_length_prefix_past_the_end() -> None:
    tensor = (3).to_bytes(4, "little") + b"abc" + (100).to_bytes(4, "little") + b"xy"
    body, hl = make_body(
        one_input(datatype="BYTES", shape=[2], parameters={"binary_data_size": len(tensor)}),
        tensor,
    )
    _, msg, status, offset = error_of(assert_same_everywhere(request(hl), body))
    assert "claims 100 bytes but only 2 remain" in msg
    assert offset == hl + 7 and status == 400


def test_bytes_prefix_cut_by_the_end_of_the_tensor() -> None:
    tensor = bytes_tensor([b"abc"]) + b"\x01\x00"
    body, hl = make_body(
        one_input(datatype="BYTES", shape=[2], parameters={"binary_data_size": len(tensor)}),
        tensor,
    )
    _, msg, _, _ = error_of(assert_same_everywhere(request(hl), body))
    assert "partial length prefix" in msg


@pytest.mark.parametrize("size", [-1, -(2**63), 4.0, 1e3, True, False, "4", None, [4], {"n": 4}])
def test_bad_binary_data_size(size: Any) -> None:
    body, hl = make_body(one_input(parameters={"binary_data_size": size}), bytes(4))
    _, msg, status, offset = error_of(assert_same_everywhere(request(hl), body))
    assert status == 400 and "binary_data_size" in msg and offset == 0


@pytest.mark.parametrize(
    "shape",
    [[-1], [2, -2], [4.0], [2.5], [True], [False, 4], ["4"], [None], 4, None, [2**64], [[4]]],
)
def test_bad_dims(shape: Any) -> None:
    body, hl = make_body(one_input(shape=shape, parameters={"binary_data_size": 4}), bytes(4))
    _, msg, status, offset = error_of(assert_same_everywhere(request(hl), body))
    assert status == 400 and "shape" in msg and offset == 0


# Shapes numpy cannot describe: a zero dimension beside dimensions whose
# product overflows, or more dimensions than numpy allows.
UNDESCRIBABLE = {
    "zero beside 2**63": [0, 2**63],
    "zero beside an overflowing product": [0, 2**62, 2**62],
    "zero beside 2**64-1": [0, 2**64 - 1],
    "zero beside 2**63 bytes": [0, 2**60],  # 8-byte elements
    "65 dimensions": [1] * 65,
}


@pytest.mark.parametrize("shape", list(UNDESCRIBABLE.values()), ids=list(UNDESCRIBABLE))
@pytest.mark.parametrize("as_json", [False, True], ids=["binary", "json-data"])
def test_shapes_numpy_cannot_describe(shape: list[int], as_json: bool) -> None:
    size = 8 if min(shape) else 0
    if as_json:
        header = one_input(datatype="INT64", shape=shape, data=[7] * (size // 8))
    else:
        header = one_input(datatype="INT64", shape=shape, parameters={"binary_data_size": size})
    body, hl = make_body(header, bytes(0 if as_json else size))
    _, msg, status, offset = error_of(assert_same_everywhere(request(hl), body))
    assert status == 400 and offset == 0
    assert ("dimensions" in msg) if len(shape) > 64 else ("too large" in msg)
    with pytest.raises(RemoteProtocolError):
        binproto.decode_request(body, header_length=hl)


def test_the_largest_describable_zero_size_shape_is_accepted() -> None:
    shape = [0, 2**60 - 1]  # 8-byte elements: just under numpy's limit (2**63 - 1 bytes)
    body, hl = make_body(
        one_input(datatype="INT64", shape=shape, parameters={"binary_data_size": 0})
    )
    out = assert_same_everywhere(request(hl), body)
    assert out.error is None
    assert binproto.decode_request(body, header_length=hl).tensors["x"].shape == (0, 2**60 - 1)


def test_a_tensor_larger_than_numpy_can_describe_is_refused_whatever_the_limit() -> None:
    limits = Limits(max_tensor_bytes=2**70, max_body_bytes=2**71)
    body, hl = make_body(one_input(shape=[2**63], parameters={"binary_data_size": 2**63}))
    out = assert_same_everywhere(request(hl, limits=limits), body)
    _, msg, status, _ = error_of(out)
    assert status == 413 and f"exceeds the limit of {2**63 - 1} bytes" in msg


def test_any_exception_inside_next_event_leaves_the_parser_in_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import binproto._readers as parser_module

    def broken(*args: Any) -> Any:
        raise ValueError("a fault outside the protocol checks")

    monkeypatch.setattr(parser_module, "build_header", broken)
    body, hl = make_body(one_input())
    p = request(hl)()
    p.receive_data(body)
    with pytest.raises(ValueError):
        p.next_event()
    assert p.state is binproto.ParserState.ERROR
    with pytest.raises(binproto.LocalProtocolError):
        p.next_event()


@pytest.mark.parametrize("role", ["inputs", "outputs"])
def test_duplicate_tensor_names(role: str) -> None:
    tensor = {"name": "x", "datatype": "INT8", "shape": [1], "data": [1]}
    body = json.dumps({role: [tensor, dict(tensor)]}).encode()
    kind: binproto.Kind = "request" if role == "inputs" else "response"
    out = assert_same_everywhere(lambda: Parser(kind, header_length=len(body)), body)
    _, msg, status, _ = error_of(out)
    assert f"duplicate {role[:-1]} name 'x'" in msg and status == 400


def test_duplicate_requested_output_names() -> None:
    header = one_input(data=[1, 2, 3, 4])
    header["outputs"] = [{"name": "o"}, {"name": "o"}]
    body = json.dumps(header).encode()
    assert "duplicate requested output name 'o'" in error_of(run(request(None), [body]))[1]


def test_escaped_nul_in_a_name_is_accepted() -> None:
    body, hl = make_body(one_input(name="a\u0000b", parameters={"binary_data_size": 4}), b"abcd")
    out = assert_same_everywhere(request(hl), body)
    assert out.error is None
    assert out.events[1] == ("tensor", 0, "a\x00b", b"abcd")
    msg = binproto.decode_request(body, header_length=hl)
    assert bytes(msg.tensors["a\x00b"]) == b"abcd"


def test_raw_nul_byte_in_the_json_is_rejected() -> None:
    body = b'{"inputs": [{"name": "a\x00b", "datatype": "UINT8", "shape": [0], "data": []}]}'
    _, msg, status, offset = error_of(assert_same_everywhere(request(len(body)), body))
    assert status == 400 and offset == body.index(b"\x00")
    assert "failed to parse the request JSON buffer" in msg


@pytest.mark.parametrize("bad", [b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82"])
def test_invalid_utf8_in_the_json_header(bad: bytes) -> None:
    body = b'{"id": "ok' + bad + b'", "inputs": []}'
    _, msg, status, offset = error_of(assert_same_everywhere(request(len(body)), body))
    assert status == 400 and "invalid UTF-8" in msg and offset == 10


def test_lone_surrogate_escape_in_a_name_never_crashes() -> None:
    body, hl = make_body(one_input(parameters={"binary_data_size": 4}), b"abcd")
    body = body.replace(b'"x"', b'"\\ud800"')
    hl += len(b'"\\ud800"') - len(b'"x"')
    _, msg, status, offset = error_of(assert_same_everywhere(request(hl), body))
    assert status == 400 and offset == body.index(b"\\ud800")
    assert "The surrogate pair in string is invalid" in msg


def test_data_after_the_end_of_the_body() -> None:
    body, hl = make_body(one_input(parameters={"binary_data_size": 4}), b"abcd")
    out = assert_same_everywhere(request(hl), body + b"!")
    _, msg, status, offset = error_of(out)
    assert "unexpected additional input data after the end of the message" in msg
    assert offset == len(body) and status == 400
    # Once the message is complete, any later byte is an error too.
    parser = Parser("request", header_length=hl, content_length=len(body))
    parser.receive_data(body)
    assert isinstance(list(parser.events())[-1], binproto.MessageComplete)
    with pytest.raises(RemoteProtocolError, match="after the end of the message"):
        parser.receive_data(b"!")
    assert parser.state is binproto.ParserState.ERROR


def test_data_after_the_end_with_content_length() -> None:
    body, hl = make_body(one_input(parameters={"binary_data_size": 4}), b"abcd")
    out = run(request(hl, len(body) + 1), [body + b"!"])
    assert "beyond the 4 bytes of binary data" in error_of(out)[1]
