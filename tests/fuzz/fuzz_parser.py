#!/usr/bin/env python3
"""Fuzz target for the body parser (atheris / libFuzzer).

Each input is split by a FuzzedDataProvider into a parser configuration (kind,
content encoding, raw mode, whether the length is known), chunk boundaries,
and a body. The body is parsed whole and in the fuzzed chunking; the target
asserts that only RemoteProtocolError escapes and that both give the same
normalized events, or the same error message and offset. When the length is
known, the whole-body ``decode_*`` must accept the body too, or report the
same fault.

Run (see tests/fuzz/README.md)::

    python tests/fuzz/fuzz_parser.py -runs=10000000 tests/fuzz/corpus
"""

from __future__ import annotations

import gzip
import sys
import zlib
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# Coverage feedback from binproto only: instrumenting numpy and the standard
# library would make every run several times slower.
with atheris.instrument_imports(include=["binproto"]):
    import binproto
from tests.helpers import Outcome, run, split

LIMITS = binproto.Limits(
    max_header_bytes=8192,
    max_tensors=16,
    max_tensor_bytes=1 << 16,
    max_body_bytes=1 << 17,
    max_json_depth=32,
    # Below the ratio floor: the ratio limit never decides, the byte cap does.
    max_decompressed_bytes=1 << 16,
)

RAW_SPECS = (
    binproto.TensorSpec("raw", "FP32", [-1, -1], batched=True),
    binproto.TensorSpec("raw", "BYTES", [1]),
    binproto.TensorSpec("raw", "INT8", [3, -1]),
    binproto.TensorSpec("raw", "UINT16", [2, 2]),
    binproto.TensorSpec("raw", "BOOL", [-1]),
    binproto.TensorSpec("raw", "INT16", [-1, -1]),  # cannot be deduced: an error
    binproto.TensorSpec("raw", "BYTES", [-1, 1], batched=True),
)


def _compress(body: bytes, how: int) -> bytes:
    if how == 0:
        return gzip.compress(body, compresslevel=1)
    if how == 1:
        return zlib.compress(body, 1)
    comp = zlib.compressobj(1, zlib.DEFLATED, -15)  # raw deflate
    return comp.compress(body) + comp.flush()


def parse_case(data: bytes) -> tuple[Outcome, Outcome, tuple[object, ...] | None]:
    """The whole-body and chunked outcomes of the case ``data`` encodes, and
    what whole-body decoding gives: ``("ok",)`` or the error's type, message
    and offset (None when the length is not known)."""
    fdp = atheris.FuzzedDataProvider(data)
    flags = fdp.ConsumeInt(2)
    kind: binproto.Kind = "request" if flags & 1 else "response"
    encoding_mode = (flags >> 1 & 0x7) % 5  # identity, gzip, deflate, raw deflate, gzip bytes
    length_known = bool(flags & 0x100)
    raw_mode = bool(flags & 0x200) and kind == "request"
    header_length: int | None = fdp.ConsumeIntInRange(0, 4000)
    if flags & 0x400:
        header_length = None
    cuts = [fdp.ConsumeIntInRange(0, 700) for _ in range(fdp.ConsumeIntInRange(0, 6))]
    plain = fdp.ConsumeBytes(fdp.remaining_bytes())

    encoding: str | None = None
    body = plain
    if encoding_mode in (1, 2, 3):
        encoding = "gzip" if encoding_mode == 1 else "deflate"
        body = _compress(plain, encoding_mode - 1)
    elif encoding_mode == 4:
        encoding = "gzip"  # the fuzzer's bytes are the compressed stream itself
    spec = None
    if raw_mode:
        spec = RAW_SPECS[(flags >> 12) % len(RAW_SPECS)]
        header_length = 0
        if spec.needs_length:
            # The shape comes from the body's length: known for a whole body
            # (decode_request decompresses first), never to a streaming parser
            # of a compressed one (a 415, checked in test_one_input).
            if encoding_mode == 4:
                encoding, body = None, plain
            length_known = True
    content_length = len(body) if length_known else None

    def make() -> binproto.Parser:
        return binproto.Parser(
            kind,
            header_length=header_length,
            content_length=content_length,
            limits=LIMITS,
            content_encoding=encoding,
            raw_input=spec,
        )

    whole = run(make, [body])
    chunked = run(make, split(body, cuts))
    decoded: tuple[object, ...] | None = None
    if length_known:
        decoded = _decoded(kind, body, header_length, encoding, spec)
        if spec is not None and spec.needs_length and encoding is not None:
            # Streaming, the shape cannot be known up front: a 415. Whole,
            # the body decompresses to what the plain body decodes to.
            assert whole.error is not None and whole.error[2] == 415, whole.error
            plain_decoded = _decoded(kind, plain, 0, None, spec)
            assert decoded == plain_decoded, (decoded, plain_decoded)
            decoded = None
    return whole, chunked, decoded


def _decoded(
    kind: binproto.Kind,
    body: bytes,
    header_length: int | None,
    encoding: str | None,
    spec: binproto.TensorSpec | None,
) -> tuple[object, ...]:
    """What whole-body decoding gives: ``("ok", arrays)`` or the error's
    type, message and offset."""
    try:
        if kind == "request":
            msg = binproto.decode_request(
                body, header_length=header_length, limits=LIMITS,
                content_encoding=encoding, raw_input=spec,
            )  # fmt: skip
        else:
            msg = binproto.decode_response(
                body, header_length=header_length, limits=LIMITS, content_encoding=encoding
            )
    except binproto.ProtocolError as exc:
        return (type(exc).__name__, exc.msg, exc.offset)
    # Bytes compare NaNs too; BYTES (object) arrays compare by their elements.
    arrays = {
        name: (a.dtype.str, a.shape, a.tolist() if a.dtype.hasobject else a.tobytes())
        for name, a in msg.tensors.items()
    }
    return ("ok", arrays)


def test_one_input(data: bytes) -> None:
    """The libFuzzer entry point."""
    whole, chunked, decoded = parse_case(data)
    for outcome in (whole, chunked):
        if outcome.error is not None:
            assert outcome.error[0] == "RemoteProtocolError", outcome.error
    assert whole == chunked, (whole, chunked)
    if decoded is not None:
        if whole.error is None:
            assert decoded[0] == "ok", decoded
        else:
            assert decoded == ("RemoteProtocolError", whole.error[1], whole.error[3]), (
                decoded,
                whole.error,
            )


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
