"""The numpy 1 environment, ``.venv-np1/``, that tests/test_numpy1.py runs
the core tests in.

It holds numpy at the floor of pyproject.toml's dependencies, binproto with
its extras (installed from a copy of the checkout), tritonclient and the
test extra's pytest. ``BINPROTO_NP1_VENV`` names another place. It is
rebuilt when pyproject.toml changes. ``.ci/run`` builds it beside the main
install (``python3 -m tests.numpy1_env``); the tests wait for that build
through the same file lock.
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
from collections.abc import Sequence
from pathlib import Path

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


def main() -> None:
    """Build the environment; print where its Python is, or why it cannot be."""
    try:
        print(numpy1_environment())
    except Unavailable as exc:
        print(f"no numpy 1 environment ({VENV}): {exc}", file=sys.stderr)


if __name__ == "__main__":
    main()
