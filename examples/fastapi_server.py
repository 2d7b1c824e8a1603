"""A V2 inference server on FastAPI that speaks the binary tensor data extension.

Run it::

    pip install -e ".[asgi]" fastapi uvicorn
    python examples/fastapi_server.py --port 8000        # serves 127.0.0.1:8000

or ``uvicorn examples.fastapi_server:app``. binproto's V2 application
(:class:`binproto.adapters.asgi.V2App`) is mounted at the root: it serves

- ``POST /v2/models/{name}[/versions/{version}]/infer``: the request body is
  parsed as it arrives; the response streams the output arrays' own memory,
  unjoined, or compresses it a piece at a time when the request's
  ``Accept-Encoding`` allows it;
- ``GET /v2`` (server metadata, with ``"extensions": ["binary_tensor_data"]``),
  ``GET /v2/health/live``, ``GET /v2/health/ready``,
  ``GET /v2/models/{name}`` and ``GET /v2/models/{name}/ready``;

with the statuses and error bodies of binproto's own servers (Triton's
wording). Routes of your own go on ``app`` before the mount.

The built-in ``echo`` model returns each input as the output of the same name
(only the outputs the request lists, when it lists any). The ``ramp`` model
shows a streaming response: given ``n`` it produces ``0 .. n-1`` as FP32 a
piece at a time through a :class:`binproto.BodyWriter`, never holding the
whole output.
"""

from __future__ import annotations

import argparse
import socket
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from fastapi import FastAPI

import binproto
from binproto.adapters.asgi import V2App
from binproto.adapters.server import (
    InferenceError,
    InferRequest,
    Model,
    StreamingResponse,
    echo_model,
)

#: The most elements the ramp model produces (1 GiB of FP32).
MAX_RAMP = 1 << 28


async def ramp(request: InferRequest) -> StreamingResponse:
    """A streaming model: input ``n`` (one integer) gives output ``ramp``, the FP32
    values 0 .. n-1, produced and sent a piece at a time (always binary)."""
    inputs = await request.tensors()
    n_in = inputs.get("n")
    name = request.model.name
    if n_in is None or n_in.size != 1 or n_in.dtype.kind not in "iu":
        raise InferenceError(f"model '{name}' takes one integer input 'n'")
    n = int(n_in.reshape(-1)[0])
    if not 0 <= n <= MAX_RAMP:
        raise InferenceError(f"'n' must be in [0, {MAX_RAMP}], got {n}")
    output = {
        "name": "ramp",
        "datatype": "FP32",
        "shape": [n],
        "parameters": {"binary_data_size": 4 * n},
    }
    response: dict[str, Any] = {"model_name": name, "outputs": [output]}
    if request.header.id is not None:
        response["id"] = request.header.id
    step = 1 << 18  # elements per piece: 1 MiB

    async def pieces() -> AsyncIterator[tuple[int, np.ndarray[Any, Any]]]:
        for start in range(0, n, step):
            yield 0, np.arange(start, min(n, start + step), dtype=np.float32)

    return StreamingResponse(binproto.BodyWriter(response), pieces())


MODELS = [echo_model(), Model("ramp", ramp)]

app = FastAPI(title="binproto example server")
app.mount("/", V2App(MODELS, name="binproto-fastapi"))


def main(argv: list[str] | None = None) -> None:
    """Serve the app with uvicorn on 127.0.0.1 (or on an inherited listening socket)."""
    import uvicorn

    parser = argparse.ArgumentParser(description="binproto FastAPI example server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--fd", type=int, help="serve on this inherited listening socket")
    args = parser.parse_args(argv)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning")
    server = uvicorn.Server(config)
    sockets = None if args.fd is None else [socket.socket(fileno=args.fd)]
    try:
        server.run(sockets=sockets)
    except KeyboardInterrupt:  # uvicorn shuts down on Ctrl-C, then raises it again
        pass


if __name__ == "__main__":
    main()
