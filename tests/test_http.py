"""Reading the extension's HTTP headers, and parsers built from them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import binproto
from binproto import (
    HEADER_LENGTH_NAME,
    BodyClaims,
    LocalProtocolError,
    Parser,
    RemoteProtocolError,
    body_claims,
    header_length_from,
    parser_from_headers,
    preferred_encoding,
)
from binproto._http import content_length_from


@pytest.mark.parametrize(
    "headers",
    [
        {"Inference-Header-Content-Length": "42"},
        {"inference-header-content-length": "42"},
        [("INFERENCE-HEADER-CONTENT-LENGTH", " 42 ")],
        [(b"inference-header-content-length", b"42"), (b"content-length", b"100")],
        [("Inference-Header-Content-Length", "42"), ("inference-header-content-length", "42")],
    ],
)
def test_reads_header_in_any_case_and_form(headers: Any) -> None:
    assert header_length_from(headers) == 42


def test_absent_header_means_plain_json() -> None:
    assert header_length_from({"Content-Length": "5"}) is None
    assert header_length_from([]) is None


@pytest.mark.parametrize(
    ("value", "match", "status"),
    [
        ("abc", "Unable to parse Inference-Header-Content-Length, got: abc", 400),
        ("4.5", "Unable to parse", 400),
        ("", "Unable to parse", 400),
        ("-3", "should be in range", 400),
        (str(-(2**53)), "should be in range", 400),  # negative: out of range, whatever its size
        ("-" + "9" * 25, "should be in range", 400),
        ("1e3", "Unable to parse", 400),
        ("٣", "Unable to parse", 400),  # a non-ASCII digit
        ("99999999999999999999999", "absurdly large", 413),
        (str(2**53), "absurdly large", 413),
    ],
)
def test_bad_values(value: str, match: str, status: int) -> None:
    with pytest.raises(RemoteProtocolError, match=match) as info:
        header_length_from({"Inference-Header-Content-Length": value})
    assert info.value.status_hint == status


@pytest.mark.parametrize("zeros", [1, 30, 5000])  # 5000: past int()'s digit limit
def test_leading_zeros_are_no_size(zeros: int) -> None:
    """Zeros before the digits (Triton takes them too) do not make a value
    absurdly large; only its digits count."""
    value = "0" * zeros + "42"
    assert header_length_from({"Inference-Header-Content-Length": value}) == 42
    assert content_length_from({"Content-Length": value}) == 42
    with pytest.raises(RemoteProtocolError, match="absurdly large") as info:
        content_length_from({"Content-Length": "0" * zeros + "9" * 21})
    assert info.value.status_hint == 413


def test_larger_than_content_length() -> None:
    with pytest.raises(RemoteProtocolError, match=r"range \(0, 10\), got: 11"):
        header_length_from({"Inference-Header-Content-Length": "11"}, content_length=10)
    assert header_length_from({"Inference-Header-Content-Length": "10"}, content_length=10) == 10


def test_conflicting_repeats() -> None:
    with pytest.raises(RemoteProtocolError, match="conflicting"):
        header_length_from([("inference-header-content-length", "1"),
                            ("Inference-Header-Content-Length", "2")])  # fmt: skip


# -- parser_from_headers ------------------------------------------------------------


def _parse_all(parser: Parser, body: bytes) -> binproto.DecodedMessage:
    asm = binproto.TensorAssembler()
    parser.receive_data(body)
    parser.receive_data(b"")
    for event in parser.events():
        asm.feed(event)
    assert asm.header is not None
    return binproto.DecodedMessage(header=asm.header, tensors=asm.tensors, shared_memory=())


def _request(**kw: Any) -> tuple[binproto.EncodedBody, bytes]:
    body = binproto.encode_request({"x": np.arange(6, dtype=np.int32)}, **kw)
    return body, b"".join(bytes(memoryview(b)) for b in body.buffers)


def test_body_claims_read_the_three_framing_headers() -> None:
    body, wire = _request()
    claims = body_claims([(k.lower().encode(), v.encode()) for k, v in body.headers])
    assert claims == BodyClaims(len(wire), None, body.header_length)
    assert body_claims({"Content-Length": "7"}) == BodyClaims(7, None, None)
    # With a coding the header may be longer than the compressed body.
    coded = {"Content-Length": "10", "Content-Encoding": "x-gzip", HEADER_LENGTH_NAME: "500"}
    assert body_claims(coded) == BodyClaims(10, "gzip", 500)
    with pytest.raises(RemoteProtocolError, match="should be in range"):
        body_claims({"Content-Length": "10", HEADER_LENGTH_NAME: "500"})
    with pytest.raises(RemoteProtocolError) as info:
        body_claims({"Content-Length": "10", "Content-Encoding": "br"})
    assert info.value.status_hint == 415


def test_body_claims_of_header_fields_are_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import binproto._http as http

    reads: list[int] = []
    original = http._content_length

    def counting(fields: Any) -> int | None:
        reads.append(1)
        return original(fields)

    monkeypatch.setattr(http, "_content_length", counting)
    fields = binproto.HeaderFields({"Content-Length": "7", HEADER_LENGTH_NAME: "3"})
    first = body_claims(fields)
    assert first == BodyClaims(7, None, 3) and body_claims(fields) is first
    assert len(reads) == 1
    # A list of pairs is read each time; a fault is found each time.
    pairs = [("Content-Length", "7")]
    assert body_claims(pairs) == body_claims(pairs) and len(reads) == 3
    bad = binproto.HeaderFields({"Content-Length": "10", HEADER_LENGTH_NAME: "500"})
    for _ in range(2):
        with pytest.raises(RemoteProtocolError, match="should be in range"):
            body_claims(bad)


@pytest.mark.parametrize(
    ("claims", "status", "match"),
    [
        (BodyClaims(101, None, 10), 413, "Content-Length 101 exceeds"),
        (BodyClaims(100, None, 0), 400, "raw binary requests"),
        (BodyClaims(50, None, 60), 400, "should be in range"),
        (BodyClaims(100, None, 51), 413, "inference header size 51 exceeds"),
        (BodyClaims(None, None, 51), 413, "inference header size 51 exceeds"),
        (BodyClaims(80, None, None), 413, "inference header size 80 exceeds"),
    ],
)
def test_body_claims_check_is_a_parsers_first_check(
    claims: BodyClaims, status: int, match: str
) -> None:
    limits = binproto.Limits(max_body_bytes=100, max_header_bytes=50)
    with pytest.raises(RemoteProtocolError, match=match) as info:
        claims.check(limits)
    assert info.value.status_hint == status
    # The same claims make a parser fail the same way before any body byte.
    parser = binproto.Parser(
        "request",
        header_length=claims.header_length,
        content_length=claims.content_length,
        limits=limits,
    )
    with pytest.raises(RemoteProtocolError, match=match):
        parser.next_event()
    # A compressed body's length does not bound its (uncompressed) header.
    BodyClaims(50, "gzip", 60).check(binproto.Limits(max_header_bytes=100))


def test_parser_from_headers_reads_the_framing_headers() -> None:
    body, wire = _request()
    headers = [(str(k), str(v)) for k, v in body.headers]
    parser = parser_from_headers("request", headers)
    assert parser.kind == "request"
    assert parser.header_length == body.header_length
    assert parser.content_length == len(wire)
    assert parser.content_encoding is None
    np.testing.assert_array_equal(_parse_all(parser, wire).tensors["x"], np.arange(6))


def test_parser_from_headers_plain_json_and_bytes_names() -> None:
    wire = json.dumps({"outputs": [{"name": "y", "shape": [1], "datatype": "INT8", "data": [3]}]})
    headers = {b"content-length": str(len(wire)).encode()}
    parser = parser_from_headers("response", headers, strict_bool=False)
    assert parser.header_length is None
    assert parser.content_length == len(wire)
    assert parser.strict_bool is False
    assert _parse_all(parser, wire.encode()).tensors["y"].tolist() == [3]


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_parser_from_headers_compressed_body(encoding: str) -> None:
    """With a coding, content_length is the compressed length on the wire, and
    the header length may exceed it (it counts uncompressed JSON)."""
    body = binproto.encode_request({"x": np.zeros(10_000, dtype=np.float32)})
    assert body.header_length is not None
    wire = b"".join(binproto.compress_buffers(body.buffers, encoding))
    assert len(wire) < body.header_length + 40_000
    headers = {
        "Inference-Header-Content-Length": str(body.header_length),
        "Content-Length": str(len(wire)),
        "Content-Encoding": encoding.upper(),
    }
    parser = parser_from_headers("request", headers)
    assert parser.content_encoding == encoding
    assert parser.content_length == len(wire)
    np.testing.assert_array_equal(_parse_all(parser, wire).tensors["x"], np.zeros(10_000))


def test_parser_from_headers_passes_limits_and_raw_input() -> None:
    limits = binproto.Limits(max_tensor_bytes=8)
    spec = binproto.TensorSpec("x", "INT32", [-1])
    data = np.arange(2, dtype=np.int32).tobytes()
    headers = {"Inference-Header-Content-Length": "0", "Content-Length": str(len(data))}
    parser = parser_from_headers("request", headers, limits=limits, raw_input=spec)
    assert parser.limits is limits
    assert _parse_all(parser, data).tensors["x"].tolist() == [0, 1]
    too_big = np.arange(3, dtype=np.int32).tobytes()
    headers["Content-Length"] = str(len(too_big))
    parser = parser_from_headers("request", headers, limits=limits, raw_input=spec)
    with pytest.raises(RemoteProtocolError, match="exceeds the limit"):
        _parse_all(parser, too_big)


@pytest.mark.parametrize(
    # (a no-break space, a vertical tab or NEL around digits is no HTTP whitespace)
    "value",
    ["abc", "-1", "1.5", "", "0x10", "٣", "1" * 30, "\xa012", "12\x0b", "\x8512"],
)
def test_parser_from_headers_bad_content_length(value: str) -> None:
    with pytest.raises(RemoteProtocolError, match="Content-Length"):
        parser_from_headers("request", {"Content-Length": value})


@pytest.mark.parametrize(
    ("headers", "match", "status"),
    [
        ({"Content-Encoding": "br"}, "unsupported Content-Encoding 'br'", 415),
        ({"Inference-Header-Content-Length": "x"}, "Unable to parse", 400),
        (
            {"Inference-Header-Content-Length": "11", "Content-Length": "10"},
            r"range \(0, 10\)",
            400,
        ),
    ],
)
def test_parser_from_headers_bad_headers(headers: dict[str, str], match: str, status: int) -> None:
    with pytest.raises(RemoteProtocolError, match=match) as info:
        parser_from_headers("request", headers)
    assert info.value.status_hint == status


def test_parser_from_headers_kind_is_checked() -> None:
    with pytest.raises(binproto.LocalProtocolError):
        parser_from_headers("reply", {})  # type: ignore[arg-type]


# -- preferred_encoding ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (None, None),
        ("", None),
        ("gzip", "gzip"),
        ("GZIP", "gzip"),
        ("x-gzip", "gzip"),
        ("deflate", "deflate"),
        ("gzip, deflate, br", "gzip"),
        ("deflate, gzip", "gzip"),
        ("gzip;q=0, deflate", "deflate"),
        ("gzip; q=0.000, deflate;q=0.5", "deflate"),
        ("gzip;q=0.001", "gzip"),
        ("GZip ; Q=1.0", "gzip"),
        ("gzip;q=0, deflate;q=0", None),
        ("br", None),
        ("identity", None),
        ("*", None),
        ("*;q=1, br", None),
        ("compress, zstd;q=1", None),
        ("gzip;q=2", None),  # malformed q-values refuse the entry
        ("gzip;q=abc, deflate", "deflate"),
        ("gzip;q=, deflate", "deflate"),
        ("gzip;q=0, gzip", None),  # the refusal wins
        (" , ;, gzip;level=9", "gzip"),
        # The highest q-value wins; gzip on a tie.
        ("deflate;q=0.5, gzip;q=0.4", "deflate"),
        ("gzip;q=0.4, deflate", "deflate"),
        ("deflate;q=0.5, gzip;q=0.5", "gzip"),
        ("deflate;q=1, gzip;q=0.999", "deflate"),
        ("deflate;q=0.2, gzip", "gzip"),
    ],
)
def test_preferred_encoding(accept: str | None, expected: str | None) -> None:
    assert preferred_encoding(accept) == expected


def test_content_length_beside_transfer_encoding_does_not_count() -> None:
    headers = {"Content-Length": "5", "Transfer-Encoding": "chunked"}
    assert content_length_from(headers) is None
    assert content_length_from({"Content-Length": "5"}) == 5
    parser = binproto.parser_from_headers("request", headers)
    assert parser.content_length is None  # framed by its chunks


def test_header_fields_are_read_once_and_looked_up_by_any_case() -> None:
    fields = binproto.HeaderFields(
        [(b"Content-Length", b"12"), (b"inference-header-content-length", b" 4 "), (b"X", b"1")]
    )
    assert fields.get("content-length") == "12"
    assert fields.get("Inference-Header-Content-Length") == "4"
    assert fields.get("absent") is None
    parser = binproto.parser_from_headers("request", fields)
    assert (parser.header_length, parser.content_length) == (4, 12)


def test_header_fields_refuse_a_conflict_only_when_it_is_looked_up() -> None:
    fields = binproto.HeaderFields([("X", "1"), ("x", "2"), ("Content-Length", "3")])
    assert fields.get("content-length") == "3"
    with pytest.raises(RemoteProtocolError, match="conflicting X headers: '1' and '2'"):
        fields.get("X")
    # A repeat with the same value is no conflict.
    assert binproto.HeaderFields({"a": "1", "A": "1"}).get("a") == "1"


def test_header_fields_compare_repeats_as_they_are_read() -> None:
    # Values are decoded and stripped when looked up: str, bytes, whitespace alike.
    fields = binproto.HeaderFields([("X", " 1"), (b"x", b"1\t"), ("Y", "a"), (b"y", b"b")])  # type: ignore[arg-type]
    assert fields.get("x") == "1"
    with pytest.raises(RemoteProtocolError, match="conflicting Y headers: 'a' and 'b'"):
        fields.get("Y")


@pytest.mark.parametrize(
    "headers", [{"Content-Length": None}, [("X", None), ("x", "1")], [("X", 5)], [(5, "1")]]
)
def test_header_fields_refuse_names_and_values_that_are_no_text(headers: Any) -> None:
    with pytest.raises(binproto.LocalProtocolError, match="str or bytes"):
        binproto.HeaderFields(headers)


def test_header_fields_lower_bytes_names_as_latin_1_text_and_refuse_subclasses() -> None:
    fields = binproto.HeaderFields([(b"X-\xc0", b"1"), ("x-\xe0", "2")])  # type: ignore[arg-type]
    with pytest.raises(RemoteProtocolError, match="conflicting"):
        fields.get("X-\xc0")  # one name: latin-1 \xc0 lower-cased is \xe0

    class Name(bytes):
        pass

    with pytest.raises(binproto.LocalProtocolError, match="str or bytes"):
        binproto.HeaderFields([(Name(b"Content-Length"), b"3")])


def test_reading_claims_compares_no_bytes_with_str() -> None:
    # (python -bb makes such a comparison an error, at import or per request)
    code = "import binproto; print(binproto.body_claims([(b'Content-Length', b'5')]))"
    tree = Path(binproto.__file__).resolve().parent.parent  # (the binproto under test)
    out = subprocess.run(
        [sys.executable, "-bb", "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
    )
    assert (
        out.stdout.strip()
        == "BodyClaims(content_length=5, content_encoding=None, header_length=None)"
    )


def test_content_length_from_a_one_shot_iterator_sees_its_transfer_encoding() -> None:
    # The headers are read once, then looked up: both lookups see every pair.
    pairs = iter([("Content-Length", "10"), ("Transfer-Encoding", "chunked")])
    assert content_length_from(pairs) is None


def test_body_claims_of_pairs_read_only_their_headers_in_any_case() -> None:
    pairs = [
        (b"X-Trace", b"1"),
        (b"x-trace", b"2"),  # a conflict in a header the claims do not read
        (b"CONTENT-LENGTH", b"20"),
        (b"Inference-Header-Content-Length", b" 8"),
        (b"Content-Encoding", b"identity"),
    ]
    assert body_claims(pairs) == BodyClaims(20, None, 8)
    assert body_claims([*pairs, (b"Transfer-Encoding", b"chunked")]).content_length is None
    with pytest.raises(RemoteProtocolError, match="conflicting Content-Length headers"):
        body_claims([*pairs, (b"content-length", b"21")])


def test_header_fields_say_which_headers_are_present() -> None:
    fields = binproto.HeaderFields([(b"Content-Length", b"7"), (b"X-A", b"1"), (b"x-a", b"2")])
    assert "content-length" in fields and "Content-Length" in fields
    assert "x-a" in fields  # present, though its values conflict
    assert "expect" not in fields and b"content-length" not in fields


@pytest.mark.parametrize("header_length", [None, 0, 143])
def test_the_framing_headers_in_both_forms(header_length: int | None) -> None:
    raw = binproto.raw_message_headers(header_length, 4239)
    text = binproto.message_headers(header_length, 4239)
    binary = header_length is not None
    kind = "application/octet-stream" if binary else "application/json"
    expected = [("Content-Length", "4239"), ("Content-Type", kind)]
    if binary:
        expected.insert(0, ("Inference-Header-Content-Length", str(header_length)))
    assert text == expected
    assert raw == [(k.lower().encode(), v.encode()) for k, v in expected]


def test_an_encoded_body_gives_its_framing_headers_in_both_forms() -> None:
    body = binproto.encode_request({"x": np.arange(3, dtype=np.int32)})
    assert body.headers == binproto.message_headers(body.header_length, body.content_length)
    assert body.raw_headers == binproto.raw_message_headers(body.header_length, body.content_length)
    assert dict(body.raw_headers)[b"content-length"] == b"%d" % len(bytes(body))


def test_spaces_and_tabs_around_a_value_are_http_whitespace() -> None:
    claims = binproto.body_claims(
        [(b"content-length", b" \t12\t "), (b"content-encoding", b" gzip")]
    )
    assert claims.content_length == 12 and claims.content_encoding == "gzip"


@pytest.mark.parametrize(
    ("header_length", "content_length"),
    [(None, 12.7), (None, "9"), (None, -1), (True, 5), (3, None), (1.0, 5), (None, True)],
)
def test_framing_headers_of_lengths_that_are_not_whole_numbers_are_refused(
    header_length: Any, content_length: Any
) -> None:
    for make in (binproto.message_headers, binproto.raw_message_headers):
        with pytest.raises(LocalProtocolError, match="must be a non-negative int"):
            make(header_length, content_length)
    assert binproto.message_headers(np.int64(3), np.uint16(7))[0] == (  # type: ignore[arg-type, unused-ignore]
        "Inference-Header-Content-Length",
        "3",
    )
