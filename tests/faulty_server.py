"""A small threaded V2 server with an ``echo`` model and planted faults.

``binproto check`` and ``binproto fuzz`` must find exactly the planted fault.
Without a fault (``"none"``) the server is correct enough to pass every
case: it decodes requests with binproto and echoes the inputs. Each
connection carries one request and is closed after the answer.

========================== ===========================================================
fault                      what the server does wrong
========================== ===========================================================
500-bad-header-length      a 500 for an Inference-Header-Content-Length that is no size
bool-byte-2                accepts BOOL bytes other than 0 and 1
read-past-content-length   reads until the JSON's sizes are met, past Content-Length
hang-on-truncated          never answers when the client ends a body cut short
json-outputs               sends outputs as JSON where binary was asked
bytes-prefix               adds 1 to the first length prefix of a binary BYTES output
501-unknown-coding         a 501 for a Content-Encoding it does not know (a SHOULD)
========================== ===========================================================
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

import binproto

FAULTS = (
    "none",
    "500-bad-header-length",
    "bool-byte-2",
    "read-past-content-length",
    "hang-on-truncated",
    "json-outputs",
    "bytes-prefix",
    "501-unknown-coding",
)
_BINARY_ONLY = ("FP16", "BF16")


class Refused(Exception):
    """A request answered with an error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class FaultyServer:
    """Serves on 127.0.0.1 in daemon threads until :meth:`stop`."""

    def __init__(self, *faults: str) -> None:
        assert set(faults) <= set(FAULTS), faults
        self.faults = set(faults)
        self.stopping = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Stop accepting; a hung connection is released."""
        self.stopping.set()
        with contextlib.suppress(OSError):  # (wakes the blocked accept on Linux)
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self.thread.join(5)

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        with conn:
            try:
                status, headers, body = self._answer(conn)
            except Exception:  # (a bug here shows as a close without an answer)
                return
            if status < 0:
                return  # (closed without an answer)
            head = [f"HTTP/1.1 {status} X", f"Content-Length: {len(body)}", "Connection: close"]
            head += [f"{k}: {v}" for k, v in headers]
            with contextlib.suppress(OSError):
                conn.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)

    def _hang(self) -> tuple[int, list[tuple[str, str]], bytes]:
        self.stopping.wait(60)
        return -1, [], b""

    def _answer(self, conn: socket.socket) -> tuple[int, list[tuple[str, str]], bytes]:
        buf = bytearray()
        while b"\r\n\r\n" not in buf:
            data = conn.recv(65536)
            if not data:
                return -1, [], b""
            buf += data
        head, _, rest = bytes(buf).partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        pairs = [tuple(x.strip() for x in line.split(":", 1)) for line in lines[1:] if ":" in line]
        headers = {k.lower(): v for k, v in pairs}
        try:
            body = self._body(conn, headers, bytearray(rest))
            if body is None:
                return self._hang()
            return self._route(method, path, [(k, v) for k, v in pairs], headers, body)
        except Refused as exc:
            return exc.status, [("Content-Type", "application/json")], _error(str(exc))

    def _body(self, conn: socket.socket, headers: dict[str, str], buf: bytearray) -> bytes | None:
        if headers.get("transfer-encoding", "").lower() == "chunked":
            return _dechunk(conn, buf)
        length = headers.get("content-length", "0")
        if not length.isdigit():
            raise Refused(400, "bad Content-Length")
        size = int(length)
        if size > 1 << 30:
            raise Refused(413, "Content-Length too large")
        while len(buf) < size:
            data = conn.recv(65536)
            if not data:
                if "hang-on-truncated" in self.faults:
                    return None
                raise Refused(400, "body cut short")
            buf += data
        if "read-past-content-length" in self.faults:
            # The fault: trust the JSON's sizes over Content-Length.
            while len(buf) < _claimed(headers, bytes(buf)):
                data = conn.recv(65536)
                if not data:
                    break
                buf += data
            return bytes(buf[: max(size, _claimed(headers, bytes(buf)))])
        return bytes(buf[:size])

    def _route(
        self,
        method: str,
        path: str,
        pairs: list[tuple[str, str]],
        headers: dict[str, str],
        body: bytes,
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        js = [("Content-Type", "application/json")]
        if method == "GET" and path == "/v2":
            meta = {"name": "faulty", "version": "0", "extensions": ["binary_tensor_data"]}
            return 200, js, json.dumps(meta).encode()
        if method == "GET" and path == "/v2/models/echo":
            return 200, js, json.dumps({"name": "echo", "inputs": [], "outputs": []}).encode()
        if method != "POST" or path != "/v2/models/echo/infer":
            raise Refused(404, f"no route {method} {path}")
        return self._infer(pairs, body)

    def _infer(
        self, pairs: list[tuple[str, str]], body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        try:
            header_length = binproto.header_length_from(pairs)
        except binproto.RemoteProtocolError as exc:
            status = 500 if "500-bad-header-length" in self.faults else exc.status_hint
            raise Refused(status, str(exc)) from None
        try:
            coding = binproto.content_encoding_from(pairs)
        except binproto.RemoteProtocolError as exc:
            status = 501 if "501-unknown-coding" in self.faults else exc.status_hint
            raise Refused(status, str(exc)) from None
        try:
            request = binproto.decode_request(
                body,
                header_length=header_length,
                content_encoding=coding,
                strict_bool="bool-byte-2" not in self.faults,
            )
        except binproto.RemoteProtocolError as exc:
            raise Refused(exc.status_hint, str(exc)) from None
        header = request.header
        wanted = header.requested_outputs
        names = [o.name for o in wanted] if wanted is not None else list(request.tensors)
        outputs = []
        for name in names:
            if name not in request.tensors:
                raise Refused(400, f"unexpected output {name!r}")
            info = header.tensor(name)
            array = request.tensors[name]
            if info.datatype == "BOOL":  # (the fault's bytes 2-255, sent back as true)
                array = array.view(np.uint8) != 0
            outputs.append(binproto.Tensor(name, array, datatype=info.datatype))
        if "json-outputs" in self.faults:
            binary = [t.name for t in outputs if t.datatype in _BINARY_ONLY or not _utf8(t)]
            encoded = binproto.encode_response(outputs, model_name="echo", binary=binary)
        else:
            encoded = binproto.encode_response(outputs, model_name="echo", request=header)
        data = bytes(encoded)
        if "bytes-prefix" in self.faults:
            data = _bump_bytes_prefix(data, encoded.header_length)
        return 200, [h for h in encoded.headers if h[0] != "Content-Length"], data


def _utf8(tensor: binproto.Tensor) -> bool:
    """False for a BYTES tensor JSON cannot carry."""
    if tensor.datatype != "BYTES":
        return True
    try:
        for item in np.asarray(tensor.array).ravel():
            bytes(item).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _error(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


def _claimed(headers: dict[str, str], body: bytes) -> int:
    """The JSON header's length plus its binary_data_sizes, or 0."""
    try:
        length = int(headers.get(binproto.HEADER_LENGTH_NAME.lower(), ""))
        meta = json.loads(body[:length])
        sizes = [(t.get("parameters") or {}).get("binary_data_size", 0) for t in meta["inputs"]]
        return length + sum(int(s) for s in sizes)
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return 0


def _bump_bytes_prefix(data: bytes, header_length: int | None) -> bytes:
    if header_length is None:
        return data
    meta: Any = json.loads(data[:header_length])
    offset = header_length
    for out in meta["outputs"]:
        size = (out.get("parameters") or {}).get("binary_data_size")
        if size is None:
            continue
        if out["datatype"] == "BYTES" and size >= 4:
            (n,) = struct.unpack_from("<I", data, offset)
            return data[:offset] + struct.pack("<I", n + 1) + data[offset + 4 :]
        offset += size
    return data


def _dechunk(conn: socket.socket, buf: bytearray) -> bytes:
    out = bytearray()
    while True:
        while b"\r\n" not in buf:
            data = conn.recv(65536)
            if not data:
                raise Refused(400, "chunked body cut short")
            buf += data
        line, _, rest = bytes(buf).partition(b"\r\n")
        size = int(line.split(b";")[0], 16)
        buf[:] = rest
        while len(buf) < size + 2:
            data = conn.recv(65536)
            if not data:
                raise Refused(400, "chunked body cut short")
            buf += data
        out += buf[:size]
        del buf[: size + 2]
        if size == 0:
            return bytes(out)


@contextlib.contextmanager
def running_faulty_server(*faults: str) -> Iterator[int]:
    """Serve with ``faults`` planted (``"none"``, or none given: no fault);
    yields the port on 127.0.0.1."""
    server = FaultyServer(*faults)
    try:
        yield server.port
    finally:
        server.stop()
