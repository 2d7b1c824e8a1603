"""Loopback workload: a 256 MiB FP32 request received into a numpy array by the
asyncio adapter's server, over a real socket, versus a raw socket in the same run.

Three servers run side by side, each in its own process on 127.0.0.1:

* ``raw``: a plain socket server: it reads an 8-byte length, allocates a numpy
  array of that size and ``recv_into``\\ s it, then answers one byte. The
  ceiling for receiving the same bytes over a socket.
* ``zero_copy``: binproto's asyncio server on its BufferedProtocol transport:
  tensor bytes go from the kernel straight into the array.
* ``streams``: the same server on asyncio streams: bytes go through a
  ``StreamReader`` and h11, and the assembler copies them into the array.

The binproto servers serve a ``sink`` model that receives every input into a
numpy array (``request.tensors()``) and answers with how many tensor bytes the
assembler copied and how many arrived in place. The client (this process)
sends with binproto's asyncio client (the same for both servers), which passes
the tensor's memory to ``loop.sock_sendall`` without joining or copying it; the
raw client uses ``sendall``. Each round trip
is timed from the first byte sent to the answer. The cases alternate round by
round. Each server's peak RSS (``VmHWM``) is read after the rounds and
reported as a multiple of the payload: absolute, and above the server's RSS
before the first request.

Run the servers alone with ``python -m benchmarks.bench_loopback --serve MODE``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ._harness import Row, interleave, mode, pick, row

MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[1]
MODES = ("raw", "zero_copy", "streams")


# -- the servers (run in child processes) -------------------------------------------------


def _serve_raw(listener: socket.socket) -> None:
    while True:
        conn, _ = listener.accept()
        with conn:
            while True:
                head = bytearray()
                while len(head) < 8:
                    more = conn.recv(8 - len(head))
                    if not more:
                        break
                    head += more
                if len(head) < 8:
                    break
                n = int.from_bytes(head, "little")
                dst = np.empty(n, dtype=np.uint8)
                view = dst.data
                got = 0
                while got < n:
                    k = conn.recv_into(view[got:], n - got)
                    if not k:
                        raise ConnectionError("the client closed early")
                    got += k
                conn.sendall(b"k")
                del view, dst


async def _sink(request: Any) -> dict[str, Any]:
    tensors = await request.tensors()
    asm = request.body.assembler
    if asm is None:  # a small body, decoded whole: its bytes copied once, whole
        copied, in_place = sum(t.nbytes for t in tensors.values()), 0
    else:
        copied, in_place = asm.bytes_copied, asm.bytes_in_place
    return {
        "copied": np.array([copied], dtype=np.int64),
        "in_place": np.array([in_place], dtype=np.int64),
        "elements": np.array([sum(t.size for t in tensors.values())], dtype=np.int64),
    }


async def _serve_binproto(zero_copy: bool, ready: Any) -> None:
    from binproto.adapters._server import Model, V2Server
    from binproto.adapters.asyncio import start_server

    app = V2Server([Model("sink", _sink)])
    server = await start_server(app, "127.0.0.1", 0, zero_copy=zero_copy)
    async with server:
        ready(server.sockets[0].getsockname()[1])
        await server.serve_forever()


def serve_main(argv: list[str] | None = None) -> None:
    """Entry point of a server process: prints ``port N`` once listening."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve", choices=MODES, required=True)
    args = parser.parse_args(argv)

    def ready(port: int) -> None:
        print(f"port {port}", flush=True)

    if args.serve == "raw":
        listener = socket.create_server(("127.0.0.1", 0))
        ready(listener.getsockname()[1])
        _serve_raw(listener)
    else:
        asyncio.run(_serve_binproto(args.serve == "zero_copy", ready))


# -- the client side (this process) ------------------------------------------------------


@contextlib.contextmanager
def _server(kind: str) -> Iterator[tuple[int, int]]:
    """Start a server process; yield its pid and port."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.bench_loopback", "--serve", kind],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.match(r"port (\d+)", line)
        if match is None:
            raise RuntimeError(f"the {kind} server did not start: {line!r}")
        yield proc.pid, int(match.group(1))
    finally:
        proc.terminate()
        proc.wait(30)


def _status(pid: int, key: str) -> int:
    """A /proc/<pid>/status figure in bytes (VmRSS, VmHWM)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


class _RawClient:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))

    def send(self, data: memoryview) -> None:
        self.sock.sendall(len(data).to_bytes(8, "little"))
        self.sock.sendall(data)
        if self.sock.recv(1) != b"k":
            raise RuntimeError("the raw server did not answer")

    def close(self) -> None:
        self.sock.close()


def run(quick: bool) -> list[Row]:
    """Time one request into a numpy array on each server; report peak RSS."""
    from binproto.adapters.asyncio import Client

    current = mode(quick)
    payload = pick(current, full=256 * MiB, quick=32 * MiB, tiny=64 * 1024)
    repeats = pick(current, full=7, quick=5, tiny=1)
    tensor = np.full(payload // 4, 1.5, dtype=np.float32)
    raw_view = tensor.data.cast("B")
    loop = asyncio.new_event_loop()
    seen: dict[str, dict[str, int]] = {}

    def infer(client: Client, kind: str) -> None:
        out = loop.run_until_complete(client.infer("sink", {"x": tensor}))
        if int(out["elements"][0]) != tensor.size:
            raise AssertionError(f"the {kind} server received {out['elements']} elements")
        seen[kind] = {"copied": int(out["copied"][0]), "in_place": int(out["in_place"][0])}

    with (
        _server("raw") as (raw_pid, raw_port),
        _server("zero_copy") as (zc_pid, zc_port),
        _server("streams") as (st_pid, st_port),
    ):
        pids = {"raw": raw_pid, "zero_copy": zc_pid, "streams": st_pid}
        raw = _RawClient(raw_port)
        zc = Client("127.0.0.1", zc_port, zero_copy=True)
        st = Client("127.0.0.1", st_port, zero_copy=True)  # the same client: servers differ
        try:
            idle = {k: _status(pid, "VmRSS") for k, pid in pids.items()}
            times = interleave(
                {
                    "raw": lambda: raw.send(raw_view),
                    "zero_copy": lambda: infer(zc, "zero_copy"),
                    "streams": lambda: infer(st, "streams"),
                },
                repeats,
                warmup=current != "full",
            )
            peak = {k: _status(pid, "VmHWM") for k, pid in pids.items()}
        finally:
            raw.close()
            loop.run_until_complete(zc.aclose())
            loop.run_until_complete(st.aclose())
            loop.close()

    size = f"{payload // MiB} MiB" if payload >= MiB else f"{payload // 1024} KiB"
    workload = f"loopback {size} FP32 request into numpy"

    def rss(kind: str) -> dict[str, Any]:
        return {
            "peak_rss_x_payload": round(peak[kind] / payload, 3),
            "peak_above_idle_x_payload": round((peak[kind] - idle[kind]) / payload, 3),
        }

    rows = [
        row(
            workload,
            "raw socket sendall -> recv_into (2 processes)",
            times["raw"],
            nbytes=payload,
            raw="socket",
            **rss("raw"),
        )
    ]
    for kind, label in (
        ("zero_copy", "binproto asyncio, BufferedProtocol (in place)"),
        ("streams", "binproto asyncio, streams + h11"),
    ):
        above = (peak[kind] - idle[kind]) / payload
        rows.append(
            row(
                workload,
                label,
                times[kind],
                nbytes=payload,
                baseline="raw socket",
                baseline_samples=times["raw"],
                min_ratio=0.7,
                raw="socket",
                rss_target="peak above idle <= 1.1x payload",
                rss_met=bool(above <= 1.1),
                bytes_copied=seen[kind]["copied"],
                bytes_in_place=seen[kind]["in_place"],
                **rss(kind),
            )
        )
    return rows


if __name__ == "__main__":
    serve_main()
