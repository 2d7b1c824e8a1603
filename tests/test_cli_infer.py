"""``binproto infer`` against ``binproto serve``; ``binproto encode``'s
output flags; ``binproto inspect`` taking the kind from a status line."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from binproto.cli import main

from .servers import serve_command

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def served() -> Iterator[str]:
    """``binproto serve`` on a free port; yields its base URL."""
    with serve_command() as served:
        yield served.url


def _saved(tmp_path: Path, **arrays: np.ndarray[Any, Any]) -> list[str]:
    specs = []
    for name, array in arrays.items():
        path = tmp_path / f"{name}.npy"
        np.save(path, array)
        specs.append(f"{name}={path}")
    return specs


def test_infer_prints_a_table_and_saves_the_outputs(
    served: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3) + 0.5
    n = np.array([7, 8], dtype=np.int64)
    out = tmp_path / "out.npz"
    assert main(["infer", served, "echo", *_saved(tmp_path, x=x, n=n), "-o", str(out)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["output", "datatype", "shape", "bytes", "values"]
    assert table[1].split()[:2] == ["x", "FP32"] and "[2, 3]" in table[1]
    assert table[1].split("[2, 3]")[1].split()[0] == "24"
    assert table[1].rstrip().endswith("0.5, 1.5, 2.5, 3.5, 4.5, ...")
    assert table[2].split()[:2] == ["n", "INT64"] and table[2].rstrip().endswith("7, 8")
    with np.load(out) as saved:
        assert np.array_equal(saved["x"], x) and np.array_equal(saved["n"], n)


def test_infer_with_json_outputs_and_named_outputs(
    served: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    x = np.arange(3, dtype=np.int32)
    out = tmp_path / "out.npz"
    specs = _saved(tmp_path, x=x, y=x + 1)
    argv = ["infer", served, "echo", *specs, "--json-outputs", "--outputs", "y", "-o", str(out)]
    assert main(argv) == 0
    rows = capsys.readouterr().out.splitlines()
    assert len(rows) == 2 and rows[1].split()[:2] == ["y", "INT32"]
    with np.load(out) as saved:
        assert list(saved) == ["y"] and np.array_equal(saved["y"], x + 1)


def test_infer_reports_an_error_answer(
    served: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    specs = _saved(tmp_path, x=np.zeros(2))
    assert main(["infer", served, "nowhere", *specs]) == 1
    assert "the server answered HTTP 404" in capsys.readouterr().err
    assert main(["infer", "ftp://host", "echo", *specs]) == 2
    assert "http:// or https://" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "asked"),
    [([], None), (["--binary-outputs"], True), (["--json-outputs"], False)],
)
def test_encode_asks_for_outputs(
    tmp_path: Path, flags: list[str], asked: bool | None, capsys: pytest.CaptureFixture[str]
) -> None:
    body = tmp_path / "body"
    specs = _saved(tmp_path, x=np.zeros(2, np.float32))
    assert main(["encode", *specs, "--outputs", "y,z", *flags, "-o", str(body)]) == 0
    length = dict(
        line.split(": ") for line in capsys.readouterr().err.splitlines() if ": " in line
    )["Inference-Header-Content-Length"]
    header = json.loads(body.read_bytes()[: int(length)])
    assert [o["name"] for o in header["outputs"]] == ["y", "z"]
    assert header.get("parameters", {}).get("binary_data_output") == asked
    argv = ["encode", *specs, "--kind", "response", "--outputs", "y"]
    assert main(argv) == 2
    assert "are for a request" in capsys.readouterr().err


def _post(url: str, body: bytes, headers: dict[str, str], path: str) -> tuple[str, bytes]:
    """The response to a POST as ``curl -D`` saves it: the head, then the body."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("POST", path, body=body, headers=headers)
    response = conn.getresponse()
    data = response.read()
    conn.close()
    head = f"HTTP/1.1 {response.status} {response.reason}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in response.getheaders()) + "\r\n"
    return head, data


def test_inspect_takes_the_kind_from_a_saved_status_line(
    served: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    request, head_file = tmp_path / "request", tmp_path / "request.headers"
    specs = _saved(tmp_path, x=np.arange(4, dtype=np.float32))
    argv = ["encode", *specs, "--binary-outputs", "-o", str(request)]
    assert main([*argv, "--headers-out", str(head_file)]) == 0
    sent = dict(line.split(": ", 1) for line in head_file.read_text().splitlines())
    for path, status in (("/v2/models/echo/infer", 200), ("/v2/models/nowhere/infer", 404)):
        head, data = _post(served, request.read_bytes(), sent, path)
        (tmp_path / "h").write_text("HTTP/1.1 100 Continue\r\n\r\n" + head)
        (tmp_path / "b").write_bytes(data)
        capsys.readouterr()
        code = main(["inspect", str(tmp_path / "b"), "--headers", str(tmp_path / "h")])
        out, err = capsys.readouterr()
        if status == 200:
            assert code == 0 and "outputs:" in out and "FP32  shape [4]" in out
        else:
            assert code == 1 and "the saved response is HTTP 404" in err
            assert "nowhere" in err
    # A request's own head (a request line, or bare headers): still a request.
    assert main(["inspect", str(request), "--headers", str(head_file)]) == 0
    assert "inputs:" in capsys.readouterr().out
