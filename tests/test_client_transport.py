"""The asyncio client's connections: a request cancelled while its answer
is awaited."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from binproto.adapters._server import Timeouts
from binproto.adapters.asyncio import (
    Client,
    InferRequest,
    Model,
    V2Server,
    close_server,
    echo_model,
    start_server,
)


def _run(main: Any) -> Any:
    return asyncio.run(main())


class _Counting(V2Server):
    """A server counting the connections it serves."""

    connections = 0

    async def serve_connection(self, stream: Any, timeouts: Timeouts | None = None) -> None:
        self.connections += 1
        await super().serve_connection(stream, timeouts)


def test_a_request_cancelled_while_its_answer_is_awaited_gives_its_connection_back() -> None:
    # With one connection allowed, a request cancelled while the model runs
    # must not keep the connection: it is closed (half-way through an
    # exchange), and the next request opens another.
    started = asyncio.Event()

    async def slow(request: InferRequest) -> Any:
        started.set()
        await asyncio.sleep(30)
        return await request.tensors()

    server = _Counting(models=[Model("slow", slow), echo_model()])
    x = np.arange(6, dtype=np.float32)

    async def main() -> None:
        srv = await start_server(server, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        try:
            async with Client("127.0.0.1", port, timeout=10, max_connections=1) as c:
                task = asyncio.create_task(c.infer("slow", {"x": x}))
                await asyncio.wait_for(started.wait(), 10)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                assert c.open_connections == 0
                out = await asyncio.wait_for(c.infer("echo", {"x": x}), 10)
                assert np.array_equal(out["x"], x)
                assert c.open_connections == 1
        finally:
            await close_server(srv)

    _run(main)
    assert server.connections == 2
