"""Without a package index the Ray tests skip, and fail under BINPROTO_REQUIRE_RAY."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _ray_tests(tmp_path: Path, require: bool) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "BINPROTO_RAY_VENV": str(tmp_path / "venv"),
        "PIP_CONFIG_FILE": os.devnull,  # no index, no extra links: nothing to install
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": "",
        "PYTHONPATH": str(ROOT),
    }
    env.pop("BINPROTO_REQUIRE_RAY", None)
    if require:
        env["BINPROTO_REQUIRE_RAY"] = "1"
    test = "tests/test_ray_serve.py::test_two_replicas_answer_through_the_proxy"
    command = [sys.executable, "-m", "pytest", "-q", "-rsf", "-p", "no:cacheprovider", test]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


@pytest.mark.parametrize("require", [False, True])
def test_no_package_index(tmp_path: Path, require: bool) -> None:
    done = _ray_tests(tmp_path, require)
    if require:
        assert done.returncode == 1, done.stdout
        assert "BINPROTO_REQUIRE_RAY is set but no Ray environment" in done.stdout
    else:
        assert done.returncode == 0, done.stdout
        assert "SKIPPED" in done.stdout and "no Ray environment" in done.stdout
    # The reason names the step that failed, and pip's own words.
    assert "pip install" in done.stdout and "No matching distribution" in done.stdout
