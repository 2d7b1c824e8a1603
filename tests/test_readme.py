"""Every ```python block of README.md and docs/*.md runs as written.

Each block runs in a fresh namespace, so each must be complete on its own. A
block whose fence says ```python no-run is shown but not run (none is
allowed to be in README.md's Sans-IO loop section).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```python([^\n]*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(path: Path) -> list[tuple[int, str, str]]:
    """(line number, fence flags, code) of each python block in ``path``."""
    text = path.read_text(encoding="utf-8")
    return [
        (text.count("\n", 0, m.start()) + 1, m.group(1).strip(), m.group(2))
        for m in FENCE.finditer(text)
    ]


CASES = [
    pytest.param(path, line, code, id=f"{path.name}:{line}")
    for path in DOCS
    for line, flags, code in blocks(path)
    if "no-run" not in flags.split()
]


@pytest.mark.parametrize(("path", "line", "code"), CASES)
def test_block_runs(path: Path, line: int, code: str) -> None:
    compiled = compile(code, f"{path.name}:{line}", "exec")
    exec(compiled, {"__name__": f"readme_block_{line}"})


def test_the_sans_io_loop_is_run() -> None:
    readme = ROOT / "README.md"
    text = readme.read_text(encoding="utf-8")
    start = text.index("## The Sans-IO loop")
    end = text.index("\n## ", start + 1)
    first, last = text.count("\n", 0, start) + 1, text.count("\n", 0, end) + 1
    section = [(flags, code) for line, flags, code in blocks(readme) if first < line < last]
    assert section, "the Sans-IO loop section has no python block"
    # Each is collected by test_block_runs: none is marked no-run.
    assert all("no-run" not in flags.split() for flags, _ in section)
    loop = section[0][1]
    for needed in ("binproto.Parser(", "receive_data(", ".events()", "TensorChunk", 'b""'):
        assert needed in loop
