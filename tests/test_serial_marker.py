"""A test marked ``serial`` runs while no other test does, under pytest-xdist."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

CONFTEST = "from tests.conftest import _serial_tests_run_alone  # noqa: F401\n"

# Each plain test leaves a file in RUNNING while it runs; the serial test
# looks for any, several times, and leaves its own file that they look for.
TESTS = """
import os, time
from pathlib import Path
import pytest

RUNNING = Path(os.environ["RUNNING"])

@pytest.mark.parametrize("n", range(8))
def test_plain(n):
    mine = RUNNING / f"plain-{n}"
    mine.touch()
    for _ in range(3):
        assert not (RUNNING / "serial").exists()
        time.sleep(0.1)
    mine.unlink()

@pytest.mark.serial
@pytest.mark.parametrize("n", range(2))
def test_serial(n):
    (RUNNING / "serial").touch()
    for _ in range(5):
        assert [p.name for p in RUNNING.iterdir()] == ["serial"]
        time.sleep(0.1)
    (RUNNING / "serial").unlink()
"""


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="the lock is flock(2)")
def test_serial_tests_run_alone_under_xdist(tmp_path: Path) -> None:
    pytest.importorskip("xdist")
    project = tmp_path / "project"
    project.mkdir()
    (project / "conftest.py").write_text(CONFTEST)
    (project / "test_lock.py").write_text(TESTS)
    running = tmp_path / "running"
    running.mkdir()
    env = {**os.environ, "RUNNING": str(running), "PYTHONPATH": str(ROOT)}
    env.pop("PYTEST_XDIST_WORKER", None)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
         "-m", "", "-o", "markers=serial", "--rootdir", str(project), str(project)],
        cwd=project, env=env, capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "10 passed" in result.stdout
