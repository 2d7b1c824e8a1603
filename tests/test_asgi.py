"""The ASGI adapter's helpers on raw ASGI callables and Starlette streams:
reading requests and sending responses. (The FastAPI example under
uvicorn: test_asgi_example.py.)"""

from __future__ import annotations

import asyncio
import gc
import gzip
import itertools
import logging
import subprocess
import sys
import weakref
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.requests import Request

import binproto
from binproto._http import SEEN_PER_KEPT, KeptOnSecondSight
from binproto.adapters import _intake, asgi
from tests.fakes import AsgiRecorder
from tests.helpers import arrays_equal

MiB = 1 << 20

# -- raw ASGI -------------------------------------------------------------------------


def scope_for(headers: list[tuple[str, str]]) -> dict[str, Any]:
    """An ASGI HTTP scope carrying ``headers`` (lower-cased, as servers give them)."""
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]
    return {"type": "http", "method": "POST", "path": "/", "headers": raw}


def receiver(chunks: list[bytes], *, disconnect: bool = False) -> asgi.Receive:
    """An ASGI receive callable delivering ``chunks`` (then a disconnect, if asked)."""
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": c, "more_body": disconnect or i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]
    if disconnect:
        messages.append({"type": "http.disconnect"})
    queue = iter(messages)

    async def receive() -> dict[str, Any]:
        return next(queue)

    return receive


def sample_inputs() -> dict[str, Any]:
    return {
        "fp32": np.arange(12, dtype=np.float32).reshape(3, 4),
        "int64": np.array([-(2**40), 7], dtype=np.int64),
        "bool": np.array([True, False, True]),
        "text": np.array([b"a", b"", b"\xff\x00"], dtype=object),
        "empty": np.zeros((0, 3), dtype=np.uint16),
    }


def encoded() -> tuple[binproto.EncodedBody, bytes]:
    body = binproto.encode_request(sample_inputs())
    return body, bytes(body)


def split_at(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)] or [b""]


def check_decoded(msg: binproto.DecodedMessage) -> None:
    expected = sample_inputs()
    assert set(msg.tensors) == set(expected)
    for name, arr in expected.items():
        assert arrays_equal(msg.tensors[name], np.asarray(arr)), name


@pytest.mark.parametrize("size", [1, 3, 64, 10**9])
def test_read_request_any_chunking(size: int) -> None:
    body, data = encoded()
    msg = asyncio.run(asgi.read_request(scope_for(body.headers), receiver(split_at(data, size))))
    check_decoded(msg)
    assert msg.header.kind == "request"


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_http_1_0_with_transfer_encoding_is_refused(version: str) -> None:
    # RFC 9112, section 6.1: HTTP/1.0 has no Transfer-Encoding, so the
    # framing is faulty, whatever the ASGI server made of it.
    body, data = encoded()
    scope = scope_for([*body.headers, ("Transfer-Encoding", "chunked")])
    scope["http_version"] = version
    if version == "1.1":  # (the same request over HTTP/1.1 is taken)
        check_decoded(asyncio.run(asgi.read_request(scope, receiver([data]))))
        asgi.parser_from_scope(scope)
        return
    with pytest.raises(
        binproto.RemoteProtocolError, match=r"HTTP/1\.0 request may not carry"
    ) as info:
        asyncio.run(asgi.read_request(scope, receiver([data])))
    assert info.value.status_hint == 400
    with pytest.raises(binproto.RemoteProtocolError, match=r"HTTP/1\.0 request may not carry"):
        asgi.parser_from_scope(scope)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=4000), max_size=6))
def test_read_request_hypothesis_splits(cuts: list[int]) -> None:
    body, data = encoded()
    points = sorted({c for c in cuts if c < len(data)})
    edges = [0, *points, len(data)]
    chunks = [data[a:b] for a, b in itertools.pairwise(edges)]
    msg = asyncio.run(asgi.read_request(scope_for(body.headers), receiver(chunks)))
    check_decoded(msg)


def _outcome(headers: list[tuple[str, str]], chunks: list[bytes]) -> tuple[Any, ...]:
    """What read_request makes of a body: its header and tensors, or its fault."""
    try:
        msg = asyncio.run(asgi.read_request(scope_for(headers), receiver(chunks)))
    except binproto.ProtocolError as exc:
        return (type(exc).__name__, exc.status_hint, exc.offset, exc.msg)
    arrays = {
        name: (a.dtype.str, a.shape, a.tolist() if a.dtype == object else a.tobytes())
        for name, a in msg.tensors.items()
    }
    return ("ok", msg.header.raw, arrays)


@settings(max_examples=150, deadline=None)
@given(
    edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=3),
    cut=st.integers(0, 10**6),
    length=st.sampled_from([0, -1, 1]),
)
def test_a_body_whole_or_in_pieces_gives_the_same_result_or_fault(
    edits: list[tuple[int, int]], cut: int, length: int
) -> None:
    # A body in one message is decoded whole, one in pieces by the parser:
    # for damaged bodies and a wrong header length too, the same outcome.
    body, data = encoded()
    damaged = bytearray(data)
    for where, value in edits:
        damaged[where % len(damaged)] = value
    headers = [
        (k, str(int(v) + length) if k == binproto.HEADER_LENGTH_NAME else v)
        for k, v in body.headers
    ]
    point = 1 + cut % (len(damaged) - 1)
    whole = _outcome(headers, [bytes(damaged)])
    assert whole == _outcome(headers, [bytes(damaged[:point]), bytes(damaged[point:])])
    if not edits and not length:
        assert whole[0] == "ok"


def test_a_body_in_one_message_is_decoded_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    # Most small requests arrive in one message: decoded as a whole body (the
    # parser's checks without its per-event work), into writable arrays of
    # their own, as the assembler would give.
    body, data = encoded()
    assembled = asyncio.run(
        asgi.read_request(scope_for(body.headers), receiver(split_at(data, 64)))
    )

    def no_assembler(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the body went through the events")

    def no_parser(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a parser was built")

    # (The body intake binproto's servers and the ASGI readers share.)
    monkeypatch.setattr(_intake, "TensorAssembler", no_assembler)
    monkeypatch.setattr(_intake, "Parser", no_parser)  # the head's claims need none either
    msg = asyncio.run(asgi.read_request(scope_for(body.headers), receiver([data])))
    check_decoded(msg)
    assert msg.header == assembled.header
    for arr in msg.tensors.values():
        if arr.dtype != object:
            assert arr.flags.writeable and not np.shares_memory(arr, np.frombuffer(data, np.uint8))
    # In pieces, or with destinations, the events are read as they come.
    with pytest.raises(AssertionError, match="a parser was built"):
        asyncio.run(asgi.read_request(scope_for(body.headers), receiver(split_at(data, 64))))


def test_arrays_of_a_body_in_one_message_are_aligned() -> None:
    # An odd-sized tensor before a float64 one: views of one buffer would be
    # misaligned; the assembler's arrays never are.
    inputs: dict[str, np.ndarray[Any, Any]] = {
        "a": np.arange(16, dtype=np.float64),
        "odd": np.arange(3, dtype=np.int8),
        "b": np.arange(4, dtype=np.float64),
    }
    body = binproto.encode_request(inputs, id="a")
    msg = asyncio.run(asgi.read_request(scope_for(body.headers), receiver([bytes(body)])))
    assert msg.tensors["a"].ctypes.data % 16 == 0  # the first tensor: aligned in place
    for name, array in inputs.items():
        assert msg.tensors[name].flags.aligned and msg.tensors[name].flags.writeable
        assert arrays_equal(msg.tensors[name], array)


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: d[:50] + b"!" + d[51:],  # the JSON
        lambda d: d.replace(b"\x01\x00\x01", b"\x01\x07\x01", 1),  # a BOOL byte
        lambda d: d.replace(b'"BOOL"', b'"BOOX"'),
    ],
)
def test_a_bad_body_in_one_message_fails_as_in_pieces(damage: Any) -> None:
    body, data = encoded()
    bad = damage(data)
    assert bad != data and len(bad) == len(data)

    def outcome(chunks: list[bytes]) -> Any:
        try:
            asyncio.run(asgi.read_request(scope_for(body.headers), receiver(chunks)))
        except binproto.RemoteProtocolError as exc:
            return (exc.msg, exc.status_hint, exc.offset)
        return None

    whole = outcome([bad])
    assert whole is not None and whole == outcome(split_at(bad, 7))


def test_iter_events_same_as_parser() -> None:
    body, data = encoded()

    async def collect() -> list[binproto.Event]:
        events = []
        async for ev in asgi.iter_events(scope_for(body.headers), receiver(split_at(data, 5))):
            events.append(ev)
        return events

    got = asyncio.run(collect())
    parser = binproto.Parser("request", header_length=body.header_length)
    parser.receive_data(data)
    parser.receive_data(b"")
    want = list(parser.events())
    assert type(got[0]) is binproto.HeaderParsed
    assert type(got[-1]) is binproto.MessageComplete
    merged = [bytes(e.data) for e in got if type(e) is binproto.TensorChunk]
    assert b"".join(merged) == b"".join(
        bytes(e.data) for e in want if type(e) is binproto.TensorChunk
    )


def test_starlette_request_stream_and_receive() -> None:
    body, data = encoded()
    scope = scope_for(body.headers)

    async def both() -> tuple[binproto.DecodedMessage, binproto.DecodedMessage]:
        request = Request(scope, receiver(split_at(data, 100)))
        a = await asgi.read_request(request.scope, request.stream())
        request = Request(scope, receiver(split_at(data, 100)))
        b = await asgi.read_request(request.scope, request.receive)
        return a, b

    for msg in asyncio.run(both()):
        check_decoded(msg)


def test_json_only_body_without_header_length() -> None:
    body = binproto.encode_request({"x": np.array([1, 2, 3], dtype=np.int32)}, binary=False)
    assert body.header_length is None
    msg = asyncio.run(asgi.read_request(scope_for(body.headers), receiver([bytes(body)])))
    assert msg.tensors["x"].tolist() == [1, 2, 3]


def test_chunked_body_without_content_length() -> None:
    body, data = encoded()
    headers = [(k, v) for k, v in body.headers if k.lower() != "content-length"]
    msg = asyncio.run(asgi.read_request(scope_for(headers), receiver(split_at(data, 7))))
    check_decoded(msg)


def fails(scope: dict[str, Any], receive: asgi.Receive) -> binproto.RemoteProtocolError:
    with pytest.raises(binproto.RemoteProtocolError) as info:
        asyncio.run(asgi.read_request(scope, receive))
    return info.value


def test_disconnect_mid_body() -> None:
    body, data = encoded()
    err = fails(scope_for(body.headers), receiver([data[:50]], disconnect=True))
    assert err.status_hint == 400
    assert err.offset == 50
    assert "disconnected" in str(err)


def test_disconnect_mid_body_is_a_client_disconnected_logged_at_info(
    caplog: pytest.LogCaptureFixture,
) -> None:
    body, data = encoded()
    caplog.set_level(logging.INFO, logger="binproto.asgi")
    err = fails(scope_for(body.headers), receiver([data[:50]], disconnect=True))
    assert isinstance(err, asgi.ClientDisconnected) and err.offset == 50
    assert [r.levelno for r in caplog.records] == [logging.INFO]


def _example_app() -> Any:
    import importlib.util

    from tests.example_server import EXAMPLE

    spec = importlib.util.spec_from_file_location("example_fastapi_server", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.app


def test_fastapi_example_client_leaving_mid_body_is_a_quiet_close(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Starlette's request.stream() raises ClientDisconnect on http.disconnect:
    # that ends the request quietly (INFO), not as a fault of the application.
    body, data = encoded()
    scope = scope_for(body.headers)
    scope.update(path="/v2/models/echo/infer", raw_path=b"/v2/models/echo/infer")
    scope.update(query_string=b"", root_path="", scheme="http", http_version="1.1")
    scope.update(server=("127.0.0.1", 8000), client=("127.0.0.1", 1234))
    caplog.set_level(logging.INFO)
    asyncio.run(_example_app()(scope, receiver([data[:50]], disconnect=True), AsgiRecorder()))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.name for r in caplog.records if r.levelno == logging.INFO] == ["binproto.asgi"]


def test_a_failed_read_lets_its_arrays_go_at_once() -> None:
    # The body ends inside its second tensor, after the first is assembled:
    # the fault (kept by the parser, in a cycle with its traceback) must not
    # keep the first tensor's array until the garbage collector runs.
    body = binproto.encode_request(
        {"a": np.ones(1 << 16, dtype=np.float32), "b": np.ones(1 << 16, dtype=np.float32)}
    )
    data = bytes(body)
    refs: list[weakref.ref[np.ndarray[Any, Any]]] = []

    def destination(info: binproto.TensorInfo) -> np.ndarray[Any, Any]:
        array: np.ndarray[Any, Any] = np.empty(info.shape, dtype=np.float32)
        refs.append(weakref.ref(array))
        return array

    gc.disable()
    try:
        try:
            asyncio.run(
                asgi.read_request(
                    scope_for(body.headers), receiver([data[:-100]]), destinations=destination
                )
            )
        except binproto.RemoteProtocolError as exc:
            assert "b" in str(exc) or exc.offset is not None
        assert len(refs) == 2
        assert refs[0]() is None and refs[1]() is None
    finally:
        gc.enable()


def test_body_shorter_than_declared() -> None:
    body, data = encoded()
    headers = [(k, v) for k, v in body.headers if k.lower() != "content-length"]
    err = fails(scope_for(headers), receiver([data[:-3]]))
    assert err.status_hint == 400
    assert "expecting 3 additional bytes" in str(err)


def test_body_longer_than_declared() -> None:
    body, data = encoded()
    headers = [(k, v) for k, v in body.headers if k.lower() != "content-length"]
    err = fails(scope_for(headers), receiver([data, b"xx"]))
    assert "additional" in str(err)


@pytest.mark.parametrize(
    ("name", "value", "status"),
    [
        ("Inference-Header-Content-Length", "abc", 400),
        ("Inference-Header-Content-Length", "999999", 400),
        ("Content-Length", "12x", 400),
        ("Content-Encoding", "br", 415),
    ],
)
def test_bad_framing_headers(name: str, value: str, status: int) -> None:
    body, data = encoded()
    headers = [(k, v) for k, v in body.headers if k.lower() != name.lower()]
    headers.append((name, value))
    err = fails(scope_for(headers), receiver([data]))
    assert err.status_hint == status


class _CountedFields(binproto.HeaderFields):
    made = 0

    def __init__(self, headers: Any) -> None:
        type(self).made += 1
        super().__init__(headers)


@pytest.fixture
def counted_fields(monkeypatch: pytest.MonkeyPatch) -> type[_CountedFields]:
    """HeaderFields counted as the ASGI readers make them, none kept yet."""
    monkeypatch.setattr(asgi, "HeaderFields", _CountedFields)
    monkeypatch.setattr(asgi, "_known_lists", KeptOnSecondSight())
    _CountedFields.made = 0
    return _CountedFields


def test_a_header_list_that_comes_again_is_read_once(
    counted_fields: type[_CountedFields],
) -> None:
    body, data = encoded()
    for _ in range(3):  # equal lists, each made anew (as a server makes them)
        msg = asyncio.run(asgi.read_request(scope_for(body.headers), receiver([data])))
        check_decoded(msg)
        parser = asgi.parser_from_scope(scope_for(body.headers))
        assert (parser.header_length, parser.content_length) == (body.header_length, len(data))
    # Noted the first time, kept the second, read no more.
    assert counted_fields.made == 2 and len(asgi._known_lists.kept) == 1
    # Another body length is another list.
    other = binproto.encode_request({"x": np.zeros(3, np.float32)})
    for _ in range(3):
        msg = asyncio.run(asgi.read_request(scope_for(other.headers), receiver([bytes(other)])))
        assert msg.tensors["x"].shape == (3,)
    assert counted_fields.made == 4 and len(asgi._known_lists.kept) == 2


def test_a_header_list_of_the_most_lines_kept_is_kept(
    counted_fields: type[_CountedFields],
) -> None:
    body, _ = encoded()
    extra = [(f"x-{i}", "") for i in range(asgi.KNOWN_HEADER_LINES - len(body.headers))]
    for _ in range(3):
        asgi.parser_from_scope(scope_for([*body.headers, *extra]))
    assert counted_fields.made == 2 and len(asgi._known_lists.kept) == 1


@pytest.mark.parametrize(
    "extra",
    [
        [("Authorization", "Bearer secret")],
        [("cookie", "session=1")],
        [("Proxy-Authorization", "Basic eDp5")],
        [("x-long", "v" * asgi.KNOWN_HEADER_BYTES)],
        [(f"x-{i}", "") for i in range(asgi.KNOWN_HEADER_LINES)],
    ],
)
def test_a_header_list_with_credentials_or_too_long_is_read_each_time(
    counted_fields: type[_CountedFields], extra: list[tuple[str, str]]
) -> None:
    body, data = encoded()
    for _ in range(3):
        msg = asyncio.run(asgi.read_request(scope_for([*body.headers, *extra]), receiver([data])))
        check_decoded(msg)
    assert counted_fields.made == 3
    assert not asgi._known_lists.kept


def test_only_lists_of_bytes_are_kept_and_only_they_find_one(
    counted_fields: type[_CountedFields],
) -> None:
    body, data = encoded()
    kept = scope_for(body.headers)
    for _ in range(2):
        asgi.parser_from_scope(scope_for(body.headers))
    assert len(asgi._known_lists.kept) == 1 and counted_fields.made == 2

    class Name(bytes):
        pass

    # Equal to the kept list, but not bytes: read each time, as before, and a
    # fault of the same list read fresh stays a fault.
    as_text = [(k.decode(), v.decode()) for k, v in kept["headers"]]
    assert asgi.parser_from_scope({"headers": as_text}).content_length == len(data)
    for odd in (
        [(Name(k), v) for k, v in kept["headers"]],
        [(k, memoryview(v)) for k, v in kept["headers"]],
    ):
        with pytest.raises(binproto.LocalProtocolError, match="str or bytes"):
            asgi.parser_from_scope({"headers": odd})
    assert counted_fields.made == 5 and len(asgi._known_lists.kept) == 1
    # Under python -bb, a str list equal to a kept bytes list is no BytesWarning.
    code = (
        "from binproto.adapters import asgi\n"
        "h = [(b'content-length', b'5'), (b'inference-header-content-length', b'2')]\n"
        "for _ in range(2): asgi.parser_from_scope({'headers': h})\n"
        "t = [(k.decode(), v.decode()) for k, v in h]\n"
        "assert asgi.parser_from_scope({'headers': t}).header_length == 2\n"
    )
    subprocess.run([sys.executable, "-bb", "-c", code], check=True)


def test_header_lists_kept_are_bounded_and_pairs_may_be_lists(
    counted_fields: type[_CountedFields], monkeypatch: pytest.MonkeyPatch
) -> None:
    body, data = encoded()
    for i in range(asgi.KNOWN_HEADER_LISTS + 5):
        for _ in range(2):
            asgi.parser_from_scope(scope_for([*body.headers, ("x-request", str(i))]))
        assert 0 < len(asgi._known_lists.kept) <= asgi.KNOWN_HEADER_LISTS
    for i in range(SEEN_PER_KEPT * asgi.KNOWN_HEADER_LISTS + 5):
        asgi.parser_from_scope(scope_for([*body.headers, ("x-id", str(i))]))
        assert len(asgi._known_lists.seen) <= SEEN_PER_KEPT * asgi.KNOWN_HEADER_LISTS
    # None kept, and none used, when none may be.
    last = scope_for([*body.headers, ("x-request", str(asgi.KNOWN_HEADER_LISTS + 4))])
    assert tuple(last["headers"]) in asgi._known_lists.kept  # kept now
    monkeypatch.setattr(asgi, "KNOWN_HEADER_LISTS", 0)
    made = counted_fields.made
    for _ in range(2):
        asgi.parser_from_scope(scope_for([*body.headers, ("x-request", "new")]))
        asgi.parser_from_scope(last)
    assert counted_fields.made == made + 4
    assert tuple(scope_for([*body.headers, ("x-request", "new")])["headers"]) not in (
        asgi._known_lists.kept
    )
    # Pairs as lists (ASGI allows any two-item iterable): read, not kept.
    monkeypatch.setattr(asgi, "KNOWN_HEADER_LISTS", 64)
    scope = scope_for(body.headers)
    scope["headers"] = [list(pair) for pair in scope["headers"]]
    asgi._known_lists.kept.clear()
    for _ in range(3):
        check_decoded(asyncio.run(asgi.read_request(scope, receiver([data]))))
    assert not asgi._known_lists.kept


def test_a_kept_header_list_with_a_bad_claim_fails_each_time(
    counted_fields: type[_CountedFields],
) -> None:
    body, data = encoded()
    headers = [*body.headers, ("content-length", "1")]  # a second, different length
    for _ in range(3):
        err = fails(scope_for(headers), receiver([data]))
        assert err.status_hint == 400 and "conflicting Content-Length" in str(err)
    assert counted_fields.made == 2


def test_gzip_request_body() -> None:
    body, data = encoded()
    packed = gzip.compress(data)
    headers = [(k, v) for k, v in body.headers if k.lower() != "content-length"]
    headers += [("Content-Length", str(len(packed))), ("Content-Encoding", "gzip")]
    msg = asyncio.run(asgi.read_request(scope_for(headers), receiver(split_at(packed, 33))))
    check_decoded(msg)


def test_limits_apply() -> None:
    body, data = encoded()
    limits = binproto.Limits(max_tensor_bytes=8)
    with pytest.raises(binproto.RemoteProtocolError) as info:
        asyncio.run(asgi.read_request(scope_for(body.headers), receiver([data]), limits=limits))
    assert info.value.status_hint == 413


def test_destinations_receive_the_tensor() -> None:
    body, data = encoded()
    dest = np.empty((3, 4), dtype=np.float32)
    msg = asyncio.run(
        asgi.read_request(
            scope_for(body.headers), receiver(split_at(data, 9)), destinations={"fp32": dest}
        )
    )
    assert msg.tensors["fp32"] is dest
    assert dest.tolist() == sample_inputs()["fp32"].tolist()


# -- reading: claims in the head, raw binary requests ----------------------------------


@pytest.mark.parametrize("reader", ["iter_events", "read_request"])
@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ([("Content-Length", str(100 << 30)), ("Inference-Header-Content-Length", "10")], 413),
        ([("Content-Length", "100"), ("Inference-Header-Content-Length", str(1 << 30))], 400),
        ([("Content-Length", "100"), ("Inference-Header-Content-Length", "0")], 400),
        (
            [("Content-Length", str(65 << 20)), ("Inference-Header-Content-Length", str(65 << 20))],
            413,
        ),
        ([("Content-Length", "10"), ("Content-Encoding", "br")], 415),
        ([("Content-Length", "0")], 400),  # no body: no header
        ([("Content-Length", "0"), ("Content-Encoding", "gzip")], 400),
    ],
)
def test_claims_in_the_head_are_refused_before_the_first_receive(
    reader: str, headers: list[tuple[str, str]], status: int
) -> None:
    # A server sends "100 Continue" on the app's first receive(): a body the
    # head already rules out (too long, a header past its end, a raw request,
    # a header over its limit, a coding binproto cannot decode) must be
    # refused before it.
    received: list[int] = []

    async def receive() -> dict[str, Any]:
        received.append(1)
        return {"type": "http.request", "body": b"{", "more_body": True}

    async def main() -> None:
        if reader == "read_request":
            await asgi.read_request(scope_for(headers), receive)
            return
        async for _ in asgi.iter_events(scope_for(headers), receive):
            pass

    with pytest.raises(binproto.RemoteProtocolError) as info:
        asyncio.run(main())
    assert info.value.status_hint == status and not received


def test_read_request_refuses_bad_limits_as_misuse_before_receiving() -> None:
    body, data = encoded()
    received: list[int] = []

    async def receive() -> dict[str, Any]:
        received.append(1)
        return {"type": "http.request", "body": data, "more_body": False}

    with pytest.raises(binproto.LocalProtocolError, match="limits"):
        asyncio.run(
            asgi.read_request(scope_for(body.headers), receive, limits={})  # type: ignore[arg-type]
        )
    assert not received


def test_a_compressed_message_is_never_held_expanded() -> None:
    # One message of 64 KB that inflates to 64 MiB: its events are made as
    # they are taken, so the consumer holds a step of it at a time.
    import gzip
    import tracemalloc

    size = 64 << 20
    header = binproto.encode_request({"z": np.zeros(1, dtype=np.uint8)}).buffers[0]
    header = bytes(header).replace(b'"shape":[1]', f'"shape":[{size}]'.encode())
    header = header.replace(b'"binary_data_size":1', f'"binary_data_size":{size}'.encode())
    body = gzip.compress(header + bytes(size), compresslevel=1)
    scope = scope_for(
        [
            ("Content-Encoding", "gzip"),
            ("Inference-Header-Content-Length", str(len(header))),
            ("Content-Length", str(len(body))),
        ]
    )

    async def count() -> int:
        total = 0
        async for event in asgi.iter_events(scope, receiver([body])):
            if isinstance(event, binproto.TensorChunk):
                total += len(event.data)
        return total

    tracemalloc.start()
    try:
        assert asyncio.run(count()) == size
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak


_RAW_HEADERS = [("Inference-Header-Content-Length", "0"), ("Content-Length", "12")]
_RAW_SPEC = binproto.TensorSpec("x", "FP32", [-1])


@pytest.mark.parametrize("pieces", [1, 3], ids=["whole", "in pieces"])
def test_read_request_takes_a_raw_binary_request_given_the_models_input(pieces: int) -> None:
    x = np.array([1.0, 2.5, -4.0], dtype=np.float32)
    data = x.tobytes()
    chunks = [data[i * len(data) // pieces : (i + 1) * len(data) // pieces] for i in range(pieces)]
    got = asyncio.run(
        asgi.read_request(scope_for(_RAW_HEADERS), receiver(chunks), raw_input=_RAW_SPEC)
    )
    assert got.tensors["x"].tolist() == x.tolist()
    assert got.header.binary_data_output is True  # a raw request's outputs travel binary
    events = asyncio.run(_events_of(chunks, raw_input=_RAW_SPEC))
    names = [type(e).__name__ for e in events]
    assert names[0] == "HeaderParsed" and names[-2:] == ["TensorComplete", "MessageComplete"]
    assert names.count("TensorChunk") == pieces


async def _events_of(
    chunks: list[bytes], headers: list[tuple[str, str]] | None = None, **options: Any
) -> list[binproto.Event]:
    scope = scope_for(_RAW_HEADERS if headers is None else [_RAW_HEADERS[0], *headers])
    return [e async for e in asgi.iter_events(scope, receiver(chunks), **options)]


def test_a_raw_binary_request_without_the_models_input_is_refused() -> None:
    with pytest.raises(binproto.RemoteProtocolError, match="raw binary requests"):
        asyncio.run(asgi.read_request(scope_for(_RAW_HEADERS), receiver([b"\0" * 12])))


@pytest.mark.parametrize(
    "spec", [_RAW_SPEC, binproto.TensorSpec("s", "BYTES", [1])], ids=["variable", "BYTES"]
)
def test_a_raw_request_whose_length_gives_its_shape_needs_content_length(
    spec: binproto.TensorSpec,
) -> None:
    # Sent chunked, the peer's fault (411), not the caller's (a parser built
    # without content_length says so with a LocalProtocolError).
    scope = scope_for([("Inference-Header-Content-Length", "0")])
    for call in (
        lambda: asgi.read_request(scope, receiver([b"\0" * 4, b"\0" * 8]), raw_input=spec),
        lambda: _events_of([b"\0" * 12], raw_input=spec, headers=[]),
    ):
        with pytest.raises(binproto.RemoteProtocolError, match="needs Content-Length") as info:
            asyncio.run(call())
        assert info.value.status_hint == 411
