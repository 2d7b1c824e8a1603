"""A V2 inference server on asyncio with two custom models.

* ``scale`` multiplies every numeric input by the request parameter
  ``factor`` (default 2; one the input's datatype cannot hold is a 400) and
  returns it under the same name. It takes its inputs as numpy arrays
  (``await request.tensors()``), which binproto receives straight into the
  arrays' memory.
* ``crc32`` never holds a tensor: it reads the request body event by event as
  it arrives and returns, per binary input ``x``, a UINT32 output
  ``x_crc32`` with the CRC-32 of its bytes. Its memory stays O(chunk) however
  large the inputs are.

Run it::

    pip install -e ".[h11]"
    python examples/asyncio_server.py --port 8000    # serves 127.0.0.1:8000
    python examples/asyncio_server.py --demo         # serve on a free port, call it once, exit

Any V2 client can call it, e.g. binproto's own::

    async with binproto.adapters.asyncio.Client("127.0.0.1", 8000) as c:
        out = await c.infer("scale", {"x": x}, parameters={"factor": 3})
"""

from __future__ import annotations

import argparse
import asyncio
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from binproto import TensorChunk, TensorComplete
from binproto.adapters import asyncio as binproto_asyncio
from binproto.adapters.asyncio import InferenceError, InferRequest, Model, V2Server


async def scale(request: InferRequest) -> Mapping[str, Any]:
    """The ``scale`` model: each numeric input times the ``factor`` parameter,
    in the input's datatype (a factor it cannot hold is a 400)."""
    factor = request.header.parameters.get("factor", 2)
    if isinstance(factor, bool) or not isinstance(factor, (int, float)):
        raise InferenceError(f"parameter 'factor' must be a number, got {factor!r}")
    if isinstance(factor, float) and factor.is_integer():
        factor = int(factor)  # 2.0 scales integers too
    tensors = await request.tensors()
    outputs: dict[str, Any] = {}
    for name, array in tensors.items():
        if array.dtype.kind not in "iuf":
            raise InferenceError(f"input '{name}' is {array.dtype}: scale takes numbers")
        if array.dtype.kind in "iu":  # (1.5 would be cast to 1, -2 wrap around a UINT8)
            limits = np.iinfo(array.dtype)
            fits = isinstance(factor, int) and limits.min <= factor <= limits.max
        else:  # (1e6 would be inf as FP16)
            fits = abs(factor) <= float(np.finfo(array.dtype).max)  # (compared as Python floats)
        if not fits:
            raise InferenceError(f"factor {factor!r} is no {array.dtype} value (input '{name}')")
        outputs[name] = array * np.asarray(factor, dtype=array.dtype)
    return outputs


async def crc32(request: InferRequest) -> Mapping[str, Any]:
    """The ``crc32`` model: the CRC-32 of each binary input, chunk by chunk."""
    crcs: dict[str, int] = {}
    async for event in request.body:
        if type(event) is TensorChunk:
            # event.data is a view of the bytes just received: use it now.
            crcs[event.name] = zlib.crc32(event.data, crcs.get(event.name, 0))
        elif type(event) is TensorComplete and event.info.binary_size is not None:
            crcs.setdefault(event.name, 0)  # a zero-size tensor has no chunks
    return {f"{name}_crc32": np.array([crc], dtype=np.uint32) for name, crc in crcs.items()}


def make_server() -> V2Server:
    """A server with the ``scale`` and ``crc32`` models."""
    return V2Server(models=[Model(name="scale", handler=scale), Model(name="crc32", handler=crc32)])


async def demo() -> dict[str, np.ndarray[Any, Any]]:
    """Serve on a free port, call both models with binproto's asyncio client, stop."""
    server = await binproto_asyncio.start_server(make_server(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    async with server, binproto_asyncio.Client("127.0.0.1", port) as client:
        scaled = await client.infer(
            "scale", {"x": x}, parameters={"factor": 3}, binary_data_output=True
        )
        checked = await client.infer("crc32", {"x": x}, binary_data_output=True)
    return {**scaled, **checked}


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: serve, or ``--demo`` for one call against a throwaway server."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    parser.add_argument("--demo", action="store_true", help="call the server once and exit")
    args = parser.parse_args(argv)
    if args.demo:
        outputs = asyncio.run(demo())
        print("scale x:", outputs["x"].tolist())
        print("crc32 x:", int(outputs["x_crc32"][0]))
        return

    def ready(port: int) -> None:
        print(f"serving scale and crc32 on http://{args.host}:{port}", flush=True)

    try:
        asyncio.run(binproto_asyncio.serve(make_server(), args.host, args.port, ready=ready))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
