"""Raw HTTP/1.1 exchanges for ``binproto check`` and ``binproto fuzz``.

A request is written byte for byte on a plain socket, so malformed heads and
bodies reach the server as built. Every wait is bounded: one deadline covers
the whole exchange (connect, send, answer), and the answer is read up to a
size bound. The outcome says what happened: an answer, a close without one, a
reset, or no answer before the deadline.
"""

from __future__ import annotations

import shlex
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (socket is imported when a request is sent, not when the CLI starts)
    import socket

__all__ = ["Reply", "Request", "Target", "exchange"]

#: The most answer bytes read; a longer answer is cut there (and fails its case).
MAX_ANSWER = 64 << 20


@dataclass(frozen=True)
class Target:
    """Where the server listens: ``http://host:port`` and a path prefix."""

    host: str
    port: int
    prefix: str = ""

    @classmethod
    def parse(cls, url: str) -> Target:
        """The target of an ``http://`` URL (``https`` is not supported)."""
        parts = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"not an http:// URL: {url!r}")
        return cls(parts.hostname, parts.port or 80, parts.path.rstrip("/"))

    @property
    def url(self) -> str:
        """The URL, without a trailing slash."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{self.prefix}"

    @property
    def authority(self) -> str:
        """The Host header's value."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class Request:
    """One request as it goes on the wire.

    ``headers`` are sent as given, after ``Host``; ``Content-Length`` is added
    (the body's length) unless ``headers`` has one or ``chunked`` is set.
    ``segments`` cuts the body into writes of those sizes (the rest in one);
    with ``chunked`` each write is one chunk of the chunked transfer coding.
    ``end_input`` half-closes the connection once the request is sent.
    """

    path: str
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
    method: str = "POST"
    segments: tuple[int, ...] = ()
    chunked: bool = False
    end_input: bool = False

    def pieces(self) -> list[bytes]:
        """The body cut as it is written."""
        out, at = [], 0
        for size in self.segments:
            if at >= len(self.body):
                break
            out.append(self.body[at : at + size])
            at += size
        if at < len(self.body):
            out.append(self.body[at:])
        if self.chunked:
            out = [b"%x\r\n%s\r\n" % (len(p), p) for p in out if p] + [b"0\r\n\r\n"]
        return out

    def head(self, target: Target) -> bytes:
        """The request line and header fields."""
        names = {k.lower() for k, _ in self.headers}
        lines = [f"{self.method} {target.prefix}{self.path} HTTP/1.1", f"Host: {target.authority}"]
        lines += [f"{k}: {v}" for k, v in self.headers]
        if self.chunked:
            lines.append("Transfer-Encoding: chunked")
        elif "content-length" not in names and (self.body or self.method == "POST"):
            lines.append(f"Content-Length: {len(self.body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def wire(self, target: Target) -> bytes:
        """Every byte sent, head and body."""
        return self.head(target) + b"".join(self.pieces())

    def curl(self, target: Target, body_file: str) -> str:
        """A curl command that sends the same request (its body read from ``body_file``)."""
        words = ["curl", "-sS", "-i", "--max-time", "30", "-X", self.method]
        words += ["-H", "Expect:"]  # (curl would add Expect: 100-continue to large bodies)
        for k, v in self.headers:
            words += ["-H", f"{k}: {v}" if v else f"{k};"]
        if self.chunked:
            words += ["-H", "Transfer-Encoding: chunked"]
        if self.body or self.method == "POST":
            words += ["--data-binary", "@" + body_file]
        words.append(target.url + self.path)
        return shlex.join(words)


@dataclass
class Reply:
    """What came back.

    ``outcome`` is ``"answered"`` (a whole final response), ``"closed"`` (the
    connection closed first), ``"reset"``, ``"timeout"`` (the deadline
    passed), or ``"unreachable"`` (no connection).
    """

    outcome: str
    status: int | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    elapsed: float = 0.0
    detail: str = ""
    informational: list[int] = field(default_factory=list)

    def header(self, name: str) -> str | None:
        """A header's value (the last of that name), or None."""
        found = None
        for k, v in self.headers:
            if k.lower() == name.lower():
                found = v
        return found

    @property
    def unanswered(self) -> bool:
        """True when the connection ended (closed or reset) before any byte
        of a final answer: no head, no garbage, no body cut short (a
        ``100 Continue`` may have come first)."""
        return self.outcome in ("closed", "reset") and self.status is None and not self.body

    def describe(self) -> str:
        """The status, or what happened instead."""
        if self.outcome == "answered":
            return str(self.status)
        return self.outcome


class _Reader:
    """Reads from a socket until a deadline; buffers what it read."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock, self.deadline, self.buf = sock, deadline, bytearray()

    def more(self) -> bool:
        """Read some more; False at the end of input."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        self.sock.settimeout(left)
        data = self.sock.recv(1 << 16)
        if not data:
            return False
        self.buf += data
        if len(self.buf) > MAX_ANSWER + (1 << 16):
            raise ValueError(f"answer longer than {MAX_ANSWER} bytes")
        return True

    def until(self, mark: bytes) -> bytes | None:
        """Bytes up to and including ``mark``, or None at the end of input."""
        while (at := self.buf.find(mark)) < 0:
            if not self.more():
                return None
        out = bytes(self.buf[: at + len(mark)])
        del self.buf[: at + len(mark)]
        return out

    def exactly(self, n: int) -> bytes | None:
        """The next ``n`` bytes, or None at the end of input."""
        while len(self.buf) < n:
            if not self.more():
                return None
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out


def _read_reply(reader: _Reader, method: str, reply: Reply) -> None:
    while True:
        head = reader.until(b"\r\n\r\n")
        if head is None:
            reply.outcome, reply.body = "closed", bytes(reader.buf)
            reply.detail = "closed without an answer" if not reader.buf else "closed mid-head"
            return
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            reply.outcome, reply.detail = "closed", f"not an HTTP answer: {lines[0][:80]!r}"
            reply.body = head
            return
        status = int(parts[1])
        headers = [
            tuple(x.strip() for x in line.split(":", 1)) for line in lines[1:] if ":" in line
        ]
        if 100 <= status < 200:
            reply.informational.append(status)
            continue
        reply.status, reply.headers = status, [(k, v) for k, v in headers]
        break
    length = reply.header("content-length")
    if method == "HEAD" or status in (204, 304):
        body: bytes | None = b""
    elif (reply.header("transfer-encoding") or "").lower().endswith("chunked"):
        body = _read_chunked(reader)
    elif length is not None and length.strip().isdigit():
        if int(length) > MAX_ANSWER:
            raise ValueError(f"answer claims {length} bytes, more than {MAX_ANSWER}")
        body = reader.exactly(int(length))
    else:
        while reader.more():
            pass
        body = bytes(reader.buf)
    if body is None:
        reply.outcome, reply.detail = "closed", "closed before the whole answer body"
        reply.body = bytes(reader.buf)
        return
    reply.outcome, reply.body = "answered", body


def _read_chunked(reader: _Reader) -> bytes | None:
    out = bytearray()
    while True:
        line = reader.until(b"\r\n")
        if line is None:
            return None
        size = int(line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            return bytes(out) if reader.until(b"\r\n") is not None else None
        chunk = reader.exactly(size + 2)
        if chunk is None:
            return None
        out += chunk[:-2]
        if len(out) > MAX_ANSWER:
            raise ValueError(f"answer longer than {MAX_ANSWER} bytes")


def exchange(target: Target, request: Request, timeout: float) -> Reply:
    """Send ``request`` on a new connection and read the answer, all within
    ``timeout`` seconds. Never raises for what the server does."""
    import socket

    start = time.monotonic()
    deadline = start + timeout
    reply = Reply("unreachable")
    try:
        sock = socket.create_connection((target.host, target.port), timeout=timeout)
    except OSError as exc:
        reply.detail = f"cannot connect: {exc}"
        reply.elapsed = time.monotonic() - start
        return reply
    reader = _Reader(sock, deadline)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            sock.sendall(request.head(target))
            for piece in request.pieces():
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                sock.sendall(piece)
            if request.end_input:
                sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may have answered early: read what it said
        except TimeoutError:
            reply.outcome, reply.detail = "timeout", "the server stopped reading the request"
            return reply
        _read_reply(reader, request.method, reply)
    except TimeoutError:
        reply.outcome, reply.detail = "timeout", f"no whole answer within {timeout:g} s"
    except ConnectionResetError:
        reply.outcome, reply.detail = "reset", "connection reset"
        reply.body = reply.body or bytes(reader.buf)  # (what came before it)
    except (OSError, ValueError) as exc:
        reply.outcome, reply.detail = "closed", str(exc)
        reply.body = reply.body or bytes(reader.buf)  # (what came before it)
    finally:
        reply.elapsed = time.monotonic() - start
        sock.close()
    return reply
