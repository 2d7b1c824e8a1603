"""The servers when the process runs out of file descriptors: they stop
accepting for a moment and retry, with no spin and no flood of log lines,
and serve again once connections close. (asyncio's own selector loops
retry once per queued connection, each time with a logged traceback;
trio's serve_listeners logs a traceback per retry, ten a second.) A server
in a subprocess, under a lowered RLIMIT_NOFILE."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

resource = pytest.importorskip("resource")

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX descriptor limits")

# Serves with room for about 32 more descriptors; prints its port, then its
# CPU seconds for each line read on stdin.
SERVER = """
import asyncio, functools, os, resource, sys, threading, time, logging
import trio
from binproto.adapters import asyncio as ba, trio as bt

logging.basicConfig(level=logging.INFO, stream=sys.stderr)
backend = sys.argv[1]
in_use = len(os.listdir("/dev/fd")) if os.path.isdir("/dev/fd") else 32
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (in_use + 32, hard))

def cpu_on_request():
    for _ in sys.stdin:
        print(time.process_time(), flush=True)

def ready(port):
    print(port, flush=True)
    threading.Thread(target=cpu_on_request, daemon=True).start()

if backend == "trio":
    trio.run(functools.partial(bt.serve, None, "127.0.0.1", 0, timeout=60, ready=ready))
else:
    zero_copy = backend == "asyncio"
    asyncio.run(ba.serve(None, "127.0.0.1", 0, zero_copy=zero_copy, timeout=60, ready=ready))
"""

GET_LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


def _cpu(proc: subprocess.Popen[str]) -> float:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("\n")
    proc.stdin.flush()
    return float(proc.stdout.readline())


@pytest.mark.parametrize("backend", ["asyncio", "asyncio-streams", "trio"])
def test_out_of_descriptors_costs_no_spin_and_no_log_flood(backend: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    log_path = tmp_path / "stderr"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVER, backend],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=env,
        )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        # Three times what the server has descriptors for: the rest queue
        # in the listen backlog, and every accept() fails meanwhile.
        clients = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(96)]
        time.sleep(0.5)
        before = _cpu(proc)
        time.sleep(2)
        spent = _cpu(proc) - before
        logged = log_path.stat().st_size
        for sock in clients:
            sock.close()
        # Served again once the connections are gone (retried every 0.1 s).
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(GET_LIVE)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
    finally:
        proc.kill()
        proc.wait(10)
    text = log_path.read_text()
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    assert "Too many open files" in text  # the shortage did happen, and was said
    assert logged < 4096, text[:2000]
    assert spent < 0.5, f"{spent:.2f} s of CPU in 2 s out of descriptors"
