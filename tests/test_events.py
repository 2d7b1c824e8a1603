"""Parser events: immutable named tuples, one ``Event`` union for them all."""

from __future__ import annotations

import numpy as np
import pytest

import binproto


def test_parser_chunks_are_immutable_named_tuples() -> None:
    data = np.arange(4, dtype=np.int32)
    encoded = binproto.encode_response({"x": data}, model_name="m")
    body = bytes(encoded)
    p = binproto.Parser("response", header_length=encoded.header_length)
    p.receive_data(body)
    chunk = next(e for e in p.events() if isinstance(e, binproto.TensorChunk))
    assert type(chunk) is binproto.TensorChunk and isinstance(chunk, binproto.Event)
    made = binproto.TensorChunk(index=0, name="x", offset=0, data=chunk.data)
    assert chunk == made
    assert chunk._fields == ("index", "name", "offset", "data")
    for event in (chunk, made):
        with pytest.raises(AttributeError):
            event.offset = 1  # type: ignore[misc]
        with pytest.raises(AttributeError):
            event.extra = 1  # type: ignore[attr-defined]


def test_every_event_of_a_body_is_an_event_and_reads_plainly() -> None:
    encoded = binproto.encode_response({"x": np.arange(4, dtype=np.int32)}, model_name="m")
    parser = binproto.Parser("response", header_length=encoded.header_length)
    parser.receive_data(bytes(encoded))
    parser.receive_data(b"")
    events = list(parser.events())
    assert [type(e).__name__ for e in events] == [
        "HeaderParsed", "TensorChunk", "TensorComplete", "MessageComplete"
    ]  # fmt: skip
    assert all(isinstance(e, binproto.Event) for e in events)
    assert all(events)  # MessageComplete has no fields, but is true like the others
    assert not isinstance(b"x", binproto.Event)
    assert [repr(e) for e in events] == [
        "HeaderParsed(kind='response', tensors=['x'])",
        "TensorChunk(index=0, name='x', offset=0, len=16, data=<0000000001000000…>)",
        "TensorComplete(index=0, name='x')",
        "MessageComplete()",
    ]
    complete = events[2]
    assert type(complete) is binproto.TensorComplete
    assert complete.info is parser.header.tensors[0]  # type: ignore[union-attr]
    with pytest.raises(AttributeError):
        complete.index = 1  # type: ignore[misc]
