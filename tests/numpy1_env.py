"""The numpy 1 environment, ``.venv-np1/``, that tests/test_numpy1.py runs
the core tests in (see tests/environments.py).

It holds numpy at the floor of pyproject.toml's dependencies, binproto with
its extras, tritonclient and the test extra's pytest. ``BINPROTO_NP1_VENV``
names another place.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from pathlib import Path

from .environments import ROOT, Unavailable, build

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
    "test_encode_bytes.py",
    "test_encode_foreign.py",
    "test_errors.py",
    "test_events.py",
    "test_fuzz_hypothesis.py",
    "test_header.py",
    "test_json_header.py",
    "test_limits.py",
    "test_parser.py",
    "test_parser_regions.py",
    "test_raw.py",
    "test_readers.py",
    "test_util.py",
    "test_writer.py",
)

#: Long tests of those files in which numpy plays no part (JSON text only).
NOT_NUMPY = ("test_json_header.py::test_orjson_and_the_standard_parser_agree_on_any_text",)

#: The oldest numpy 1 with wheels for a Python newer than the floor's.
#: numpy 1 has no wheels for Python 3.13 or later.
FIRST_NUMPY_FOR_PYTHON = {(3, 12): "1.26"}


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


def numpy1_environment() -> Path:
    """The Python of ``.venv-np1/``, built first when missing or out of date."""
    numpy = numpy_requirement()
    pyproject = (ROOT / "pyproject.toml").read_bytes()
    wanted = hashlib.sha256(pyproject + numpy.encode()).hexdigest()

    def requirements(source: Path) -> list[str]:
        # Only wheels for numpy: an old numpy built from source takes minutes.
        extras = [f"{source}[all]", "tritonclient[http]", *_test_requirements()]
        return ["--only-binary", "numpy", numpy, *extras]

    return build(VENV, wanted, requirements)
