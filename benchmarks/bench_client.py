"""Clients under concurrency: many small infers through one client.

2,000 infers of a 4 KiB FP32 echo, 64 in flight at a time (64 tasks, each
sending its share in turn), against ``binproto serve`` in its own process:
binproto's pooled asyncio client against ``tritonclient.http.aio``, both
asking for binary outputs, both with up to 64 connections. Rounds are
interleaved, and each round runs both clients in this process, each in a
fresh event loop. Reported per request: wall time (the rate) and this
process's CPU time (``time.process_time``: the client's cost, since the
server runs elsewhere), with the p99 latency in the notes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from ._harness import Row, median, mode, pick, row
from .bench_throughput import COMMANDS, running

KiB = 1024

#: A run of one client: (wall seconds, CPU seconds, latencies in seconds).
Outcome = tuple[float, float, list[float]]


async def _drive(send: Callable[[], Awaitable[None]], total: int, concurrency: int) -> Outcome:
    """``total`` calls of ``send``, ``concurrency`` tasks at a time."""
    latencies: list[float] = []

    async def worker(count: int) -> None:
        for _ in range(count):
            t0 = time.perf_counter()
            await send()
            latencies.append(time.perf_counter() - t0)

    shares = [total // concurrency + (i < total % concurrency) for i in range(concurrency)]
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker(n) for n in shares))
    return time.perf_counter() - wall0, time.process_time() - cpu0, latencies


async def _binproto(port: int, x: np.ndarray[Any, Any], total: int, concurrency: int) -> Outcome:
    from binproto.adapters.asyncio import Client

    async with Client(f"http://127.0.0.1:{port}", max_connections=concurrency) as client:

        async def send() -> None:
            out = await client.infer("echo", {"x": x})
            assert out["x"].shape == x.shape

        await _drive(send, concurrency * 2, concurrency)  # (connections opened, warm)
        return await _drive(send, total, concurrency)


async def _tritonclient(
    port: int, x: np.ndarray[Any, Any], total: int, concurrency: int
) -> Outcome:
    import tritonclient.http.aio as aioclient

    client = aioclient.InferenceServerClient(f"127.0.0.1:{port}", conn_limit=concurrency)
    try:

        async def send() -> None:
            data = aioclient.InferInput("x", list(x.shape), "FP32")
            data.set_data_from_numpy(x, binary_data=True)
            wanted = [aioclient.InferRequestedOutput("x", binary_data=True)]
            result = await client.infer("echo", [data], outputs=wanted)
            assert result.as_numpy("x").shape == x.shape

        await _drive(send, concurrency * 2, concurrency)
        return await _drive(send, total, concurrency)
    finally:
        await client.close()


def _p99(latencies: list[float]) -> float:
    return float(np.percentile(latencies, 99))


def run(quick: bool) -> list[Row]:
    """The client rows: rate and client CPU per request, binproto against tritonclient."""
    current = mode(quick)
    total = pick(current, full=2000, quick=2000, tiny=64)
    concurrency = pick(current, full=64, quick=64, tiny=8)
    rounds = pick(current, full=7, quick=3, tiny=1)
    x = np.arange(KiB, dtype=np.float32)  # 4 KiB
    cases = {"binproto": _binproto, "tritonclient": _tritonclient}
    try:
        import tritonclient.http.aio  # noqa: F401
    except ImportError:
        del cases["tritonclient"]
    outcomes: dict[str, list[Outcome]] = {name: [] for name in cases}
    with running("binproto-asyncio", COMMANDS["binproto-asyncio"]) as port:
        for r in range(rounds):
            names = list(cases) if r % 2 == 0 else list(reversed(list(cases)))
            for name in names:
                outcomes[name].append(asyncio.run(cases[name](port, x, total, concurrency)))
    workload = f"{total:,} infers of a 4 KiB FP32 echo, {concurrency} at a time"
    impls = {
        "binproto": f"binproto asyncio Client (one, pool of {concurrency})",
        "tritonclient": f"tritonclient.http.aio (conn_limit {concurrency})",
    }
    rows: list[Row] = []
    base = outcomes.get("tritonclient")
    for name, runs in outcomes.items():
        walls = [w for w, _, _ in runs]
        cpus = [c for _, c, _ in runs]
        p99 = median([_p99(lat) for _, _, lat in runs])
        compared = name == "binproto" and base is not None
        notes = {
            "req_per_s": round(total / median(walls)),
            "p99_ms": round(p99 * 1e3, 2),
            "client_cpu_us_per_request": round(median(cpus) / total * 1e6, 1),
        }
        rows.append(
            row(
                f"{workload}: rate",
                impls[name],
                walls,
                per=total,
                baseline=impls["tritonclient"] if compared else None,
                baseline_samples=[w for w, _, _ in base] if compared and base else None,
                min_ratio=2.0 if compared else None,
                **notes,
            )
        )
        rows.append(
            row(
                f"{workload}: client CPU",
                impls[name],
                cpus,
                per=total,
                baseline=impls["tritonclient"] if compared else None,
                baseline_samples=[c for _, c, _ in base] if compared and base else None,
                min_ratio=2.5 if compared else None,  # (CPU <= 0.4x tritonclient's)
                **notes,
            )
        )
    return rows


if __name__ == "__main__":
    import json
    import sys

    for r in run("--quick" in sys.argv):
        r.pop("samples")
        print(json.dumps(r))
