"""Fakes for tests: a scripted HTTP/1.1 server, in-memory byte streams and
an ASGI ``send`` recorder.

:class:`MemoryStream` (and its variants) is a server connection in memory;
:class:`TimingOutStream` times out every wait once its reads are used up.
:class:`AsgiRecorder` is an ASGI ``send`` callable that keeps the messages.

A scripted server answers client tests as told, right or wrong.
:class:`ScriptedServer` listens on loopback in a thread, so asyncio and
trio clients can both call it. Each request it reads takes the next entry
of its script. An entry is one step or a list of steps:

| step | does |
|---|---|
| ``bytes`` | sends them as they are |
| a callable | sends what it returns for the request's ``(head, body)`` |
| a ``float`` | waits that many seconds |
| ``"close"`` | closes the connection |
| ``"reset"`` | resets the connection (a zero linger time) |

With the script used up, ``otherwise`` answers, or the connection closes.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import subprocess
import threading
from collections.abc import Callable, MutableMapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import binproto

__all__ = [
    "AsgiRecorder",
    "MemoryStream",
    "MemoryStreamInto",
    "ScriptedServer",
    "Step",
    "ThreadedStream",
    "TimingOutStream",
    "TimingOutStreamInto",
    "echo_answer",
    "ok_answer",
    "tls_contexts",
]

Step = bytes | str | float | Callable[[bytes, bytes], bytes]


class ScriptedServer:
    """A scripted server on a free loopback port; a context manager.

    ``read_body`` False leaves request bodies unread (a server that answers
    from the head). ``heads`` and ``bodies`` keep what it read, in order.
    """

    def __init__(
        self,
        script: Sequence[Step | Sequence[Step]] = (),
        *,
        otherwise: Step | Sequence[Step] | None = None,
        read_body: bool = True,
    ) -> None:
        self.script = list(script)
        self.otherwise = otherwise
        self.read_body = read_body
        self.heads: list[bytes] = []
        self.bodies: list[bytes] = []
        self.connections = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._threads: list[threading.Thread] = []
        self._open: set[socket.socket] = set()
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def __enter__(self) -> ScriptedServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop listening and wait for the connections' threads."""
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._accepting.join(10)
        with self._lock:  # (a client may keep its connection open: end it)
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        for thread in list(self._threads):
            thread.join(10)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                self._open.add(sock)
            thread = threading.Thread(target=self._serve, args=(sock,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _next(self) -> Sequence[Step]:
        with self._lock:
            entry = self.script.pop(0) if self.script else self.otherwise
        if entry is None:
            return ["close"]
        if isinstance(entry, (bytes, str, float)) or callable(entry):
            return [entry]
        return entry

    def _serve(self, sock: socket.socket) -> None:
        sock.settimeout(10)
        pending = b""
        try:
            while True:
                while b"\r\n\r\n" not in pending:
                    data = sock.recv(65536)
                    if not data:
                        return
                    pending += data
                head, _, pending = pending.partition(b"\r\n\r\n")
                head += b"\r\n\r\n"
                body = b""
                if self.read_body:
                    length = _content_length(head)
                    while len(pending) < length:
                        data = sock.recv(65536)
                        if not data:
                            return
                        pending += data
                    body, pending = pending[:length], pending[length:]
                with self._lock:
                    self.heads.append(head)
                    self.bodies.append(body)
                if not self._do(sock, self._next(), head, body):
                    return
        except OSError:
            return
        finally:
            with self._lock:
                self._open.discard(sock)
            sock.close()

    def _do(self, sock: socket.socket, steps: Sequence[Step], head: bytes, body: bytes) -> bool:
        """Run ``steps``; False once the connection is closed."""
        for step in steps:
            if step == "close":
                return False
            if step == "reset":
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return False
            if isinstance(step, float):
                threading.Event().wait(step)
            elif isinstance(step, bytes):
                sock.sendall(step)
            elif callable(step):
                sock.sendall(step(head, body))
        return True


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def ok_answer(payload: bytes = b"", *, close: bool = False, status: str = "200 OK") -> bytes:
    """An HTTP/1.1 answer with ``payload`` as its body (JSON, when any)."""
    head = f"HTTP/1.1 {status}\r\nContent-Length: {len(payload)}\r\n"
    if payload:
        head += "Content-Type: application/json\r\n"
    if close:
        head += "Connection: close\r\n"
    return head.encode() + b"\r\n" + payload


def echo_answer(head: bytes, body: bytes, **headers: Any) -> bytes:
    """The echo model's answer to a request (``head``, ``body``), binary outputs."""
    hl = None
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"inference-header-content-length":
            hl = int(value)
    request = binproto.decode_request(body, header_length=hl)
    encoded = binproto.encode_response(request.tensors, model_name="echo", request=request.header)
    lines = ["HTTP/1.1 200 OK", *(f"{k}: {v}" for k, v in encoded.headers)]
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + bytes(encoded)


class AsgiRecorder:
    """An ASGI send callable that keeps every message."""

    def __init__(self) -> None:
        self.messages: list[MutableMapping[str, Any]] = []

    async def __call__(self, message: MutableMapping[str, Any]) -> None:
        self.messages.append(message)

    @property
    def headers(self) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in self.messages[0]["headers"]}

    @property
    def bodies(self) -> list[Any]:
        return [m["body"] for m in self.messages[1:]]

    def body(self) -> bytes:
        return b"".join(bytes(b) for b in self.bodies)


class MemoryStream:
    """A ByteStream in memory, for a server's connection without sockets.

    Reads hand out ``reads`` in turn, each cut to what is asked and to
    ``most`` bytes, then the end (``b""``). What the server sends is kept
    in ``sent``.

    | option | does |
    |---|---|
    | ``most`` | the most bytes one read hands out |
    | ``mutable`` | reads are ``bytearray``, as some transports give |
    | ``whole`` | each read must fit what is asked (never cut) |
    | ``sending`` | False: a send is an error |
    """

    timeout: float | None = None

    def __init__(
        self,
        *reads: bytes,
        most: int | None = None,
        mutable: bool = False,
        whole: bool = False,
        sending: bool = True,
    ) -> None:
        self.reads = [r for r in reads if r]
        self.most = most
        self.mutable = mutable
        self.whole = whole
        self.sending = sending
        self.sent = bytearray()

    async def receive_some(self, max_bytes: int) -> bytes:
        if not self.reads:
            return b""
        if self.whole:
            assert len(self.reads[0]) <= max_bytes, (len(self.reads[0]), max_bytes)
        take = max_bytes if self.most is None else min(max_bytes, self.most)
        data, rest = self.reads[0][:take], self.reads[0][take:]
        if rest:
            self.reads[0] = rest
        else:
            self.reads.pop(0)
        return bytearray(data) if self.mutable else data  # type: ignore[return-value]

    async def send_all(self, buffers: Any) -> None:
        assert self.sending, "nothing is sent"
        for buffer in buffers:
            self.sent += buffer

    async def aclose(self) -> None:
        pass


class _Receives(Protocol):
    async def receive_some(self, max_bytes: int) -> bytes: ...


class _ReceivesInto:
    """``receive_into`` made of a stream's own ``receive_some``."""

    async def receive_into(self: _Receives, view: memoryview) -> int:
        data = await self.receive_some(len(view))
        view[: len(data)] = data
        return len(data)


class MemoryStreamInto(_ReceivesInto, MemoryStream):
    """:class:`MemoryStream` that also receives into the caller's memory."""


class ThreadedStream(MemoryStream):
    """:class:`MemoryStream` that offers ``to_thread``; ``threaded`` names each function sent."""

    def __init__(self, *reads: bytes, **options: Any) -> None:
        super().__init__(*reads, **options)
        self.threaded: list[str] = []

    async def to_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        import asyncio

        self.threaded.append(getattr(fn, "func", fn).__name__)
        return await asyncio.to_thread(fn, *args)


class TimingOutStream:
    """A ByteStream that hands out ``pieces``, one read each, then times out
    every wait, noting the timeout the server had set for it; what the
    server sends is kept in ``sent``."""

    def __init__(self, *pieces: bytes) -> None:
        self.pieces = list(pieces)
        self.timeout: float | None = None
        self.waits: list[float | None] = []
        self.sent = bytearray()

    async def receive_some(self, max_bytes: int) -> bytes:
        if not self.pieces:
            self.waits.append(self.timeout)
            raise TimeoutError(f"no bytes from the peer within {self.timeout} s")
        piece = self.pieces.pop(0)
        if len(piece) > max_bytes:
            self.pieces.insert(0, piece[max_bytes:])
        return piece[:max_bytes]

    async def send_all(self, buffers: Any) -> None:
        for buffer in buffers:
            self.sent += buffer

    async def aclose(self) -> None:
        pass


class TimingOutStreamInto(_ReceivesInto, TimingOutStream):
    """:class:`TimingOutStream` that also receives into the caller's memory."""


def tls_contexts(folder: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server and a client context for a self-signed certificate of
    ``localhost`` and 127.0.0.1, made in ``folder``."""
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
         "-out", cert, "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    return server, ssl.create_default_context(cafile=str(cert))
