"""A loopback HTTP server that records the requests a real client sends.

Lets the tests capture exactly what tritonclient puts on the wire (headers,
compression, body) without a model server: every POST is recorded and answered
with a fixed, valid V2 response.
"""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

#: The reply to every POST: a valid, empty V2 inference response.
EMPTY_RESPONSE = b'{"model_name":"echo","outputs":[]}'


@dataclass(frozen=True)
class Recorded:
    """One request as it arrived: method, path, headers (as sent) and body."""

    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        """The value of header ``name`` (case-insensitive), or None."""
        for key, value in self.headers:
            if key.lower() == name.lower():
                return value
        return None


@dataclass
class Recorder:
    """Where the server listens, and what it has received so far."""

    host: str
    port: int
    requests: list[Recorded] = field(default_factory=list)

    @property
    def url(self) -> str:
        """``host:port``, as tritonclient wants it."""
        return f"{self.host}:{self.port}"


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    recorder: Recorder

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        self.recorder.requests.append(Recorded("POST", self.path, list(self.headers.items()), body))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(EMPTY_RESPONSE)))
        self.end_headers()
        self.wfile.write(EMPTY_RESPONSE)

    def log_message(self, format: str, *args: object) -> None:
        pass  # keep test output clean


@contextlib.contextmanager
def recording_server() -> Iterator[Recorder]:
    """Run a recording server on 127.0.0.1 and a free port for the ``with`` block."""
    recorder = Recorder("127.0.0.1", 0)
    handler = type("Handler", (_Handler,), {"recorder": recorder})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    recorder.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield recorder
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
