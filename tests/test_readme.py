"""Every ```python block of README.md and docs/*.md runs as written.

Each block runs in a fresh namespace, so each must be complete on its own. A
block whose fence says ```python no-run is shown but not run (none is
allowed to be in README.md's Sans-IO loop section).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import binproto

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


def table(heading: str) -> list[list[str]]:
    """The body rows of the first Markdown table after README's ``heading``."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index(heading) :]
    # The lines of the first table: from its first row to the next blank line.
    first = section[section.index("\n|") + 1 :].split("\n\n", 1)[0].splitlines()
    rows = [r for r in first if r.startswith("|")]
    return [[c.strip() for c in r.strip("|").split("|")] for r in rows[2:]]


_SIZES = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def _default(text: str) -> float:
    number, _, unit = text.partition(" ")
    return float(number) * _SIZES.get(unit, 1)


def _over(field: str) -> tuple[binproto.Limits, bytes, int | None, str | None]:
    """A body that goes over ``field`` when it is set low, and how to decode it."""
    inputs: dict[str, Any] = {"x": np.zeros(1 << 19, dtype=np.float32)}
    encoding = None
    low: dict[str, Any] = {field: 1}
    if field == "max_tensors":
        inputs["y"] = np.zeros(2, dtype=np.float32)
    elif field == "max_json_depth":
        inputs = {"x": [[[[1.0]]]]}
    elif field in ("max_decompressed_bytes", "max_decompression_ratio"):
        encoding = "gzip"
        low = {field: 1000 if field == "max_decompressed_bytes" else 2}
    body = binproto.encode_request(inputs)
    wire = bytes(body)
    if encoding:
        wire = b"".join(binproto.compress_buffers(body.buffers, encoding))
    return binproto.Limits(**low), wire, body.header_length, encoding


def test_limits_table_matches_the_code() -> None:
    rows = table("## Limits")
    fields = {f.name for f in dataclasses.fields(binproto.Limits)}
    assert {r[0].strip("`") for r in rows} == fields
    defaults = binproto.Limits()
    for name, default, _, status in rows:
        field = name.strip("`")
        assert getattr(defaults, field) == _default(default), field
        limits, wire, header_length, encoding = _over(field)
        with pytest.raises(binproto.RemoteProtocolError) as exc:
            binproto.decode_request(
                wire, header_length=header_length, limits=limits, content_encoding=encoding
            )
        assert exc.value.status_hint == int(status), field


def test_datatype_table_matches_the_code() -> None:
    rows = table("## Datatypes")
    seen: set[str] = set()
    for names, sizes, _ in rows:
        for name, size in zip(names.split(", "), sizes.split(", "), strict=False):
            seen.add(name)
            itemsize = binproto.DATATYPES[name].itemsize
            if name == "BYTES":
                assert itemsize is None
            else:
                assert itemsize == int(size.split()[0]), name
    assert seen == set(binproto.DATATYPES)
