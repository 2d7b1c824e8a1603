"""The Ray Serve recipes: examples/ray_serve.py (V2App as a deployment behind
Ray's HTTP proxy, 2 replicas) and examples/ray_ingress.py (V2App under
uvicorn, arrays to 2 Ray replicas through the object store).

Ray pulls protobuf 7, which the test extra's kserve and grpcio-tools refuse.
So these tests run tests/ray_check.py in an environment of its own,
``.venv-ray/`` (tests/ray_env.py). Without a package index to build it they
skip, or fail when ``BINPROTO_REQUIRE_RAY`` is set (CI).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

import binproto
from tests.environments import ROOT, Unavailable
from tests.ray_env import VENV, ray_environment

# One worker runs them all: one Ray at a time, one build of its environment.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]

REQUIRE_RAY = "BINPROTO_REQUIRE_RAY"
SIZES_MIB = (64, 256)


@pytest.fixture(scope="module")
def ray_run() -> dict[str, Any]:
    """What tests/ray_check.py saw, run once in the Ray environment."""
    try:
        python = ray_environment()
    except Unavailable as exc:
        reason = f"no Ray environment ({VENV}): {exc}"
        if os.environ.get(REQUIRE_RAY):
            pytest.fail(f"{REQUIRE_RAY} is set but {reason}")
        pytest.skip(reason)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
    sizes = ",".join(map(str, SIZES_MIB))
    command: list[str | Path] = [python, ROOT / "tests" / "ray_check.py", "--sizes", sizes]
    try:  # about 45 s here, on 2 cores
        done = subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=300, cwd=ROOT
        )
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
        pytest.fail(f"tests/ray_check.py took over 300 s: {stderr[-4000:]}")
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(lines[-1])
    return result


@pytest.mark.parametrize("front", ["proxy", "ingress"])
def test_the_v2_routes(ray_run: dict[str, Any], front: str) -> None:
    assert ray_run[front]["routes"] == {
        "ready": {"ready": True},
        "metadata_name": "echo",
        "unknown_model": 404,
        "unknown_output": [400, {"error": "unexpected inference output 'z' for model 'echo'"}],
    }


@pytest.mark.parametrize("client", ["binproto", "tritonclient"])
@pytest.mark.parametrize("front", ["proxy", "ingress"])
def test_every_datatype(ray_run: dict[str, Any], front: str, client: str) -> None:
    assert ray_run[front][client] == sorted(binproto.DATATYPES)


def test_two_replicas_answer_through_the_proxy(ray_run: dict[str, Any]) -> None:
    assert ray_run["proxy"]["replicas_answering"] == 2


def test_big_tensors_come_back_whole(ray_run: dict[str, Any]) -> None:
    seconds = ray_run["echo_seconds"]
    assert sorted(seconds) == sorted(map(str, SIZES_MIB))
    for mib, row in seconds.items():
        assert sorted(row) == ["ingress", "proxy", "uvicorn"]
        # None: the echo came back different.
        assert all(s is not None for times in row.values() for s in times), (mib, row)
        print(f"{mib} MiB echo, seconds:", {front: times for front, times in row.items()})
    mib, took = ray_run["proxy"]["tritonclient_big"]
    assert (mib, took is not None) == (max(SIZES_MIB), True)


def test_the_ingress_passes_arrays_through_the_object_store(ray_run: dict[str, Any]) -> None:
    # Arrays that Ray reads from its object store are read-only views of it.
    assert ray_run["object_store"] == {
        "replica_reads_in_place": True,
        "ingress_reads_in_place": True,
        "same": True,
    }
