"""Static checks run as part of the suite: mypy --strict and ruff."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=False)


@pytest.mark.slow
def test_mypy_strict() -> None:
    targets = ["binproto", "tests"]
    targets += [p for p in ("benchmarks", "examples") if (ROOT / p).is_dir()]
    result = _run(sys.executable, "-m", "mypy", "--strict", *targets)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(
    shutil.which("ruff") is None and not (Path(sys.executable).parent / "ruff").exists(),
    reason="ruff is not installed",
)
def test_ruff_check_and_format() -> None:
    ruff = str(Path(sys.executable).parent / "ruff")
    if not Path(ruff).exists():
        ruff = shutil.which("ruff") or "ruff"
    check = _run(ruff, "check", ".")
    assert check.returncode == 0, check.stdout + check.stderr
    fmt = _run(ruff, "format", "--check", ".")
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def test_core_imports_no_io_library() -> None:
    code = (
        "import sys, binproto, binproto.adapters\n"
        "io_libs = {'asyncio', 'socket', 'trio', 'h11', 'httpx', 'selectors', 'ssl'}\n"
        "bad = io_libs & set(sys.modules)\n"
        "print(sorted(bad))\n"
    )
    result = _run(sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
