"""Where an ASGI app's time goes, for the 4 KiB FP32 echo.

Two measurements:

- **In a loop**: ``V2App`` and the codec floor
  (:func:`benchmarks.floor_servers.asgi_codec_app`: the echo with binproto's
  codec and nothing else) called in an asyncio event loop, the body in one
  message, a ``send`` that does nothing. CPU time a request, interleaved
  rounds. The difference is ``V2App``'s own steps.
- **Under uvicorn** (needs ``wrk``): the trivial ASGI app, the codec floor
  and ``V2App``, each wrapped by :func:`benchmarks.floor_servers.timed`,
  which adds up the CPU time of each step (``receive``, the app's own work,
  the response start, the body) while ``wrk -c8`` posts the echo. A row
  per step, in µs a request, and one for the server's whole CPU a request
  (from /proc): the rest is uvicorn's own work. The wrapper's clock reads
  cost a few tenths of a µs a step. The warm-up run is not counted.

Run alone with ``python -m benchmarks.bench_asgi_steps`` (``--quick``: shorter).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.bench_parser import small_request, small_request_scope
from binproto.adapters.asgi import V2App

from ._harness import Row, mode, pick, row
from .bench_throughput import ECHO, PIDS, _uvicorn, running, tree_cpu, write_request
from .floor_servers import STEPS_OUT, asgi_codec_app

WORKLOAD = "4 KiB FP32 echo, CPU a request"


def _scope_and_receive() -> tuple[dict[str, Any], Any]:
    body, hl = small_request()
    message = {"type": "http.request", "body": body, "more_body": False}

    async def receive() -> dict[str, Any]:
        return message

    return small_request_scope(body, hl), receive


async def _send(message: dict[str, Any]) -> None:
    pass


def in_a_loop(rounds: int, count: int) -> dict[str, list[float]]:
    """CPU seconds a request of V2App and of the codec floor, per round."""
    scope, receive = _scope_and_receive()
    apps: dict[str, Any] = {"V2App": V2App(), "codec floor": asgi_codec_app}
    samples: dict[str, list[float]] = {name: [] for name in apps}

    async def main() -> None:
        for app in apps.values():  # (warm-up)
            for _ in range(count // 10 + 1):
                await app(scope, receive, _send)
        for _ in range(rounds):
            for name, app in apps.items():
                start = time.process_time()
                for _ in range(count):
                    await app(scope, receive, _send)
                samples[name].append((time.process_time() - start) / count)

    asyncio.run(main())
    return samples


#: The apps timed under uvicorn, by name.
TIMED = {
    "trivial ASGI app": "benchmarks.floor_servers:timed_asgi_app",
    "codec floor": "benchmarks.floor_servers:timed_asgi_codec_app",
    "V2App": "benchmarks.floor_servers:timed_v2app",
}


def under_uvicorn(name: str, seconds: float, script: Path, out: Path) -> dict[str, float]:
    """µs a request of each step of ``name`` under uvicorn, and of the
    server's whole CPU (``server``)."""
    os.environ[STEPS_OUT] = str(out)  # (read by the server, which inherits it)
    out.unlink(missing_ok=True)  # (no totals of another app's server)
    with running(name, _uvicorn(TIMED[name])) as port:
        url = f"http://127.0.0.1:{port}{ECHO[0]}"
        warm = ["wrk", "-t1", "-c8", "-d1s", "-s", str(script), url]
        subprocess.run(warm, capture_output=True, check=True)
        # A GET starts the app's count again: the steps cover the run below.
        urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=10).close()
        pid = PIDS[port]
        before = tree_cpu(pid)
        done = subprocess.run(
            ["wrk", "-t1", "-c8", f"-d{seconds:g}s", "-s", str(script), url],
            capture_output=True,
            text=True,
            check=True,
        )
        after = tree_cpu(pid)
    served = json.loads(out.read_text())
    line = next(x for x in done.stdout.splitlines() if "requests in" in x)
    requests = int(line.split()[0])
    n = served["requests"]
    steps = {step: ns / n / 1000 for step, ns in served["ns"].items()}
    if before is not None and after is not None:
        steps["server"] = (after - before) / requests * 1e6
    return steps


def run(quick: bool) -> list[Row]:
    """In-loop rows always; the per-step rows under uvicorn when wrk is here."""
    current = mode(quick)
    rounds = pick(current, full=7, quick=3, tiny=1)
    count = pick(current, full=20_000, quick=5_000, tiny=200)
    loop = in_a_loop(rounds, count)
    rows = [
        row("in a loop, µs a request", "V2App", loop["V2App"], baseline="codec floor",
            baseline_samples=loop["codec floor"]),
        row("in a loop, µs a request", "codec floor", loop["codec floor"]),
    ]  # fmt: skip
    if shutil.which("wrk") is None:
        print("asgi_steps: wrk is not installed: no rows under uvicorn", file=sys.stderr)
        return rows
    seconds = pick(current, full=8, quick=4, tiny=1)
    with tempfile.TemporaryDirectory() as tmp:
        script = write_request(Path(tmp), 4096)
        for name in TIMED:
            steps = under_uvicorn(name, seconds, script, Path(tmp) / "steps.json")
            for step, us in steps.items():
                rows.append(row(f"under uvicorn, {step}", name, [us * 1e-6]))
    return rows


if __name__ == "__main__":
    for r in run("--quick" in sys.argv):
        micro = r["seconds"] * 1e6
        ratio = f"  {r['ratio']:.2f}x {r['baseline']}" if r.get("ratio") else ""
        print(f"{r['workload']:38} {r['impl']:18} {micro:8.2f} µs{ratio}")
