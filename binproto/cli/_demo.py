"""``python -m binproto demo``: a large tensor through binproto's asyncio server.

The demo sends one FP32 tensor (1 GiB by default) to the ``echo`` model of a
server on a free 127.0.0.1 port and checks every byte that comes back, twice:

* **streaming**: binproto's asyncio server (:mod:`binproto.adapters.asyncio`)
  parses the request as it arrives, receiving tensor bytes straight into the
  tensor's array; binproto's asyncio client sends the encoder's buffers
  without joining them and checks the response chunk by chunk, as the parser
  hands the chunks out, keeping none of them.
* **whole-body**: a plain h11 server and client read each body whole (its
  pieces joined into one ``bytes``) and only then decode it with
  :func:`binproto.decode_request` / :func:`binproto.decode_response`.

Each path gets a fresh server process, so its peak RSS (``VmHWM`` in
``/proc/<pid>/status``) is that path's alone; the client's peak is reset
between paths through ``/proc/self/clear_refs``. Where ``/proc`` does not
offer these, the peaks are reported as ``n/a``.

I/O libraries are imported only when the demo runs: ``import binproto``
stays free of them.
"""

from __future__ import annotations

import argparse
import gc
import re
import select
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "DemoResult",
    "add_demo",
    "format_size",
    "parse_size",
    "peak_rss",
    "run_demo",
    "size_arg",
]

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

_UNITS = {
    "": 1,
    "b": 1,
    "k": KiB,
    "kib": KiB,
    "kb": 1000,
    "m": MiB,
    "mib": MiB,
    "mb": 1000**2,
    "g": GiB,
    "gib": GiB,
    "gb": 1000**3,
    "t": 1024 * GiB,
    "tib": 1024 * GiB,
    "tb": 1000**4,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")


def parse_size(text: str) -> int:
    """Bytes in a size such as ``64MiB``, ``1GiB``, ``512KiB``, ``1.5GB`` or ``4096``.

    Binary units (``KiB``, ``MiB``, ``GiB``; also ``K``, ``M``, ``G``) are
    powers of 1024, decimal ones (``KB``, ``MB``, ``GB``) powers of 1000;
    case does not matter. Raises ValueError for anything else.
    """
    match = _SIZE.fullmatch(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(f"not a size: {text!r} (try 64MiB, 1GiB, 512KiB or a byte count)")
    return int(float(match.group(1)) * _UNITS[unit])


def format_size(n: float) -> str:
    """``n`` bytes with a binary unit: ``1.00 GiB``, ``64.0 MiB``, ``12 B``."""
    if n < KiB:
        return f"{int(n)} B"
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= scale:
            value = n / scale
            return f"{value:.2f} {unit}" if value < 10 else f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


def _size_arg(text: str) -> int:
    """--size: whole FP32 elements, at least one (argparse's ``type``)."""
    size = _chunk_arg(text)
    if size % 4:
        raise argparse.ArgumentTypeError(f"the size must be a multiple of 4 bytes, got {size}")
    return size


def size_arg(text: str) -> int:
    """A size flag's value in bytes, read by :func:`parse_size` (argparse's ``type``)."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _chunk_arg(text: str) -> int:
    """--chunk: a size of at least one byte (argparse's ``type``)."""
    size = size_arg(text)
    if size < 1:
        raise argparse.ArgumentTypeError(f"the size must be positive, got {text!r}")
    return size


# -- memory --------------------------------------------------------------------


def peak_rss(pid: int | str = "self") -> int | None:
    """Peak resident memory (VmHWM) of process ``pid`` in bytes, None if unknown."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * KiB
    except (OSError, ValueError):
        return None
    return None


def reset_peak_rss() -> bool:
    """Reset this process's VmHWM to its current RSS (Linux); False if not possible."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
    except OSError:
        return False
    return True


# -- progress ------------------------------------------------------------------


class Progress:
    """A one-line progress report on a stream, redrawn at most every ``interval`` s.

    On a terminal the line is redrawn in place; elsewhere a line is written
    at most every ``interval`` seconds.
    """

    def __init__(self, out: TextIO | None, label: str, total: int, interval: float = 0.2) -> None:
        self.out = out
        self.label = label
        self.total = total
        self.sent = 0
        self.received = 0
        self.interval = interval if out is not None and out.isatty() else max(interval, 1.0)
        self._start = time.perf_counter()
        self._last = -float("inf")  # the first update draws

    def add(self, sent: int = 0, received: int = 0) -> None:
        """Count bytes written and read; redraw if it is time."""
        self.sent += sent
        self.received += received
        now = time.perf_counter()
        if self.out is not None and now - self._last >= self.interval:
            self._last = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        assert self.out is not None
        elapsed = max(now - self._start, 1e-9)
        rate = (self.sent + self.received) / elapsed / 1e9
        total = format_size(self.total)
        line = (
            f"[{self.label}] sent {format_size(min(self.sent, self.total))} / {total}"
            f"  received {format_size(min(self.received, self.total))} / {total}"
            f"  {rate:.2f} GB/s"
        )
        if self.out.isatty():
            self.out.write("\r" + line.ljust(78))
        else:
            self.out.write(line + "\n")
        self.out.flush()

    def close(self) -> None:
        """Draw the final state and end the line."""
        if self.out is None:
            return
        self._draw(time.perf_counter())
        if self.out.isatty():
            self.out.write("\n")
        self.out.flush()


class DemoError(Exception):
    """The echo did not come back intact, or a server did not start."""


class _Metered:
    """A ByteStream wrapper: reads and writes at most ``chunk`` bytes at a time,
    counted into a :class:`Progress`. Buffers are sliced, never copied."""

    def __init__(self, inner: Any, chunk: int, progress: Progress) -> None:
        self._inner = inner
        self._chunk = chunk
        self._progress = progress

    @property
    def timeout(self) -> float | None:
        """The wrapped stream's bound on one wait for the peer."""
        return self._inner.timeout  # type: ignore[no-any-return]

    @timeout.setter
    def timeout(self, value: float | None) -> None:
        self._inner.timeout = value

    async def receive_some(self, max_bytes: int) -> Any:
        data = await self._inner.receive_some(min(max_bytes, self._chunk))
        self._progress.add(received=len(data))
        return data

    async def receive_into(self, view: memoryview) -> int:
        n: int = await self._inner.receive_into(view[: self._chunk])
        self._progress.add(received=n)
        return n

    async def send_all(self, buffers: Sequence[Any]) -> None:
        for buf in buffers:
            view = memoryview(buf).cast("B")
            for start in range(0, len(view), self._chunk):
                piece = view[start : start + self._chunk]
                await self._inner.send_all([piece])
                self._progress.add(sent=len(piece))

    async def aclose(self) -> None:
        await self._inner.aclose()


# -- the two paths -------------------------------------------------------------


async def _streaming_client(
    port: int, x: np.ndarray[Any, Any], progress: Progress, chunk: int
) -> None:
    """binproto's asyncio client: check each response chunk as it is parsed."""
    from binproto import TensorChunk
    from binproto.adapters import asyncio as aio

    async def open_stream() -> _Metered:
        return _Metered(await aio.connect("127.0.0.1", port), chunk, progress)

    expected = x.reshape(-1).view(np.uint8)
    checked = 0
    async with aio.ClientCore(open_stream, host=f"127.0.0.1:{port}") as client:
        async with client.stream("echo", {"x": x}, binary_data_output=True) as response:
            async for event in response:
                if type(event) is TensorChunk:
                    got = np.frombuffer(event.data, dtype=np.uint8)
                    if not np.array_equal(got, expected[event.offset : event.offset + got.size]):
                        raise DemoError(f"echoed bytes differ near tensor byte {event.offset}")
                    checked += got.size
    if checked != x.nbytes:
        raise DemoError(f"{checked} tensor bytes came back, expected {x.nbytes}")


async def _write_pieces(
    writer: asyncio.StreamWriter, pieces: Sequence[Any], chunk: int, progress: Progress | None
) -> None:
    for piece in pieces:
        view = memoryview(piece).cast("B")
        for start in range(0, len(view), chunk):
            part = view[start : start + chunk]
            writer.write(part)
            await writer.drain()
            if progress is not None:
                progress.add(sent=len(part))


async def _whole_body_client(
    port: int, x: np.ndarray[Any, Any], progress: Progress, chunk: int
) -> None:
    """A plain h11 client: read the whole response, then decode_response."""
    import asyncio

    import h11

    import binproto
    from binproto.adapters.h11 import request_for, send_body

    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        conn = h11.Connection(h11.CLIENT)
        body = binproto.encode_request({"x": x}, binary_data_output=True)
        head = request_for("/v2/models/echo/infer", body, host=f"127.0.0.1:{port}")
        await _write_pieces(writer, [conn.send(head), *send_body(conn, body)], chunk, progress)
        response: h11.Response | None = None
        parts: list[bytes] = []
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise DemoError(f"the server's answer is not HTTP/1.1: {exc}") from None
            if event is h11.NEED_DATA:
                data = await reader.read(chunk)
                progress.add(received=len(data))
                conn.receive_data(data)
            elif type(event) is h11.Response:
                response = event
            elif type(event) is h11.Data:
                parts.append(event.data)
            elif type(event) is h11.EndOfMessage:
                break
            else:
                raise DemoError(f"unexpected HTTP event {event!r}")
        assert response is not None
        whole = b"".join(parts)
        del parts
        if response.status_code != 200:
            raise DemoError(f"the server answered {response.status_code}: {whole[:500]!r}")
        header_length = binproto.header_length_from(response.headers)
        message = binproto.decode_response(whole, header_length=header_length)
        if not np.array_equal(message.tensors["x"], x):
            raise DemoError("the echoed tensor differs from the one sent")
    finally:
        writer.close()


async def _whole_body_server(chunk: int) -> asyncio.Server:
    """A plain h11 server with an echo model: each body read whole, then decoded."""
    import asyncio

    import h11

    import binproto
    from binproto.adapters.h11 import error_response, response_for, send_body

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER)
        request: h11.Request | None = None
        parts: list[bytes] = []
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await reader.read(chunk))
                elif type(event) is h11.Request:
                    request, parts = event, []
                elif type(event) is h11.Data:
                    parts.append(event.data)
                elif type(event) is h11.EndOfMessage:
                    assert request is not None
                    whole = b"".join(parts)
                    parts = []
                    try:
                        header_length = binproto.header_length_from(request.headers)
                        message = binproto.decode_request(whole, header_length=header_length)
                        outputs = [
                            binproto.Tensor(
                                name, array, datatype=message.header.tensor(name).datatype
                            )
                            for name, array in message.tensors.items()
                        ]
                        encoded = binproto.encode_response(
                            outputs, model_name="echo", request=message.header
                        )
                        pieces = [conn.send(response_for(200, encoded)), *send_body(conn, encoded)]
                    except binproto.ProtocolError as exc:
                        head, payload = error_response(exc)
                        pieces = [
                            conn.send(head),
                            conn.send(h11.Data(data=payload)),
                            conn.send(h11.EndOfMessage()),
                        ]
                    await _write_pieces(writer, [p for p in pieces if p], chunk, None)
                    del whole, pieces
                    conn.start_next_cycle()
                else:
                    return  # ConnectionClosed
        except (ConnectionError, h11.ProtocolError):
            return
        finally:
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def _serve_child(path: str, chunk: int) -> None:
    """Run one path's server in this (child) process; print its port."""
    import asyncio

    async def main() -> None:
        if path == "streaming":
            from binproto.adapters.asyncio import start_server

            server = await start_server(host="127.0.0.1", port=0)
        else:
            server = await _whole_body_server(chunk)
        port = server.sockets[0].getsockname()[1]
        print(f"PORT {port}", flush=True)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def _start_server(path: str, chunk: int) -> tuple[subprocess.Popen[bytes], int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "binproto.cli._demo", path, str(chunk)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    line = proc.stdout.readline() if ready else b""
    if not line.startswith(b"PORT "):
        proc.kill()
        _, err = proc.communicate()
        raise DemoError(f"the {path} server did not start: {err.decode(errors='replace')}")
    return proc, int(line.split()[1])


def _stop_server(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


@dataclass(frozen=True, slots=True)
class DemoResult:
    """One path's figures: round-trip seconds and peak RSS (bytes, None if unknown)."""

    path: str
    nbytes: int
    seconds: float
    client_peak: int | None
    server_peak: int | None

    @property
    def throughput(self) -> float:
        """Tensor bytes moved (request and response) per second."""
        return 2 * self.nbytes / self.seconds


def _run_path(
    path: str, x: np.ndarray[Any, Any], chunk: int, progress_out: TextIO | None
) -> DemoResult:
    import asyncio

    proc, port = _start_server(path, chunk)
    try:
        gc.collect()
        can_reset = reset_peak_rss()
        progress = Progress(progress_out, path, x.nbytes)
        client = _streaming_client if path == "streaming" else _whole_body_client
        start = time.perf_counter()
        asyncio.run(client(port, x, progress, chunk))
        seconds = time.perf_counter() - start
        progress.close()
        client_peak = peak_rss() if can_reset else None
        server_peak = peak_rss(proc.pid)
    finally:
        _stop_server(proc)
    return DemoResult(path, x.nbytes, seconds, client_peak, server_peak)


def run_demo(nbytes: int, chunk: int = MiB, *, progress: TextIO | None = None) -> list[DemoResult]:
    """Echo an FP32 tensor of ``nbytes`` bytes through both paths; their figures.

    Raises :class:`DemoError` if a byte comes back wrong.
    """
    if nbytes < 4 or nbytes % 4:
        raise ValueError(f"the size must be a positive multiple of 4 bytes, got {nbytes}")
    if chunk < 1:
        raise ValueError(f"the chunk size must be positive, got {chunk}")
    x = np.arange(nbytes // 4, dtype=np.float32)  # pages touched: resident from the start
    return [_run_path(path, x, chunk, progress) for path in ("streaming", "whole-body")]


def _peak(value: int | None, nbytes: int) -> str:
    if value is None:
        return "n/a"
    return f"{format_size(value)} ({value / nbytes:.1f}x)"


def report(results: list[DemoResult], out: TextIO) -> None:
    """Print the figures as a table."""
    nbytes = results[0].nbytes
    rows = [("path", "round trip", "throughput", "client peak RSS", "server peak RSS")]
    for r in results:
        rows.append(
            (
                r.path,
                f"{r.seconds:.2f} s",
                f"{r.throughput / 1e9:.2f} GB/s",
                _peak(r.client_peak, nbytes),
                _peak(r.server_peak, nbytes),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)), file=out)
    print(
        f"\nthroughput: tensor bytes sent plus received ({format_size(2 * nbytes)}) per second"
        " of round trip; peak RSS: VmHWM, as a multiple of the tensor size (the client"
        " also holds the tensor it sends)",
        file=out,
    )


def _demo(args: argparse.Namespace) -> int:
    # What a server that answers wrongly makes binproto's client raise.
    from binproto import ProtocolError
    from binproto.adapters.h11 import HTTPError

    out = sys.stdout
    print(
        f"binproto demo: echo of a {format_size(args.size)} FP32 tensor over 127.0.0.1,"
        f" {format_size(args.chunk)} client reads and writes",
        file=out,
        flush=True,
    )
    try:
        results = run_demo(args.size, args.chunk, progress=None if args.quiet else sys.stderr)
    except (DemoError, ValueError, HTTPError, ProtocolError) as exc:
        print(f"binproto demo: {exc}", file=sys.stderr)
        return 1
    report(results, out)
    return 0


def add_demo(subparsers: Any) -> None:
    """Register ``demo``: stream a large tensor through the asyncio server and back."""
    p = subparsers.add_parser(
        "demo",
        help="stream a large tensor through binproto's asyncio server and back",
        description="Start binproto's asyncio server on a free 127.0.0.1 port, send one FP32"
        " tensor to its echo model, check every byte that comes back, and print"
        " throughput and peak memory for the streaming path vs the whole-body path.",
    )
    p.add_argument(
        "--size", type=_size_arg, default=GiB, help="tensor size, e.g. 64MiB (default 1GiB)"
    )
    p.add_argument(
        "--chunk",
        type=_chunk_arg,
        default=MiB,
        help="bytes per client socket read and write, e.g. 64KiB (default 1MiB)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.set_defaults(func=_demo)


if __name__ == "__main__":  # a path's server, started by run_demo
    _serve_child(sys.argv[1], int(sys.argv[2]))
