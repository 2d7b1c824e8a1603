"""Stream a response's tensors into memory-mapped ``.npy`` files.

A :class:`binproto.TensorAssembler` takes a *destination* per tensor: here a
``numpy.lib.format.open_memmap`` array, created from the tensor's validated
header entry the moment its first byte arrives. Tensors larger than memory
land on disk, and the process keeps only what the page cache holds.

Two sources:

* a server (``--port``): one FP32 tensor is sent to the ``echo`` model and
  the response is received with :func:`binproto.adapters.h11.receive_body_into`,
  which lets the kernel write tensor bytes straight into the memory map
  (``recv_into``): no copy in between;
* a saved body (``--body FILE`` plus ``--header-length N``; ``--kind
  request`` for a request body), e.g. one written by ``binproto encode``:
  read in 1 MiB pieces and fed to the parser, one copy per byte into the
  memory map.

Run it::

    python -m binproto serve --port 8000 &
    python examples/stream_to_memmap.py --port 8000 --elements 67108864 --out /tmp/tensors
    python examples/stream_to_memmap.py --body resp.bin --header-length 123 --out /tmp/tensors

Each tensor ends up as ``OUT/<name>.npy``; ``numpy.load(path, mmap_mode="r")``
opens it without reading it. BF16 tensors are stored as ``uint16`` (their raw
bits); BYTES tensors, which have no fixed-size form, are saved when complete.
"""

from __future__ import annotations

import argparse
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import h11
import numpy as np

import binproto
from binproto import Kind
from binproto.adapters.h11 import (
    error_message,
    parser_for,
    receive_body_into,
    request_for,
    send_message,
)

#: Bytes read per piece from a saved body.
READ_SIZE = 1 << 20


def npy_path(out: Path, name: str) -> Path:
    """``OUT/<name>.npy``. The peer chose the name: one that is not a plain
    file name (``../x``, ``/etc/x``, ``a/b``) is its fault, never a path
    outside ``out``."""
    if name in ("", ".", "..") or Path(name).name != name or "\0" in name or "\\" in name:
        raise binproto.RemoteProtocolError(f"tensor name {name!r} cannot name a file here")
    return out / f"{name}.npy"


def memmap_destinations(out: Path) -> Any:
    """A TensorAssembler destination callable: one ``OUT/<name>.npy`` per tensor."""
    out.mkdir(parents=True, exist_ok=True)

    def destination(info: binproto.TensorInfo) -> np.ndarray[Any, Any] | None:
        if not info.binary_size:
            return None  # nothing to map: the assembler makes the empty array
        dtype = np.dtype("<u2") if info.datatype == "BF16" else info.dtype
        path = npy_path(out, info.name)
        # numpy 1 types open_memmap loosely: the annotation keeps the result typed.
        mapped: np.ndarray[Any, Any] = np.lib.format.open_memmap(  # type: ignore[no-untyped-call,unused-ignore]
            path, mode="w+", dtype=dtype, shape=info.shape
        )
        return mapped

    return destination


def save_rest(assembler: binproto.TensorAssembler, out: Path) -> dict[str, Path]:
    """Flush the memory maps; save tensors that had none (BYTES, JSON data).
    Returns each tensor's file by name."""
    paths = {}
    for name, array in assembler.tensors.items():
        path = npy_path(out, name)
        if isinstance(array, np.memmap):
            array.flush()
        else:
            np.save(path, array, allow_pickle=array.dtype == object)
        paths[name] = path
    return paths


def from_server(
    host: str, port: int, x: np.ndarray[Any, Any], out: Path
) -> binproto.TensorAssembler:
    """Echo ``x`` through the server's ``echo`` model into ``OUT/x.npy``."""
    body = binproto.encode_request({"x": x}, binary_data_output=True)
    head = request_for("/v2/models/echo/infer", body, host=f"{host}:{port}")
    with socket.create_connection((host, port)) as sock:
        conn = h11.Connection(h11.CLIENT)
        for piece in send_message(conn, head, body):
            sock.sendall(piece)
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(sock.recv(1 << 16))
            elif type(event) is h11.Response:
                break
            else:
                raise binproto.RemoteProtocolError(f"expected a response, got {event!r}")
        if event.status_code != 200:
            data = b""
            while True:
                part = conn.next_event()
                if part is h11.NEED_DATA:
                    conn.receive_data(sock.recv(1 << 16))
                elif type(part) is h11.Data:
                    data += part.data
                else:
                    raise error_message(event.status_code, data)
        assembler = binproto.TensorAssembler(memmap_destinations(out))
        receive_body_into(sock, conn, parser_for(event), assembler)
    return assembler


def from_body(
    path: Path, header_length: int | None, out: Path, kind: Kind = "response"
) -> binproto.TensorAssembler:
    """Parse a saved body (a response, or a request with ``kind``) piece by
    piece into memory maps under ``out``."""
    parser = binproto.Parser(kind, header_length=header_length, content_length=path.stat().st_size)
    assembler = binproto.TensorAssembler(memmap_destinations(out))
    with path.open("rb") as f:
        while parser.state is not binproto.ParserState.DONE:
            parser.receive_data(f.read(READ_SIZE))  # b"" at the end of the file
            for event in parser.events():
                assembler.feed(event)
    return assembler


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: from a server (``--port``) or from a saved body (``--body``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for the .npy files")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, help="a V2 server with an echo model")
    parser.add_argument("--elements", type=int, default=1 << 20, help="FP32 elements to echo")
    parser.add_argument("--body", type=Path, help="a saved body instead of a server")
    parser.add_argument("--header-length", type=int, help="the body's header length")
    parser.add_argument(
        "--kind",
        choices=("response", "request"),
        default="response",
        help="what the saved body is (default response)",
    )
    args = parser.parse_args(argv)
    if (args.port is None) == (args.body is None):
        parser.error("give either --port or --body")

    if args.body is not None:
        try:
            assembler = from_body(args.body, args.header_length, args.out, args.kind)
        except binproto.ProtocolError as exc:
            hint = " (a request body? add --kind request)" if args.kind == "response" else ""
            raise SystemExit(f"{args.body}: not a valid {args.kind} body: {exc}{hint}") from None
    else:
        x = np.arange(args.elements, dtype=np.float32)
        assembler = from_server(args.host, args.port, x, args.out)
    for name, path in save_rest(assembler, args.out).items():
        pickled = assembler.tensors[name].dtype == object
        array = np.load(path, mmap_mode=None if pickled else "r", allow_pickle=pickled)
        print(f"{path}: {array.dtype} {list(array.shape)}")
    print(
        f"{assembler.bytes_in_place} bytes received in place,"
        f" {assembler.bytes_copied} copied from chunks"
    )


if __name__ == "__main__":
    main()
