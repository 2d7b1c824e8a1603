"""Every ```python block of README.md and docs/*.md runs as written.

The tables of limits and datatypes in docs/ are checked against the code.

Each block runs in a fresh namespace, so each must be complete on its own. A
block whose fence says ```python no-run is shown but not run (none is
allowed to be in README.md's Sans-IO loop section).
"""

from __future__ import annotations

import dataclasses
import json
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


def table(doc: str, heading: str) -> list[list[str]]:
    """The body rows of the first Markdown table after ``heading`` in ``doc``."""
    text = (ROOT / doc).read_text(encoding="utf-8")
    section = text[text.index(heading) :]
    # The lines of the first table: from its first row to the next blank line.
    first = section[section.index("\n|") + 1 :].split("\n\n", 1)[0].splitlines()
    rows = [r for r in first if r.startswith("|")]
    return [[c.strip() for c in r.strip("|").split("|")] for r in rows[2:]]


_SIZES = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def _default(text: str) -> float:
    # "64 MiB (Triton's HTTP input default)" or "1,048,576"
    number, _, unit = text.split(" (")[0].replace(",", "").partition(" ")
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
    elif field == "max_bytes_elements":
        inputs = {"s": np.array([b"a", b"b"], dtype=object)}
    elif field in ("max_decompressed_bytes", "max_decompression_ratio"):
        encoding = "gzip"
        low = {field: 1000 if field == "max_decompressed_bytes" else 2}
    body = binproto.encode_request(inputs)
    wire = bytes(body)
    if encoding:
        wire = b"".join(binproto.compress_buffers(body.buffers, encoding))
    return binproto.Limits(**low), wire, body.header_length, encoding


def test_limits_table_matches_the_code() -> None:
    rows = table("docs/limits-and-errors.md", "## Limits")
    fields = {f.name for f in dataclasses.fields(binproto.Limits)}
    assert {r[0].strip("`") for r in rows} == fields
    defaults = binproto.Limits()
    for name, default, _, status in rows:
        field = name.strip("`")
        assert getattr(defaults, field) == _default(default), field
        limits, wire, header_length, encoding = _over(field)
        with pytest.raises(binproto.RemoteProtocolError) as exc:
            decoded = binproto.decode_request(
                wire, header_length=header_length, limits=limits, content_encoding=encoding
            )
            if field == "max_json_output_elements":  # the encoder's: the echo as JSON
                binproto.encode_response(
                    decoded.tensors,
                    model_name="m",
                    request=decoded.header,
                    max_json_elements=limits.max_json_output_elements,
                )
        assert exc.value.status_hint == int(status), field


def test_datatype_table_matches_the_code() -> None:
    rows = table("docs/parser.md", "## Datatypes")
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


def _fault(kind: str) -> binproto.ProtocolError:
    """The error binproto raises for the fault ``kind`` of the errors table."""

    def decode(obj: Any, tail: bytes = b"", **options: Any) -> None:
        head = json.dumps(obj).encode()
        binproto.decode_request(head + tail, header_length=len(head), **options)

    def one(**fields: Any) -> dict[str, Any]:
        return {"inputs": [{"name": "a", "datatype": "FP32", "shape": [1], **fields}]}

    body = binproto.encode_request({"x": np.arange(6, dtype=np.float32).reshape(2, 3)})
    wire = bytes(body)
    attempts: dict[str, Any] = {
        "range": lambda: binproto.header_length_from(
            {"Inference-Header-Content-Length": "99"}, content_length=10
        ),
        "absurd": lambda: binproto.header_length_from(
            {"Inference-Header-Content-Length": str(2**62)}
        ),
        "shape": lambda: decode(one(shape=[-1], data=[1])),
        "datatype": lambda: decode(one(datatype="FP8", data=[1])),
        "duplicate": lambda: decode({"inputs": one(data=[1])["inputs"] * 2}),
        "neither": lambda: decode(one()),
        "size": lambda: decode(one(shape=[2], parameters={"binary_data_size": 4}), b"\0" * 4),
        "count": lambda: decode(one(shape=[2], data=[1])),
        "bytes": lambda: decode(
            one(datatype="BYTES", parameters={"binary_data_size": 6}), b"\x09\0\0\0ab"
        ),
        "bool": lambda: decode(
            one(datatype="BOOL", shape=[2], parameters={"binary_data_size": 2}), b"\x01\x07"
        ),
        "short": lambda: _short(wire, body.header_length),
        "extra": lambda: decode(one(data=[1]), b"zz"),
        "tensors": lambda: decode(
            {"inputs": [*one(data=[1])["inputs"], {**one(data=[1])["inputs"][0], "name": "b"}]},
            limits=binproto.Limits(max_tensors=1),
        ),
        "depth": lambda: decode(one(shape=[1], data=[1]), limits=binproto.Limits(max_json_depth=3)),
        "gzip": lambda: binproto.decode_request(
            b"".join(binproto.compress_buffers(body.buffers, "gzip"))[:-10],
            header_length=body.header_length,
            content_encoding="gzip",
        ),
        "br": lambda: binproto.decode_request(b"{}", header_length=None, content_encoding="br"),
    }
    with pytest.raises(binproto.ProtocolError) as exc:
        attempts[kind]()
    return exc.value


def _short(wire: bytes, header_length: int | None) -> None:
    parser = binproto.Parser("request", header_length=header_length)
    parser.receive_data(wire[:-3])
    parser.receive_data(b"")
    list(parser.events())


# (fault, the message as the errors table shows it; "..." ends a prefix)
ERRORS_TABLE = [
    ("range", "inference header size should be in range (0, 10), got: 99 ..."),
    ("absurd", "Inference-Header-Content-Length is absurdly large, got: ..."),
    ("shape", "Unable to parse 'shape' of input 'a': expected a list of non-negative integers"),
    ("datatype", "invalid datatype 'FP8' for input 'a'"),
    ("duplicate", "duplicate input name 'a'"),
    (
        "neither",
        "Input 'a' must set only one of the following fields: 'data', 'binary_data_size' in"
        " 'parameters', 'shared_memory_region' in 'parameters'. But no field is set",
    ),
    ("size", "unexpected total byte size 4 for input 'a', expecting 8 (2 FP32 elements)"),
    ("count", "unexpected number of elements in 'data' for input 'a': shape [2] holds 2, got 1"),
    (
        "bytes",
        "BYTES element 0 of input 'a' claims 9 bytes but only 2 remain in its binary_data_size",
    ),
    ("bool", "invalid BOOL value 7 for input 'a': expecting 0 or 1"),
    (
        "short",
        "unexpected size for input 'x', expecting 3 additional bytes"
        " (received 115 of 118 body bytes)",
    ),
    (
        "extra",
        "unexpected additional input data: the body has 2 bytes beyond the 0 bytes of binary data"
        " announced",
    ),
    ("tensors", "2 inputs exceed the limit of 1"),
    ("depth", "JSON nesting is 4 deep, deeper than the limit of 3"),
    ("gzip", "the compressed body ended before the end of its gzip stream ..."),
    (
        "br",
        "unsupported Content-Encoding 'br': supported are gzip, deflate, identity"
        " (Accept-Encoding: gzip, deflate)",
    ),
]


@pytest.mark.parametrize(("kind", "message"), ERRORS_TABLE, ids=[k for k, _ in ERRORS_TABLE])
def test_errors_table_messages_are_what_binproto_says(kind: str, message: str) -> None:
    text = " ".join((ROOT / "docs" / "limits-and-errors.md").read_text(encoding="utf-8").split())
    shown = message.removesuffix("...").rstrip()
    assert f"`{shown}" in text, "the table no longer shows this message"
    error = _fault(kind)
    if message.endswith("..."):
        assert error.msg.startswith(shown)
    else:
        assert error.msg == message


def test_the_readmes_test_command_is_what_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    command = 'pip install -e ".[test]" && python -m pytest -n auto'
    assert f"\n    {command}\n" in readme
    assert ci.rstrip().endswith(command)
