"""``binproto serve MODULE:ATTR``: the user's models, on many processes, or
under uvicorn. Real processes on a loopback port: connections spread over
the workers, SIGTERM stops them all, a worker that dies is replaced."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

import binproto

from .servers import answering_pids, gone

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


class Served:
    """A ``binproto serve`` process: its ``Popen`` and the port it serves on."""

    def __init__(self, proc: subprocess.Popen[str], port: int) -> None:
        self.proc = proc
        self.port = port
        self.url = f"http://127.0.0.1:{port}"

    def children(self) -> set[int]:
        """The worker processes' ids."""
        path = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        return {int(p) for p in path.read_text().split()} if path.exists() else set()


@contextlib.contextmanager
def serving(*args: str, env: dict[str, str] | None = None) -> Iterator[Served]:
    """``python -m binproto serve *args --port 0`` until the block ends."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    proc = subprocess.Popen(
        [sys.executable, "-m", "binproto", "serve", *args, "--port", "0"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # (its own group: cleaned up whole, whatever happens)
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, "no 'serving' line within 30 s"
        line = proc.stdout.readline()
        assert "serving V2 on http://127.0.0.1:" in line, line
        port = int(line.split("127.0.0.1:")[1].split()[0].rstrip("/"))
        served = Served(proc, port)
        _wait_ready(served)
        yield served
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def _wait_ready(served: Served) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(served.url + "/v2/health/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert served.proc.poll() is None, "the server exited"
        assert time.monotonic() < deadline, "not ready within 30 s"
        time.sleep(0.05)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_sixteen_connections_are_answered_by_several_workers_and_sigterm_stops_all(
    backend: str,
) -> None:
    with serving("tests.cli_models:MODELS", "--workers", "2", "--backend", backend) as served:
        workers = served.children()
        assert len(workers) == 2
        pids = answering_pids(served.port, 16)
        assert len(set(pids)) >= 2, pids
        assert set(pids) <= workers
        served.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        while not (served.proc.poll() is not None and all(map(gone, workers))):
            assert time.monotonic() < deadline, "workers still running 5 s after SIGTERM"
            time.sleep(0.05)
        assert served.proc.returncode == 0


def test_a_worker_that_dies_is_replaced() -> None:
    with serving("tests.cli_models:MODELS", "--workers", "2") as served:
        first = served.children()
        victim = min(first)
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while len(served.children() - {victim}) < 2:
            assert time.monotonic() < deadline, "no worker started in its place"
            time.sleep(0.05)
        _wait_ready(served)
        pids = answering_pids(served.port, 16)
        assert victim not in pids and set(pids) <= served.children()


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "binproto", "serve", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("tests.cli_models:NOT_MODELS", "must be a Model, a list of Model"),
        ("tests.cli_models:NOPE", "has no attribute 'NOPE'"),
        ("no_such_module_here:MODELS", "cannot import 'no_such_module_here'"),
        ("tests.cli_models", "models are named MODULE:ATTR"),
    ],
)
def test_what_is_not_models_is_one_line_and_status_2(spec: str, said: str) -> None:
    result = _run(spec, "--workers", "2", "--port", "0")
    assert result.returncode == 2
    assert said in result.stderr and "Traceback" not in result.stderr, result.stderr


@pytest.mark.parametrize("how", [(), ("--uvicorn",)], ids=["binproto", "uvicorn"])
def test_a_factory_of_models_is_served_and_an_unmade_output_is_400(how: tuple[str, ...]) -> None:
    if how:
        pytest.importorskip("uvicorn")
    with serving("tests.cli_models:make_models", *how) as served:
        body = binproto.encode_request({"x": np.zeros(1, np.float32)}, outputs=["z"])
        with httpx.Client(base_url=served.url, timeout=10) as client:
            r = client.post("/v2/models/pid/infer", content=bytes(body), headers=body.headers)
            assert (r.status_code, r.json()) == (
                400,
                {"error": "unexpected inference output 'z' for model 'pid'"},
            )
            assert client.get("/v2/models/echo").status_code == 404  # only the factory's
            pids = answering_pids(served.port, 2)
        assert set(pids) == {served.proc.pid}  # one process: the server itself
        served.proc.send_signal(signal.SIGTERM)
        served.proc.wait(5)


@pytest.mark.slow
def test_uvicorn_workers_serve_and_stop_on_sigterm() -> None:
    pytest.importorskip("uvicorn")
    with serving("tests.cli_models:MODELS", "--uvicorn", "--workers", "2") as served:
        deadline = time.monotonic() + 30
        while len(served.children()) < 2:
            assert time.monotonic() < deadline, "uvicorn's workers did not start"
            time.sleep(0.05)
        workers = served.children()
        pids = answering_pids(served.port, 16)
        assert set(pids) <= workers
        served.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while not (served.proc.poll() is not None and all(map(gone, workers))):
            assert time.monotonic() < deadline, "uvicorn's workers still running after SIGTERM"
            time.sleep(0.05)


def test_each_worker_calls_the_factory_and_the_parent_does_not(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    env = {"BINPROTO_TEST_CALLS": str(calls)}
    with serving("tests.cli_models:noting_models", "--workers", "2", env=env) as served:
        workers = served.children()
        deadline = time.monotonic() + 10
        while len(calls.read_text().split()) < 2:
            assert time.monotonic() < deadline, calls.read_text()
            time.sleep(0.05)
        callers = {int(p) for p in calls.read_text().split()}
        assert callers == workers and served.proc.pid not in callers
