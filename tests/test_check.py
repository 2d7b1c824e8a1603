"""``binproto check`` against binproto's own servers: every MUST case passes."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from binproto.adapters._server import Model, V2Server, echo_model
from binproto.cli import main
from binproto.cli._cases import CASES
from binproto.cli._check import judge, load_context, run_check
from binproto.cli._wire import Reply, Request, Target

from .interop.binproto_servers import _identity, running_binproto_server
from .servers import running

#: Models that declare their inputs, so the raw-request cases apply.
SINGLE = Model(
    "single",
    _identity,
    inputs=[{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}],
    outputs=[{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1]}],
)
PAIR = Model(
    "pair",
    _identity,
    inputs=[
        {"name": "INPUT0", "datatype": "INT32", "shape": [-1]},
        {"name": "INPUT1", "datatype": "INT32", "shape": [-1]},
    ],
    outputs=[{"name": "OUTPUT0", "datatype": "INT32", "shape": [-1]}],
)


@pytest.fixture(scope="module")
def server() -> Iterator[Target]:
    app = V2Server([echo_model(), SINGLE, PAIR])
    with running("asyncio", app) as served:
        yield Target("127.0.0.1", served.port)


def test_case_ids_are_unique_and_levelled() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)) and len(ids) >= 70
    assert {c.level for c in CASES} == {"MUST", "SHOULD"}
    assert all(c.clause and c.summary for c in CASES)


@pytest.mark.parametrize(
    ("reply", "result"),
    [
        (Reply("answered", 400), "pass"),
        (Reply("closed"), "pass"),
        (Reply("reset"), "pass"),
        (Reply("closed", 200, body=b"half an answer"), "fail"),  # a 200 begun, then a close
        (Reply("closed", body=b"HTTP/1.1 2"), "fail"),  # closed mid-head
        (Reply("timeout"), "fail"),
    ],
)
def test_a_body_cut_short_may_be_refused_or_closed_on_but_not_half_answered(
    reply: Reply, result: str
) -> None:
    (case,) = [c for c in CASES if c.id == "truncated-body-then-eof"]
    assert judge(case, Request("/v2/models/echo/infer"), reply)[0] == result


def test_every_case_passes_against_binproto(server: Target, tmp_path: Path) -> None:
    ctx = load_context(server, ["echo", "single", "pair"], 5)
    assert [len(m.inputs) for m in ctx.models] == [0, 1, 2]
    outcomes = run_check(server, ctx, timeout=5, echo=True, out=tmp_path)
    assert {o.id for o in outcomes} == {c.id for c in CASES}
    bad = [(o.id, o.seen, o.detail) for o in outcomes if o.result != "pass"]
    assert bad == []
    # Each case left its request's bytes behind.
    assert all(Path(o.request_file).stat().st_size > 0 for o in outcomes)


@pytest.mark.parametrize("backend", ["asyncio-streams", "trio"])
def test_every_must_case_passes_on_each_backend(backend: str, tmp_path: Path) -> None:
    if backend == "trio":
        pytest.importorskip("trio")
    with running_binproto_server(backend) as port:
        target = Target("127.0.0.1", port)
        outcomes = run_check(target, load_context(target, ["echo"], 5), timeout=5, echo=True)
    results = {o.id: o.result for o in outcomes}
    assert {k for k, v in results.items() if v == "fail"} == set()
    # The echo model declares no inputs: a raw request cannot be made for it.
    assert {k for k, v in results.items() if v == "n/a"} == {
        "raw-single-input",
        "raw-several-inputs",
    }


def test_cli_reports_and_exit_status(
    server: Target, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report, page, out = tmp_path / "r.json", tmp_path / "r.html", tmp_path / "repro"
    argv = ["check", server.url, "--model", "echo", "--json", str(report), "--html", str(page)]
    assert main([*argv, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "valid-binary" in text and "0 failed" in text
    data = json.loads(report.read_text())
    assert data["summary"]["fail"] == 0 and data["server"]["name"] == "binproto"
    assert len(data["cases"]) == len(CASES)
    assert "<table>" in page.read_text() and "bool-byte-2" in page.read_text()
    # A model that does not exist cannot be checked, nor a server that is not
    # there: exit status 2.
    assert main(["check", server.url, "--model", "nope", "--out", str(out)]) == 2
    assert main(["check", "http://127.0.0.1:1", "--out", str(out)]) == 2


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_the_curl_reproducer_gets_the_same_status(server: Target, tmp_path: Path) -> None:
    ctx = load_context(server, ["echo"], 5)
    outcomes = run_check(
        server, ctx, only=["header-length-not-a-number", "valid-binary"], out=tmp_path
    )
    for o in outcomes:
        done = subprocess.run(o.curl, shell=True, capture_output=True, timeout=30, check=True)
        assert done.stdout.startswith(f"HTTP/1.1 {o.seen} ".encode()), (o.id, done.stdout[:80])


def test_every_case_is_documented_with_its_level_and_clause() -> None:
    doc = Path(__file__).resolve().parents[1] / "docs" / "testing.md"
    rows = [line for line in doc.read_text().splitlines() if line.startswith("| `")]
    for c in CASES:
        (row,) = [r for r in rows if f"`{c.id}`" in r]
        assert f"| {c.level} |" in row and c.clause.split(";")[0] in row, c.id
