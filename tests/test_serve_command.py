"""``python -m binproto serve`` as a process: health checks, the
compression switch, the trio backend, and a 256 MiB tensor whose echo
keeps the server's memory bounded."""

from __future__ import annotations

import asyncio
import http.client
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

import binproto
from binproto.adapters.asyncio import Client

from .servers import assert_served, serve_command


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _echo(port: int, inputs: dict[str, Any], **kw: Any) -> dict[str, np.ndarray[Any, Any]]:
    async with Client("127.0.0.1", port) as c:
        return await c.infer("echo", inputs, **kw)


def _vm(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(key)


@pytest.fixture
def serve_process(request: pytest.FixtureRequest) -> Iterator[tuple[int, int]]:
    with serve_command(*request.param) as served:
        yield served.proc.pid, served.port


@pytest.mark.slow
@pytest.mark.parametrize("serve_process", [[], ["--streams"]], indirect=True, ids=["zc", "st"])
def test_256_mib_through_the_reference_server(serve_process: tuple[int, int]) -> None:
    pid, port = serve_process
    assert_served(port)  # warm up: imports, first allocations
    before = _vm(pid, "VmRSS")
    x = np.arange(64 << 20, dtype=np.float32)  # 256 MiB
    out = run(_echo(port, {"x": x}, binary_data_output=True))
    assert out["x"].dtype == np.float32
    assert np.array_equal(out["x"], x)
    peak = _vm(pid, "VmHWM")
    # The echo model holds the tensor once; everything else is O(chunk).
    assert peak - before <= x.nbytes * 1.1, (peak - before) / x.nbytes


def test_serve_command_answers_health_checks() -> None:
    with serve_command("--host", "127.0.0.1") as served:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{served.port}", connection_timeout=30)
        try:
            assert client.is_server_live()
            assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
        finally:
            client.close()


@pytest.mark.parametrize(
    ("serve_process", "coding"),
    [([], "gzip"), (["--no-compress"], None), (["--backend", "trio", "--no-compress"], None)],
    indirect=["serve_process"],
)
def test_serve_command_compression_switch(
    serve_process: tuple[int, int], coding: str | None
) -> None:
    import http.client

    _, port = serve_process
    body = binproto.encode_request({"x": np.arange(1000, dtype=np.int32)}, binary_data_output=True)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(
            "POST",
            "/v2/models/echo/infer",
            body=bytes(body),
            headers={**dict(body.headers), "Accept-Encoding": "gzip"},
        )
        response = conn.getresponse()
        raw = response.read()
        assert response.status == 200
        assert response.getheader("Content-Encoding") == coding
        hl = binproto.header_length_from(response.getheaders())
        out = binproto.decode_response(raw, header_length=hl, content_encoding=coding)
        assert np.array_equal(out.tensors["x"], np.arange(1000, dtype=np.int32))
    finally:
        conn.close()


def test_serve_command_with_the_trio_backend() -> None:
    with serve_command("--backend", "trio") as served:
        conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=10)
        conn.request("GET", "/v2/health/ready")
        response = conn.getresponse()
        assert response.status == 200 and response.read() == b'{"ready": true}'
        conn.close()
