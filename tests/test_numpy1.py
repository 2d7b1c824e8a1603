"""The core tests on numpy 1, the floor of pyproject.toml's dependencies.

The suite runs on numpy 2, the test extra's. numpy 1 stays covered here:
these tests run the core test files in ``.venv-np1/`` (tests/numpy1_env.py),
which has numpy at the floor. Without a package index to build it they
skip, or fail when ``BINPROTO_REQUIRE_NUMPY1`` is set (CI).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests import numpy1_env
from tests.environments import ROOT, Unavailable
from tests.numpy1_env import (
    CORE_TESTS,
    NOT_NUMPY,
    REQUIRE_NUMPY1,
    numpy1_environment,
    numpy_floor,
    numpy_requirement,
)


def _child_env() -> dict[str, str]:
    """This environment without what would point the child at another
    Python's packages, or make it think it is an xdist worker."""
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTEST_ADDOPTS")
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("PYTEST_")}


@pytest.fixture(scope="module")
def python() -> Path:
    """The numpy 1 environment's Python; skipped (or failed in CI) without one."""
    if sys.version_info >= (3, 13):
        pytest.skip("numpy 1 has no wheels for Python 3.13 or later")
    try:
        return numpy1_environment()
    except Unavailable as exc:
        reason = f"no numpy 1 environment ({numpy1_env.VENV}): {exc}"
        if os.environ.get(REQUIRE_NUMPY1):
            pytest.fail(f"{REQUIRE_NUMPY1} is set but {reason}")
        pytest.skip(reason)


@pytest.mark.slow
@pytest.mark.xdist_group("numpy1")  # one worker builds the environment and runs both
def test_the_environment_imports_numpy_1_and_the_installed_binproto(
    python: Path, tmp_path: Path
) -> None:
    code = "import numpy, binproto; print(numpy.__version__, binproto.__file__)"
    done = subprocess.run(
        [python, "-c", code], capture_output=True, text=True, env=_child_env(), cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    version, where = done.stdout.split()
    wanted = numpy_requirement().removeprefix("numpy==").removesuffix("*")
    assert version.startswith(wanted), version
    assert Path(where).is_relative_to(numpy1_env.VENV), where


@pytest.mark.slow
@pytest.mark.xdist_group("numpy1")  # one worker builds the environment and runs both
def test_the_core_tests_pass_on_numpy_1(python: Path, tmp_path: Path) -> None:
    report = tmp_path / "report.xml"
    files = [ROOT / "tests" / name for name in CORE_TESTS]
    # --import-mode=append puts the checkout after site-packages: the tests
    # import the binproto installed in the environment, not the checkout's.
    command: list[str | Path] = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    command += ["-c", ROOT / "pyproject.toml", "--rootdir", ROOT, "--import-mode=append"]
    command += ["-o", "addopts=-ra", f"--junitxml={report}", *files]
    command += [f"--deselect=tests/{test}" for test in NOT_NUMPY]
    done = subprocess.run(
        command, capture_output=True, text=True, env=_child_env(), cwd=tmp_path, timeout=600
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    # Every file ran tests that passed: none was skipped whole.
    passed: dict[str, int] = {}
    for case in ET.parse(report).iter("testcase"):
        if not list(case):  # no <skipped>, <failure> or <error>
            name = case.get("classname", "").split(".")[1] + ".py"  # tests.<module>[.Class]
            passed[name] = passed.get(name, 0) + 1
    assert sorted(passed) == sorted(CORE_TESTS), sorted(set(CORE_TESTS) - set(passed))
    print(f"numpy 1: {sum(passed.values())} tests passed in {len(passed)} files")


def test_numpy_at_the_floor_or_the_first_with_wheels() -> None:
    floor = numpy_floor()
    assert re.fullmatch(r"1\.[0-9]+", floor), floor
    assert numpy_requirement((3, 10)) == numpy_requirement((3, 11)) == f"numpy=={floor}.*"
    # numpy 1.24 and 1.25 have no wheels for Python 3.12.
    assert numpy_requirement((3, 12)) == "numpy==1.26.*"


def test_no_numpy_1_past_python_3_12() -> None:
    with pytest.raises(Unavailable, match=r"no wheels for Python 3\.13"):
        numpy_requirement((3, 13))


@pytest.mark.skipif(sys.version_info >= (3, 13), reason="no numpy 1 to ask for")
def test_without_a_package_index_pip_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(numpy1_env, "VENV", tmp_path / "venv")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    with pytest.raises(Unavailable) as raised:
        numpy1_environment()
    # The reason names the step that failed, and pip's own words.
    assert "pip install" in str(raised.value) and "No matching distribution" in str(raised.value)
    assert not (tmp_path / "venv" / "binproto.stamp").exists()
