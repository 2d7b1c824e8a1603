"""Compressed bodies: gzip and deflate decompressed inside the parser, bounded."""

from __future__ import annotations

import gzip
import json
import random
import tracemalloc
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import binproto
from binproto import LocalProtocolError, Parser, RemoteProtocolError, TensorChunk
from binproto._compression import BLOCK, RATIO_FLOOR, STEP
from tests.helpers import (
    Outcome,
    arrays_equal,
    assert_same_everywhere,
    bytes_tensor,
    make_body,
    run,
    split,
)

ARR = np.arange(12, dtype=np.float32).reshape(3, 4)
REQUEST, REQUEST_HL = make_body(
    {
        "inputs": [
            {
                "name": "a",
                "datatype": "FP32",
                "shape": [3, 4],
                "parameters": {"binary_data_size": 48},
            },
            {
                "name": "s",
                "datatype": "BYTES",
                "shape": [2],
                "parameters": {"binary_data_size": 14},
            },
            {"name": "j", "datatype": "INT32", "shape": [2], "data": [7, 8]},
        ]
    },
    ARR.tobytes(),
    bytes_tensor([b"hello", b"x"]),
)
RESPONSE, RESPONSE_HL = make_body(
    {
        "model_name": "m",
        "outputs": [
            {"name": "o", "datatype": "UINT8", "shape": [5], "parameters": {"binary_data_size": 5}}
        ],
    },
    b"\x01\x02\x03\x04\x05",
)


def uint8_request(data: bytes, name: str, *, size: int | None = None) -> tuple[bytes, int]:
    """A request of one UINT8 input ``name`` of ``size`` bytes (default
    ``len(data)``) followed by ``data``: (body, header_length)."""
    n = len(data) if size is None else size
    header = {"inputs": [{"name": name, "datatype": "UINT8", "shape": [n],
                          "parameters": {"binary_data_size": n}}]}  # fmt: skip
    return make_body(header, data)


def raw_deflate(data: bytes, level: int = 6) -> bytes:
    comp = zlib.compressobj(level, zlib.DEFLATED, -15)
    return comp.compress(data) + comp.flush()


COMPRESSORS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.compress,
    "deflate": zlib.compress,  # zlib-wrapped: what tritonclient sends as deflate
    "raw-deflate": raw_deflate,  # what some other peers send as deflate
}


def wire_name(how: str) -> str:
    return "deflate" if how == "raw-deflate" else how


def make(
    kind: binproto.Kind,
    hl: int | None,
    encoding: str | None,
    content_length: int | None = None,
    limits: binproto.Limits | None = None,
) -> Callable[[], Parser]:
    return lambda: Parser(
        kind,
        header_length=hl,
        content_length=content_length,
        content_encoding=encoding,
        limits=limits,
    )


@pytest.mark.parametrize("how", sorted(COMPRESSORS))
@pytest.mark.parametrize("known", [False, True])
@pytest.mark.parametrize(
    ("kind", "plain", "hl"),
    [("request", REQUEST, REQUEST_HL), ("response", RESPONSE, RESPONSE_HL)],
)
def test_compressed_body_gives_the_plain_events_in_every_chunking(
    how: str, known: bool, kind: binproto.Kind, plain: bytes, hl: int
) -> None:
    body = COMPRESSORS[how](plain)
    expected = assert_same_everywhere(make(kind, hl, None, len(plain)), plain)
    assert expected.error is None
    cl = len(body) if known else None
    got = assert_same_everywhere(make(kind, hl, wire_name(how), cl), body)
    assert got == expected


@pytest.mark.parametrize("encoding", ["identity", "IDENTITY", None])
def test_identity_is_no_encoding(encoding: str | None) -> None:
    parser = Parser("request", header_length=REQUEST_HL, content_encoding=encoding)
    assert parser.content_encoding is None
    assert run(make("request", REQUEST_HL, encoding), [REQUEST]).error is None


@pytest.mark.parametrize("name", ["GZIP", "x-gzip", " gzip "])
def test_encoding_names_are_case_insensitive(name: str) -> None:
    body = gzip.compress(REQUEST)
    assert run(make("request", REQUEST_HL, name), [body]).error is None


@pytest.mark.parametrize("how", sorted(COMPRESSORS))
def test_decode_with_content_encoding(how: str) -> None:
    body = COMPRESSORS[how](REQUEST)
    msg = binproto.decode_request(body, header_length=REQUEST_HL, content_encoding=wire_name(how))
    assert arrays_equal(msg.tensors["a"], ARR)
    assert list(msg.tensors["s"]) == [b"hello", b"x"]
    assert arrays_equal(msg.tensors["j"], np.array([7, 8], dtype=np.int32))
    resp = binproto.decode_response(
        COMPRESSORS[how](RESPONSE), header_length=RESPONSE_HL, content_encoding=wire_name(how)
    )
    assert resp.tensors["o"].tolist() == [1, 2, 3, 4, 5]


def test_chunks_are_views_of_bounded_decompressed_output() -> None:
    data = np.random.default_rng(0).integers(0, 4, size=3 * STEP, dtype=np.uint8)
    plain, hl = uint8_request(data.tobytes(), "x")
    parser = Parser("request", header_length=hl, content_encoding="gzip")
    parser.receive_data(gzip.compress(plain))
    parser.receive_data(b"")
    sizes = []
    got = bytearray()
    for ev in parser.events():
        if isinstance(ev, TensorChunk):
            assert isinstance(ev.data, memoryview)
            sizes.append(len(ev.data))
            got += ev.data
    assert bytes(got) == data.tobytes()
    assert len(sizes) > 3 and max(sizes) <= STEP


def test_unknown_encoding_is_415_from_next_event() -> None:
    parser = Parser("request", header_length=REQUEST_HL, content_encoding="br")
    parser.receive_data(REQUEST)  # receive_data only buffers
    with pytest.raises(RemoteProtocolError) as exc:
        parser.next_event()
    assert exc.value.status_hint == 415
    assert "gzip, deflate" in exc.value.msg and "'br'" in exc.value.msg
    assert parser.state is binproto.ParserState.ERROR
    with pytest.raises(RemoteProtocolError, match="unsupported Content-Encoding 'zstd'"):
        binproto.decode_request(REQUEST, header_length=REQUEST_HL, content_encoding="zstd")


def test_content_encoding_must_be_a_string() -> None:
    with pytest.raises(LocalProtocolError):
        Parser("request", content_encoding=b"gzip")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, None),
        ({"Content-Encoding": "identity"}, None),
        ({"content-encoding": "GZIP"}, "gzip"),
        ([(b"Content-Encoding", b"deflate")], "deflate"),
        ([("CONTENT-ENCODING", "x-gzip")], "gzip"),
        ({"Content-Encoding": "gzip, identity"}, "gzip"),
        ({"Content-Encoding": "identity, deflate"}, "deflate"),
    ],
)
def test_content_encoding_from(headers: Any, expected: str | None) -> None:
    assert binproto.content_encoding_from(headers) == expected


@pytest.mark.parametrize("value", ["br", "zstd", "gzip, deflate", "compress"])
def test_content_encoding_from_rejects_unsupported(value: str) -> None:
    with pytest.raises(RemoteProtocolError) as exc:
        binproto.content_encoding_from({"Content-Encoding": value})
    assert exc.value.status_hint == 415
    assert "supported are gzip, deflate" in exc.value.msg


# -- corrupt, truncated and trailing data -----------------------------------------


def outcome_everywhere(
    body: bytes, encoding: str, *, known: bool = False, limits: binproto.Limits | None = None
) -> tuple[str, str, int, int | None]:
    cl = len(body) if known else None
    out = assert_same_everywhere(make("request", REQUEST_HL, encoding, cl, limits), body)
    assert out.error is not None
    return out.error


@pytest.mark.parametrize("known", [False, True])
@pytest.mark.parametrize("how", sorted(COMPRESSORS))
def test_truncated_stream(how: str, known: bool) -> None:
    body = COMPRESSORS[how](REQUEST)
    kind, msg, status, offset = outcome_everywhere(body[:-5], wire_name(how), known=known)
    assert (kind, status) == ("RemoteProtocolError", 400)
    assert "ended before the end of its" in msg
    assert offset is not None


@pytest.mark.parametrize("known", [False, True])
@pytest.mark.parametrize("how", sorted(COMPRESSORS))
def test_data_after_the_stream(how: str, known: bool) -> None:
    body = COMPRESSORS[how](REQUEST) + b"\x00junk"
    _, msg, status, offset = outcome_everywhere(body, wire_name(how), known=known)
    assert "after the end of the" in msg and status == 400
    assert offset == len(REQUEST)


@pytest.mark.parametrize("how", sorted(COMPRESSORS))
def test_bytes_past_content_length_fail_alike_in_every_chunking(how: str) -> None:
    # Whether they come with the stream's last bytes or on their own, they
    # are past the body's end: the message an uncompressed body gets.
    body = COMPRESSORS[how](REQUEST)
    out = assert_same_everywhere(
        make("request", REQUEST_HL, wire_name(how), len(body)), body + b"xx"
    )
    assert out.error is not None
    assert out.error[1].startswith("unexpected additional input data after the end of the message")


def test_stream_ending_before_content_length() -> None:
    body = gzip.compress(REQUEST)
    # Content-Length says 3 more bytes than the stream has: an error even if
    # those bytes never arrive.
    out = run(make("request", REQUEST_HL, "gzip", len(body) + 3), [body], end=True)
    assert out.error is not None and "after the end of the gzip stream" in out.error[1]


def test_second_gzip_member_is_rejected() -> None:
    body = gzip.compress(REQUEST) + gzip.compress(b"")
    _, msg, _, _ = outcome_everywhere(body, "gzip")
    assert "after the end of the gzip stream" in msg


@pytest.mark.parametrize("how", sorted(COMPRESSORS))
def test_corrupt_streams_fail_the_same_way_in_every_chunking(how: str) -> None:
    body = COMPRESSORS[how](REQUEST)
    rng = random.Random(1)
    for _ in range(12):
        bad = bytearray(body)
        at = rng.randrange(len(bad))
        bad[at] ^= 1 << rng.randrange(8)
        out = assert_same_everywhere(
            make("request", REQUEST_HL, wire_name(how)), bytes(bad), two_way_limit=0
        )
        # A flipped bit may still decode (e.g. inside a stored length); when it
        # fails, it is a RemoteProtocolError with an offset.
        if out.error is not None:
            assert out.error[0] == "RemoteProtocolError" and out.error[3] is not None


def test_corrupt_data_error_has_offset_of_good_output() -> None:
    # The decompressed bytes before the corrupt byte are handed out, and the
    # error offset says how many: the same for every chunking.
    data = np.random.default_rng(2).integers(0, 256, size=BLOCK * 2, dtype=np.uint8)
    plain, hl = uint8_request(data.tobytes(), "x")
    body = bytearray(zlib.compress(plain, 6))
    body[BLOCK + 100 :] = b"\xff" * (len(body) - BLOCK - 100)
    reference = run(make("request", hl, "deflate"), [bytes(body)])
    assert reference.error is not None
    _, msg, status, offset = reference.error
    assert "invalid deflate data" in msg and status == 400
    assert offset is not None and 0 < offset < len(plain)
    rng = random.Random(3)
    for _ in range(5):
        cuts = [rng.randrange(len(body)) for _ in range(20)]
        assert run(make("request", hl, "deflate"), split(bytes(body), cuts)) == reference


def test_empty_compressed_body_is_truncated() -> None:
    out = run(make("request", REQUEST_HL, "gzip"), [])
    assert out.error is not None and "ended before the end of its gzip stream" in out.error[1]


def test_zlib_header_sniffing_accepts_both_deflate_forms() -> None:
    for body in (zlib.compress(REQUEST), raw_deflate(REQUEST)):
        msg = binproto.decode_request(body, header_length=REQUEST_HL, content_encoding="deflate")
        assert arrays_equal(msg.tensors["a"], ARR)


# -- limits ---------------------------------------------------------------------


def zeros_header(n: int) -> bytes:
    """The JSON header of a request whose one UINT8 tensor has ``n`` bytes."""
    return uint8_request(b"", "z", size=n)[0]


def zeros_body(n: int) -> tuple[bytes, int]:
    """A request whose one UINT8 tensor is ``n`` zero bytes."""
    header = zeros_header(n)
    return header + bytes(n), len(header)


def chunkings_of(body: bytes, seed: int) -> list[list[bytes]]:
    rng = random.Random(seed)
    out = [[body], [body[i : i + 7] for i in range(0, len(body), 7)]]
    for _ in range(4):
        out.append(split(body, [rng.randrange(len(body)) for _ in range(rng.randrange(1, 30))]))
    return out


def sole_outcome(factory: Callable[[], Parser], body: bytes, seed: int) -> Outcome:
    """What the parser makes of ``body``: the same in every sampled chunking."""
    outcomes = {run(factory, chunks) for chunks in chunkings_of(body, seed)}
    assert len(outcomes) == 1
    return outcomes.pop()


def padded_json(n: int) -> bytes:
    """A plain JSON request body of ``n`` bytes, mostly whitespace (which
    compresses over 1000:1): a body that is all header."""
    header = json.dumps({"inputs": [{"name": "a", "datatype": "INT32", "shape": [1], "data": [1]}]})
    return header.encode().ljust(n)


@pytest.mark.parametrize("known", [False, True])
def test_claims_beyond_the_decompression_cap_are_413_at_the_header(known: bool) -> None:
    plain, hl = zeros_body(300_000)
    body = gzip.compress(plain)
    limits = binproto.Limits(max_decompressed_bytes=100_000)
    cl = len(body) if known else None
    out = sole_outcome(make("request", hl, "gzip", cl, limits), body, 4)
    # Refused from the claim, before a tensor byte is decompressed.
    assert out.error == (
        "RemoteProtocolError",
        f"the header announces a body of {len(plain)} bytes, more than the 100000 bytes"
        " the gzip body may expand to",
        413,
        hl,
    )
    assert not any(e[0] == "TensorChunk" for e in out.events)


@pytest.mark.parametrize("known", [False, True])
def test_max_decompressed_bytes_is_413_at_the_cap(known: bool) -> None:
    plain = padded_json(300_000)  # no claim to check: the header itself expands
    body = gzip.compress(plain)
    limits = binproto.Limits(max_decompressed_bytes=100_000)
    cl = len(body) if known else None
    out = sole_outcome(make("request", None, "gzip", cl, limits), body, 4)
    assert out.error == (
        "RemoteProtocolError",
        "the decompressed body exceeds the limit of 100000 bytes",
        413,
        100_000,
    )


def test_ratio_against_content_length_refuses_the_claim() -> None:
    plain, hl = zeros_body(4 * RATIO_FLOOR)
    body = gzip.compress(plain, 9)
    assert len(plain) / len(body) > 500
    limits = binproto.Limits(max_decompression_ratio=100)
    out = sole_outcome(make("request", hl, "gzip", len(body), limits), body, 5)
    allowed = max(RATIO_FLOOR, 100 * len(body))  # the floor, or the ratio times the wire length
    assert out.error == (
        "RemoteProtocolError",
        f"the header announces a body of {len(plain)} bytes, more than the {allowed} bytes"
        " the gzip body may expand to",
        413,
        hl,
    )


def test_ratio_against_content_length() -> None:
    body = gzip.compress(padded_json(4 * RATIO_FLOOR), 9)
    limits = binproto.Limits(max_decompression_ratio=100)
    out = sole_outcome(make("request", None, "gzip", len(body), limits), body, 5)
    assert out.error is not None
    _, msg, status, offset = out.error
    assert status == 413 and "expands more than 100 times" in msg
    # Under the floor nothing trips; over it, the ratio times the wire length.
    assert offset == max(RATIO_FLOOR, 100 * len(body))


def test_ratio_without_content_length_uses_bytes_so_far() -> None:
    plain, hl = zeros_body(4 * RATIO_FLOOR)
    body = gzip.compress(plain, 9)
    limits = binproto.Limits(max_decompression_ratio=100)
    out = sole_outcome(make("request", hl, "gzip", None, limits), body, 6)
    assert out.error is not None and out.error[2] == 413 and out.error[3] == RATIO_FLOOR


def test_a_compressible_body_within_the_limits_passes() -> None:
    plain, hl = zeros_body(RATIO_FLOOR - 1000)  # everything under the floor is allowed
    body = gzip.compress(plain, 9)
    msg = binproto.decode_request(body, header_length=hl, content_encoding="gzip")
    assert msg.tensors["z"].size == RATIO_FLOOR - 1000 and not msg.tensors["z"].any()


def gzip_bomb(header: bytes, total: int, fill: bytes, segment: int = 16 * 1024 * 1024) -> bytes:
    """A real gzip bomb: ``header``, then deflate blocks expanding to ``total``
    bytes of ``fill`` (the trailer is left off: a parser that honours its
    limits never gets there)."""
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = comp.compress(header) + comp.flush(zlib.Z_FULL_FLUSH)
    filler = fill * segment
    first = comp.compress(filler) + comp.flush(zlib.Z_FULL_FLUSH)
    again = comp.compress(filler) + comp.flush(zlib.Z_FULL_FLUSH)
    # After a full flush the compressor starts afresh: every segment compresses
    # to the same bytes, so the bomb is built by repetition.
    assert again == first
    gzip_header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    return gzip_header + head + first * (total // segment)


BOMBS = ["claims 8 GiB", "8 GiB after the message", "8 GiB of JSON, cap", "8 GiB of JSON, ratio"]


@pytest.mark.parametrize("bomb", BOMBS)
def test_gzip_bombs_stop_early_with_flat_memory(bomb: str) -> None:
    total = 8 * 1024**3  # 8 GiB decompressed
    header_length: int | None
    limits = binproto.Limits()
    if bomb == "claims 8 GiB":  # a header that announces the whole bomb
        header = zeros_header(total)
        header_length = len(header)
        body = gzip_bomb(header, total, b"\0")
    elif bomb == "8 GiB after the message":  # a small message, then the bomb
        header, header_length = uint8_request(b"\0" * 4, "z")
        body = gzip_bomb(header, total, b"\0")
    else:  # a plain JSON body: all of it is header
        header_length = None
        body = gzip_bomb(padded_json(1000), total, b" ")
        if bomb.endswith("cap"):
            limits = binproto.Limits(
                max_decompressed_bytes=4 * 1024**2, max_decompression_ratio=1e9
            )
        else:
            limits = binproto.Limits(max_decompression_ratio=200)
    assert len(body) < total // 500  # ~8 MB on the wire
    parser = Parser("request", header_length=header_length, content_encoding="gzip", limits=limits)
    view = memoryview(body)
    tracemalloc.start()
    try:
        with pytest.raises(RemoteProtocolError) as exc:
            for start in range(0, len(view), 65536):
                parser.receive_data(view[start : start + 65536])
                for _ in parser.events():
                    pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    err = exc.value
    if bomb == "claims 8 GiB":
        assert err.status_hint == 413 and "the header announces a body of" in err.msg
    elif bomb == "8 GiB after the message":
        assert err.status_hint == 400 and "unexpected additional input data" in err.msg
    elif bomb.endswith("cap"):
        assert err.status_hint == 413 and err.offset == 4 * 1024**2
        assert "exceeds the limit of 4194304 bytes" in err.msg
    else:
        assert err.status_hint == 413 and "expands more than" in err.msg
    # Memory stays flat: a few decompression steps, and a JSON header within
    # its cap, never the decompressed size.
    assert peak < 4 * STEP + 2 * BLOCK + 256 * 1024 + 2 * 4 * 1024**2, peak


# -- compression on the sending side -------------------------------------------


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
@pytest.mark.parametrize("level", [0, 1, 6, 9])
def test_compress_buffers_round_trip(encoding: str, level: int) -> None:
    arr = np.arange(100_000, dtype=np.int32)
    header = REQUEST[:REQUEST_HL]
    pieces = list(
        binproto.compress_buffers([header, arr, memoryview(b"tail")], encoding, level=level)
    )
    assert all(isinstance(p, bytes) and p for p in pieces)
    body = b"".join(pieces)
    plain = header + arr.tobytes() + b"tail"
    decoded = gzip.decompress(body) if encoding == "gzip" else zlib.decompress(body)
    assert decoded == plain


def test_compress_buffers_streams_in_pieces() -> None:
    data = np.random.default_rng(7).integers(0, 256, size=3 * 1024 * 1024, dtype=np.uint8)
    pieces = list(binproto.compress_buffers([data], "gzip", level=1, piece=256 * 1024))
    assert len(pieces) > 3
    assert gzip.decompress(b"".join(pieces)) == data.tobytes()


def test_compress_buffers_then_parse() -> None:
    body = b"".join(binproto.compress_buffers([RESPONSE], "deflate"))
    out = assert_same_everywhere(make("response", RESPONSE_HL, "deflate", len(body)), body)
    assert out == assert_same_everywhere(make("response", RESPONSE_HL, None), RESPONSE)


@pytest.mark.parametrize(
    ("encoding", "level"),
    [("identity", 6), ("gzip", 10), ("deflate", -2), ("gzip", 1.5), ("gzip", True)],
)
def test_compress_buffers_rejects_misuse(encoding: str, level: Any) -> None:
    with pytest.raises(LocalProtocolError):
        list(binproto.compress_buffers([b"x"], encoding, level=level))


def test_compress_buffers_unsupported_encoding_is_the_callers_misuse() -> None:
    with pytest.raises(LocalProtocolError, match="unsupported Content-Encoding 'br'") as exc:
        list(binproto.compress_buffers([b"x"], "br"))
    assert exc.value.status_hint == 500


@pytest.mark.parametrize(
    "buffer",
    [np.arange(8, dtype=np.uint8)[::2], np.zeros((3, 2), order="F"), "text", 5],
    ids=["strided", "fortran", "str", "int"],
)
def test_compress_buffers_refuses_what_is_no_contiguous_buffer(buffer: Any) -> None:
    with pytest.raises(LocalProtocolError):
        list(binproto.compress_buffers([b"x", buffer], "gzip"))


@pytest.mark.parametrize("piece", [0, -1, 1.5, True])
def test_compress_buffers_rejects_a_bad_piece_size(piece: Any) -> None:
    with pytest.raises(LocalProtocolError, match="piece must be a positive int"):
        list(binproto.compress_buffers([b"x"], "gzip", piece=piece))


# -- real peers ---------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_tritonclient_compressed_request_parses(encoding: str) -> None:
    from tritonclient.http import InferenceServerClient, InferInput

    inp = InferInput("a", [3, 4], "FP32")
    inp.set_data_from_numpy(ARR, binary_data=True)
    body, json_size = InferenceServerClient.generate_request_body([inp])
    # tritonclient compresses the whole body exactly so before sending it.
    wire = gzip.compress(body) if encoding == "gzip" else zlib.compress(body)
    msg = binproto.decode_request(wire, header_length=json_size, content_encoding=encoding)
    assert arrays_equal(msg.tensors["a"], ARR)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_tritonclient_reads_compress_buffers_output(encoding: str) -> None:
    from tritonclient.http import InferenceServerClient

    body = b"".join(binproto.compress_buffers([RESPONSE], encoding, level=3))
    result = InferenceServerClient.parse_response_body(
        body, header_length=RESPONSE_HL, content_encoding=encoding
    )
    assert result.as_numpy("o").tolist() == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_encoder_output_compressed_round_trip(encoding: str) -> None:
    arrays = {"a": ARR, "b": np.array([b"x", b"yz"], dtype=object)}
    encoded = binproto.encode_request(arrays)
    body = b"".join(binproto.compress_buffers(encoded, encoding))
    whole = assert_same_everywhere(
        make("request", encoded.header_length, encoding, len(body)), body, two_way_limit=100
    )
    plain = run(make("request", encoded.header_length, None), [bytes(encoded)])
    assert whole == plain and whole.error is None
    msg = binproto.decode_request(
        body, header_length=encoded.header_length, content_encoding=encoding
    )
    assert arrays_equal(msg.tensors["a"], ARR)
    assert list(msg.tensors["b"]) == [b"x", b"yz"]


def test_tiny_chunks_are_gathered_not_queued_as_views() -> None:
    data = np.random.default_rng(8).integers(0, 256, size=4 * BLOCK, dtype=np.uint8)
    plain, hl = uint8_request(data.tobytes(), "x")
    body = gzip.compress(plain)
    parser = Parser("request", header_length=hl, content_encoding="gzip")
    got = bytearray()
    tracemalloc.start()
    try:
        # 4096 one-byte pieces queue up between reads of the events.
        for i in range(len(body)):
            parser.receive_data(body[i : i + 1])
            if i % 4096 == 4095:
                for ev in parser.events():
                    if isinstance(ev, TensorChunk):
                        got += ev.data
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    parser.receive_data(b"")
    for ev in parser.events():
        if isinstance(ev, TensorChunk):
            got += ev.data
    assert bytes(got) == data.tobytes()
    # The waiting bytes are gathered into a few buffers: a view per byte
    # (about 400 bytes with its one-byte object) would hold 1.7 MB.
    assert peak < 8 * BLOCK + len(body), peak


@pytest.mark.parametrize(
    ("label", "how"), [("deflate", "gzip"), ("gzip", "deflate"), ("gzip", "raw-deflate")]
)
def test_mislabelled_streams(label: str, how: str) -> None:
    body = COMPRESSORS[how](REQUEST)
    out = assert_same_everywhere(make("request", REQUEST_HL, label), body, two_way_limit=50)
    if how == "raw-deflate":  # no header to recognise: gzip is required
        assert out.error is not None and "invalid gzip data" in out.error[1]
    else:  # Triton inflates gzip and zlib streams under either name: so does binproto
        assert out == run(make("request", REQUEST_HL, None), [REQUEST])


# -- buffer reuse ------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["gzip", "deflate", None])
def test_one_receive_buffer_reused_after_need_data(encoding: str | None) -> None:
    """The zero-copy rule holds for compressed bodies too: once next_event()
    has said NEED_DATA, the buffer last passed in may be overwritten."""
    x = np.random.default_rng(0).integers(0, 4, 200_000, dtype=np.uint8)
    plain, hl = uint8_request(x.tobytes(), "x")
    wire = COMPRESSORS[encoding](plain) if encoding else plain
    parser = Parser("request", header_length=hl, content_encoding=encoding)
    assembler = binproto.TensorAssembler()
    buf = bytearray(5000)  # one receive buffer, refilled like recv_into's
    for start in range(0, len(wire), len(buf)):
        piece = wire[start : start + len(buf)]
        buf[: len(piece)] = piece
        parser.receive_data(memoryview(buf)[: len(piece)])
        while (event := parser.next_event()) is not binproto.NEED_DATA:
            assembler.feed(event)
        buf[:] = b"\xee" * len(buf)  # scribble over it before the next read
    parser.receive_data(b"")
    for event in parser.events():
        assembler.feed(event)
    assert parser.state is binproto.ParserState.DONE
    np.testing.assert_array_equal(assembler.tensors["x"], x)
