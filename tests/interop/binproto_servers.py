"""binproto's servers (the echo model, or Triton's identity models) for the
interop tests, which point real clients at them over 127.0.0.1. They run on
tests/servers.py's harness: each in a thread with its own event loop."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import binproto
from binproto.adapters._server import InferenceError, InferRequest, Model, V2Server
from tests.servers import BACKENDS, running

__all__ = ["BACKENDS", "identity_app", "running_binproto_server", "running_identity_server"]


@contextlib.contextmanager
def _served(backend: str, app: V2Server) -> Iterator[int]:
    """``app`` on ``backend`` (tests/servers.py's, or ``trio-streams``: trio
    without in-place receive); yields the port on 127.0.0.1."""
    if backend == "trio-streams":
        with running("trio", app, zero_copy=False) as server:
            yield server.port
    else:
        with running(backend, app) as server:
            yield server.port


@contextlib.contextmanager
def running_binproto_server(backend: str) -> Iterator[int]:
    """Serve binproto's echo model with ``backend``; yields the port on 127.0.0.1."""
    with _served(backend, V2Server()) as port:
        yield port


async def _identity(request: InferRequest) -> dict[str, binproto.Tensor]:
    """Triton's identity models, in binproto: INPUTn comes back as OUTPUTn."""
    tensors = await request.tensors()
    header = request.header
    available = {
        "OUTPUT" + name.removeprefix("INPUT"): name for name in tensors if name.startswith("INPUT")
    }
    wanted = header.requested_outputs
    names = [o.name for o in wanted] if wanted is not None else list(available)
    outputs = {}
    for out in names:
        if out not in available:
            raise InferenceError(
                f"unexpected inference output '{out}' for model '{request.model.name}'"
            )
        name = available[out]
        outputs[out] = binproto.Tensor(out, tensors[name], datatype=header.tensor(name).datatype)
    return outputs


def identity_app(model_names: Iterable[str]) -> V2Server:
    """binproto's reference server with Triton's identity models of these names."""
    return V2Server([Model(name, _identity) for name in model_names])


@contextlib.contextmanager
def running_identity_server(model_names: Iterable[str], backend: str = "asyncio") -> Iterator[int]:
    """Serve :func:`identity_app` with ``backend`` (one of :data:`BACKENDS`,
    ``trio-streams``: trio without in-place receive, or ``uvicorn``: the same
    models through V2App under uvicorn); yields the port on 127.0.0.1."""
    with _served(backend, identity_app(model_names)) as port:
        yield port
