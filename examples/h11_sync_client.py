"""A synchronous V2 client: a blocking socket, h11, and binproto's Sans-IO core.

The request is streamed: the encoder's buffers (the JSON header, then views
of the caller's arrays) are written one after the other, never joined. The
response is parsed incrementally: each piece h11 hands over goes straight to
the parser, whose events feed a :class:`binproto.TensorAssembler`, so tensor
bytes are copied once, from the socket's buffer into the output array.

Run it against any V2 server with an ``echo`` model, e.g. binproto's own::

    python -m binproto serve --port 8000 &
    python examples/h11_sync_client.py --port 8000 --elements 16777216
"""

from __future__ import annotations

import argparse
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import h11
import numpy as np

import binproto
from binproto.adapters.h11 import (
    error_message,
    parser_for,
    receive_events,
    request_for,
    send_message,
)

#: Bytes asked of the socket per read.
CHUNK = 1 << 16


@dataclass
class Result:
    """The outputs, and how the response body arrived."""

    outputs: dict[str, np.ndarray[Any, Any]]
    chunks: int  #: TensorChunk events the parser produced
    body_bytes: int  #: response body bytes parsed


def _next_event(sock: socket.socket, conn: h11.Connection) -> Any:
    """The next h11 event, reading from the socket when h11 needs bytes."""
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        conn.receive_data(sock.recv(CHUNK))


def infer(
    host: str,
    port: int,
    model: str,
    inputs: Mapping[str, Any],
    *,
    binary_data_output: bool = True,
) -> Result:
    """Send one inference request and parse the response as it arrives."""
    body = binproto.encode_request(inputs, binary_data_output=binary_data_output)
    head = request_for(f"/v2/models/{model}/infer", body, host=f"{host}:{port}")
    with socket.create_connection((host, port), timeout=300) as sock:  # a silent server
        conn = h11.Connection(h11.CLIENT)
        for piece in send_message(conn, head, body):
            sock.sendall(piece)  # a view of at most 1 MiB of the caller's array

        response = _next_event(sock, conn)
        if type(response) is not h11.Response:
            raise binproto.RemoteProtocolError(f"expected a response, got {response!r}")
        if response.status_code != 200:
            data = b""
            while type(event := _next_event(sock, conn)) is h11.Data:
                data += event.data
            raise error_message(response.status_code, data)

        parser = parser_for(response)  # header length, Content-Length, Content-Encoding
        assembler = binproto.TensorAssembler()
        chunks = 0
        while parser.state is not binproto.ParserState.DONE:
            event = _next_event(sock, conn)
            if type(event) not in (h11.Data, h11.EndOfMessage):
                raise binproto.RemoteProtocolError("the connection closed in the body")
            for ev in receive_events(parser, event):
                chunks += type(ev) is binproto.TensorChunk
                assembler.feed(ev)
    return Result(outputs=assembler.tensors, chunks=chunks, body_bytes=parser.bytes_parsed)


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: echo one FP32 tensor through a server's ``echo`` model."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", default="echo")
    parser.add_argument("--elements", type=int, default=1 << 20, help="FP32 elements to send")
    args = parser.parse_args(argv)

    x = np.arange(args.elements, dtype=np.float32)
    start = time.perf_counter()
    result = infer(args.host, args.port, args.model, {"x": x})
    seconds = time.perf_counter() - start
    same = np.array_equal(result.outputs["x"], x)
    print(
        f"echoed {x.nbytes} bytes in {seconds:.3f} s: {result.chunks} chunks,"
        f" {result.body_bytes} body bytes, {'identical' if same else 'DIFFERENT'}"
    )


if __name__ == "__main__":
    main()
