"""The asyncio and trio servers and clients compress bodies in worker
threads: the event loop keeps serving other connections (and running other
tasks) while a large response or request is compressed."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pytest
import trio

import binproto
from binproto.adapters import asyncio as aio_adapter
from binproto.adapters import trio as trio_adapter

from .fakes import MemoryStream

# A response of four 1 MiB pieces, each compressed slowly on purpose.
X = np.arange(1 << 20, dtype=np.float32)
PIECE_DELAY = 0.25


class SlowCompression:
    """Wraps binproto.compress_buffers: records the thread of every step and
    sleeps in it, as a large, slow compression would."""

    def __init__(self) -> None:
        self.threads: list[int] = []
        self.real = binproto.compress_buffers

    def __call__(self, buffers: Iterable[Any], encoding: str, **kw: Any) -> Iterator[bytes]:
        for piece in self.real(buffers, encoding, **kw):
            self.threads.append(threading.get_ident())
            time.sleep(PIECE_DELAY)
            yield piece


@pytest.fixture
def slow(monkeypatch: pytest.MonkeyPatch) -> SlowCompression:
    wrapper = SlowCompression()
    monkeypatch.setattr(binproto, "compress_buffers", wrapper)
    return wrapper


def _check(slow: SlowCompression, loop_thread: int, out: dict[str, Any], waited: float) -> None:
    np.testing.assert_array_equal(out["x"], X)
    assert len(slow.threads) >= 4
    assert loop_thread not in slow.threads  # every step ran off the event loop
    # Answered while the compressed response was still being produced.
    assert waited < PIECE_DELAY * len(slow.threads) / 2


@pytest.mark.parametrize("zero_copy", [True, False], ids=["zero_copy", "streams"])
def test_asyncio_server_compresses_off_the_loop(slow: SlowCompression, zero_copy: bool) -> None:
    import asyncio

    async def main() -> tuple[int, dict[str, Any], float]:
        srv = await aio_adapter.start_server(port=0, zero_copy=zero_copy)
        port = srv.sockets[0].getsockname()[1]
        try:
            async with (
                aio_adapter.Client("127.0.0.1", port, accept_encoding="gzip") as big,
                aio_adapter.Client("127.0.0.1", port) as small,
            ):
                task = asyncio.ensure_future(big.infer("echo", {"x": X}, binary_data_output=True))
                while not slow.threads:  # compression has started
                    await asyncio.sleep(0.01)
                start = time.perf_counter()
                status, _ = await small.get("/v2/health/live")
                waited = time.perf_counter() - start
                assert status == 200
                return threading.get_ident(), await task, waited
        finally:
            srv.close()
            await srv.wait_closed()

    loop_thread, out, waited = asyncio.run(main())
    _check(slow, loop_thread, out, waited)


def test_trio_server_compresses_off_the_loop(slow: SlowCompression) -> None:
    async def main() -> tuple[int, dict[str, Any], float]:
        result: dict[str, Any] = {}
        async with trio.open_nursery() as nursery:
            port = await nursery.start(trio_adapter.serve, None, "127.0.0.1", 0)

            async def big() -> None:
                async with trio_adapter.Client("127.0.0.1", port, accept_encoding="gzip") as c:
                    result["out"] = await c.infer("echo", {"x": X}, binary_data_output=True)

            nursery.start_soon(big)
            while not slow.threads:
                await trio.sleep(0.01)
            async with trio_adapter.Client("127.0.0.1", port) as small:
                start = time.perf_counter()
                status, _ = await small.get("/v2/health/live")
                waited = time.perf_counter() - start
            assert status == 200
            while "out" not in result:
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
        return threading.get_ident(), result["out"], waited

    loop_thread, out, waited = trio.run(main)
    _check(slow, loop_thread, out, waited)


@pytest.mark.parametrize("zero_copy", [True, False], ids=["socket", "streams"])
def test_asyncio_client_compresses_requests_off_the_loop(
    slow: SlowCompression, zero_copy: bool
) -> None:
    import asyncio

    async def main() -> tuple[int, dict[str, Any], int]:
        srv = await aio_adapter.start_server(port=0)
        port = srv.sockets[0].getsockname()[1]
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        tick = asyncio.ensure_future(ticker())
        try:
            async with aio_adapter.Client(
                "127.0.0.1", port, zero_copy=zero_copy, request_encoding="gzip"
            ) as c:
                out = await c.infer("echo", {"x": X}, binary_data_output=True)
        finally:
            tick.cancel()
            srv.close()
            await srv.wait_closed()
        return threading.get_ident(), out, ticks

    loop_thread, out, ticks = asyncio.run(main())
    np.testing.assert_array_equal(out["x"], X)
    assert len(slow.threads) >= 4 and loop_thread not in slow.threads
    # The loop kept running other tasks while the request was compressed.
    assert ticks >= len(slow.threads) * PIECE_DELAY / 0.01 / 4


def test_trio_client_compresses_requests_off_the_loop(slow: SlowCompression) -> None:
    async def main() -> tuple[int, dict[str, Any], int]:
        ticks = 0
        async with trio.open_nursery() as nursery:
            port = await nursery.start(trio_adapter.serve, None, "127.0.0.1", 0)

            async def ticker() -> None:
                nonlocal ticks
                while True:
                    await trio.sleep(0.01)
                    ticks += 1

            nursery.start_soon(ticker)
            async with trio_adapter.Client("127.0.0.1", port, request_encoding="gzip") as c:
                out = await c.infer("echo", {"x": X}, binary_data_output=True)
            nursery.cancel_scope.cancel()
        return threading.get_ident(), out, ticks

    loop_thread, out, ticks = trio.run(main)
    np.testing.assert_array_equal(out["x"], X)
    assert len(slow.threads) >= 4 and loop_thread not in slow.threads
    assert ticks >= len(slow.threads) * PIECE_DELAY / 0.01 / 4


# -- decompression yields to other tasks ------------------------------------------


class OneRead(MemoryStream):
    """A stream whose whole body arrives in one read, as a fast peer's can,
    and that lets other tasks run at a checkpoint."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data, sending=False)

    async def checkpoint(self) -> None:
        import asyncio

        await asyncio.sleep(0)


@pytest.mark.parametrize("how", ["events", "tensors"])
def test_a_compressed_body_from_one_read_lets_other_tasks_run(how: str) -> None:
    import asyncio
    import gzip

    import h11

    from binproto.adapters._server import YIELD_BYTES, BodyReader, MessageBody

    x = np.zeros(8 * YIELD_BYTES, dtype=np.uint8)  # 8 MiB: ~8 KiB of gzip
    plain = binproto.encode_request({"x": x})
    wire = gzip.compress(bytes(plain))
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\n"
        + f"Content-Length: {len(wire)}\r\n\r\n".encode()
    )
    assert isinstance(conn.next_event(), h11.Request)

    async def main() -> list[int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        claims = binproto.BodyClaims(len(wire), "gzip", plain.header_length)
        body = MessageBody(
            "request", claims, BodyReader(OneRead(wire), conn, len(wire), receive_in_place=False)
        )
        task = asyncio.ensure_future(ticker())
        await asyncio.sleep(0)
        seen: list[int] = [ticks]
        if how == "events":
            async for event in body:
                if type(event) is binproto.TensorChunk:
                    seen.append(ticks)
        else:
            np.testing.assert_array_equal((await body.tensors())["x"], x)
            seen.append(ticks)
        task.cancel()
        return seen

    seen = asyncio.run(main())
    # The ticker ran about once a YIELD_BYTES of tensor bytes, though the
    # whole compressed body came from one read that never waited.
    assert seen[-1] - seen[0] >= 6, seen
