"""Run binproto's asyncio or trio reference server (echo model) in a thread.

The interop tests point real clients (tritonclient's sync and aio clients) at
it over 127.0.0.1. Each backend runs its own event loop in a daemon thread; the
context manager stops it and joins the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import binproto
from binproto.adapters._server import InferenceError, InferRequest, Model, V2Server

#: The server flavours: asyncio with in-place receive (BufferedProtocol),
#: asyncio streams, and trio (recv_into).
BACKENDS = ("asyncio", "asyncio-streams", "trio")
HOST = "127.0.0.1"


@contextlib.contextmanager
def _asyncio_server(zero_copy: bool, app: V2Server | None = None) -> Iterator[int]:
    from binproto.adapters import asyncio as adapter

    started = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        server = await adapter.start_server(app, host=HOST, port=0, zero_copy=zero_copy)
        box["port"] = server.sockets[0].getsockname()[1]
        box["stop"] = stop = asyncio.Event()
        box["loop"] = asyncio.get_running_loop()
        started.set()
        async with server:
            await stop.wait()

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:  # report start-up failures to the caller
            box["error"] = exc
            started.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    started.wait(30)
    if "port" not in box:
        raise RuntimeError(f"the asyncio server did not start: {box.get('error')!r}")
    try:
        yield box["port"]
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(10)


@contextlib.contextmanager
def _trio_server(zero_copy: bool = True, app: V2Server | None = None) -> Iterator[int]:
    import trio

    from binproto.adapters import trio as adapter

    started = threading.Event()
    box: dict[str, Any] = {}

    async def serve(task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        await adapter.serve(app, zero_copy=zero_copy, task_status=task_status)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            box["port"] = await nursery.start(serve)
            box["cancel"] = nursery.cancel_scope.cancel
            box["token"] = trio.lowlevel.current_trio_token()
            started.set()

    def run() -> None:
        try:
            trio.run(main)
        except BaseException as exc:
            box["error"] = exc
            started.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    started.wait(30)
    if "port" not in box:
        raise RuntimeError(f"the trio server did not start: {box.get('error')!r}")
    try:
        yield box["port"]
    finally:
        trio.from_thread.run_sync(box["cancel"], trio_token=box["token"])
        thread.join(10)


@contextlib.contextmanager
def running_binproto_server(backend: str) -> Iterator[int]:
    """Serve binproto's echo model with ``backend``; yields the port on 127.0.0.1."""
    if backend == "trio":
        with _trio_server() as port:
            yield port
    else:
        with _asyncio_server(zero_copy=backend == "asyncio") as port:
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
    app = identity_app(model_names)
    if backend == "uvicorn":  # V2App under a real uvicorn, with the same models
        from tests.servers import Running

        running = Running("uvicorn", app)
        try:
            yield running.port
        finally:
            running.close()
        return
    server = (
        _trio_server(zero_copy=backend == "trio", app=app)
        if backend.startswith("trio")
        else _asyncio_server(zero_copy=backend == "asyncio", app=app)
    )
    with server as port:
        yield port
