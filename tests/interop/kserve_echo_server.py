"""A real ``kserve.ModelServer`` serving an echo model on an inherited loopback socket.

Run by the interop tests (and ``tests/fixtures/capture.py``) as a subprocess::

    python tests/interop/kserve_echo_server.py --fd N [--model echo]

``N`` is a listening TCP socket bound to 127.0.0.1 that the parent created and
passed down (``subprocess.Popen(pass_fds=...)``). The installed KServe hard-codes
``host="0.0.0.0"`` in its REST server's uvicorn config and has no option to
change it, so this script builds the ``ModelServer`` (model registry, data plane,
model repository extension), then runs KServe's own ``RESTServer`` (the same
FastAPI app and routes ``ModelServer.start`` would run) on the loopback socket
through its public ``run(sockets=...)`` parameter. gRPC is not started.

The echo model returns each input as the output of the same name, datatype and
shape, and hands the request's output policy (``binary_data_output`` and the
requested outputs) to KServe's ``InferResponse`` unchanged, so what comes back
is KServe's own encoding decision.
"""

from __future__ import annotations

import argparse
import socket
from typing import Any

import kserve
from kserve.constants.constants import FASTAPI_APP_IMPORT_STRING
from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse
from kserve.protocol.rest.server import RESTServer
from kserve.utils.utils import generate_uuid


class EchoModel(kserve.Model):  # type: ignore[misc]
    """Each input comes back as the output of the same name."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.ready = True

    async def predict(
        self,
        payload: InferRequest,
        headers: dict[str, str] | None = None,
        response_headers: dict[str, str] | None = None,
    ) -> InferResponse:
        outputs = [
            InferOutput(
                name=tensor.name,
                shape=list(tensor.shape),
                datatype=tensor.datatype,
                data=tensor.as_numpy(),
            )
            for tensor in payload.inputs
        ]
        # KServe's REST response model requires a string id; echo the request's.
        return InferResponse(
            response_id=payload.id if payload.id is not None else generate_uuid(),
            model_name=self.name,
            infer_outputs=outputs,
            use_binary_outputs=payload.use_binary_outputs,
            requested_outputs=payload.request_outputs,
        )


def main(argv: list[str] | None = None) -> None:
    """Serve the echo model on the inherited socket until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fd", type=int, required=True, help="listening socket to serve on")
    parser.add_argument("--model", default="echo", help="model name")
    args, _ = parser.parse_known_args(argv)
    sock = socket.socket(fileno=args.fd)
    host, port = sock.getsockname()[:2]
    if host != "127.0.0.1":
        raise SystemExit(f"refusing to serve on {host}: only 127.0.0.1 is allowed")

    server: Any = kserve.ModelServer(
        http_port=port, enable_grpc=False, enable_latency_logging=False, grace_period=1
    )
    server.register_model(EchoModel(args.model))
    rest = RESTServer(
        FASTAPI_APP_IMPORT_STRING,
        server.dataplane,
        server.model_repository_extension,
        port,
        grace_period=1,
        event_loop="asyncio",
    )
    rest.run(sockets=[sock])


if __name__ == "__main__":
    main()
