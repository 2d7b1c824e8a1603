"""V2App under gunicorn with uvicorn workers: two worker processes answer
the V2 routes (an unmade output 400, as everywhere), and SIGTERM stops the
arbiter and its workers within 5 s."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

import binproto

from .servers import answering_pids, gone

pytest.importorskip("gunicorn")
pytest.importorskip("uvicorn_worker")
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

ROOT = Path(__file__).resolve().parent.parent


def test_v2app_under_gunicorn_with_uvicorn_workers() -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    argv = [sys.executable, "-m", "gunicorn", "tests.cli_models:app"]
    argv += ["-k", "uvicorn_worker.UvicornWorker", "-w", "2", "--bind", "127.0.0.1:0"]
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert proc.stderr is not None
        port = None
        deadline = time.monotonic() + 30
        while port is None:
            assert time.monotonic() < deadline, "gunicorn did not say where it listens"
            ready, _, _ = select.select([proc.stderr], [], [], 1)
            if ready:
                found = re.search(
                    r"Listening at: http://127\.0\.0\.1:(\d+)", proc.stderr.readline()
                )
                port = int(found.group(1)) if found else None
        url = f"http://127.0.0.1:{port}"
        children: set[int] = set()
        while len(children) < 2:
            assert time.monotonic() < deadline, "gunicorn's workers did not start"
            path = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
            children = {int(p) for p in path.read_text().split()}
            time.sleep(0.05)
        while True:
            try:
                if httpx.get(url + "/v2/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "not ready within 30 s"
            time.sleep(0.05)
        body = binproto.encode_request({"x": np.zeros(1, np.float32)}, outputs=["z"])
        r = httpx.post(url + "/v2/models/pid/infer", content=bytes(body), headers=body.headers)
        assert (r.status_code, r.json()) == (
            400,
            {"error": "unexpected inference output 'z' for model 'pid'"},
        )
        assert set(answering_pids(port, 16)) <= children
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        while not (proc.poll() is not None and all(map(gone, children))):
            assert time.monotonic() < deadline, "gunicorn still running 5 s after SIGTERM"
            time.sleep(0.05)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)
