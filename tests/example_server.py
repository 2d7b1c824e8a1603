"""Run a V2 server script (the FastAPI example, or KServe's echo server) in a
subprocess on an inherited 127.0.0.1 socket, and read its memory figures."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "fastapi_server.py"
KSERVE_ECHO = ROOT / "tests" / "interop" / "kserve_echo_server.py"


@dataclass(frozen=True)
class Server:
    """A running example server: where it listens and its process id."""

    url: str
    pid: int

    def status(self, field: str) -> int:
        """A ``/proc/<pid>/status`` memory field (e.g. ``VmHWM``, ``VmRSS``), in bytes."""
        return proc_status(self.pid, field)


def proc_status(pid: int, field: str) -> int:
    """A memory field of ``/proc/<pid>/status``, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


@contextmanager
def run_server_script(
    script: Path, *args: str, timeout: float = 60.0, quiet: bool = False
) -> Iterator[Server]:
    """Run ``script --fd N *args`` serving on a free loopback port; stop it on exit.

    The listening socket is bound here and inherited, so nothing else can take
    the port and nothing listens beyond 127.0.0.1. Waits until
    ``GET /v2/health/ready`` answers 200.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.DEVNULL if quiet else None
    proc = subprocess.Popen(
        [sys.executable, str(script), "--fd", str(sock.fileno()), *args],
        pass_fds=[sock.fileno()],
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=out,
        env=env,
    )
    sock.close()  # the child has its own copy
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{script.name} exited with {proc.returncode}")
            try:
                if httpx.get(url + "/v2/health/ready", timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{script.name} did not become ready")
            time.sleep(0.05)
        yield Server(url=url, pid=proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_example_server(timeout: float = 30.0) -> contextlib.AbstractContextManager[Server]:
    """Start the FastAPI example app under uvicorn; stop it on exit."""
    return run_server_script(EXAMPLE, timeout=timeout)
