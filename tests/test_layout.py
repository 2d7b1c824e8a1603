"""The test suite's own layout: shared code lives in modules that are not tests."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _imported_modules(path: Path) -> list[str]:
    """The modules ``path`` imports, as written (``.test_x``, ``tests.test_x``)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            names.append(module)
            if node.module is None:  # from . import x
                names += ["." + alias.name for alias in node.names]
    return names


def test_no_test_module_imports_another() -> None:
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        for name in _imported_modules(path):
            if name.rsplit(".", 1)[-1].startswith("test_"):
                offenders.append(f"{path.relative_to(TESTS)} imports {name}")
    assert offenders == []


def test_the_check_finds_an_import_of_a_test_module(tmp_path: Path) -> None:
    # The check above can fail: each form of such an import is found.
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from .test_parser import FAULTS\nimport tests.test_asyncio\nfrom . import test_trio\n"
    )
    assert _imported_modules(bad) == [".test_parser", "tests.test_asyncio", ".", ".test_trio"]
