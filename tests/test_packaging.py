"""binproto.adapters imports from a wheel, an editable install, the repo root,
and under mypy --strict; no top-level ``adapters`` package is ever installed."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: One worker builds the wheel once for both tests that read it.
pytestmark = pytest.mark.xdist_group("wheel")


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, check=False)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # Built from a copy: setuptools builds in the source's build/ folder, which
    # two test processes building at once would share.
    source = out / "source"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git",
            ".venv*",
            ".hypothesis",
            "build",
            "dist",
            "*.egg-info",
            "__pycache__",
            ".*_cache",
        ),
    )
    result = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "-q", "-w", str(out), str(source)],
        source,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (path,) = out.glob("binproto-*.whl")
    return path


def test_wheel_ships_adapters_inside_binproto(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "binproto/py.typed" in names
    assert "binproto/adapters/__init__.py" in names
    shipped = {n.split("/")[-1] for n in names if n.startswith("binproto/adapters/")}
    in_repo = {p.name for p in (ROOT / "binproto" / "adapters").glob("*.py")}
    assert in_repo <= shipped
    assert not [n for n in names if n.startswith(("adapters/", "tests/", "benchmarks/"))]


def test_wheel_imports_outside_the_repo(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    unpacked = zipfile.ZipFile(wheel)
    unpacked.extractall(target)
    code = "import binproto.adapters, binproto; print(binproto.adapters.__file__)"
    env_path = str(target)
    result = subprocess.run(
        [sys.executable, "-S", "-c", f"import sys; sys.path[:0] = [{env_path!r}] + "
         f"[p for p in {sys.path!r} if 'site-packages' in p]; {code}"],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith(str(target))


def test_import_from_repo_root_and_mypy_outside(tmp_path: Path) -> None:
    use = tmp_path / "use.py"
    use.write_text(
        "import binproto\nimport binproto.adapters\n\n"
        'p: binproto.Parser = binproto.Parser("request", header_length=None)\n'
    )
    result = _run([sys.executable, "-m", "mypy", "--strict", str(use)], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    result = _run([sys.executable, "-c", "import binproto.adapters"], ROOT)
    assert result.returncode == 0, result.stderr
