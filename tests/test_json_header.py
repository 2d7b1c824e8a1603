"""JSON headers that parsers read differently: a repeated key and a lone
surrogate escape are refused with a 400 and the byte offset, by the parser
(every chunking, requests and responses) and by the reference server (never a
500). Written against public behaviour only, whatever JSON backend decodes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import binproto
from binproto import Parser, RemoteProtocolError
from binproto._json import loads_header
from binproto.adapters._server import V2Server, echo_model
from binproto.adapters.asyncio import close_server, start_server
from tests.helpers import assert_same_everywhere, make_body

TENSOR = '{"name":"x","datatype":"UINT8","shape":[2],"data":[1,2]}'

# (header, the repeated key, where the repeat starts)
DUPLICATES = [
    ('{"inputs":[' + TENSOR + '],"inputs":[]}', "inputs", '"inputs":[]'),
    ('{"id":"a","inputs":[' + TENSOR + '],"id":"b"}', "id", '"id":"b"'),
    (
        '{"inputs":[{"name":"x","datatype":"UINT8","shape":[2],"data":[1,2],"shape":[1]}]}',
        "shape",
        '"shape":[1]',
    ),
    (
        '{"inputs":[' + TENSOR + '],"parameters":{"p":{"q":1,"q":2}}}',
        "q",
        '"q":2',
    ),
    # The same key spelled with an escape is the same key.
    ('{"id":"a","i\\u0064":"b","inputs":[' + TENSOR + "]}", "id", '"i\\u0064"'),
    # A duplicate inside a string is no duplicate; the real one after it is.
    (
        '{"id":"{\\"k\\":1,\\"k\\":2}","inputs":[' + TENSOR + '],"inputs":[]}',
        "inputs",
        '"inputs":[]',
    ),
]


def _request(header: str) -> tuple[bytes, int]:
    raw = header.encode()
    return raw, len(raw)


@pytest.mark.parametrize(("header", "key", "at"), DUPLICATES)
def test_duplicate_key_is_a_400_naming_the_key(header: str, key: str, at: str) -> None:
    body, hl = _request(header)
    out = assert_same_everywhere(lambda: Parser("request", header_length=hl), body)
    assert out.error is not None
    kind, message, status, offset = out.error
    assert kind == "RemoteProtocolError" and status == 400
    assert f"duplicate key {json.dumps(key)}" in message
    assert offset == body.index(at.encode())


def test_duplicate_key_in_a_response_and_a_plain_json_body() -> None:
    body = b'{"model_name":"m","outputs":[],"model_name":"n"}'
    expected = 'response JSON buffer: duplicate key "model_name"'
    with pytest.raises(RemoteProtocolError, match=expected) as exc:
        binproto.decode_response(body, header_length=len(body))
    assert exc.value.offset == body.rindex(b'"model_name"') and exc.value.status_hint == 400
    with pytest.raises(RemoteProtocolError, match='duplicate key "inputs"'):
        binproto.decode_request(b'{"inputs":[],"inputs":[]}', header_length=None)


def test_same_key_in_different_objects_is_fine() -> None:
    header = {
        "inputs": [
            {"name": "a", "datatype": "UINT8", "shape": [1], "data": [1]},
            {"name": "b", "datatype": "UINT8", "shape": [1], "data": [2]},
        ],
        "outputs": [{"name": "c", "parameters": {"name": {"name": 1}}}],
    }
    body, hl = make_body(header)
    decoded = binproto.decode_request(body, header_length=hl)
    assert list(decoded.tensors) == ["a", "b"]


@pytest.mark.parametrize(
    "extra",
    [
        '"id":"urn:uuid:1","parameters":{"t":"12:00:00"}',  # colons inside strings
        '"id":"a\\":\\"b"',  # an escaped quote before a colon inside a string
        # objects the header format does not define (a requested output's
        # parameters are taken as sent)
        '"outputs":[{"name":"y","parameters":{"p":{"q":1,"r":{"q":2}}}}]',
    ],
)
def test_headers_without_a_repeated_key_are_accepted(extra: str) -> None:
    body, hl = _request("{" + extra + ',"inputs":[' + TENSOR + "]}")
    out = assert_same_everywhere(lambda: Parser("request", header_length=hl), body)
    assert out.error is None
    decoded = binproto.decode_request(body, header_length=hl)
    assert decoded.tensors["x"].tolist() == [1, 2]
    assert decoded.header.raw == json.loads(body)


# (a JSON string's content as written in the header, whether it is accepted)
SURROGATES = [
    ("\\ud800", False),  # lone high
    ("\\udfff", False),  # lone low
    ("a\\uDBFFb", False),  # lone high, upper-case hex, between characters
    ("\\ud800\\ud800", False),  # two highs
    ("\\udc00\\ud800", False),  # a pair in the wrong order
    ("\\\\\\ud800", False),  # an escaped backslash, then a lone surrogate escape
    ("\\ud83d\\ude00", True),  # a pair: U+1F600
    ("\\\\ud800", True),  # an escaped backslash, then the text "ud800"
    ("\\u00e9\\u4e2d", True),  # escapes of characters outside the surrogates
]


@pytest.mark.parametrize("field", ["id", "name", "data", "parameter"])
@pytest.mark.parametrize(("text", "accepted"), SURROGATES)
def test_lone_surrogate_escape_is_a_400_anywhere(text: str, accepted: bool, field: str) -> None:
    tensor = {"name": "x", "datatype": "BYTES", "shape": [1], "data": ["s"]}
    header: dict[str, object] = {"id": "i", "inputs": [tensor], "parameters": {"p": "v"}}
    raw = json.dumps(header, separators=(",", ":"))
    target = {"id": '"i"', "name": '"x"', "data": '["s"]', "parameter": '"v"'}[field]
    replaced = '"' + text + '"'
    raw = raw.replace(target, f"[{replaced}]" if field == "data" else replaced, 1)
    body = raw.encode()
    out = assert_same_everywhere(lambda: Parser("request", header_length=len(body)), body)
    if accepted:
        assert out.error is None
        return
    assert out.error is not None
    kind, message, status, offset = out.error
    assert kind == "RemoteProtocolError" and status == 400
    assert "The surrogate pair in string is invalid" in message
    start = body.index(text.encode())
    assert offset is not None and start <= offset < start + len(text)
    assert body[offset : offset + 2] == b"\\u"


async def _post_to_server(bodies: list[tuple[bytes, int]]) -> list[httpx.Response]:
    server = await start_server(V2Server([echo_model()]), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            return [
                await client.post(
                    "/v2/models/echo/infer",
                    content=body,
                    headers={binproto.HEADER_LENGTH_NAME: str(hl)},
                )
                for body, hl in bodies
            ]
    finally:
        await close_server(server)


def test_server_answers_400_never_500() -> None:
    tensor = '{"name":"x","datatype":"UINT8","shape":[2],"data":[1,2]}'
    cases = [
        '{"id":"\\ud800","inputs":[' + tensor + "]}",
        '{"id":"\\udc00x","inputs":[' + tensor + "]}",
        '{"inputs":[' + tensor + '],"inputs":[' + tensor + "]}",
        '{"id":"a","id":"b","inputs":[' + tensor + "]}",
        '{"id":"\\ud83d\\ude00","inputs":[' + tensor + "]}",  # a valid pair is echoed
    ]
    responses = asyncio.run(_post_to_server([_request(h) for h in cases]))
    messages = [r.json()["error"] for r in responses[:4]]
    assert [r.status_code for r in responses] == [400, 400, 400, 400, 200]
    assert "The surrogate pair in string is invalid" in messages[0]
    assert "The surrogate pair in string is invalid" in messages[1]
    assert 'duplicate key "inputs"' in messages[2]
    assert 'duplicate key "id"' in messages[3]
    assert responses[4].json()["id"] == "\U0001f600"


@pytest.mark.parametrize(
    ("tail", "nul"), [(b"\0\0", True), (b"\0x", True), (b"  x", False), (b"x\0", False)]
)
def test_bytes_after_the_json_are_refused_with_a_hint(tail: bytes, nul: bool) -> None:
    """Text after the JSON points at the header length; a NUL byte there (the
    padding some clients add, or a header length one too long into tensor
    bytes that start with 0) also says that JSON does not take it as padding."""
    header = b'{"inputs":[{"name":"x","datatype":"UINT8","shape":[1],"data":[1]}]}'
    at = len(header) + tail.count(b" ")
    with pytest.raises(RemoteProtocolError, match=f"Extra data; the JSON ends at byte {at}") as err:
        binproto.decode_request(header + tail, header_length=None)
    assert err.value.offset == at
    assert ("a NUL byte after the JSON is no whitespace" in str(err.value)) == nul


# -- orjson (the fast extra): the same results as the standard parser ---------------


def _canonical(value: object) -> object:
    """``value`` with every type made visible: an int is not a float, -0.0 is
    not 0.0, NaN equals NaN, and key order counts."""
    if isinstance(value, dict):
        return ("dict", [(k, _canonical(v)) for k, v in value.items()])
    if isinstance(value, list):
        return ("list", [_canonical(v) for v in value])
    if isinstance(value, float):
        return ("float", value.hex())
    return (type(value).__name__, value)


def _outcome(raw: bytes, fast: Callable[[bytes], object] | None, max_depth: int = 16) -> object:
    """What loads_header makes of ``raw`` with ``fast`` as its fast parser."""
    saved = binproto._json.FAST_LOADS
    binproto._json.FAST_LOADS = fast
    try:
        return ("ok", _canonical(loads_header(raw, max_depth=max_depth)))
    except RemoteProtocolError as exc:
        return ("error", str(exc), exc.offset, exc.status_hint)
    finally:
        binproto._json.FAST_LOADS = saved


def _same_with_orjson(raw: bytes, max_depth: int = 16) -> None:
    orjson = pytest.importorskip("orjson")
    assert _outcome(raw, orjson.loads, max_depth) == _outcome(raw, None, max_depth), raw


# Texts where the two parsers differ, or might: each must come out the same.
EDGES = [
    b'{"a":NaN,"b":Infinity,"c":-Infinity}',
    b"[9223372036854775807,-9223372036854775808,18446744073709551615]",
    b"[18446744073709551616,-9223372036854775809,123456789012345678901234567890]",
    b"[1e400,-1e400,1.5e-400,5e-324,1.7976931348623157e308,2.2250738585072014e-308]",
    b'[0.1000000000000000055511151231257827,"1234567890123456789"]',
    b"[-0,-0.0,0.0,1E2,1e-2,10.5e+3]",
    b'["\\ud800"]',
    b'["\\udc00\\ud800","\\ud83d\\ude00","\\ud800\\u0041"]',
    b"\xef\xbb\xbf{}",
    b'{"a":"\xff"}',
    b'{"a":"\xed\xa0\x80"}',  # a surrogate encoded in UTF-8 (CESU)
    b' \t\r\n{"a":1} \n',
    b'\x0c{"a":1}',
    b'{"a":1}x',
    b'{"a":1}\x00',
    b'{"a":"\x1f"}',
    b'{"a":"\x7f"}',
    b'{"a":1,"a":2}',
    b"[01]",
    b"[1.]",
    b"[.5]",
    b"[+1]",
    b"[1e]",
    b"[" * 17 + b"]" * 17,
    b"[" * 16 + b"]" * 16,
    b"",
    b'{"a":1',
    b'"\\x"',
    b"[true,false,null]",
    b"[tru]",
]


@pytest.mark.parametrize("raw", EDGES)
def test_orjson_and_the_standard_parser_give_the_same_result(raw: bytes) -> None:
    _same_with_orjson(raw)


_JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(st.characters(codec=None, exclude_categories=()), max_size=6),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=12,
)
_NUMBERS = st.from_regex(
    rb"-?(0|[1-9][0-9]{0,8})(\.[0-9]{1,9})?([eE][+-]?[0-9]{1,3})?", fullmatch=True
) | st.from_regex(rb"-?(0|[1-9][0-9]{0,24})(\.[0-9]{1,22})?([eE][+-]?[0-9]{1,4})?", fullmatch=True)


@st.composite
def _json_texts(draw: st.DrawFn) -> bytes:
    """JSON texts as peers write them (escaped or raw UTF-8, lone surrogates,
    big integers, NaN), number literals, and texts one byte away from them."""
    if draw(st.booleans()):
        value = draw(_JSON_VALUES)
        text = json.dumps(value, ensure_ascii=draw(st.booleans()))
        raw = text.encode("utf-8", "surrogatepass")
    else:
        raw = b"[" + b",".join(draw(st.lists(_NUMBERS, min_size=1, max_size=4))) + b"]"
    if raw and draw(st.booleans()):  # one byte changed, added or dropped
        at = draw(st.integers(0, len(raw) - 1))
        byte = bytes([draw(st.integers(0, 255))])
        raw = draw(
            st.sampled_from(
                [
                    raw[:at] + byte + raw[at + 1 :],
                    raw[:at] + byte + raw[at:],
                    raw[:at] + raw[at + 1 :],
                ]
            )
        )
    return raw


@pytest.mark.slow
@settings(max_examples=1500, deadline=None)
@given(_json_texts())
def test_orjson_and_the_standard_parser_agree_on_any_text(raw: bytes) -> None:
    _same_with_orjson(raw)


@pytest.mark.parametrize("depth", [200, 257, 990, 1000, 1024, 1100])
@pytest.mark.parametrize("max_depth", [256, 5000])
def test_orjson_and_the_standard_parser_agree_on_deep_nesting(depth: int, max_depth: int) -> None:
    # The standard parser runs out of Python stack near 1000 levels, orjson at
    # 1024: a depth limit raised that far must not tell them apart.
    _same_with_orjson(b'{"p":' + b'{"k":' * depth + b"1" + b"}" * depth + b"}", max_depth)
    _same_with_orjson(b"[" * depth + b"]" * depth, max_depth)


def test_a_header_nested_near_the_stack_limit_is_a_400_whatever_parses_it() -> None:
    depth = 1000
    nested = '{"k":' * depth + "1" + "}" * depth
    raw = ('{"id":"a","inputs":[' + TENSOR + '],"parameters":{"p":' + nested + "}}").encode()
    with pytest.raises(RemoteProtocolError, match="nesting") as err:
        binproto.decode_request(
            raw, header_length=len(raw), limits=binproto.Limits(max_json_depth=5000)
        )
    assert err.value.status_hint == 400


def test_orjson_parses_the_header_when_installed() -> None:
    orjson = pytest.importorskip("orjson")
    assert binproto._json.FAST_LOADS is orjson.loads
    parsed: list[bytes] = []

    def spy(raw: bytes) -> object:
        parsed.append(raw)
        return orjson.loads(raw)

    body, hl = make_body({"id": "a", "inputs": [json.loads(TENSOR)]})
    plain = binproto.decode_request(body, header_length=hl)
    binproto._json.FAST_LOADS = spy
    try:
        fast = binproto.decode_request(body, header_length=hl)
    finally:
        binproto._json.FAST_LOADS = orjson.loads
    assert parsed == [body[:hl]]
    assert fast.header.raw == plain.header.raw
    assert fast.tensors["x"].tolist() == plain.tensors["x"].tolist() == [1, 2]
    # An integer past 64 bits is the standard parser's (orjson makes it a float).
    big, hl = make_body({"id": "a", "inputs": [json.loads(TENSOR)], "parameters": {"n": 2**64}})
    binproto._json.FAST_LOADS = spy
    try:
        header = binproto.decode_request(big, header_length=hl).header
    finally:
        binproto._json.FAST_LOADS = orjson.loads
    assert parsed == [body[:hl]] and header.parameters["n"] == 2**64
    # A header over FAST_MAX too: orjson's working memory is many times its size.
    long_id = "a" * binproto._json.FAST_MAX
    big, hl = make_body({"id": long_id, "inputs": [json.loads(TENSOR)]})
    binproto._json.FAST_LOADS = spy
    try:
        header = binproto.decode_request(big, header_length=hl).header
    finally:
        binproto._json.FAST_LOADS = orjson.loads
    assert parsed == [body[:hl]] and header.id == long_id


@pytest.mark.parametrize("max_depth", [0, 1, 5, 100])
@pytest.mark.parametrize("wrap", ["[]", "{}"])
def test_the_shortest_header_past_the_depth_limit_is_refused(max_depth: int, wrap: str) -> None:
    # Nesting d deep takes 2d bytes at least: a header of 2 x max_depth bytes
    # is never scanned, and the shortest one a level deeper is refused.
    opener, closer = wrap.encode()[:1], wrap.encode()[1:]
    if wrap == "{}":  # an object needs a key and a value at each level
        at_limit = b'{"a":' * max_depth + b"1" + b"}" * max_depth
        past = b'{"a":' * (max_depth + 1) + b"1" + b"}" * (max_depth + 1)
    else:
        at_limit = opener * max_depth + closer * max_depth
        past = opener * (max_depth + 1) + closer * (max_depth + 1)
    if max_depth:
        loads_header(at_limit, max_depth=max_depth)
    with pytest.raises(RemoteProtocolError, match="nesting"):
        loads_header(past, max_depth=max_depth)


@pytest.mark.parametrize("raw", [b"[[[[", b"{{{{", b"[[[]", b"[{[{"])
def test_short_unbalanced_headers_are_refused_as_malformed(raw: bytes) -> None:
    # Too short to be nested past the limit, so not scanned for depth: the
    # JSON parser refuses them, as it refuses any other malformed header.
    with pytest.raises(RemoteProtocolError, match="failed to parse") as err:
        loads_header(raw, max_depth=2)
    assert err.value.status_hint == 400 and err.value.offset is not None
