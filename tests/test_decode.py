"""Whole-body decoding: views of the body, and the parser's own checks in
the parser's order (the same fault, message and offset as the parser)."""

from __future__ import annotations

import gzip
from typing import Any

import numpy as np
import pytest

import binproto
from binproto import LocalProtocolError, Parser, RemoteProtocolError
from binproto._decode import decode

from .bad_bodies import FAULTS
from .helpers import run


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


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_every_parser_fault_is_the_same_fault_whole(name: str) -> None:
    (body, hl, _), _, _, _ = FAULTS[name]
    # decode has the whole body, so the parser it stands for knows its length.
    parsed = run(lambda: Parser("request", header_length=hl, content_length=len(body)), [body])
    if parsed.error is None:  # a fault of a body whose length was not known
        assert binproto.decode_request(body, header_length=hl).header.kind == "request"
        return
    with pytest.raises(RemoteProtocolError) as caught:
        binproto.decode_request(body, header_length=hl)
    exc = caught.value
    assert ("RemoteProtocolError", exc.msg, exc.status_hint, exc.offset) == parsed.error


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ({"header_length": -1}, "header_length"),
        ({"header_length": True}, "header_length"),
        ({"header_length": 2, "limits": {}}, "limits must be a binproto.Limits"),
        ({"header_length": 2, "raw_input": "x"}, "raw_input must be a TensorSpec"),
    ],
)
def test_misuse_is_local_as_for_the_parser(args: dict[str, Any], match: str) -> None:
    with pytest.raises(LocalProtocolError, match=match):
        Parser("request", **args)
    with pytest.raises(LocalProtocolError, match=match):
        binproto.decode_request(b"{}", **args)
    with pytest.raises(LocalProtocolError, match="kind"):
        decode("both", b"{}", header_length=None)  # type: ignore[arg-type]


def test_a_plain_body_is_decoded_without_a_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    # Whole, a body needs the parser's checks but not its queue and events
    # (half a small request's decoding time).
    encoded = binproto.encode_request({"x": np.arange(4, dtype=np.int32)})
    body, hl = bytes(encoded), encoded.header_length

    def no_parser(*args: Any, **kwargs: Any) -> Parser:
        raise AssertionError("a Parser was built")

    monkeypatch.setattr(binproto._decode, "Parser", no_parser)
    assert binproto.decode_request(body, header_length=hl).tensors["x"].tolist() == [0, 1, 2, 3]
    # A compressed body goes through the parser's events.
    with pytest.raises(AssertionError, match="a Parser was built"):
        binproto.decode_request(gzip.compress(body), header_length=hl, content_encoding="gzip")
