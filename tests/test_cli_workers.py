"""``binproto serve MODULE:ATTR``: the user's models, on many processes, or
under uvicorn. Real processes on a loopback port: connections spread over
the workers, SIGTERM stops them all, a worker that dies is replaced."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

import binproto
from binproto.cli import _serving

from .servers import answering_pids, gone, serve_command, wait_ready

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_sixteen_connections_are_answered_by_several_workers_and_sigterm_stops_all(
    backend: str,
) -> None:
    with serve_command("tests.cli_models:MODELS", "--workers", "2", "--backend", backend) as served:
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
    with serve_command("tests.cli_models:MODELS", "--workers", "2") as served:
        first = served.children()
        victim = min(first)
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while len(served.children() - {victim}) < 2:
            assert time.monotonic() < deadline, "no worker started in its place"
            time.sleep(0.05)
        wait_ready(served)
        pids = answering_pids(served.port, 16)
        assert victim not in pids and set(pids) <= served.children()


def test_workers_that_keep_dying_stop_the_server_with_status_1() -> None:
    # Each worker fails to make its models; past 3 deaths a worker within
    # 30 s the server stops, rather than start workers forever.
    done = _run("tests.cli_models:failing_models", "--workers", "2", "--port", "0")
    assert done.returncode == 1, done.stderr[-2000:]
    assert "workers keep exiting" in done.stderr
    assert done.stderr.count("starting another") == _serving.DEATHS_PER_WORKER * 2


def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_serving, "STOP_GRACE", 0.5)
    code = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)"
    code += "; print(flush=True); time.sleep(60)"
    stubborn = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert stubborn.stdout is not None and stubborn.stdout.readline()  # (ignoring by now)
    start = time.monotonic()
    _serving._stop([stubborn])
    assert stubborn.returncode == -signal.SIGKILL
    assert 0.5 <= time.monotonic() - start < 3


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
    with serve_command("tests.cli_models:make_models", *how) as served:
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
    with serve_command("tests.cli_models:MODELS", "--uvicorn", "--workers", "2") as served:
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
    with serve_command("tests.cli_models:noting_models", "--workers", "2", env=env) as served:
        workers = served.children()
        deadline = time.monotonic() + 10
        while len(calls.read_text().split()) < 2:
            assert time.monotonic() < deadline, calls.read_text()
            time.sleep(0.05)
        callers = {int(p) for p in calls.read_text().split()}
        assert callers == workers and served.proc.pid not in callers
