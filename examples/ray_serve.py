"""binproto's V2 server on Ray Serve: V2App as a deployment with replicas.

Run it (Ray Serve listens on 127.0.0.1:8000)::

    pip install "ray[serve]"
    python examples/ray_serve.py --replicas 2

Ray's HTTP proxy passes every ASGI message between processes, pickled:
``V2App(views=False)`` sends bodies as ``bytes`` (a view cannot be
pickled), and each body is copied on its way through the proxy. For big
tensors see examples/ray_ingress.py: decode at an ingress, pass the arrays to
the replicas through Ray's object store.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from binproto.adapters.asgi import V2App
from binproto.adapters.server import Model, echo_model


def deployment(models: list[Model], replicas: int = 2) -> Any:
    """A Ray Serve application serving ``models`` with V2App on ``replicas`` replicas."""
    from ray import serve

    class V2:
        """binproto's V2 routes, answered in a replica."""

    ingress: Any = serve.ingress(V2App(models, views=False))
    return serve.deployment(num_replicas=replicas)(ingress(V2)).bind()


def main(argv: list[str] | None = None) -> None:
    """Start Ray locally, deploy the echo model, and serve until Ctrl-C."""
    import ray
    from ray import serve

    parser = argparse.ArgumentParser(description="binproto's V2 server on Ray Serve")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    ray.init(include_dashboard=False)
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    serve.run(deployment([echo_model()], args.replicas), route_prefix="/")
    print(f"serving V2 on http://127.0.0.1:{args.port}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
