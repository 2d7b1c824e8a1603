"""Instructions spent by the parser per 64 KiB chunk, and by whole-body
decoding of 64 tensors of 4 KiB next to tritonclient, counted by callgrind.

Times drift on a shared host; instruction counts do not. Each loop runs in
its own interpreter under ``valgrind --tool=callgrind``, which counts the
whole process. The streaming loops have the count of an empty loop of as
many rounds, after the same set-up, subtracted; the decode and request loops
run twice, ``n`` and ``2n`` rounds, and the difference over ``n`` is one
round's count (set-up, imports and first-call work cancel out). The
streaming loops run over ``--chunks`` chunks (the same 64 KiB buffer stands
for every chunk of one large tensor: the parser never reads tensor bytes);
the decode loops decode the same 64 x 4 KiB response body ``--decodes`` times
(binproto, tritonclient, and ``json.loads`` of its header alone, the share
neither library can avoid); the request loops answer the throughput
benchmark's 4 KiB echo request ``--requests`` times, with no I/O: the codec
alone (``decode_request`` + ``encode_response``), the reference server
(``V2Server.serve_connection`` over a stream whose peer is always ready: h11,
the server's layers and the codec; the same head each time, and a new one
each time, which the server cannot have read before, remembering heads or
not) and docs/adapters.md's ASGI echo app::

    python -m benchmarks.instructions            # all of them
    python -m benchmarks.instructions --chunks 50000 --decodes 200 --requests 1000

Needs valgrind (Debian's ``valgrind`` package).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import numpy as np

import binproto

CHUNK = 64 * 1024
DECODE_MODES = ("decode-binproto", "decode-tritonclient", "decode-json")


def _chunks(count: int) -> tuple[list[memoryview], int, int]:
    """A header chunk, then ``count`` views of one 64 KiB buffer."""
    size = CHUNK * count
    tensor = {"name": "x", "datatype": "UINT8", "shape": [size],
              "parameters": {"binary_data_size": size}}  # fmt: skip
    header = json.dumps({"outputs": [tensor]}).encode()
    piece = np.ones(CHUNK, dtype=np.uint8).data
    return [memoryview(header), *[piece] * count], len(header), len(header) + size


def loop(mode: str, count: int) -> None:
    """Run one loop: ``empty``, ``events`` or ``next_event``, or one of
    :data:`DECODE_MODES`."""
    if mode in DECODE_MODES:
        decode_loop(mode, count)
        return
    if mode in REQUEST_MODES:
        request_loop(mode, count)
        return
    chunks, hl, total = _chunks(count)
    if mode == "empty":
        for _c in chunks:
            pass
        return
    p = binproto.Parser("response", header_length=hl, content_length=total)
    if mode == "events":
        for c in chunks:
            p.receive_data(c)
            for _ev in p.events():
                pass
    else:
        for c in chunks:
            p.receive_data(c)
            while (ev := p.next_event()) is not binproto.NEED_DATA:
                if type(ev) is binproto.MessageComplete:
                    break
    assert p.state is binproto.ParserState.DONE


def decode_loop(mode: str, count: int) -> None:
    """Decode the 64 x 4 KiB response ``count`` times."""
    from tritonclient.http import InferenceServerClient  # imported by every mode alike

    from .bench_parser import many_body

    body, hl = many_body(64, 4 * 1024)
    names = [f"output{i}" for i in range(64)]
    header = body[:hl]

    def binproto_decode() -> None:
        tensors = binproto.decode_response(body, header_length=hl).tensors
        for name in names:
            tensors[name]

    def tritonclient_decode() -> None:
        result = InferenceServerClient.parse_response_body(body, header_length=hl)
        for name in names:
            result.as_numpy(name)

    def json_only() -> None:
        json.loads(header)

    run = {
        "decode-binproto": binproto_decode,
        "decode-tritonclient": tritonclient_decode,
        "decode-json": json_only,
    }[mode]
    for _ in range(count):
        run()


REQUEST_MODES = (
    "request-codec",
    "request-serve",
    "request-serve-new-heads",
    "request-serve-new-heads-none-kept",
    "request-asgi",
    "request-v2app",
)


class _Ready:
    """A byte stream whose peer is always ready: the same request each read,
    ``count`` times, then the end; writes are counted, and the last one's
    first bytes and size kept."""

    timeout: float | None = None

    def __init__(self, request: bytes, count: int, *, new_heads: bool = False) -> None:
        self.request = request
        # With new_heads, each request's Host differs: no head comes twice.
        self.parts = request.split(b"Host: ", 1) if new_heads else None
        self.left = count
        self.written = 0
        self.status_line = b""
        self.size = 0

    async def receive_some(self, max_bytes: int) -> bytes:
        if not self.left:
            return b""
        self.left -= 1
        if self.parts is None:
            return self.request
        before, after = self.parts
        return b"%sHost: h%d.%s" % (before, self.left, after)

    async def send_all(self, buffers: Sequence[Any]) -> None:
        self.written += 1
        self.status_line = bytes(buffers[0][:13])
        self.size = sum(len(b) for b in buffers)

    async def aclose(self) -> None:
        pass


def _run_now(coroutine: Coroutine[Any, Any, None]) -> None:
    """Run a coroutine that never waits, without an event loop."""
    try:
        coroutine.send(None)
    except StopIteration:
        return
    raise RuntimeError("the coroutine waited")


def request_loop(mode: str, count: int) -> None:
    """The 4 KiB FP32 echo request ``count`` times: the codec alone, through
    ``V2Server.serve_connection`` (h11, the server's layers, the codec), or
    through docs/adapters.md's ASGI echo app; no I/O, no event loop. Each loop
    checks that the last request was answered with the echo."""
    from binproto.adapters._server import REMEMBERED_HEADS, V2Server
    from binproto.adapters.asgi import V2App

    from .bench_parser import small_request, small_request_scope
    from .floor_servers import binproto_asgi_app

    body, hl = small_request()
    head = (
        b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/octet-stream\r\n"
        b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
    ) % (hl, len(body))
    scope = small_request_scope(body, hl)
    message = {"type": "http.request", "body": body, "more_body": False}

    async def receive() -> dict[str, object]:
        return message

    tensor_bytes = len(body) - hl
    sent: dict[str, Any] = {}  # the ASGI app's last response: status, body size, messages

    async def send(message: dict[str, Any]) -> None:
        sent["messages"] += 1
        if message["type"] == "http.response.start":
            sent["status"] = message["status"]
        else:
            sent["size"] = len(message["body"])

    def codec(n: int) -> None:
        sizes = set()
        for _ in range(n):
            decoded = binproto.decode_request(body, header_length=hl)
            out = binproto.encode_response(
                decoded.tensors, model_name="echo", request=decoded.header
            )
            sizes.add(out.content_length - len(out.json))
        assert sizes <= {tensor_bytes}  # the tensor, echoed

    def serve(n: int, new_heads: bool = False, remembered: int = REMEMBERED_HEADS) -> None:
        stream = _Ready(head + body, n, new_heads=new_heads)
        _run_now(V2Server(remembered_heads=remembered).serve_connection(stream))
        assert stream.written == n
        if n:
            assert stream.status_line == b"HTTP/1.1 200 " and stream.size > tensor_bytes

    def asgi(n: int, app: Any = binproto_asgi_app) -> None:
        sent["messages"] = 0
        for _ in range(n):
            _run_now(app(scope, receive, send))
        assert sent["messages"] == 2 * n  # each a response's start and its body
        if n:
            assert sent["status"] == 200 and sent["size"] > tensor_bytes

    runs: dict[str, Callable[[int], None]] = {
        "request-codec": codec,
        "request-serve": serve,
        "request-serve-new-heads": lambda n: serve(n, new_heads=True),
        "request-serve-new-heads-none-kept": lambda n: serve(n, new_heads=True, remembered=0),
        "request-asgi": asgi,
        # (No event loop: V2App's body timeout, asyncio only, is not counted.)
        "request-v2app": lambda n: asgi(n, V2App()),
    }
    run: Callable[[int], None] = runs[mode]
    run(count)


def count_instructions(mode: str, count: int) -> int:
    """Instructions the whole interpreter ran for ``loop(mode, count)``."""
    cmd = [
        "valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
        sys.executable, "-m", "benchmarks.instructions", "--run", mode, "--count", str(count),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stderr
    found = re.search(r"Collected : (\d+)", out)
    if found is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{out[-2000:]}")
    return int(found.group(1))


def per_round(mode: str, n: int) -> float:
    """Instructions of one round of ``mode``: its loop run ``2n`` and ``n``
    times, the difference over ``n`` (the set-up and first-call work, run
    by both, cancel out)."""
    return (count_instructions(mode, 2 * n) - count_instructions(mode, n)) / n


def main(argv: list[str] | None = None) -> int:
    """The ``python -m benchmarks.instructions`` command."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.instructions")
    ap.add_argument("--chunks", type=int, default=200_000, help="chunks per streaming loop")
    ap.add_argument("--decodes", type=int, default=500, help="decodes per decode loop")
    ap.add_argument("--requests", type=int, default=2000, help="requests per request loop")
    ap.add_argument("--run", help=argparse.SUPPRESS)  # one loop, inside valgrind
    ap.add_argument("--count", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.run:
        loop(args.run, args.count)
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not installed", file=sys.stderr)
        return 1
    empty = count_instructions("empty", args.chunks)
    for mode in ("events", "next_event"):
        extra = count_instructions(mode, args.chunks) - empty
        print(f"{mode}: {extra / args.chunks:,.0f} instructions per chunk")
    ours, theirs, header = (per_round(mode, args.decodes) for mode in DECODE_MODES)
    print(
        f"decode 64 x 4 KiB: binproto {ours:,.0f} instructions, tritonclient {theirs:,.0f}"
        f" ({theirs / ours:.2f}x); json.loads of the header alone {header:,.0f}"
    )
    counts = [per_round(mode, args.requests) for mode in REQUEST_MODES]
    codec, serve, new, none_kept, asgi, v2app = counts
    print(
        f"4 KiB echo request: decode_request + encode_response {codec:,.0f} instructions;"
        f" through V2Server.serve_connection {serve:,.0f} ({new:,.0f} when each request's"
        f" head is new, {none_kept:,.0f} with remembered_heads=0); through the ASGI echo app"
        f" {asgi:,.0f}; through V2App {v2app:,.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
