"""A bounded soak of the reference server (asyncio) on loopback: slow-drip
connections, clients with valid requests and a stream of mid-request resets,
all at once. Every valid request is answered byte-exact, and afterwards the
server holds no more file descriptors or tasks than when idle, and its
resident memory is back near idle."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import binproto
from binproto.adapters.asyncio import Client

from .helpers import proc_status

ROOT = Path(__file__).resolve().parent.parent

#: Measures memory or latency: no other test may run beside it.
pytestmark = pytest.mark.serial

#: How long the three kinds of traffic run together, in seconds.
SOAK = 20.0
DRIPPERS = 200
CLIENTS = 32
RESETS = 20  # connections reset mid-body, at least (127 here; 32 beside six busy loops)

# The server: the echo model, and "tasks", which counts the server's tasks.
SERVER = """
import asyncio, sys
import numpy as np
from binproto.adapters.asyncio import serve
from binproto.adapters._server import Model, Timeouts, V2Server, echo_model

async def tasks(request):
    return {"n": np.array([len(asyncio.all_tasks())], dtype=np.int64)}

app = V2Server(
    [echo_model(), Model("tasks", tasks)],
    timeouts=Timeouts(keep_alive=2, head=3, body=2, write=5),
)
asyncio.run(serve(app, port=0, ready=lambda port: print(port, flush=True)))
"""


def _fds(pid: int) -> int:
    """The process's open descriptors, once the count holds still for 0.2 s
    (a socket whose peer just closed is closed by the server a moment later)."""
    count = len(os.listdir(f"/proc/{pid}/fd"))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(0.2)
        count, before = len(os.listdir(f"/proc/{pid}/fd")), count
        if count == before:
            break
    return count


async def _tasks(port: int) -> int:
    async with Client("127.0.0.1", port, timeout=10) as c:
        out = await c.infer("tasks", {"x": np.zeros(1, dtype=np.uint8)})
    return int(out["n"][0])


async def _valid(port: int, deadline: float, seed: int, counts: dict[str, int]) -> None:
    rng = np.random.default_rng(seed)
    async with Client("127.0.0.1", port, timeout=30) as c:
        while time.monotonic() < deadline:
            size = int(rng.integers(1, 1 << 20))
            x = rng.integers(0, 256, size, dtype=np.uint8)
            if rng.random() < 0.5:
                x = x[: size // 4 * 4].view(np.float32)
            out = await c.infer("echo", {"x": x}, binary_data_output=True)
            assert out["x"].dtype == x.dtype and out["x"].tobytes() == x.tobytes()
            counts["valid"] += 1


async def _dripper(port: int, deadline: float, counts: dict[str, int]) -> None:
    head = b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: 1\r\n" * 50
    while time.monotonic() < deadline:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            answer = b""
            for i in range(len(head)):
                if time.monotonic() >= deadline:
                    break
                writer.write(head[i : i + 1])
                try:  # a byte every 0.25 s, until the server answers
                    answer = await asyncio.wait_for(reader.read(65536), 0.25)
                except asyncio.TimeoutError:
                    continue
                break
            answer += await asyncio.wait_for(reader.read(), 10)
            if answer.startswith(b"HTTP/1.1 408 "):
                counts["cut"] += 1
        except (ConnectionError, asyncio.TimeoutError):
            pass
        finally:
            writer.close()


async def _resetter(port: int, deadline: float, counts: dict[str, int]) -> None:
    x = np.zeros(1 << 20, dtype=np.uint8)
    body = binproto.encode_request({"x": x})
    head = "POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in body.headers) + "\r\n"
    partial = head.encode() + bytes(body.buffers[0]) + bytes(100_000)
    while time.monotonic() < deadline:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(partial)
        await writer.drain()
        await asyncio.sleep(0.02)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # a reset mid-body
        counts["reset"] += 1
        await asyncio.sleep(0.03)


async def _soak(port: int) -> dict[str, int]:
    counts = {"valid": 0, "cut": 0, "reset": 0}
    deadline = time.monotonic() + SOAK
    jobs: list[Any] = [_valid(port, deadline, seed, counts) for seed in range(CLIENTS)]
    jobs += [_dripper(port, deadline, counts) for _ in range(DRIPPERS)]
    jobs += [_resetter(port, deadline, counts)]
    await asyncio.wait_for(asyncio.gather(*jobs), SOAK + 60)
    return counts


@pytest.mark.slow
def test_soak_slow_drips_valid_clients_and_resets_at_once() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        # Warm up (imports, first buffers), then take the idle figures.
        asyncio.run(_tasks(port))
        time.sleep(0.5)
        idle_tasks = asyncio.run(_tasks(port))
        idle_fds = _fds(proc.pid)
        idle_rss = proc_status(proc.pid, "VmRSS")

        counts = asyncio.run(_soak(port))

        # Every connection ends within the server's timeouts once its peer
        # stops: wait them out, then compare with idle.
        time.sleep(4)
        tasks = asyncio.run(_tasks(port))
        time.sleep(0.5)
        fds = _fds(proc.pid)
        rss = proc_status(proc.pid, "VmRSS")
        peak = proc_status(proc.pid, "VmHWM")
    finally:
        proc.terminate()
        proc.wait(10)
    print(
        f"soak: {counts}; tasks {idle_tasks} -> {tasks}; fds {idle_fds} -> {fds};"
        f" RSS {idle_rss >> 20} -> {rss >> 20} MiB (peak {peak >> 20} MiB)"
    )
    assert counts["valid"] >= CLIENTS * 10
    assert counts["cut"] >= DRIPPERS  # each dripped head was cut at its deadline
    assert counts["reset"] >= RESETS
    assert tasks == idle_tasks
    assert fds == idle_fds
    assert rss - idle_rss < 64 << 20
