"""Parser workloads: streaming a large body, one small request, whole-body decode,
BYTES, many tensors.

Each workload runs side by side with its baseline (a bare copy loop, or
tritonclient's response parser), interleaved round by round.
"""

from __future__ import annotations

import gc
import json
import math
import statistics
import struct
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import binproto

from ._harness import Row, interleave, median, mode, pick, row

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
CHUNK = 64 * KiB
# The header is padded with JSON whitespace to a page, so the tensor's
# 64 KiB pieces start at the same alignment in the body and in the destination
# (memcpy speed depends on alignment).
HEADER_PAD = 4096
# Whole-body decodes timed per sample (each takes a fraction of a millisecond).
INNER_DECODES = 20


def response_header(outputs: list[dict[str, Any]], pad: int = 0) -> bytes:
    """The JSON header of a response with ``outputs``, padded with spaces to ``pad``."""
    raw = json.dumps({"model_name": "bench", "id": "1", "outputs": outputs}).encode()
    if pad and len(raw) < pad:
        raw = raw.ljust(pad)
    return raw


def fp32_body(nbytes: int, pad: int = HEADER_PAD) -> tuple[np.ndarray[Any, Any], int]:
    """A response body with one FP32 output of ``nbytes``, in numpy memory."""
    header = response_header(
        [
            {
                "name": "output0",
                "datatype": "FP32",
                "shape": [nbytes // 4],
                "parameters": {"binary_data_size": nbytes},
            }
        ],
        pad,
    )
    hl = len(header)
    body = np.empty(hl + nbytes, dtype=np.uint8)
    body[:hl] = np.frombuffer(header, dtype=np.uint8)
    values = body[hl:].view(np.float32)  # may be unaligned without the pad: still valid
    values[:] = 1.5  # touches every page: real memory, not the zero page
    values[:: 4096 // 4] = np.arange(values[:: 4096 // 4].size, dtype=np.float32)
    return body, hl


def _tritonclient() -> Any:
    try:
        from tritonclient.http import InferenceServerClient
    except ImportError:  # pragma: no cover - tritonclient is in the test extra
        return None
    return InferenceServerClient


# -- streaming a large FP32 body in 64 KiB chunks ----------------------------------


def stream_rows(nbytes: int, repeats: int) -> list[Row]:
    """Parser overhead per chunk, and parse + assemble vs a bare copy loop."""
    body, hl = fp32_body(nbytes)
    total = len(body)
    view = body.data
    chunks = [view[i : i + CHUNK] for i in range(0, total, CHUNK)]
    # The tensor's pieces exactly as the parser hands them out.
    pieces = [chunks[0][hl:], *chunks[1:]]
    nchunks = len(chunks)
    size_label = _size(nbytes)

    def empty_loop() -> None:
        for _c in chunks:
            pass

    def events_loop() -> None:
        p = binproto.Parser("response", header_length=hl, content_length=total)
        receive = p.receive_data
        events = p.events
        for c in chunks:
            receive(c)
            for _ev in events():
                pass
        assert p.state is binproto.ParserState.DONE

    def next_event_loop() -> None:
        p = binproto.Parser("response", header_length=hl, content_length=total)
        receive = p.receive_data
        nxt = p.next_event
        need = binproto.NEED_DATA
        done = binproto.MessageComplete
        for c in chunks:
            receive(c)
            while True:
                ev = nxt()
                if ev is need or type(ev) is done:
                    break
        assert p.state is binproto.ParserState.DONE

    times = interleave(
        {"empty": empty_loop, "events": events_loop, "next_event": next_event_loop}, repeats
    )
    rows = []
    work = f"stream {size_label} FP32 in 64 KiB chunks: parser only"
    for impl, key in (
        ("binproto Parser, events() loop", "events"),
        ("binproto Parser, next_event() loop", "next_event"),
    ):
        per_chunk = [(t - e) / nchunks for t, e in zip(times[key], times["empty"], strict=True)]
        us = median(per_chunk) * 1e6
        rows.append(
            row(
                work,
                impl,
                times[key],
                nbytes=nbytes,
                chunks=nchunks,
                us_per_chunk=us,
                target="<= 1.5 us/chunk",
                met=us <= 1.5,
            )
        )

    dest = np.empty(nbytes // 4, dtype=np.float32)
    dest.view(np.uint8)[:] = 0  # fault the pages in once, like a reused buffer
    dest_mv = dest.data.cast("B")

    def bare_copy() -> None:
        off = 0
        for piece in pieces:
            n = len(piece)
            dest_mv[off : off + n] = piece
            off += n

    def assemble() -> None:
        p = binproto.Parser("response", header_length=hl, content_length=total)
        asm = binproto.TensorAssembler({"output0": dest})
        receive = p.receive_data
        events = p.events
        feed = asm.feed
        for c in chunks:
            receive(c)
            for ev in events():
                feed(ev)
        assert asm.tensors["output0"] is dest

    def least() -> None:
        receive, events = least_events(hl)
        for c in chunks:
            receive(c)
            for _, _, offset, data in events():
                dest_mv[offset : offset + len(data)] = data

    marks = np.arange(dest[:: 4096 // 4].size, dtype=np.float32)  # (as fp32_body writes them)
    for fill in (assemble, least):  # each leaves the whole tensor in dest
        dest[:] = -1
        fill()
        assert np.array_equal(dest[:: 4096 // 4], marks) and dest[1] == dest[-1] == 1.5, fill
    times = interleave({"bare": bare_copy, "asm": assemble, "least": least}, repeats)
    work = f"stream {size_label} FP32 in 64 KiB chunks: parse + copy, preallocated"
    overhead = [(a - b) / nchunks for a, b in zip(times["asm"], times["bare"], strict=True)]
    over_us = median(overhead) * 1e6
    rows.append(
        row(work, "bare copy loop (memoryview slice assignment)", times["bare"], nbytes=nbytes)
    )
    rows.append(
        row(
            work,
            "binproto Parser + TensorAssembler(destinations=)",
            times["asm"],
            nbytes=nbytes,
            baseline="bare copy loop",
            baseline_samples=times["bare"],
            min_ratio=0.85,
            chunks=nchunks,
            overhead_us_per_chunk=over_us,
            overhead_met=over_us <= 1.0,
        )
    )
    least_over = [(a - b) / nchunks for a, b in zip(times["least"], times["bare"], strict=True)]
    # The least an event loop of binproto's API does: a floor, no target.
    rows.append(
        row(
            work,
            "least event loop (sketch: bench_parser.least_events)",
            times["least"],
            nbytes=nbytes,
            baseline="bare copy loop",
            baseline_samples=times["bare"],
            overhead_us_per_chunk=median(least_over) * 1e6,
        )
    )

    # The default use: the assembler allocates the tensor; the copy loop gets
    # a fresh array too, so both pay the first touch of new memory.
    fresh: dict[str, Any] = {}

    def bare_fresh() -> None:
        out = np.empty(nbytes, dtype=np.uint8)
        mv = out.data
        off = 0
        for piece in pieces:
            n = len(piece)
            mv[off : off + n] = piece
            off += n
        fresh["bare"] = out

    def assemble_fresh() -> None:
        p = binproto.Parser("response", header_length=hl, content_length=total)
        asm = binproto.TensorAssembler()
        receive = p.receive_data
        events = p.events
        feed = asm.feed
        for c in chunks:
            receive(c)
            for ev in events():
                feed(ev)
        fresh["asm"] = asm.tensors["output0"]

    times = interleave({"bare": bare_fresh, "asm": assemble_fresh}, repeats, setup=fresh.clear)
    work = f"stream {size_label} FP32 in 64 KiB chunks: parse + copy, new memory"
    rows.append(row(work, "bare copy loop into np.empty", times["bare"], nbytes=nbytes))
    rows.append(
        row(
            work,
            "binproto Parser + TensorAssembler()",
            times["asm"],
            nbytes=nbytes,
            baseline="bare copy loop into np.empty",
            baseline_samples=times["bare"],
        )
    )
    fresh.clear()
    return rows


# -- whole-body decode ---------------------------------------------------------------


def decode_rows(sizes: list[int], repeats: int) -> list[Row]:
    """binproto.decode_response vs tritonclient parse_response_body + as_numpy."""
    client = _tritonclient()
    rows: list[Row] = []
    binproto_medians: dict[int, float] = {}
    for nbytes in sizes:
        array_body, hl = fp32_body(nbytes, pad=0)
        # Both get the same bytes object, as an HTTP client hands it over.
        body = array_body.tobytes()
        del array_body

        def decode(body: bytes = body, hl: int = hl) -> Any:
            return binproto.decode_response(body, header_length=hl).tensors["output0"]

        def ours(decode: Callable[[], Any] = decode) -> None:
            # A decode takes a fraction of a millisecond: time several per
            # sample, so timer and scheduler noise do not swamp it.
            for _ in range(INNER_DECODES):
                decode()

        def theirs(body: bytes = body, hl: int = hl) -> Any:
            return client.parse_response_body(body, header_length=hl).as_numpy("output0")

        cases: dict[str, Callable[[], object]] = {"binproto": ours}
        if client is not None:
            a, b = decode(), theirs()
            assert a.shape == b.shape and a[1] == b[1] and a[-1] == b[-1]
            del a, b
            cases["tritonclient"] = theirs
        # tritonclient copies the body: a round at 1 GiB takes seconds, and
        # needs no warm-up; small sizes get more rounds.
        big = nbytes >= 256 * MiB
        times = interleave(cases, repeats if big else repeats + 2, warmup=not big)
        times["binproto"] = [t / INNER_DECODES for t in times["binproto"]]
        work = f"decode whole body, 1 FP32 tensor of {_size(nbytes)}"
        binproto_medians[nbytes] = median(times["binproto"])
        if "tritonclient" in times:
            rows.append(
                row(
                    work,
                    "tritonclient parse_response_body + as_numpy",
                    times["tritonclient"],
                    nbytes=nbytes,
                )
            )
            rows.append(
                row(
                    work,
                    "binproto.decode_response",
                    times["binproto"],
                    nbytes=nbytes,
                    baseline="tritonclient",
                    baseline_samples=times["tritonclient"],
                    min_ratio=100.0 if nbytes >= 256 * MiB else None,
                )
            )
        else:  # pragma: no cover
            rows.append(row(work, "binproto.decode_response", times["binproto"], nbytes=nbytes))
        del body, decode, ours, theirs, cases
        gc.collect()
    small, large = min(binproto_medians), max(binproto_medians)
    if large > small:
        growth = binproto_medians[large] / binproto_medians[small]
        rows[-1]["time_growth_vs_smallest"] = growth
        rows[-1]["size_independent"] = growth < 2.0
    return rows


# -- BYTES and many small tensors ----------------------------------------------------


def bytes_body(count: int, seed: int = 0) -> tuple[bytes, int, list[bytes]]:
    """A response with one BYTES output of ``count`` elements of 1 to 16 bytes."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 17, size=count)
    pool = bytes(rng.integers(97, 123, size=64, dtype=np.uint8))
    elements = [pool[: int(n)] for n in lengths]
    pack = struct.Struct("<I").pack
    data = b"".join(pack(len(e)) + e for e in elements)
    header = response_header(
        [
            {
                "name": "text",
                "datatype": "BYTES",
                "shape": [count],
                "parameters": {"binary_data_size": len(data)},
            }
        ]
    )
    return header + data, len(header), elements


def many_body(count: int, nbytes: int) -> tuple[bytes, int]:
    """A response with ``count`` FP32 outputs of ``nbytes`` each."""
    outputs = [
        {
            "name": f"output{i}",
            "datatype": "FP32",
            "shape": [nbytes // 4],
            "parameters": {"binary_data_size": nbytes},
        }
        for i in range(count)
    ]
    header = response_header(outputs)
    data = np.arange(count * nbytes // 4, dtype=np.float32).tobytes()
    return header + data, len(header)


def least_events(
    skip: int,
) -> tuple[Callable[[Any], None], Callable[[], Iterator[binproto.TensorChunk]]]:
    """A sketch of the least an event parser with binproto's API does per
    chunk, as a floor for the parse + copy rows (not binproto's code: it
    knows only that the body is one tensor after ``skip`` header bytes).
    ``receive_data`` takes the chunk's bytes (``as_byte_view``, as binproto
    does) into a queue; ``events()`` is a generator that hands each queued
    piece out as a :class:`binproto.TensorChunk` and stops at the first
    ``NEED_DATA``. No header, no state, no tensor boundaries, no checks."""
    from binproto._util import as_byte_view

    queue: deque[memoryview] = deque()
    offset = -skip  # tensor offset of the next byte

    def receive_data(data: Any) -> None:
        queue.append(as_byte_view(data))

    def next_event() -> binproto.TensorChunk | None:  # (None for NEED_DATA)
        nonlocal offset
        while offset < 0 and queue:  # the header's bytes: passed over
            data = queue.popleft()
            skipped = min(len(data), -offset)
            offset += skipped
            if skipped < len(data):
                queue.appendleft(data[skipped:])
        if not queue or offset < 0:
            return None
        data = queue.popleft()
        start = offset
        offset += len(data)
        return binproto.TensorChunk(0, "output0", start, data)

    def events() -> Iterator[binproto.TensorChunk]:
        while (event := next_event()) is not None:
            yield event

    return receive_data, events


def least_decode(body: bytes, hl: int) -> dict[str, np.ndarray[Any, Any]]:
    """A sketch of the least a decoder that checks a response of FP32 outputs
    must do in CPython, as a floor for the many-tensor rows (not binproto's
    code: it knows only this benchmark's bodies). orjson parses the header;
    the scans binproto makes of the raw header that orjson does not (nesting
    depth, integers past 64 bits, repeated keys) run as binproto runs them;
    each output's name (a string, new), datatype, shape (non-negative
    integers) and binary_data_size (the shape's bytes) are checked, a plain
    tuple stands for its record, and an array is made over its bytes."""
    from binproto._json import (
        _DIGITS_ONLY,
        _LONG_DIGIT_RUN,
        FAST_LOADS,
        _max_depth,
        refuse_repeated_keys,
    )

    assert FAST_LOADS is not None  # orjson
    raw = body[:hl]
    if raw.count(b"[") + raw.count(b"{") > 100 and _max_depth(raw, 100) > 100:
        raise ValueError("too deep")
    if _LONG_DIGIT_RUN in raw.translate(_DIGITS_ONLY):
        raise ValueError("an integer past 64 bits")
    obj = FAST_LOADS(raw)
    outputs = obj["outputs"]
    refuse_repeated_keys(raw, len(obj) + sum(len(t) + len(t["parameters"]) for t in outputs))
    fp32 = np.dtype("<f4")
    seen: set[str] = set()
    records = []
    tensors: dict[str, np.ndarray[Any, Any]] = {}
    offset = hl
    for index, t in enumerate(outputs):
        name = t["name"]
        if type(name) is not str or name in seen or t["datatype"] != "FP32":
            raise ValueError(name)
        seen.add(name)
        shape = t["shape"]
        if type(shape) is not list or not all(type(d) is int and d >= 0 for d in shape):
            raise ValueError(shape)
        size = t["parameters"]["binary_data_size"]
        if type(size) is not int or size != 4 * math.prod(shape):
            raise ValueError(size)
        records.append((index, name, "FP32", tuple(shape), size))  # what a decoder hands out
        tensors[name] = np.ndarray(tuple(shape), fp32, body, offset)
        offset += size
    if offset != len(body):
        raise ValueError(offset)
    return tensors


def small_rows(bytes_count: int, many: int, many_size: int, repeats: int) -> list[Row]:
    """BYTES of many short elements, and many small tensors, vs tritonclient."""
    client = _tritonclient()
    rows: list[Row] = []

    body, hl, elements = bytes_body(bytes_count)

    def ours_bytes() -> Any:
        return binproto.decode_response(body, header_length=hl).tensors["text"]

    def theirs_bytes() -> Any:
        return client.parse_response_body(body, header_length=hl).as_numpy("text")

    check = ours_bytes()
    assert check.shape == (bytes_count,) and check[0] == elements[0] and check[-1] == elements[-1]
    work = f"decode BYTES tensor of {bytes_count:,} elements (1-16 bytes)"
    if client is not None:
        assert list(theirs_bytes()[:3]) == elements[:3]
        times = interleave({"binproto": ours_bytes, "tritonclient": theirs_bytes}, repeats)
        rows.append(
            row(
                work,
                "tritonclient parse_response_body + as_numpy",
                times["tritonclient"],
                nbytes=len(body) - hl,
            )
        )
        rows.append(
            row(
                work,
                "binproto.decode_response",
                times["binproto"],
                nbytes=len(body) - hl,
                baseline="tritonclient",
                baseline_samples=times["tritonclient"],
                min_ratio=3.0,
            )
        )
    del body, elements, check

    body, hl = many_body(many, many_size)
    names = [f"output{i}" for i in range(many)]
    inner = pick(mode(False), full=200, quick=100, tiny=2)

    def ours_many() -> None:
        for _ in range(inner):
            t = binproto.decode_response(body, header_length=hl).tensors
            for n in names:
                t[n]

    def theirs_many() -> None:
        for _ in range(inner):
            r = client.parse_response_body(body, header_length=hl)
            for n in names:
                r.as_numpy(n)

    def least_many() -> None:
        for _ in range(inner):
            t = least_decode(body, hl)
            for n in names:
                t[n]

    work = f"decode {many} FP32 tensors of {_size(many_size)}"
    if client is not None:
        cases = {"binproto": ours_many, "tritonclient": theirs_many}
        if binproto._json.FAST_LOADS is not None:
            least = least_decode(body, hl)
            ours = binproto.decode_response(body, header_length=hl).tensors
            assert all(np.array_equal(least[n], ours[n]) for n in names)
            cases["least"] = least_many
        times = interleave(cases, repeats)
        rows.append(
            row(
                work,
                "tritonclient parse_response_body + as_numpy x64",
                times["tritonclient"],
                nbytes=len(body) - hl,
                per=inner,
            )
        )
        # The least-checking sketch: what CPython allows a decoder that
        # checks this body at all (no target of its own).
        for impl, key, target in (
            ("binproto.decode_response", "binproto", 2.0),
            ("least checking decode (sketch: bench_parser.least_decode)", "least", None),
        ):
            if key in times:
                rows.append(
                    row(
                        work,
                        impl,
                        times[key],
                        nbytes=len(body) - hl,
                        per=inner,
                        baseline="tritonclient",
                        baseline_samples=times["tritonclient"],
                        min_ratio=target,
                    )
                )
    return rows


# -- one small request: the codec's per-request cost ---------------------------------


def small_request() -> tuple[bytes, int]:
    """The 4 KiB FP32 echo request the throughput benchmark posts."""
    body = binproto.encode_request(
        {"input0": np.arange(1024, dtype=np.float32)}, binary_data_output=True
    )
    assert body.header_length is not None
    return bytes(body), body.header_length


def _without_orjson(name: str, work: Callable[[], None]) -> Callable[[], None]:
    """``work`` with ``binproto._json.<name>`` (orjson's) set aside: what runs
    without the fast extra."""

    def run() -> None:
        fast = getattr(binproto._json, name)
        setattr(binproto._json, name, None)
        try:
            work()
        finally:
            setattr(binproto._json, name, fast)

    return run


def request_rows(repeats: int) -> list[Row]:
    """Decoding one 4 KiB request, against ``json.loads`` of its header alone
    (the share no decoder of this body can avoid)."""
    body, hl = small_request()
    header = body[:hl]
    total = len(body)
    inner = pick(mode(False), full=2000, quick=1000, tiny=2)
    loads = json.loads

    def json_only() -> None:
        for _ in range(inner):
            loads(header)

    def decode() -> None:
        for _ in range(inner):
            binproto.decode_request(body, header_length=hl).tensors["input0"]

    def stream() -> None:
        for _ in range(inner):
            p = binproto.Parser("request", header_length=hl, content_length=total)
            asm = binproto.TensorAssembler()
            p.receive_data(body)
            for ev in p.events():
                asm.feed(ev)
            asm.tensors["input0"]

    cases = {"json": json_only, "decode": decode, "stream": stream}
    if binproto._json.FAST_LOADS is not None:
        cases["decode-json"] = _without_orjson("FAST_LOADS", decode)
    times = interleave(cases, repeats + 2)
    work = f"one 4 KiB FP32 request ({hl}-byte header), per request"
    rows = [row(work, "json.loads of the header alone", times["json"], per=inner)]
    for impl, key, most in (
        ("binproto.decode_request", "decode", 3.0),
        ("binproto Parser + TensorAssembler", "stream", 4.0),
    ):
        r = row(
            work,
            impl,
            times[key],
            per=inner,
            baseline="json.loads of the header",
            baseline_samples=times["json"],
        )
        # ratio is json.loads' time over ours: at most ``most`` times json.loads.
        r["times_json_loads"] = 1 / r["ratio"]
        r["target"] = f"<= {most:g}x json.loads"
        r["met"] = r["times_json_loads"] <= most
        rows.append(r)
    if "decode-json" in times:
        # What orjson (the fast extra) gives decode_request: this row, without it.
        r = row(
            work,
            "binproto.decode_request, standard json parser",
            times["decode-json"],
            per=inner,
            baseline="binproto.decode_request",
            baseline_samples=times["decode"],
        )
        r["times_json_loads"] = statistics.median(
            a / b for a, b in zip(times["decode-json"], times["json"], strict=True)
        )
        rows.append(r)
    return rows


def response_rows(repeats: int) -> list[Row]:
    """Encoding the echo response of that request, against ``json.dumps`` of
    its header alone, and without orjson (what the ``fast`` extra gives)."""
    body, hl = small_request()
    request = binproto.decode_request(body, header_length=hl)
    tensors, header = request.tensors, request.header
    obj = json.loads(binproto.encode_response(tensors, model_name="echo", request=header).json)
    inner = pick(mode(False), full=2000, quick=1000, tiny=2)
    dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode

    def json_only() -> None:
        for _ in range(inner):
            dumps(obj)

    def encode() -> None:
        for _ in range(inner):
            binproto.encode_response(tensors, model_name="echo", request=header)

    cases = {"json": json_only, "encode": encode}
    if binproto._json.FAST_DUMPS is not None:
        cases["encode-json"] = _without_orjson("FAST_DUMPS", encode)
    times = interleave(cases, repeats + 2)
    work = "the echo response of that request, per response"
    rows = [
        row(work, "json.dumps of the header alone", times["json"], per=inner),
        row(
            work,
            "binproto.encode_response",
            times["encode"],
            per=inner,
            baseline="json.dumps of the header",
            baseline_samples=times["json"],
        ),
    ]
    if "encode-json" in times:
        # What orjson (the fast extra) gives encode_response: this row, without it.
        rows.append(
            row(
                work,
                "binproto.encode_response, standard json encoder",
                times["encode-json"],
                per=inner,
                baseline="binproto.encode_response",
                baseline_samples=times["encode"],
            )
        )
    return rows


def _size(n: int) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def run(quick: bool) -> list[Row]:
    """Run every parser workload at the size of the current mode."""
    m = mode(quick)
    repeats = pick(m, full=7, quick=3, tiny=1)
    rows = stream_rows(pick(m, full=1 * GiB, quick=256 * MiB, tiny=256 * KiB), repeats)
    rows += request_rows(repeats)
    rows += response_rows(repeats)
    rows += decode_rows(
        pick(
            m,
            full=[16 * MiB, 256 * MiB, 1 * GiB],
            quick=[16 * MiB, 256 * MiB],
            tiny=[4 * KiB, 16 * KiB],
        ),
        pick(m, full=3, quick=3, tiny=1),
    )
    rows += small_rows(
        pick(m, full=1_000_000, quick=200_000, tiny=100),
        64,
        pick(m, full=4 * KiB, quick=4 * KiB, tiny=4 * KiB),
        pick(m, full=5, quick=3, tiny=1),
    )
    return rows


def small_request_scope(body: bytes, header_length: int) -> dict[str, Any]:
    """An ASGI HTTP scope for the small echo request: what uvicorn's holds
    that binproto's apps read."""
    path = "/v2/models/echo/infer"
    return {
        "type": "http",
        "http_version": "1.1",
        "method": "POST",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"application/octet-stream"),
            (b"inference-header-content-length", b"%d" % header_length),
            (b"content-length", b"%d" % len(body)),
        ],
    }
