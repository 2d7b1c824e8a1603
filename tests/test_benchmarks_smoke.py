"""The benchmark runner works end to end in its tiny mode (a few KiB, one repeat).

No timing is asserted: only that every workload ran and reported sane fields.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import binproto
from benchmarks.bench_throughput import COMMANDS, running

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"

# Substrings of the workloads the runner itself and the parser module report.
EXPECTED = {
    "raw": ["memcpy", "loopback TCP"],
    "parser": [
        "parser only",
        "copy, preallocated",
        "copy, new memory",
        "decode whole body",
        "decode BYTES tensor",
        "decode 64 FP32 tensors",
    ],
}


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--tiny", "--json", str(out / "r.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data: dict[str, Any] = json.loads((out / "r.json").read_text())
    data["_dir"] = str(out)
    data["_stdout"] = proc.stdout
    return data


def _modules_present() -> set[str]:
    return {"raw"} | {p.stem.removeprefix("bench_") for p in BENCH.glob("bench_*.py")}


@pytest.mark.slow
def test_every_module_ran_without_error(report: dict[str, Any]) -> None:
    assert report["mode"] == "tiny"
    ran = {m["module"]: m for m in report["modules"]}
    assert set(ran) == _modules_present()
    for name, m in ran.items():
        assert "error" not in m, f"{name}: {m.get('error')}"
        assert m["peak_rss_bytes"] > 0
    groups = {r["group"] for r in report["rows"]}
    assert groups == set(ran), "every module must report at least one row"


def test_every_expected_workload_is_reported(report: dict[str, Any]) -> None:
    for group, names in EXPECTED.items():
        workloads = [r["workload"] for r in report["rows"] if r["group"] == group]
        for name in names:
            assert any(name in w for w in workloads), (group, name, workloads)


@pytest.mark.slow
def test_rows_have_sane_fields(report: dict[str, Any]) -> None:
    for r in report["rows"]:
        assert isinstance(r["workload"], str) and r["workload"]
        assert isinstance(r["impl"], str)
        if "seconds" in r:
            assert isinstance(r["seconds"], float) and math.isfinite(r["seconds"])
            assert r["seconds"] > 0
        if r.get("ratio") is not None:
            assert r["ratio"] > 0 and math.isfinite(r["ratio"])
            assert isinstance(r.get("baseline"), str)
        if r.get("met") is not None:
            assert isinstance(r["met"], bool)
            assert r.get("target"), "a met flag needs the target it refers to"
        if r.get("bytes") is not None:
            assert isinstance(r["bytes"], int) and r["bytes"] > 0
            assert r["gbps"] > 0
    # The parser rows compare against their baseline within the same run.
    parser = [r for r in report["rows"] if r["group"] == "parser"]
    compared = [r for r in parser if r.get("ratio") is not None]
    assert len(compared) >= 5
    raw = report["raw_gbps"]
    assert raw["memcpy"] > 0 and raw["socket"] > 0
    assert any(r.get("vs_raw") for r in parser)


def test_machine_is_recorded(report: dict[str, Any]) -> None:
    m = report["machine"]
    for key in ("cpu", "cores", "memory_bytes", "python", "numpy", "date"):
        assert m.get(key), key
    assert m["cores"] >= 1


def test_table_and_chart_are_written(report: dict[str, Any]) -> None:
    out = Path(report["_dir"])
    md = (out / "r.md").read_text()
    assert md.count("\n|") >= len(report["rows"])
    assert "memcpy" in report["_stdout"]
    if importlib.util.find_spec("matplotlib") is not None:
        png = (out / "r.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert "no chart" in report["_stdout"]


def test_readme_has_results_markers() -> None:
    text = (BENCH / "README.md").read_text()
    start = text.index("<!-- results:start -->")
    end = text.index("<!-- results:end -->")
    assert end > start


def test_replay_redraws_a_saved_run(report: dict[str, Any], tmp_path: Path) -> None:
    saved = Path(report["_dir"]) / "r.json"
    out = tmp_path / "again.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--replay", str(saved), "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = json.loads(out.read_text())
    assert again["rows"] == json.loads(saved.read_text())["rows"]
    assert (tmp_path / "again.md").read_text().count("\n|") == len(
        again["rows"]
    ) + 2  # header and rule


def test_the_benchmarks_readme_carries_the_results_block() -> None:
    from benchmarks.run import README_END, README_START

    text = (BENCH / "README.md").read_text()
    block = text[text.index(README_START) : text.index(README_END)]
    assert "| workload | impl |" in block
    assert "![benchmark chart](results/latest.png)" in block


def test_the_readme_has_no_commit_hashes_or_instruction_counts() -> None:
    from benchmarks.run import README_START

    text = (ROOT / "README.md").read_text()
    assert README_START not in text
    assert "instructions" not in text
    # A commit hash as the benchmarks quote them: 7 hex digits with a digit and a letter.
    hashes = [w for w in re.findall(r"\b[0-9a-f]{7,40}\b", text) if re.search(r"[a-f]", w)]
    assert not [w for w in hashes if re.search(r"[0-9]", w)], hashes


def test_update_readme_replaces_only_the_marked_block(tmp_path: Path) -> None:
    from benchmarks.run import README_END, README_START, update_readme

    page = tmp_path / "README.md"
    page.write_text(f"intro\n{README_START}\nold\n{README_END}\noutro\n")
    assert update_readme(page, "new")
    assert page.read_text() == f"intro\n{README_START}\nnew\n{README_END}\noutro\n"
    plain = tmp_path / "plain.md"
    plain.write_text("no markers\n")
    assert not update_readme(plain, "new") and plain.read_text() == "no markers\n"


@pytest.mark.parametrize(
    "mode",
    [
        "events",
        "next_event",
        "decode-binproto",
        "decode-tritonclient",
        "decode-json",
        "request-codec",
        "request-serve",
        "request-serve-new-heads",
        "request-serve-new-heads-none-kept",
        "request-asgi",
    ],
)
def test_instruction_count_loops_run_their_workload(mode: str) -> None:
    from benchmarks.instructions import loop

    # The streaming loops assert the parser reached DONE; the decode loops
    # look every tensor up (KeyError if one is missing); the request loops
    # check the echo, a response per request. No valgrind needed.
    loop(mode, 50)


def test_the_codec_floor_echoes_what_it_is_sent() -> None:
    """The ``h11-codec`` floor does the echo's whole work (decode, encode), or
    its request rate would bound nothing."""
    sent = np.arange(1024, dtype=np.float32)
    body = binproto.encode_request({"input0": sent}, binary_data_output=True)
    with running("h11-codec", COMMANDS["h11-codec"]) as port:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for _ in range(2):  # and again on the same connection
            conn.request(
                "POST",
                "/v2/models/echo/infer",
                body=bytes(body),
                headers=dict(binproto.message_headers(body.header_length, body.content_length)),
            )
            answer = conn.getresponse()
            data = answer.read()
            assert answer.status == 200
            hl = binproto.header_length_from(answer.getheaders())
            got = binproto.decode_response(data, header_length=hl).tensors["input0"]
            np.testing.assert_array_equal(got, sent)
        conn.close()


def test_the_trio_floor_answers_each_request_of_a_connection() -> None:
    """The ``h11-trio-floor`` reads each request whole and answers it, on
    one keep-alive connection, as the asyncio floor does."""
    body = binproto.encode_request({"input0": np.arange(1024, dtype=np.float32)})
    with running("h11-trio-floor", COMMANDS["h11-trio-floor"]) as port:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for _ in range(3):
            conn.request("POST", "/v2/models/echo/infer", body=bytes(body))
            answer = conn.getresponse()
            assert answer.status == 200 and answer.read() == b"x" * 4096
        conn.close()
        # A request that ends its connection, then a bad one: the server goes on.
        for headers in ({"Connection": "close"}, {"Content-Length": "x"}):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("POST", "/", body=b"{}", headers=headers)
            try:
                conn.getresponse().read()
            except (http.client.HTTPException, ConnectionError):
                pass  # the refused request gets no answer from a floor
            conn.close()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("POST", "/v2/models/echo/infer", body=bytes(body))
        assert conn.getresponse().read() == b"x" * 4096
        conn.close()


@pytest.mark.slow
def test_throughput_against_a_revision_runs_its_servers_in_the_same_rounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import shutil

    from benchmarks import bench_throughput
    from benchmarks._harness import MODE_ENV

    if shutil.which("wrk") is None:
        pytest.skip("wrk is not installed (apt-get install wrk)")
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    monkeypatch.setenv(MODE_ENV, "tiny")  # one floor and binproto's asyncio server, 1 s
    rows = bench_throughput.run(quick=True, against="HEAD")
    by_impl = {r["impl"]: r for r in rows}
    assert set(by_impl) == {"h11-floor", "binproto-asyncio", "binproto-asyncio@HEAD"}
    assert all(r["errors"] == 0 and r["rps"] > 0 for r in rows)
    assert by_impl["binproto-asyncio@HEAD"]["baseline"] == "h11-floor"
    assert by_impl["binproto-asyncio"]["vs_HEAD"] > 0
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True, check=True
    )
    assert "revision" not in listed.stdout  # the revision's worktree is gone
    with pytest.raises(RuntimeError, match="no worktree of 'no-such-revision'"):
        bench_throughput.run(quick=True, against="no-such-revision")
