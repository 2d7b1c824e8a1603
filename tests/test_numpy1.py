"""The core tests on numpy 1, the floor of pyproject.toml's dependencies.

The suite runs on numpy 2, the test extra's. numpy 1 stays covered here:
this test builds ``.venv-np1/`` in the repository (``BINPROTO_NP1_VENV``
names another place) with numpy at the floor, installs binproto there with
its extras, and runs the core test files in it. The environment is reused
while pyproject.toml is unchanged. Without a package index the test skips,
or fails when ``BINPROTO_REQUIRE_NUMPY1`` is set (CI).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("BINPROTO_NP1_VENV") or ROOT / ".venv-np1")
REQUIRE_NUMPY1 = "BINPROTO_REQUIRE_NUMPY1"

#: The core's test files: no server, no real peer.
CORE_TESTS = (
    "test_assembler.py",
    "test_bytes.py",
    "test_compression.py",
    "test_cost_limits.py",
    "test_datatypes.py",
    "test_decode.py",
    "test_encode.py",
    "test_encode_foreign.py",
    "test_errors.py",
    "test_events.py",
    "test_fuzz_hypothesis.py",
    "test_header.py",
    "test_json_header.py",
    "test_limits.py",
    "test_parser.py",
    "test_raw.py",
    "test_readers.py",
    "test_util.py",
    "test_writer.py",
)

#: The oldest numpy 1 with wheels for a Python newer than the floor's.
#: numpy 1 has no wheels for Python 3.13 or later.
FIRST_NUMPY_FOR_PYTHON = {(3, 12): "1.26"}


class Unavailable(Exception):
    """The numpy 1 environment cannot be built here."""


def numpy_floor() -> str:
    """The lowest numpy that pyproject.toml's dependencies allow: ``1.24``."""
    text = (ROOT / "pyproject.toml").read_text()
    found = re.search(r'^dependencies = \[.*"numpy>=([0-9.]+)"', text, re.MULTILINE)
    assert found, "pyproject.toml's dependencies name no numpy floor"
    return found.group(1)


def numpy_requirement(python: tuple[int, int] = sys.version_info[:2]) -> str:
    """The numpy 1 to install for ``python``: the floor, or the first numpy 1
    with wheels for it (``numpy==1.24.*``)."""
    if python >= (3, 13):
        raise Unavailable(f"numpy 1 has no wheels for Python {python[0]}.{python[1]}")
    floor = numpy_floor()
    first = FIRST_NUMPY_FOR_PYTHON.get(python, floor)
    version = max(floor, first, key=lambda v: tuple(map(int, v.split("."))))
    return f"numpy=={version}.*"


def _test_requirements() -> list[str]:
    """The test extra's pytest requirements (the version pins as they are)."""
    text = (ROOT / "pyproject.toml").read_text()
    return re.findall(r'^\s*"(pytest[a-z-]*[^";]*)",', text, re.MULTILINE)


def _python() -> Path:
    return VENV / "bin" / "python"


def _run(command: Sequence[str | Path], timeout: float) -> None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unavailable(f"{' '.join(map(str, command))}: {exc}") from exc
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        errors = [line.strip() for line in lines if "ERROR:" in line] or lines[-5:]
        raise Unavailable(f"{' '.join(map(str, command))} exited {done.returncode}: {errors}")


def numpy1_environment() -> Path:
    """The Python of ``.venv-np1/``, built first when missing or out of date
    (by one process at a time)."""
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.parent / f"{VENV.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _built()


def _built() -> Path:
    numpy = numpy_requirement()
    pyproject = (ROOT / "pyproject.toml").read_bytes()
    wanted = hashlib.sha256(pyproject + numpy.encode()).hexdigest()
    stamp = VENV / "binproto-np1.stamp"  # the hash of what it was built from
    if _python().exists() and stamp.exists() and stamp.read_text() == wanted:
        return _python()
    shutil.rmtree(VENV, ignore_errors=True)
    _run([sys.executable, "-m", "venv", VENV], timeout=120)
    # Installed from a copy: a build writes into its source folder, which
    # another environment's build may be using at the same time.
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "binproto"
        shutil.copytree(ROOT / "binproto", source / "binproto")
        for name in ("pyproject.toml", "README.md", "LICENSE"):
            shutil.copy2(ROOT / name, source / name)
        install: list[str | Path] = [_python(), "-m", "pip", "install", "--quiet"]
        # Only wheels for numpy: an old numpy built from source takes minutes.
        install += ["--disable-pip-version-check", "--only-binary", "numpy", numpy]
        install += [f"{source}[all]", "tritonclient[http]", *_test_requirements()]
        _run(install, timeout=1200)
    stamp.write_text(wanted)
    return _python()


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
        reason = f"no numpy 1 environment ({VENV}): {exc}"
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
    assert Path(where).is_relative_to(VENV), where


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
    monkeypatch.setattr(sys.modules[__name__], "VENV", tmp_path / "venv")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    with pytest.raises(Unavailable) as raised:
        numpy1_environment()
    # The reason names the step that failed, and pip's own words.
    assert "pip install" in str(raised.value) and "No matching distribution" in str(raised.value)
    assert not (tmp_path / "venv" / "binproto-np1.stamp").exists()
