"""The Ray Serve recipes, run in the Ray environment (see tests/test_ray_serve.py).

Starts a local Ray with examples/ray_serve.py's deployment (V2App, 2
replicas, behind Ray's HTTP proxy) and examples/ray_ingress.py's design
(V2App under uvicorn in front of a Ray deployment handle), plus V2App under
uvicorn alone for comparison. Sends requests with binproto's client and
tritonclient, and prints what it saw as one JSON line.

    python tests/ray_check.py [--sizes 64,256] [--repeats 2]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import ml_dtypes
import numpy as np
import tritonclient.http as triton
import uvicorn

import binproto
from binproto.adapters import httpx as bphttpx
from binproto.adapters.asgi import V2App
from binproto.adapters.server import InferRequest, Model, echo_model

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _pid(request: InferRequest) -> dict[str, Any]:
    await request.tensors()
    return {"pid": np.array([os.getpid()], np.int64)}


BF16_BITS = np.array([0x3F80, 0xC020, 0x0000], dtype=np.uint16)  # 1.0, -2.5, 0.0


def _arrays() -> dict[str, np.ndarray[Any, Any]]:
    """One small array for every datatype but BF16 (numpy has none)."""
    out: dict[str, np.ndarray[Any, Any]] = {}
    for name, info in binproto.DATATYPES.items():
        if name == "BF16":
            continue
        if name == "BYTES":
            out[name] = np.array([b"ab", b"", b"\xff\x00"], dtype=object)
        elif name == "BOOL":
            out[name] = np.array([[True, False], [False, True]])
        elif info.dtype.kind in "iu":
            limits = np.iinfo(info.dtype)
            out[name] = np.array([limits.min, 0, 1, limits.max], dtype=info.dtype)
        else:
            out[name] = np.array([-1.5, 0.0, 2.25, np.inf], dtype=info.dtype)
    return out


def _with_binproto(url: str) -> list[str]:
    """Every datatype through binproto's client; the names that came back equal."""
    arrays = _arrays()
    tensors = [binproto.Tensor(n, a) for n, a in arrays.items()]
    tensors.append(binproto.Tensor("BF16", BF16_BITS, datatype="BF16"))
    with httpx.Client(base_url=url, timeout=120) as client:
        result = bphttpx.infer(client, "echo", tensors)
    arrays["BF16"] = BF16_BITS
    got = dict(result.tensors)
    got["BF16"] = got["BF16"].view(np.uint16)  # bfloat16 when ml_dtypes is installed
    datatypes = {t.name: t.datatype for t in result.header.tensors}
    return sorted(
        n for n, a in arrays.items() if datatypes.get(n) == n and got[n].tolist() == a.tolist()
    )


def _with_tritonclient(url: str) -> list[str]:
    """Every datatype through tritonclient (binary data); the names that came back equal."""
    arrays = _arrays()
    arrays["BF16"] = BF16_BITS.view(ml_dtypes.bfloat16)
    client = triton.InferenceServerClient(url.removeprefix("http://"), network_timeout=120)
    try:
        inputs = []
        for name, array in arrays.items():
            given = triton.InferInput(name, list(array.shape), name)
            given.set_data_from_numpy(array, binary_data=True)
            inputs.append(given)
        wanted = [triton.InferRequestedOutput(n, binary_data=True) for n in arrays]
        result = client.infer("echo", inputs, outputs=wanted)
        same = []
        for name, array in arrays.items():
            got = result.as_numpy(name)
            if name == "BF16":
                ok = got is not None and got.view(np.uint16).tolist() == BF16_BITS.tolist()
            else:
                ok = got is not None and got.tolist() == array.tolist()
            if ok and result.get_output(name)["datatype"] == name:
                same.append(name)
        return sorted(same)
    finally:
        client.close()


def _routes(url: str) -> dict[str, Any]:
    with httpx.Client(base_url=url, timeout=60) as client:
        body = binproto.encode_request({"x": np.zeros(3, np.float32)}, outputs=["z"])
        r = client.post("/v2/models/echo/infer", content=bytes(body), headers=body.headers)
        return {
            "ready": client.get("/v2/health/ready").json(),
            "metadata_name": client.get("/v2/models/echo").json().get("name"),
            "unknown_model": client.get("/v2/models/nope").status_code,
            "unknown_output": [r.status_code, r.json()],
        }


def _pids(url: str, requests: int = 32) -> int:
    with httpx.Client(base_url=url, timeout=60) as client:
        return len(
            {
                int(bphttpx.infer(client, "pid", {"x": np.zeros(1, np.uint8)}).tensors["pid"][0])
                for _ in range(requests)
            }
        )


def _big(mib: int) -> np.ndarray[Any, Any]:
    tensor = np.full(mib << 18, 1.5, dtype=np.float32)
    tensor[::4096] = np.arange(tensor[::4096].size, dtype=np.float32)
    return tensor


def _echo_seconds(url: str, tensor: np.ndarray[Any, Any]) -> float | None:
    """Seconds for one echo of ``tensor`` with binproto's client; None if it came back wrong."""
    with httpx.Client(base_url=url, timeout=600) as client:
        start = time.perf_counter()
        result = bphttpx.infer(client, "echo", {"x": tensor})
        seconds = time.perf_counter() - start
    return seconds if np.array_equal(result.tensors["x"], tensor) else None


def _tritonclient_big(url: str, tensor: np.ndarray[Any, Any]) -> float | None:
    client = triton.InferenceServerClient(
        url.removeprefix("http://"), network_timeout=600, connection_timeout=600
    )
    try:
        given = triton.InferInput("x", list(tensor.shape), "FP32")
        given.set_data_from_numpy(tensor, binary_data=True)
        start = time.perf_counter()
        result = client.infer("echo", [given])
        seconds = time.perf_counter() - start
        return seconds if np.array_equal(result.as_numpy("x"), tensor) else None
    finally:
        client.close()


class Probe:
    """A replica that says whether it got an array as a read-only view (Ray's
    object store) or as a copy of its own."""

    def __call__(self, arrays: dict[str, np.ndarray[Any, Any]]) -> bool:
        return not arrays["x"].flags.writeable


async def _object_store(probe: Any, echo: Any) -> dict[str, bool]:
    """Whether a 64 MiB array travels through the object store, both ways."""
    tensor = _big(64)
    back = await echo.remote({"x": tensor})
    return {
        "replica_reads_in_place": bool(await probe.remote({"x": tensor})),
        "ingress_reads_in_place": not back["x"].flags.writeable,
        "same": bool(np.array_equal(back["x"], tensor)),
    }


def _uvicorn(app: V2App) -> tuple[str, uvicorn.Server, threading.Thread]:
    port = _port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}", server, thread


def main(argv: list[str] | None = None) -> None:
    import ray
    from ray import serve

    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="64,256", help="big echoes, in MiB")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]

    out: dict[str, Any] = {"ray": ray.__version__}
    started = time.monotonic()
    # Logical CPUs: each replica asks for one; four replicas share two cores.
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    servers = []
    try:
        port = _port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = _load("ray_serve").deployment([echo_model(), Model("pid", _pid)], replicas=2)
        serve.run(app, name="v2", route_prefix="/")
        ingress_example = _load("ray_ingress")
        handle = serve.run(ingress_example.model_deployment(2), name="models", route_prefix=None)
        probe = serve.deployment(Probe, ray_actor_options={"num_cpus": 0})
        probe = serve.run(probe.bind(), name="probe", route_prefix=None)
        out["object_store"] = asyncio.run(_object_store(probe, handle))
        out["startup_seconds"] = round(time.monotonic() - started, 1)
        fronts = {"proxy": f"http://127.0.0.1:{port}"}
        url, server, thread = _uvicorn(V2App(ingress_example.ingress_models(handle)))
        fronts["ingress"] = url
        servers.append((server, thread))
        url, server, thread = _uvicorn(V2App([echo_model()]))
        fronts["uvicorn"] = url
        servers.append((server, thread))

        for front in ("proxy", "ingress"):
            url = fronts[front]
            out[front] = {
                "routes": _routes(url),
                "binproto": _with_binproto(url),
                "tritonclient": _with_tritonclient(url),
            }
        out["proxy"]["replicas_answering"] = _pids(fronts["proxy"])
        out["echo_seconds"] = {}
        for mib in sizes:
            tensor = _big(mib)
            row: dict[str, list[float | None]] = {}
            for front in ("uvicorn", "ingress", "proxy"):
                row[front] = [_echo_seconds(fronts[front], tensor) for _ in range(args.repeats)]
            if mib == max(sizes):
                out["proxy"]["tritonclient_big"] = [mib, _tritonclient_big(fronts["proxy"], tensor)]
            out["echo_seconds"][str(mib)] = row
            del tensor
    finally:
        for server, thread in servers:
            server.should_exit = True
            thread.join(10)
        serve.shutdown()
        ray.shutdown()
    out["datatypes"] = sorted(binproto.DATATYPES)
    out["total_seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
