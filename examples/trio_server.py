"""A V2 inference server on trio with a custom model that sums its inputs.

Run it::

    pip install -e ".[trio]"
    python examples/trio_server.py --port 8000     # serves 127.0.0.1:8000
    python examples/trio_server.py --demo          # serve on a free port, call it once, exit

The ``sum`` model adds its inputs element by element (every input must have
the same shape and a numeric or boolean datatype) and returns one output,
``sum``. Request tensors are received straight into their arrays (trio's
``recv_into``); the response follows the request's output policy
(``binary_data_output``, each output's ``binary_data``). Any V2 client can call
it, e.g. tritonclient::

    client = tritonclient.http.InferenceServerClient("127.0.0.1:8000")
    a = tritonclient.http.InferInput("a", [3], "FP32")
    a.set_data_from_numpy(np.ones(3, dtype=np.float32))
    client.infer("sum", [a, ...]).as_numpy("sum")
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import trio

from binproto.adapters import trio as binproto_trio
from binproto.adapters._server import InferenceError, InferRequest, Model, V2Server


async def add(request: InferRequest) -> Mapping[str, Any]:
    """The ``sum`` model: the element-wise sum of every input."""
    tensors = await request.tensors()
    if not tensors:
        raise InferenceError("the sum model needs at least one input")
    arrays = list(tensors.values())
    shapes = {a.shape for a in arrays}
    if len(shapes) != 1:
        raise InferenceError(f"every input must have the same shape, got {sorted(shapes)}")
    if any(a.dtype.kind not in "biuf" for a in arrays):
        raise InferenceError("the sum model adds numbers: BYTES inputs are not accepted")
    total = np.zeros(arrays[0].shape, dtype=np.result_type(*arrays))
    for a in arrays:
        total += a
    return {"sum": total}


def make_server() -> V2Server:
    """A server with the ``sum`` model."""
    return V2Server(models=[Model(name="sum", handler=add)])


async def demo() -> dict[str, np.ndarray[Any, Any]]:
    """Serve on a free port, send one request with binproto's trio client, stop."""
    async with trio.open_nursery() as nursery:
        port = await nursery.start(binproto_trio.serve, make_server())
        async with binproto_trio.Client("127.0.0.1", port) as client:
            outputs = await client.infer(
                "sum",
                {
                    "a": np.arange(4, dtype=np.float32),
                    "b": np.full(4, 0.5, dtype=np.float32),
                },
                binary_data_output=True,
            )
        nursery.cancel_scope.cancel()
    return outputs


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: serve, or ``--demo`` for one call against a throwaway server."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    parser.add_argument("--demo", action="store_true", help="call the server once and exit")
    args = parser.parse_args(argv)
    if args.demo:
        print("sum:", trio.run(demo)["sum"])
        return

    def ready(port: int) -> None:
        print(f"serving the sum model on http://{args.host}:{port}", flush=True)

    serve = functools.partial(binproto_trio.serve, make_server(), args.host, args.port, ready=ready)
    try:
        trio.run(serve)
    except BaseException as exc:
        # Ctrl-C: trio may hand the KeyboardInterrupt on inside an exception group.
        if not interrupted(exc):
            raise


def interrupted(exc: BaseException) -> bool:
    """True for a KeyboardInterrupt, or an exception group holding only those."""
    if isinstance(exc, KeyboardInterrupt):
        return True
    inner: Sequence[BaseException] = getattr(exc, "exceptions", ())
    return bool(inner) and all(interrupted(e) for e in inner)


if __name__ == "__main__":
    main()
