"""Start a live KServe echo server on 127.0.0.1 and talk raw HTTP to it.

Used by the interop tests' session fixture and by ``tests/fixtures/capture.py``.
The listening socket is bound here, on 127.0.0.1 and a free port chosen by the
kernel, and inherited by the server process, so there is no window in which
the port could be taken by someone else and nothing ever listens on 0.0.0.0.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SERVER_SCRIPT = Path(__file__).with_name("kserve_echo_server.py")
HOST = "127.0.0.1"
MODEL = "echo"


@dataclass(frozen=True)
class Reply:
    """An HTTP response: status, headers (names as sent), and the raw body."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        """The value of header ``name`` (case-insensitive), or None."""
        for key, value in self.headers:
            if key.lower() == name.lower():
                return value
        return None


@dataclass(frozen=True)
class KServePeer:
    """A running KServe server: where it listens and which model it serves."""

    host: str
    port: int
    model: str

    @property
    def infer_path(self) -> str:
        """The V2 infer endpoint of the echo model."""
        return f"/v2/models/{self.model}/infer"

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 30.0,
    ) -> Reply:
        """One HTTP/1.1 request on a fresh connection; returns the whole reply."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return Reply(resp.status, resp.getheaders(), resp.read())
        finally:
            conn.close()

    def infer(self, body: bytes, headers: dict[str, str]) -> Reply:
        """POST ``body`` to the echo model's infer endpoint."""
        return self.request("POST", self.infer_path, body, headers)


def _wait_ready(peer: KServePeer, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the KServe server exited with status {proc.returncode}")
        try:
            reply = peer.request("GET", "/v2/health/ready", timeout=2.0)
        except OSError as exc:
            last = repr(exc)
        else:
            if reply.status == 200:
                return
            last = f"HTTP {reply.status}: {reply.body[:200]!r}"
        time.sleep(0.1)
    raise RuntimeError(f"the KServe server was not ready within {timeout} s ({last})")


@contextlib.contextmanager
def running_kserve(
    model: str = MODEL, *, timeout: float = 60.0, log: Path | None = None
) -> Iterator[KServePeer]:
    """Run the KServe echo server for the duration of the ``with`` block.

    The process is always terminated (then killed if it lingers) on exit. Its
    output goes to ``log`` (or is discarded).
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    env = dict(os.environ)
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # leave nothing behind next to the script
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(open(log, "wb")) if log is not None else subprocess.DEVNULL
        proc = subprocess.Popen(
            [sys.executable, str(SERVER_SCRIPT), "--fd", str(sock.fileno()), "--model", model],
            pass_fds=[sock.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
        sock.close()  # the child holds its own copy
        try:
            peer = KServePeer(HOST, port, model)
            _wait_ready(peer, proc, timeout)
            yield peer
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
