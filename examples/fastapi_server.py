"""A V2 inference server on FastAPI that speaks the binary tensor data extension.

Run it::

    pip install -e ".[asgi]" fastapi uvicorn
    python examples/fastapi_server.py --port 8000        # serves 127.0.0.1:8000

or ``uvicorn examples.fastapi_server:app``. It serves:

- ``POST /v2/models/{name}[/versions/{version}]/infer``: the request body is
  parsed as it arrives (binary tensors are copied once, into their arrays);
  the response streams the output arrays' own memory, unjoined, or compresses
  it a piece at a time (gzip or deflate, by q-value) when the request's
  ``Accept-Encoding`` allows it.
- ``GET /v2`` (server metadata, with ``"extensions": ["binary_tensor_data"]``),
  ``GET /v2/health/live``, ``GET /v2/health/ready``,
  ``GET /v2/models/{name}`` and ``GET /v2/models/{name}/ready``.

Models are plain functions from the request's tensors to output tensors. The
built-in ``echo`` model returns each input as the output of the same name (only
the outputs the request lists, when it lists any); the response follows the
request's output policy (``binary_data_output`` and each output's
``binary_data``). The ``ramp`` model shows a streaming response: given ``n`` it
produces ``0 .. n-1`` as FP32 a piece at a time through a
:class:`binproto.BodyWriter`, never holding the whole output. Errors are V2
error bodies ``{"error": "..."}``.
"""

from __future__ import annotations

import argparse
import socket
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

import binproto
from binproto.adapters.asgi import EncodedResponse, WriterResponse, error_response, read_request

Tensors = dict[str, np.ndarray[Any, Any]]
#: A model: its name, the request header and the input tensors in; output
#: tensors out (arrays, or :class:`binproto.Tensor` to set a datatype).
Model = Callable[[str, binproto.InferenceHeader, Tensors], Mapping[str, Any]]


def echo(model: str, header: binproto.InferenceHeader, inputs: Tensors) -> Mapping[str, Any]:
    """Each input comes back as the output of the same name and datatype (the same array)."""
    wanted = header.requested_outputs
    names = [o.name for o in wanted] if wanted is not None else list(inputs)
    outputs: dict[str, binproto.Tensor] = {}
    for name in names:
        if name not in inputs:
            raise binproto.RemoteProtocolError(
                f"unexpected inference output '{name}' for model '{model}'"
            )
        datatype = header.tensor(name).datatype
        outputs[name] = binproto.Tensor(name, inputs[name], datatype=datatype)
    return outputs


#: The most elements the ramp model produces (1 GiB of FP32).
MAX_RAMP = 1 << 28


def ramp(model: str, header: binproto.InferenceHeader, inputs: Tensors) -> WriterResponse:
    """A streaming model: input ``n`` (one integer) gives output ``ramp``, the FP32
    values 0 .. n-1, produced and sent a piece at a time (always binary)."""
    n_in = inputs.get("n")
    if n_in is None or n_in.size != 1 or n_in.dtype.kind not in "iu":
        raise binproto.RemoteProtocolError(f"model '{model}' takes one integer input 'n'")
    n = int(n_in.reshape(-1)[0])
    if not 0 <= n <= MAX_RAMP:
        raise binproto.RemoteProtocolError(f"'n' must be in [0, {MAX_RAMP}], got {n}")
    output = {
        "name": "ramp",
        "datatype": "FP32",
        "shape": [n],
        "parameters": {"binary_data_size": 4 * n},
    }
    response: dict[str, Any] = {"model_name": model, "outputs": [output]}
    if header.id is not None:
        response["id"] = header.id
    step = 1 << 18  # elements per piece: 1 MiB

    def pieces() -> Iterator[tuple[int, np.ndarray[Any, Any]]]:
        for start in range(0, n, step):
            yield 0, np.arange(start, min(n, start + step), dtype=np.float32)

    return WriterResponse(binproto.BodyWriter(response), pieces())


MODELS: dict[str, Model] = {"echo": echo}
#: Models that answer with a response they stream themselves.
STREAMING_MODELS: dict[str, Callable[[str, binproto.InferenceHeader, Tensors], Response]] = {
    "ramp": ramp
}

app = FastAPI(title="binproto example server")


def _known(name: str) -> bool:
    return name in MODELS or name in STREAMING_MODELS


def _unknown_model(name: str) -> Response:
    return error_response(f"Request for unknown model: '{name}' is not found", 404)


@app.get("/v2")
async def server_metadata() -> dict[str, Any]:
    """Server metadata: this server implements the binary tensor data extension."""
    return {
        "name": "binproto-fastapi",
        "version": binproto.__version__,
        "extensions": ["binary_tensor_data"],
    }


@app.get("/v2/health/live")
async def live() -> Response:
    """Liveness: 200 while the server runs."""
    return Response(status_code=200)


@app.get("/v2/health/ready")
async def ready() -> Response:
    """Readiness: 200 once every model is loaded (they are built in)."""
    return Response(status_code=200)


@app.get("/v2/models/{name}/ready")
@app.get("/v2/models/{name}/versions/{version}/ready")
async def model_ready(name: str, version: str | None = None) -> Response:
    """Model readiness: 200 for a known model, else 404."""
    return Response(status_code=200) if _known(name) else _unknown_model(name)


@app.get("/v2/models/{name}")
@app.get("/v2/models/{name}/versions/{version}")
async def model_metadata(name: str, version: str | None = None) -> Response:
    """Model metadata (the echo model takes any tensors: no fixed inputs)."""
    if not _known(name):
        return _unknown_model(name)
    return JSONResponse(
        {"name": name, "versions": ["1"], "platform": "python", "inputs": [], "outputs": []}
    )


@app.post("/v2/models/{name}/infer")
@app.post("/v2/models/{name}/versions/{version}/infer")
async def infer(name: str, request: Request, version: str | None = None) -> Response:
    """Run model ``name`` on the request's tensors; answer with the output policy applied."""
    if not _known(name):
        return _unknown_model(name)
    try:
        decoded = await read_request(request.scope, request.stream())
        if decoded.shared_memory:
            raise binproto.RemoteProtocolError(
                f"shared memory inputs are not supported: {list(decoded.shared_memory)}"
            )
        streaming = STREAMING_MODELS.get(name)
        if streaming is not None:
            return streaming(name, decoded.header, decoded.tensors)
        outputs = MODELS[name](name, decoded.header, decoded.tensors)
        body = binproto.encode_response(
            outputs,
            model_name=name,
            model_version=version,
            id=decoded.header.id,
            request=decoded.header,
        )
    except binproto.ProtocolError as exc:
        return error_response(exc)
    # Compress (gzip or deflate, by q-value) when the client accepts it.
    accept = ", ".join(request.headers.getlist("accept-encoding"))
    return EncodedResponse(body, encoding=binproto.preferred_encoding(accept))


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
