"""The Ray Serve recipe (examples/ray_serve.py): V2App as a deployment with
two replicas on a local Ray, called with binproto's client. Needs
``ray[serve]`` (``pip install -e ".[ray]"``)."""

from __future__ import annotations

import importlib.util
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

import binproto
from binproto.adapters import httpx as bphttpx
from binproto.adapters.server import InferRequest, Model, echo_model

pytest.importorskip("ray.serve")
pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "ray_serve.py"


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("example_ray_serve", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def _pid(request: InferRequest) -> dict[str, Any]:
    import os

    await request.tensors()
    return {"pid": np.array([os.getpid()], np.int64)}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    import ray
    from ray import serve

    with socket.socket() as s:  # a free port for Ray's proxy
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = _example().deployment([echo_model(), Model("pid", _pid)], replicas=2)
        serve.run(app, route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def test_every_route_and_datatype_through_two_replicas(url: str) -> None:
    arrays: dict[str, np.ndarray[Any, Any]] = {
        "f32": np.arange(6, dtype=np.float32).reshape(2, 3),
        "i64": np.arange(4, dtype=np.int64),
        "u8": np.arange(5, dtype=np.uint8),
        "b": np.array([True, False]),
        "s": np.array([b"ab", b"", b"\xff"], dtype=object),
    }
    with httpx.Client(base_url=url, timeout=60) as client:
        assert client.get("/v2/health/ready").json() == {"ready": True}
        assert client.get("/v2/models/echo").json()["name"] == "echo"
        assert client.get("/v2/models/nope").status_code == 404
        result = bphttpx.infer(client, "echo", arrays)
        for name, array in arrays.items():
            assert result.tensors[name].tolist() == array.tolist(), name
        body = binproto.encode_request({"x": arrays["f32"]}, outputs=["z"])
        r = client.post("/v2/models/echo/infer", content=bytes(body), headers=body.headers)
        assert (r.status_code, r.json()) == (
            400,
            {"error": "unexpected inference output 'z' for model 'echo'"},
        )
        pids = {
            int(bphttpx.infer(client, "pid", {"x": arrays["u8"]}).tensors["pid"][0])
            for _ in range(32)
        }
    assert len(pids) == 2  # both replicas answer


def test_a_64_mib_tensor_through_the_proxy(url: str) -> None:
    tensor = np.full(16 << 20, 1.5, dtype=np.float32)
    tensor[::4096] = np.arange(tensor[::4096].size, dtype=np.float32)
    with httpx.Client(base_url=url, timeout=300) as client:
        start = time.monotonic()
        result = bphttpx.infer(client, "echo", {"x": tensor})
        seconds = time.monotonic() - start
    np.testing.assert_array_equal(result.tensors["x"], tensor)
    print(f"64 MiB echo through Ray Serve's proxy: {seconds:.2f} s")
