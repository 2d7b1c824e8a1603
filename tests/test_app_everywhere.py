"""The V2 application answers alike on every way to serve it.

One fixture serves the same models on binproto's asyncio server (in place
and through streams), its trio server, and :class:`V2App` under a real
uvicorn. Each test holds every backend to the same statuses and bodies:
the routes, the output policy, the refusals (Triton's wording), handler
faults, streaming, raw binary requests and the body budget.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import numpy as np
import pytest

import binproto
from binproto.adapters._server import V2Server
from binproto.adapters.server import (
    InferenceError,
    InferRequest,
    Model,
    StreamingResponse,
    echo_model,
)

from .servers import Running, connect, read_all, serving

pytest.importorskip("uvicorn")


async def _picky(request: InferRequest) -> dict[str, Any]:
    """Makes output ``a`` only, whatever the request asks for."""
    tensors = await request.tensors()
    return {"a": tensors["x"] + 1}


async def _fails(request: InferRequest) -> dict[str, Any]:
    await request.tensors()
    raise RuntimeError("boom")


async def _refuses(request: InferRequest) -> dict[str, Any]:
    raise InferenceError("not today", 422)


async def _events(request: InferRequest) -> dict[str, Any]:
    """Counts the tensor bytes it is handed, event by event."""
    total = 0
    async for event in request.body:
        if isinstance(event, binproto.TensorChunk):
            total += len(event.data)
    return {"bytes": np.array([total], dtype=np.int64)}


async def _ramp(request: InferRequest) -> StreamingResponse:
    n = int((await request.tensors())["n"][0])
    header = {
        "model_name": "ramp",
        "outputs": [
            {
                "name": "r",
                "datatype": "INT32",
                "shape": [n],
                "parameters": {"binary_data_size": 4 * n},
            }
        ],
    }

    async def pieces() -> AsyncIterator[tuple[int, Any]]:
        for start in range(0, n, 1000):
            yield 0, np.arange(start, min(n, start + 1000), dtype=np.int32)

    return StreamingResponse(binproto.BodyWriter(header), pieces())


async def _breaks(request: InferRequest) -> StreamingResponse:
    """Streams the first half of its output, then fails."""
    await request.tensors()
    header = {
        "model_name": "breaks",
        "outputs": [
            {
                "name": "r",
                "datatype": "INT32",
                "shape": [2000],
                "parameters": {"binary_data_size": 8000},
            }
        ],
    }

    async def pieces() -> AsyncIterator[tuple[int, Any]]:
        yield 0, np.zeros(1000, dtype=np.int32)
        raise RuntimeError("the model broke mid-answer")

    return StreamingResponse(binproto.BodyWriter(header), pieces())


async def _double(request: InferRequest) -> dict[str, Any]:
    return {"y": (await request.tensors())["x"] * 2}


MODELS = [
    echo_model(),
    Model("picky", _picky, versions=("1", "2")),
    Model("fails", _fails),
    Model("refuses", _refuses),
    Model("events", _events),
    Model("ramp", _ramp),
    Model("breaks", _breaks),
    Model("double", _double, inputs=[{"name": "x", "datatype": "FP32", "shape": [-1]}]),
]
#: Two requests of BODY bytes pass it; one fits.
BUDGET = 150_000
BODY = 100_000


@pytest.fixture(scope="module")
def server(backend: str) -> Iterator[Running]:
    app = V2Server(MODELS, max_body_bytes_in_flight=BUDGET)
    yield from serving(backend, app)


def _client(server: Running) -> httpx.Client:
    return httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=30)


def _infer(
    client: httpx.Client, model: str, body: binproto.EncodedBody, **headers: str
) -> httpx.Response:
    return client.post(
        f"/v2/models/{model}/infer", content=bytes(body), headers={**dict(body.headers), **headers}
    )


def _decoded(r: httpx.Response) -> binproto.DecodedMessage:
    hl = r.headers.get("inference-header-content-length")
    return binproto.decode_response(r.content, header_length=int(hl) if hl else None)


X = np.arange(5, dtype=np.float32)

GETS = [
    (
        "/v2",
        200,
        {"name": "binproto", "version": binproto.__version__, "extensions": ["binary_tensor_data"]},
    ),
    ("/v2/health/live", 200, {"live": True}),
    ("/v2/health/ready", 200, {"ready": True}),
    ("/v2/models/picky/ready", 200, {"name": "picky", "ready": True}),
    ("/v2/models/picky/versions/2/ready", 200, {"name": "picky", "ready": True}),
    (
        "/v2/models/picky",
        200,
        {
            "name": "picky",
            "versions": ["1", "2"],
            "platform": "binproto",
            "inputs": [],
            "outputs": [],
        },
    ),
    ("/v2/models/nope", 404, {"error": "Request for unknown model: 'nope' is not found"}),
    (
        "/v2/models/picky/versions/3",
        404,
        {"error": "Request for unknown model: 'picky' version 3 is not found"},
    ),
    ("/v2/models/nope/ready", 404, {"error": "Request for unknown model: 'nope' is not found"}),
    ("/elsewhere", 404, {"error": "Not Found"}),
    ("/v2/models/picky/infer", 405, {"error": "method GET not allowed"}),
]


@pytest.mark.parametrize(("path", "status", "answer"), GETS, ids=[g[0] for g in GETS])
def test_the_get_routes(server: Running, path: str, status: int, answer: Any) -> None:
    with _client(server) as client:
        r = client.get(path)
    assert (r.status_code, r.json()) == (status, answer)
    if status == 405:
        assert r.headers["allow"] == "POST"


def test_head_is_get_without_a_body_and_post_to_a_get_route_is_405(server: Running) -> None:
    with _client(server) as client:
        r = client.head("/v2/health/ready")
        assert r.status_code == 200 and r.content == b""
        r = client.post("/v2", content=b"{}")
        assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD"


def test_echo_binary_and_json(server: Running) -> None:
    with _client(server) as client:
        r = _infer(client, "echo", binproto.encode_request({"x": X}, binary_data_output=True))
        assert r.status_code == 200
        assert _decoded(r).tensors["x"].tolist() == X.tolist()
        r = _infer(client, "echo", binproto.encode_request({"x": X}, binary_data_output=False))
        assert r.status_code == 200 and "inference-header-content-length" not in r.headers
        out = r.json()["outputs"][0]
        assert out["data"] == X.tolist() and r.json()["model_name"] == "echo"


def test_a_compressed_answer_when_the_client_accepts_it(server: Running) -> None:
    with _client(server) as client:
        body = binproto.encode_request({"x": X}, binary_data_output=True)
        r = client.post(
            "/v2/models/echo/infer",
            content=bytes(body),
            headers={**dict(body.headers), "Accept-Encoding": "gzip"},
        )
    assert r.status_code == 200
    assert r.headers["content-encoding"] == "gzip" and r.headers["vary"] == "Accept-Encoding"
    # (httpx inflated it.)
    assert _decoded(r).tensors["x"].tolist() == X.tolist()


def test_an_output_the_model_does_not_make_is_400(server: Running) -> None:
    with _client(server) as client:
        r = _infer(client, "picky", binproto.encode_request({"x": X}, outputs=["z"]))
        assert (r.status_code, r.json()) == (
            400,
            {"error": "unexpected inference output 'z' for model 'picky'"},
        )
        r = _infer(client, "echo", binproto.encode_request({"x": X}, outputs=["y"]))
        assert (r.status_code, r.json()) == (
            400,
            {"error": "unexpected inference output 'y' for model 'echo'"},
        )
        # The one it makes is answered.
        r = _infer(client, "picky", binproto.encode_request({"x": X}, outputs=["a"]))
        assert r.status_code == 200, r.text


def test_shared_memory_and_classification_are_refused(server: Running) -> None:
    shm = {
        "inputs": [
            {
                "name": "x",
                "datatype": "FP32",
                "shape": [1],
                "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 4},
            }
        ]
    }
    cls = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}],
        "outputs": [{"name": "x", "parameters": {"classification": 1}}],
    }
    with _client(server) as client:
        r = client.post("/v2/models/echo/infer", content=json.dumps(shm).encode())
        assert (r.status_code, r.json()) == (
            400,
            {"error": "shared memory is not supported here (inputs ['x'])"},
        )
        r = client.post("/v2/models/echo/infer", content=json.dumps(cls).encode())
        assert (r.status_code, r.json()) == (
            400,
            {"error": "classification is not supported here (outputs ['x'])"},
        )


def test_handler_faults_and_refusals(server: Running) -> None:
    with _client(server) as client:
        r = _infer(client, "fails", binproto.encode_request({"x": X}))
        assert (r.status_code, r.json()) == (500, {"error": "internal error: boom"})
        r = _infer(client, "refuses", binproto.encode_request({"x": X}))
        assert (r.status_code, r.json()) == (422, {"error": "not today"})
        # A bad body is the client's fault, named with its offset.
        r = client.post(
            "/v2/models/echo/infer",
            content=b'{"inputs": [}',
            headers={"Content-Type": "application/json"},
        )
        assert r.status_code == 400 and "JSON" in r.json()["error"]
        assert client.get("/v2/health/live").status_code == 200  # and it goes on


def test_events_streaming_and_raw_requests(server: Running) -> None:
    with _client(server) as client:
        big = np.arange(200_000, dtype=np.float32)  # parsed as it arrives
        for x in (X, big):
            r = _infer(client, "events", binproto.encode_request({"x": x}, binary_data_output=True))
            assert _decoded(r).tensors["bytes"].tolist() == [x.nbytes]
        r = _infer(client, "ramp", binproto.encode_request({"n": np.array([2500], np.int64)}))
        assert r.status_code == 200
        assert _decoded(r).tensors["r"].tolist() == list(range(2500))
        # A raw binary body is the model's one declared input.
        r = client.post(
            "/v2/models/double/infer",
            content=X.tobytes(),
            headers={"Inference-Header-Content-Length": "0"},
        )
        assert r.status_code == 200, r.text
        assert _decoded(r).tensors["y"].tolist() == (X * 2).tolist()
        r = client.post(
            "/v2/models/echo/infer",
            content=X.tobytes(),
            headers={"Inference-Header-Content-Length": "0"},
        )
        assert r.status_code == 400
        assert "declares 0 inputs" in r.json()["error"]


def test_a_gzip_request_body(server: Running) -> None:
    body = binproto.encode_request({"x": X}, binary_data_output=True)
    with _client(server) as client:
        r = client.post(
            "/v2/models/echo/infer",
            content=gzip.compress(bytes(body)),
            headers={
                "Inference-Header-Content-Length": str(body.header_length),
                "Content-Encoding": "gzip",
            },
        )
    assert r.status_code == 200, r.text
    assert _decoded(r).tensors["x"].tolist() == X.tolist()


def _head(length: int) -> bytes:
    return (
        "POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


def test_the_body_budget_refuses_a_second_big_body_with_503(server: Running) -> None:
    held = json.dumps(
        {"inputs": [{"name": "x", "datatype": "INT32", "shape": [1], "data": [1]}]}
    ).encode()
    held = held + b" " * (BODY - len(held))
    with connect(server.port) as a:
        a.sendall(_head(BODY) + held[:100])  # holds its claim, waiting for the rest
        time.sleep(0.3)
        with connect(server.port) as b:
            b.sendall(_head(BODY).replace(b"Host: x", b"Host: x\r\nConnection: close") + held)
            answer = read_all(b)
        a.sendall(held[100:])
        a.shutdown(socket.SHUT_WR)
        first = read_all(a)
    assert answer.split(b" ", 2)[1] == b"503", answer[:300]
    assert b"retry-after: 1" in answer.lower()
    assert b"the server is busy" in answer
    assert first.split(b" ", 2)[1] == b"200", first[:300]


@pytest.mark.parametrize("prefix", ["", "/triton"])
def test_v2app_mounted_in_fastapi_beside_other_routes(prefix: str) -> None:
    from fastapi import FastAPI

    from binproto.adapters.asgi import V2App

    api = FastAPI()

    @api.get("/hello")
    async def hello() -> dict[str, str]:
        return {"hello": "world"}

    api.mount(prefix or "/", V2App(MODELS))

    async def main() -> None:
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
            assert (await client.get("/hello")).json() == {"hello": "world"}
            r = await client.get(prefix + "/v2/models/picky/ready")
            assert (r.status_code, r.json()) == (200, {"name": "picky", "ready": True})
            body = binproto.encode_request({"x": X}, outputs=["z"])
            r = await client.post(
                prefix + "/v2/models/picky/infer", content=bytes(body), headers=body.headers
            )
            assert r.status_code == 400
            body = binproto.encode_request({"x": X}, binary_data_output=True)
            r = await client.post(
                prefix + "/v2/models/echo/infer", content=bytes(body), headers=body.headers
            )
            assert _decoded(r).tensors["x"].tolist() == X.tolist()

    asyncio.run(main())


@pytest.mark.parametrize("views", [True, False])
def test_response_bodies_are_views_or_bytes(views: bool) -> None:
    from binproto.adapters.asgi import V2App

    app = V2App(MODELS, views=views)
    big = np.arange(1 << 18, dtype=np.float32)  # 1 MiB: sent as a view of its memory
    body = binproto.encode_request({"x": big}, binary_data_output=True)
    data = bytes(body)
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v2/models/echo/infer",
        "raw_path": b"/v2/models/echo/infer",
        "root_path": "",
        "headers": [(k.lower().encode(), str(v).encode()) for k, v in body.headers],
    }
    sent: list[Any] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": data, "more_body": False}

    async def send(message: Any) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    bodies = [m["body"] for m in sent if m["type"] == "http.response.body"]
    assert sent[0]["status"] == 200
    if views:
        assert any(type(b) is memoryview for b in bodies)
    else:
        assert all(type(b) is bytes for b in bodies)  # (as the ASGI spec says)
    joined = b"".join(bytes(b) for b in bodies)
    hl = int(dict(sent[0]["headers"])[b"inference-header-content-length"])
    assert binproto.decode_response(joined, header_length=hl).tensors["x"].tolist() == big.tolist()


def test_a_streamed_answer_that_breaks_is_cut_short_not_replaced(server: Running) -> None:
    body = binproto.encode_request({"x": X})
    head = "POST /v2/models/breaks/infer HTTP/1.1\r\nHost: x\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in body.headers)
    with connect(server.port) as sock:
        sock.sendall(head.encode() + b"\r\n" + bytes(body))
        answer = read_all(sock)  # the server closes the connection
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    assert answer.count(b"HTTP/1.1 ") == 1  # no second answer after the first began
    assert not answer.endswith(b"0\r\n\r\n")  # the chunked body never ends
    with _client(server) as client:
        assert client.get("/v2/health/live").status_code == 200
