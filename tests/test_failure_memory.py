"""A failed request's memory goes as the request ends, without the garbage
collector: no exception kept in a reference cycle with the request's arrays."""

from __future__ import annotations

import gc
import json
import os
import re
import socket
import subprocess
import sys
import time
import weakref
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from binproto.adapters._server import InferenceError, InferRequest, Model, V2Server

from .servers import connect, running, until_closed

#: Measures memory or latency: no other test may run beside it.
pytestmark = pytest.mark.serial

#: Weak references to the arrays the failing models assembled.
ASSEMBLED: list[weakref.ref[Any]] = []


async def _assemble_then_fail(request: InferRequest) -> Any:
    tensors = await request.tensors()
    ASSEMBLED.append(weakref.ref(tensors["x"]))
    raise RuntimeError("the model failed")


async def _assemble_then_refuse(request: InferRequest) -> Any:
    tensors = await request.tensors()
    ASSEMBLED.append(weakref.ref(tensors["x"]))
    raise InferenceError("refused")


async def _assemble(request: InferRequest) -> Any:
    try:
        return await request.tensors()
    finally:
        # The body's fault comes after the tensor is complete.
        assert request.body.assembler is not None
        ASSEMBLED.append(weakref.ref(request.body.assembler.tensors["x"]))


MODELS = [
    Model("fail", _assemble_then_fail),
    Model("refuse", _assemble_then_refuse),
    Model("assemble", _assemble),
]


@pytest.fixture
def port(http_backend: str) -> Iterator[int]:
    app = V2Server(MODELS)
    with running(http_backend, app) as server:
        yield server.port


def _compressed_request(
    model: str, x: np.ndarray[Any, Any], tail: bytes = b"", cut: int = 0
) -> bytes:
    """A compressed body whose tensor is complete before its fault: bytes
    after the message (``tail``) or a stream cut ``cut`` bytes short. zlib's
    format (``deflate``), whose trailer does not give the length: a gzip body
    this small would be refused by its trailer before any tensor is made."""
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": [x.size],
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ]
        }
    ).encode()
    deflate = zlib.compressobj(1, zlib.DEFLATED, 15)
    body = deflate.compress(header) + deflate.compress(x.tobytes()) + deflate.compress(tail)
    body += deflate.flush()
    body = body[: len(body) - cut]
    return (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\nContent-Encoding: deflate\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + body


CASES = [
    ("fail", {}, b"HTTP/1.1 500 "),
    ("refuse", {}, b"HTTP/1.1 400 "),
    ("assemble", {"tail": b"more"}, b"HTTP/1.1 400 "),
    ("assemble", {"cut": 3}, b"HTTP/1.1 400 "),
]


@pytest.mark.parametrize(("model", "fault", "status"), CASES)
def test_a_failed_requests_arrays_are_freed_without_the_collector(
    port: int, model: str, fault: dict[str, Any], status: bytes
) -> None:
    ASSEMBLED.clear()
    wire = _compressed_request(model, np.arange(1 << 18, dtype=np.float32), **fault)
    gc.disable()
    try:
        with connect(port) as sock:
            sock.sendall(wire)
            received = until_closed(sock)
        assert received.startswith(status), received[:200]
        # The answer is sent once the request's memory is let go.
        assert len(ASSEMBLED) == 1
        deadline = time.monotonic() + 2
        while ASSEMBLED[0]() is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ASSEMBLED[0]() is None
    finally:
        gc.enable()


async def _answer_big(request: InferRequest) -> Any:
    tensors = await request.tensors()
    output = np.repeat(tensors["x"], 1 << 12)  # 64 MiB back: more than socket buffers hold
    ASSEMBLED.append(weakref.ref(output))
    return {"x": output}


def test_a_response_nobody_reads_is_freed_after_the_write_stall(http_backend: str) -> None:
    import h11

    import binproto
    from binproto.adapters._server import Timeouts
    from binproto.adapters.h11 import request_for, send_message

    ASSEMBLED.clear()
    app = V2Server([Model("big", _answer_big)], timeouts=Timeouts(write=0.3))
    body = binproto.encode_request(
        {"x": np.ones(1 << 12, dtype=np.float32)}, binary_data_output=True
    )
    conn = h11.Connection(h11.CLIENT)
    wire = b"".join(
        bytes(p) for p in send_message(conn, request_for("/v2/models/big/infer", body), body)
    )
    gc.disable()
    try:
        with running(http_backend, app) as server, connect(server.port) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
            sock.sendall(wire)  # and never reads: the server gives up on it
            deadline = time.monotonic() + 5
            while (not ASSEMBLED or ASSEMBLED[0]() is not None) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(ASSEMBLED) == 1 and ASSEMBLED[0]() is None
    finally:
        gc.enable()


# -- measured: the reference server's resident memory after failing requests ------------


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        match = re.search(r"^VmRSS:\s+(\d+) kB", f.read(), re.M)
    assert match
    return int(match.group(1)) * 1024


@pytest.mark.slow
def test_failing_256_mib_requests_leave_the_server_near_idle() -> None:
    # Four 256 MiB requests that fail after their tensor is assembled (bytes
    # after the end of the compressed body): the server's resident memory comes back
    # to within half a payload of idle, with no collection in between.
    payload = 256 << 20
    x = np.zeros(payload // 4, dtype=np.float32)
    wire = _compressed_request("echo", x, tail=b"more")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-m", "binproto", "serve", "--port", "0"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        match = re.search(r":(\d+)$", proc.stdout.readline().strip())
        assert match
        server_port = int(match.group(1))
        small = _compressed_request("echo", np.zeros(16, dtype=np.float32))
        with connect(server_port) as sock:
            sock.sendall(small)
            assert until_closed(sock).startswith(b"HTTP/1.1 200 ")
        idle = _rss(proc.pid)
        for _ in range(4):
            with connect(server_port) as sock:
                sock.settimeout(60)
                sock.sendall(wire)
                received = until_closed(sock)
            assert received.startswith(b"HTTP/1.1 400 "), received[:200]
        time.sleep(0.5)
        after = _rss(proc.pid)
    finally:
        proc.terminate()
        proc.wait(10)
    assert after - idle < payload // 2, (idle, after)
