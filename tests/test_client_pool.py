"""What a client user expects of the asyncio, trio and httpx clients: binary
outputs by default, a shared pool of connections, retries that send the same
buffers again, and parsed health and metadata answers."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from typing import Any

import httpx
import numpy as np
import pytest
import trio

import binproto
from binproto import LocalProtocolError, RemoteProtocolError
from binproto.adapters import httpx as bphttpx
from binproto.adapters import trio as bt
from binproto.adapters._client import Retry, retry_after
from binproto.adapters._server import Timeouts, V2Server
from binproto.adapters.asyncio import Client, close_server, start_server
from binproto.adapters.h11 import HTTPError

from .fakes import ScriptedServer, ok_answer, tls_contexts
from .servers import running, serving_here

X = np.arange(6, dtype=np.float32)
BIG = np.arange(16 << 20, dtype=np.float32)  # 64 MiB


class _Counting(V2Server):
    """The echo server, counting the connections it serves and the most open at once."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.connections = 0
        self.open = 0
        self.most_open = 0

    async def serve_connection(self, stream: Any, timeouts: Timeouts | None = None) -> None:
        self.connections += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            await super().serve_connection(stream, timeouts)
        finally:
            self.open -= 1


# -- binary outputs by default -------------------------------------------------------


def test_asyncio_outputs_are_binary_by_default_and_json_when_asked() -> None:
    async def main() -> None:
        async with serving_here(V2Server()) as port, Client("127.0.0.1", port) as c:
            async with c.stream("echo", {"x": X}) as response:
                await response.tensors()
                assert response.header is not None
                assert response.header.tensor("x").binary_size == X.nbytes
            async with c.stream("echo", {"x": X}, binary_data_output=False) as response:
                out = await response.tensors()
                assert response.header is not None
                assert response.header.tensor("x").binary_size is None
            assert np.array_equal(out["x"], X)
            async with c.stream("echo", {"x": X}, outputs=["x"]) as response:
                await response.tensors()
                assert response.header is not None
                assert response.header.tensor("x").binary_size == X.nbytes

    asyncio.run(main())


def test_a_64_mib_echo_with_default_arguments_asyncio() -> None:
    async def main() -> None:
        async with serving_here(V2Server()) as port, Client("127.0.0.1", port) as c:
            out = await c.infer("echo", {"x": BIG})
        assert np.array_equal(out["x"], BIG)

    asyncio.run(main())


def test_a_64_mib_echo_with_default_arguments_trio() -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(bt.serve, V2Server(), "127.0.0.1", 0)
            async with bt.Client("127.0.0.1", port) as c:
                out = await c.infer("echo", {"x": BIG})
            assert np.array_equal(out["x"], BIG)
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_64_mib_echo_with_default_arguments_httpx() -> None:
    with running("asyncio", V2Server()) as served:
        port = served.port
        url = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=url, timeout=60) as client:
            result = bphttpx.infer(client, "echo", {"x": BIG}, outputs=["x"])
        assert np.array_equal(result.tensors["x"], BIG)
        assert result.header.tensor("x").binary_size == BIG.nbytes

        async def main() -> None:
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                result = await bphttpx.ainfer(client, "echo", {"x": BIG})
            assert np.array_equal(result.tensors["x"], BIG)

        asyncio.run(main())


# -- the pool --------------------------------------------------------------------------


def test_100_concurrent_infers_through_a_pool_of_4_open_at_most_4_connections() -> None:
    server = _Counting()

    async def main() -> None:
        async with (
            serving_here(server) as port,
            Client(f"http://127.0.0.1:{port}", max_connections=4) as c,
        ):
            xs = [X + i for i in range(100)]
            outs = await asyncio.gather(*(c.infer("echo", {"x": x}) for x in xs))
            assert all(np.array_equal(o["x"], x) for o, x in zip(outs, xs, strict=True))
            assert c.open_connections <= 4

    asyncio.run(main())
    assert 1 < server.connections <= 4
    assert server.most_open <= 4


def test_trio_100_concurrent_infers_through_a_pool_of_4() -> None:
    server = _Counting()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(bt.serve, server, "127.0.0.1", 0)
            async with bt.Client(f"http://127.0.0.1:{port}", max_connections=4) as c:
                got: dict[int, np.ndarray[Any, Any]] = {}

                async def one(i: int) -> None:
                    got[i] = (await c.infer("echo", {"x": X + i}))["x"]

                async with trio.open_nursery() as requests:
                    for i in range(100):
                        requests.start_soon(one, i)
                assert all(np.array_equal(got[i], X + i) for i in range(100))
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert 1 < server.connections <= 4
    assert server.most_open <= 4


def test_idle_connections_past_their_expiry_are_closed() -> None:
    now = [0.0]
    server = _Counting()

    async def main() -> None:
        async with serving_here(server) as port:
            c = Client("127.0.0.1", port, keepalive_expiry=5)
            c._clock = lambda: now[0]
            await c.infer("echo", {"x": X})
            (first,) = c._idle
            now[0] = 4.0
            await c.infer("echo", {"x": X})
            assert c._idle == [first]  # within its expiry: used again
            now[0] = 9.5
            await c.infer("echo", {"x": X})
            assert len(c._idle) == 1 and c._idle[0] is not first
            await c.aclose()

    asyncio.run(main())
    assert server.connections == 2


def test_a_base_url_with_a_path_prefixes_every_request() -> None:
    async def main(port: int) -> None:
        async with Client(f"http://127.0.0.1:{port}/triton/") as c:
            assert await c.server_live()

    with ScriptedServer([[ok_answer(), "close"]]) as fake:
        asyncio.run(main(fake.port))
    heads = fake.heads
    assert heads[0].startswith(b"GET /triton/v2/health/live HTTP/1.1\r\n")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("ftp://host",), "http:// or https://"),
        (("http://host:1", 2), "port in the URL"),
        (("http://host?q=1",), "no query"),
    ],
)
def test_bad_base_urls_are_refused(args: tuple[Any, ...], message: str) -> None:
    with pytest.raises(LocalProtocolError, match=message):
        Client(*args)


@contextmanager
def _trio_tls_server(ctx: Any) -> Iterator[int]:
    """binproto's server behind TLS (trio's), in a thread; yields its port."""
    box: dict[str, Any] = {}
    ready = threading.Event()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            handler = bt.connection_handler(V2Server())
            serve = partial(trio.serve_ssl_over_tcp, host="127.0.0.1")
            listeners = await nursery.start(serve, handler, 0, ctx)
            box["port"] = listeners[0].transport_listener.socket.getsockname()[1]
            box["stop"] = nursery.cancel_scope.cancel
            box["token"] = trio.lowlevel.current_trio_token()
            ready.set()

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
    thread.start()
    ready.wait(10)
    try:
        yield box["port"]
    finally:
        trio.from_thread.run_sync(box["stop"], trio_token=box["token"])
        thread.join(10)


def test_tls_through_an_ssl_context(tmp_path: Any) -> None:
    import ssl

    server_ctx, client_ctx = tls_contexts(tmp_path)

    with _trio_tls_server(server_ctx) as port:

        async def main() -> None:
            async with Client(f"https://127.0.0.1:{port}", ssl=client_ctx) as c:
                assert np.array_equal((await c.infer("echo", {"x": BIG[:1000]}))["x"], BIG[:1000])
                assert await c.server_ready()
            async with Client(f"https://127.0.0.1:{port}", retry=None) as c:
                with pytest.raises(ssl.SSLError):  # (a self-signed certificate)
                    await c.server_live()

        asyncio.run(main())

        async def trio_main() -> None:
            async with bt.Client("127.0.0.1", port, ssl=client_ctx) as c:
                assert np.array_equal((await c.infer("echo", {"x": X}))["x"], X)

        trio.run(trio_main)


# -- retries -----------------------------------------------------------------------------


def _ok() -> bytes:
    body = binproto.encode_response({"x": X}, model_name="m")
    head = "HTTP/1.1 200 OK\r\n" + "".join(f"{k}: {v}\r\n" for k, v in body.headers)
    return head.encode() + b"\r\n" + bytes(body)


@asynccontextmanager
async def _scripted(script: list[Any]) -> AsyncIterator[tuple[int, list[bytes]]]:
    """A server answering its requests, in order, as ``script`` says: "reset"
    (a TCP reset, no answer), bytes (sent as they are), then 200 with ``X``.
    Yields its port and the request bodies it read."""
    with ScriptedServer(script, otherwise=_ok()) as fake:
        yield fake.port, fake.bodies


class _Recorder:
    """Wraps a client's streams: what each send_all was given, and the
    waits the client asked for."""

    def __init__(self, client: Any) -> None:
        self.sent: list[list[Any]] = []
        self.waits: list[float] = []
        opening = client._open_stream

        async def open_stream() -> Any:
            stream = await opening()
            send_all = stream.send_all

            async def recording(buffers: Any) -> None:
                self.sent.append(list(buffers))
                await send_all(buffers)

            stream.send_all = recording
            return stream

        async def sleep(seconds: float) -> None:
            self.waits.append(seconds)

        client._open_stream = open_stream
        client._lib = type("Lib", (), {"sleep": staticmethod(sleep), "event": asyncio.Event})()

    def exporters(self, attempt: int) -> list[Any]:
        """The objects whose memory attempt ``attempt`` sent after its HTTP
        head (the object itself, or what a view is of)."""
        return [b.obj if isinstance(b, memoryview) else b for b in self.sent[attempt][1:]]


_BUSY = b"HTTP/1.1 503 Busy\r\nRetry-After: 1\r\nContent-Length: 4\r\n\r\nbusy"


@pytest.mark.parametrize("zero_copy", [True, False])
@pytest.mark.parametrize("first", ["reset", "503"])
def test_a_retry_sends_the_same_buffers_again(
    zero_copy: bool, first: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    encoded: list[Any] = []
    encode = binproto.encode_request

    def counting(*args: Any, **kw: Any) -> Any:
        encoded.append(encode(*args, **kw))
        return encoded[-1]

    monkeypatch.setattr(binproto, "encode_request", counting)
    x = np.arange(1000, dtype=np.float32)

    async def main() -> None:
        async with _scripted(["reset" if first == "reset" else _BUSY]) as (port, bodies):
            async with Client("127.0.0.1", port, zero_copy=zero_copy) as c:
                record = _Recorder(c)
                out = await c.infer("m", {"x": x})
        assert np.array_equal(out["x"], X)
        assert len(bodies) == 2 and bodies[0] == bodies[1]
        assert len(encoded) == 1  # encoded once
        (body,) = encoded
        assert len(record.sent) == 2
        again, once = record.exporters(1), record.exporters(0)
        assert len(again) == len(once) and all(a is b for a, b in zip(again, once, strict=True))
        assert any(o is x for o in once) and any(o is body.json for o in once)
        if first == "503":
            assert record.waits == [1.0]  # what Retry-After said
        else:
            assert len(record.waits) == 1 and 0 <= record.waits[0] <= Retry().backoff

    asyncio.run(main())


def test_a_retry_after_past_its_cap_waits_the_cap() -> None:
    busy = b"HTTP/1.1 429 Slow down\r\nRetry-After: 3600\r\nContent-Length: 0\r\n\r\n"

    async def main() -> None:
        async with _scripted([busy]) as (port, bodies):
            async with Client("127.0.0.1", port, retry=Retry(max_retry_after=2)) as c:
                record = _Recorder(c)
                assert np.array_equal((await c.infer("m", {"x": X}))["x"], X)
        assert record.waits == [2] and len(bodies) == 2

    asyncio.run(main())


@pytest.mark.parametrize("status", [400, 404, 500, 502])
def test_other_error_statuses_are_never_retried(status: int) -> None:
    answer = b'HTTP/1.1 %d No\r\nContent-Length: 16\r\n\r\n{"error": "no!"}' % status

    async def main() -> None:
        async with _scripted([answer] * 5) as (port, bodies):
            async with Client("127.0.0.1", port) as c:
                record = _Recorder(c)
                with pytest.raises(HTTPError) as info:
                    await c.infer("m", {"x": X})
        assert info.value.status == status and info.value.message == "no!"
        assert len(bodies) == 1 and record.waits == []

    asyncio.run(main())


def test_retries_are_bounded_by_attempts_and_total_time() -> None:
    async def main() -> None:
        async with _scripted([_BUSY] * 10) as (port, bodies):
            async with Client("127.0.0.1", port, retry=Retry(attempts=4)) as c:
                record = _Recorder(c)
                with pytest.raises(HTTPError) as info:
                    await c.infer("m", {"x": X})
            assert info.value.status == 503 and len(bodies) == 4 and record.waits == [1.0] * 3
            async with Client("127.0.0.1", port, retry=Retry(total=2.5)) as c:
                record = _Recorder(c)
                with pytest.raises(HTTPError):
                    await c.infer("m", {"x": X})
            # (a clock that does not move: 1 s + 1 s, and a third would end past 2.5 s)
            assert record.waits == [1.0, 1.0] and len(bodies) == 4 + 3
            async with _scripted(["reset"] * 10) as (port, bodies):
                async with Client("127.0.0.1", port, retry=None) as c:
                    with pytest.raises(RemoteProtocolError):
                        await c.infer("m", {"x": X})
                assert len(bodies) == 1

    asyncio.run(main())


def test_a_trio_client_retries_a_connection_reset_before_any_answer() -> None:
    script: list[Any] = ["reset"]

    async def main() -> None:
        async with _scripted(script) as (port, bodies):
            await asyncio.to_thread(trio.run, trio_main, port)
        assert len(bodies) == 2 and bodies[0] == bodies[1]

    async def trio_main(port: int) -> None:
        async with bt.Client("127.0.0.1", port) as c:
            assert np.array_equal((await c.infer("m", {"x": X}))["x"], X)

    asyncio.run(main())


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("1", 1.0), (" 120 ", 120.0), ("Wed, 21 Oct 2015 07:28:10 GMT", 10.0), ("soon", None)],
)
def test_retry_after_values(value: str, seconds: float | None) -> None:
    now = 1445412480.0  # 07:28:00 GMT that day
    assert retry_after(value, now) == seconds


def test_bad_retry_settings_are_refused() -> None:
    with pytest.raises(LocalProtocolError, match="attempts"):
        Retry(attempts=0)
    with pytest.raises(LocalProtocolError, match="total"):
        Retry(total=-1)


# -- health, metadata, and the check of inputs ---------------------------------------------


def _typed_server() -> _Counting:
    """An echo model that declares its input: FP32 [-1, 3]."""
    from binproto.adapters._server import Model, echo_model

    typed = Model(
        "typed",
        echo_model().handler,
        inputs=[{"name": "x", "datatype": "FP32", "shape": [-1, 3]}],
        outputs=[{"name": "x", "datatype": "FP32", "shape": [-1, 3]}],
    )
    return _Counting(models=[echo_model(), typed])


def test_health_and_metadata_helpers_return_parsed_objects() -> None:
    async def main() -> None:
        async with serving_here(_typed_server()) as port, Client(f"http://127.0.0.1:{port}") as c:
            assert await c.server_live() is True
            assert await c.server_ready() is True
            assert await c.model_ready("typed") is True
            assert await c.model_ready("nowhere") is False
            server = await c.server_metadata()
            assert server.version == binproto.__version__
            assert "binary_tensor_data" in server.extensions
            meta = await c.model_metadata("typed")
            assert meta.name == "typed" and meta.versions == ("1",)
            (spec,) = meta.inputs
            assert (spec.name, spec.datatype, spec.shape) == ("x", "FP32", (-1, 3))
            with pytest.raises(HTTPError) as info:
                await c.model_metadata("nowhere")
            assert info.value.status == 404
            await c.wait_until_ready(5, model="typed")

    asyncio.run(main())


@pytest.mark.parametrize(
    ("inputs", "problem"),
    [
        ({"y": np.zeros((2, 3), np.float32)}, "input 'y' is not one of ['x']"),
        ({"x": np.zeros((2, 3), np.float64)}, "input 'x' is FP64, the model takes FP32"),
        ({"x": np.zeros((2, 4), np.float32)}, "has shape [2, 4], the model takes [-1, 3]"),
        ({"x": np.zeros(3, np.float32)}, "has shape [3], the model takes [-1, 3]"),
    ],
)
def test_inputs_that_do_not_fit_the_metadata_fail_before_any_byte_of_them_is_sent(
    inputs: dict[str, Any], problem: str
) -> None:
    server = _typed_server()

    async def main() -> None:
        async with serving_here(server) as port, Client("127.0.0.1", port) as c:
            record = _Recorder(c)
            with pytest.raises(LocalProtocolError, match="model 'typed': ") as info:
                await c.infer("typed", inputs, check=True)
            assert problem in str(info.value)
            with pytest.raises(LocalProtocolError, match="model 'typed': "):
                await c.check_inputs("typed", inputs)
            # One GET of the metadata (then cached); no inference request.
            heads = [bytes(s[0]) for s in record.sent]
            assert len(heads) == 1 and heads[0].startswith(b"GET /v2/models/typed HTTP")
            ok = np.ones((5, 3), np.float32)
            assert np.array_equal((await c.infer("typed", {"x": ok}, check=True))["x"], ok)
            # A model that declares no inputs: nothing to check against.
            ((name, value),) = inputs.items()
            assert np.array_equal((await c.infer("echo", inputs, check=True))[name], value)

    asyncio.run(main())


def test_wait_until_ready_waits_for_a_server_to_listen() -> None:
    async def main() -> None:
        with socket.socket() as probe:  # a free port, nobody listening yet
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        async with Client("127.0.0.1", port) as c:
            with pytest.raises(TimeoutError):
                await c.wait_until_ready(0.2)

            async def later() -> asyncio.Server:
                await asyncio.sleep(0.3)
                return await start_server(V2Server(), "127.0.0.1", port)

            starting = asyncio.create_task(later())
            await c.wait_until_ready(10)
            assert await c.server_ready()
            await close_server(await starting)

    asyncio.run(main())


# -- answers read around h11, and those handed to it ------------------------------------------


def _answer(head: bytes) -> bytes:
    """The echo answer of ``X`` under ``head`` (its framing headers added)."""
    body = binproto.encode_response({"x": X}, model_name="m")
    assert body.header_length is not None
    return (
        head
        + b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
        % (body.header_length, body.content_length)
        + bytes(body)
    )


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\n",
        b"HTTP/1.1 200\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n",
        b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * (20 << 10) + b"\r\n",  # (past the plain read)
        b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\n",
        b"HTTP/1.1 200 OK\r\nX-Odd:\tvalue\t\r\n",
        b"HTTP/1.1 200 OK\r\nX-Folded: a\r\n b\r\n",  # (obs-fold: h11 unfolds it)
    ],
    ids=["plain", "no reason", "100 first", "long head", "HTTP/1.0", "tabs", "obs-fold"],
)
def test_answers_h11_would_take_are_taken(head: bytes) -> None:
    async def main() -> None:
        async with _scripted([_answer(head)]) as (port, bodies):
            async with Client("127.0.0.1", port, retry=None) as c:
                assert np.array_equal((await c.infer("m", {"x": X}))["x"], X)
                assert np.array_equal((await c.infer("m", {"x": X}))["x"], X)
        assert len(bodies) == 2

    asyncio.run(main())


@pytest.mark.parametrize(
    ("head", "message"),
    [
        (b"HTTP/1.1 200 OK\r\nBad Name: x\r\n", "malformed|illegal"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 9x\r\n", "Content-Length|malformed"),
        (b"HTTP/1.1 2000 OK\r\n", "malformed|illegal|status"),
    ],
    ids=["bad name", "bad length", "bad status"],
)
def test_answers_h11_refuses_are_refused(head: bytes, message: str) -> None:
    async def main() -> None:
        async with _scripted([_answer(head)]) as (port, _):
            async with Client("127.0.0.1", port, retry=None) as c:
                with pytest.raises(RemoteProtocolError, match=f"(?i){message}"):
                    await c.infer("m", {"x": X})

    asyncio.run(main())


def test_a_small_answer_read_whole_gives_writable_arrays_of_its_own() -> None:
    async def main() -> None:
        async with serving_here(V2Server()) as port, Client("127.0.0.1", port) as c:
            first = await c.infer("echo", {"x": X, "b": np.array([True, False])})
            second = await c.infer("echo", {"x": X}, binary_data_output=False)
            first["x"][0] = 42.0  # (writable, and not shared with the next answer)
            assert second["x"][0] == 0.0 and first["b"].tolist() == [True, False]
            assert np.array_equal(second["x"], X)
            into = np.zeros_like(X)  # (destinations: the streaming path, received in place)
            assert (await c.infer("echo", {"x": X}, destinations={"x": into}))["x"] is into
            assert np.array_equal(into, X)
            assert c.open_connections == 1

    asyncio.run(main())


def test_a_connection_that_fails_to_open_gives_its_room_to_a_waiting_request() -> None:
    async def main() -> None:
        async with serving_here(V2Server()) as port:
            c = Client("127.0.0.1", port, max_connections=1, retry=None)
            opening = c._open_stream
            gate = asyncio.Event()
            calls = 0

            async def open_stream() -> Any:
                nonlocal calls
                calls += 1
                if calls == 1:  # the first connection fails, once the second request waits
                    await gate.wait()
                    raise ConnectionRefusedError("refused")
                return await opening()

            c._open_stream = open_stream
            first = asyncio.create_task(c.infer("echo", {"x": X}))
            second = asyncio.create_task(c.infer("echo", {"x": X + 1}))
            await asyncio.sleep(0.05)  # (the second waits for the one room)
            gate.set()
            with pytest.raises(ConnectionRefusedError):
                await first
            out = await asyncio.wait_for(second, 10)  # (it waited forever before)
            assert np.array_equal(out["x"], X + 1)
            await c.aclose()

    asyncio.run(main())
