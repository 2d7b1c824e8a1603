"""Big tensors on Ray Serve: decode at the ingress, pass arrays through Ray's object store.

Ray Serve's HTTP proxy copies every request and response body between
processes. Here the HTTP front is ``V2App`` under uvicorn instead: binproto
decodes each body into numpy arrays, and a Ray deployment handle passes them
to the model's replicas. Ray puts big arrays in its shared-memory object
store, and a replica reads them there without a copy.

Run it (the V2 routes on 127.0.0.1:8000, the model on 2 Ray replicas)::

    pip install "ray[serve]" uvicorn
    python examples/ray_ingress.py --replicas 2
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

import binproto
from binproto.adapters.server import InferRequest, Model

Arrays = dict[str, np.ndarray[Any, Any]]


class Echo:
    """The model, in a Ray replica: it gets numpy arrays and returns numpy arrays.

    Arrays from the object store are read-only views of shared memory.
    """

    def __call__(self, arrays: Arrays) -> Arrays:
        return arrays


def model_deployment(replicas: int = 2) -> Any:
    """The model as a Ray Serve application with no HTTP route of its own."""
    from ray import serve

    return serve.deployment(num_replicas=replicas)(Echo).bind()


def ingress_models(handle: Any, name: str = "echo") -> list[Model]:
    """A V2 model named ``name`` whose requests go to the Ray deployment ``handle``."""

    async def infer(request: InferRequest) -> dict[str, Any]:
        arrays = await request.tensors()  # decoded here, by binproto
        outputs: Arrays = await handle.remote(arrays)  # through Ray's object store
        # numpy has no bfloat16: keep the datatype of the input of the same name.
        inputs = {t.name: t.datatype for t in request.header.tensors}
        return {
            n: binproto.Tensor(n, a, datatype=inputs[n]) if n in inputs else a
            for n, a in outputs.items()
        }

    return [Model(name, infer)]


def main(argv: list[str] | None = None) -> None:
    """Start Ray locally, deploy the model, and serve V2 with uvicorn until Ctrl-C."""
    import ray
    import uvicorn
    from ray import serve

    from binproto.adapters.asgi import V2App

    parser = argparse.ArgumentParser(description="a V2 ingress in front of Ray replicas")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    ray.init(include_dashboard=False)
    handle = serve.run(model_deployment(args.replicas), name="models", route_prefix=None)
    try:
        uvicorn.run(V2App(ingress_models(handle)), host="127.0.0.1", port=args.port)
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
