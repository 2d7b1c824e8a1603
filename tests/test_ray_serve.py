"""The Ray Serve recipes: examples/ray_serve.py (V2App as a deployment behind
Ray's HTTP proxy, 2 replicas) and examples/ray_ingress.py (V2App under
uvicorn, arrays to 2 Ray replicas through the object store).

Ray pulls protobuf 7, which the test extra's kserve and grpcio-tools refuse.
So these tests build a virtual environment of their own, ``.venv-ray/`` in
the repository (``pip install -e ".[ray-test]"``, reused while
pyproject.toml is unchanged), and run tests/ray_check.py there. Without a
package index they skip, or fail when ``BINPROTO_REQUIRE_RAY`` is set (CI).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import binproto

# One worker runs them all: one Ray at a time, one build of its environment.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]

ROOT = Path(__file__).resolve().parent.parent
#: Where the environment lives; BINPROTO_RAY_VENV names another place.
VENV = Path(os.environ.get("BINPROTO_RAY_VENV") or ROOT / ".venv-ray")
#: Holds the hash of the pyproject.toml the environment was built from.
STAMP = VENV / "binproto-ray-test.stamp"
REQUIRE_RAY = "BINPROTO_REQUIRE_RAY"
SIZES_MIB = (64, 256)


class Unavailable(Exception):
    """The Ray environment cannot be built here."""


def _python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _run(command: Sequence[str | Path], timeout: float) -> None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unavailable(f"{' '.join(map(str, command))}: {exc}") from exc
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        errors = [line.strip() for line in lines if "ERROR:" in line] or lines[-5:]
        raise Unavailable(f"{' '.join(map(str, command))} exited {done.returncode}: {errors}")


def ray_environment() -> Path:
    """The Python of ``.venv-ray/``, built first when missing or out of date
    (by one process at a time: another would run it while it is rebuilt)."""
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.parent / ".venv-ray.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _built()


def _built() -> Path:
    wanted = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if _python().exists() and STAMP.exists() and STAMP.read_text() == wanted:
        return _python()
    shutil.rmtree(VENV, ignore_errors=True)
    _run([sys.executable, "-m", "venv", VENV], timeout=120)
    install: list[str | Path] = [
        _python(),
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
    ]
    _run([*install, "-e", f"{ROOT}[ray-test]"], timeout=1200)
    STAMP.write_text(wanted)
    return _python()


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
