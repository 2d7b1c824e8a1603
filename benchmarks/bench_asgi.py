"""ASGI server workload: a 256 MiB FP32 echo through the FastAPI + binproto example
versus KServe's own server, in the same run.

Both servers run in their own process on 127.0.0.1 (the example app under
uvicorn; a ``kserve.ModelServer`` REST app with an echo model), started side by
side and called in alternation by the same client (binproto's httpx helper,
which asks for binary outputs). Each round trip sends the tensor and gets it
back: the time is the whole round trip. Each server's peak RSS (``VmHWM``) is
read after every request it served, and reported as a multiple of the payload,
both absolute and above the server's idle RSS: the echo must hold the tensor
once, so a server that makes no extra full copy stays near 1x above idle.
"""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np

from binproto.adapters import httpx as bphttpx
from tests.example_server import EXAMPLE, KSERVE_ECHO, run_server_script

from ._harness import Row, interleave, mode, pick, row

MiB = 1 << 20


def _call(client: httpx.Client, tensor: np.ndarray[Any, Any]) -> None:
    result = bphttpx.infer(client, "echo", {"input0": tensor})
    out = result.tensors["input0"]
    if out.shape != tensor.shape or out[-1] != tensor[-1] or out[0] != tensor[0]:
        raise AssertionError("the echo came back different")


def run(quick: bool) -> list[Row]:
    """Time the echo round trip on both servers; report their peak RSS."""
    current = mode(quick)
    payload = pick(current, full=256 * MiB, quick=32 * MiB, tiny=64 * 1024)
    repeats = pick(current, full=2, quick=3, tiny=1)
    tensor = np.full(payload // 4, 1.5, dtype=np.float32)
    tensor[::1024] = np.arange(tensor[::1024].size, dtype=np.float32)

    with (
        run_server_script(EXAMPLE, quiet=True) as ours,
        run_server_script(KSERVE_ECHO, "--model", "echo", quiet=True) as kserve,
        httpx.Client(base_url=ours.url, timeout=600) as ours_client,
        httpx.Client(base_url=kserve.url, timeout=600) as kserve_client,
    ):
        idle = {"binproto": ours.status("VmRSS"), "kserve": kserve.status("VmRSS")}
        times = interleave(
            {
                "binproto": lambda: _call(ours_client, tensor),
                "kserve": lambda: _call(kserve_client, tensor),
            },
            repeats,
            warmup=current != "full",  # at full size a warm-up round costs a minute
        )
        peak = {"binproto": ours.status("VmHWM"), "kserve": kserve.status("VmHWM")}

    def memory(name: str) -> dict[str, Any]:
        return {
            "server_idle_rss": idle[name],
            "server_peak_rss": peak[name],
            "server_peak_over_payload": peak[name] / payload,
            "server_extra_over_payload": (peak[name] - idle[name]) / payload,
        }

    workload = f"asgi_echo_fp32_{payload // MiB}MiB" if payload >= MiB else "asgi_echo_fp32_tiny"
    ours_extra = (peak["binproto"] - idle["binproto"]) / payload
    return [
        row(
            workload,
            "binproto-fastapi",
            times["binproto"],
            nbytes=2 * payload,
            baseline="kserve",
            baseline_samples=times["kserve"],
            payload_bytes=payload,
            target="server peak RSS above idle <= 1.5x payload",
            met=bool(ours_extra <= 1.5) if current != "tiny" else None,
            **memory("binproto"),
        ),
        row(
            workload,
            "kserve",
            times["kserve"],
            nbytes=2 * payload,
            payload_bytes=payload,
            **memory("kserve"),
        ),
    ]


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(run("--quick" in sys.argv[1:]), indent=1, default=str))
