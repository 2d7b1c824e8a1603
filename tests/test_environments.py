"""``python -m tests.environments``, as .ci/run starts it beside its install."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.environments import ROOT


def _build(tmp_path: Path, *names: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "BINPROTO_NP1_VENV": str(tmp_path / "np1"),
        "PIP_CONFIG_FILE": os.devnull,  # no index, no extra links: nothing to install
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": "",
    }
    command = [sys.executable, "-m", "tests.environments", *names]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


@pytest.mark.skipif(sys.version_info >= (3, 13), reason="no numpy 1 to ask for")
def test_a_failed_build_says_why_and_lets_the_tests_retry(tmp_path: Path) -> None:
    done = _build(tmp_path, "numpy1")
    # Caught and told: the tests build it again and report the failure.
    assert done.returncode == 0, done.stderr
    assert "no numpy1 environment" in done.stderr and "No matching distribution" in done.stderr
    assert not (tmp_path / "np1" / "binproto.stamp").exists()


def test_an_unknown_environment_is_refused(tmp_path: Path) -> None:
    done = _build(tmp_path, "numpy3")
    assert done.returncode == 1
    assert "unknown environments ['numpy3']" in done.stderr and "'ray'" in done.stderr
