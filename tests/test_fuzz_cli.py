"""``binproto fuzz``: finds planted faults fast, nothing in binproto's servers,
and replays by seed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from binproto import TensorSpec
from binproto.adapters.server import InferenceError, InferRequest, Model, V2Server
from binproto.cli import main
from binproto.cli._fuzz import DEFAULT_INPUTS, _agree, fuzz, parse_duration
from binproto.cli._wire import Reply, Request, Target, exchange

from .fakes import ScriptedServer
from .faulty_server import running_faulty_server
from .interop.binproto_servers import running_binproto_server
from .servers import running

SPECS = list(DEFAULT_INPUTS)


def test_durations() -> None:
    assert [parse_duration(t) for t in ("60", "60s", "500ms", "2m", "1.5h")] == [
        60,
        60,
        0.5,
        120,
        5400,
    ]


@pytest.mark.slow
def test_finds_the_500_and_the_hang_and_reduces_them(tmp_path: Path) -> None:
    with running_faulty_server("500-bad-header-length", "hang-on-truncated") as port:
        target = Target("127.0.0.1", port)
        report = fuzz(
            target,
            "echo",
            SPECS,
            duration=60,
            seed=0,
            timeout=0.5,
            out=tmp_path,
            # Room in any xdist worker: a seed's draws depend on the imported
            # modules (see test_cli_exit_status_and_findings).
            max_requests=200,
            reduce_budget=2,
        )
        assert set(report.findings) == {"5xx", "hang"}
        five = report.findings["5xx"]
        assert five.seen == "500" and five.reduced is not None
        assert len(five.reduced.body) <= len(five.request.body)
        # The reduced reproducer, sent again, is still a 500.
        assert exchange(target, five.reduced, 5).status == 500
        hang = report.findings["hang"]
        assert hang.seen == "timeout" and hang.request.end_input
    saved = json.loads((tmp_path / f"5xx-{five.index}.json").read_text())
    assert saved["seed"] == 0 and saved["kind"] == "5xx" and saved["curl"].startswith("curl ")
    assert ("replay" in saved) == five.reduced.end_input
    # A request cut short is replayed as written, then the client's side ended.
    assert hang.reduced is not None and hang.reduced.end_input
    replay = json.loads((tmp_path / f"hang-{hang.index}.json").read_text())["replay"]
    wire = tmp_path / f"hang-{hang.index}.reduced.http"
    assert replay == f"nc -N 127.0.0.1 {port} < {wire}"
    assert wire.read_bytes() == hang.reduced.wire(target)
    assert Path(five.files[0]).read_bytes().startswith(b"POST /v2/models/echo/infer HTTP/1.1")


def test_a_seed_replays_the_same_requests() -> None:
    def run(seed: int) -> list[tuple[str, int, bytes]]:
        with running_faulty_server("500-bad-header-length") as port:
            target = Target("127.0.0.1", port)
            report = fuzz(
                target, "echo", SPECS, seed=seed, timeout=2, max_requests=80, reduce_budget=0
            )
        return [(k, f.index, f.request.body) for k, f in sorted(report.findings.items())]

    first = run(3)
    assert first and first == run(3)
    assert run(4) != first


@pytest.mark.parametrize("other", ["trio", "uvicorn"])
def test_nothing_found_in_binproto_echo_server_on_two_backends(other: str) -> None:
    # uvicorn takes a client's half-close for a disconnect and closes, where
    # binproto's own servers answer 400: either is right for a body cut short.
    pytest.importorskip(other)
    with running_binproto_server("asyncio") as a, running_binproto_server(other) as b:
        report = fuzz(
            Target("127.0.0.1", a),
            "echo",
            SPECS,
            seed=1,
            timeout=5,
            echo=True,
            against=Target("127.0.0.1", b),
            max_requests=300,
            reduce_budget=1,
        )
    assert report.requests == 300
    assert report.findings == {}
    assert report.seen.get("200", 0) > 50 and report.seen.get("4xx", 0) > 50


REFUSED = Reply("answered", 400)


@pytest.mark.parametrize(
    ("theirs", "agree"),
    [
        (Reply("closed"), True),
        (Reply("reset"), True),
        (Reply("answered", 413), True),
        (Reply("answered", 200), False),
        (Reply("answered", 500), False),
        (Reply("timeout"), False),
        (Reply("closed", 200, body=b"half a body"), False),  # a 200 head, then a close
        (Reply("closed", body=b"HTTP/1.1 4"), False),  # closed mid-head
    ],
)
def test_on_a_body_cut_short_refusals_and_silent_ends_agree(theirs: Reply, agree: bool) -> None:
    assert _agree(REFUSED, theirs, "refuse-or-close") is agree
    assert _agree(theirs, REFUSED, "refuse-or-close") is agree
    # A silent end stands for a refusal too: it agrees where the 4xx does.
    for silent in (Reply("closed"), Reply("reset")):
        assert _agree(silent, theirs, "refuse-or-close") is agree


def test_on_a_whole_body_a_refusal_and_a_close_disagree() -> None:
    assert not _agree(REFUSED, Reply("closed"), "refuse")
    assert _agree(REFUSED, Reply("answered", 413), "refuse")


@pytest.mark.parametrize(
    ("steps", "unanswered"),
    [
        (["close"], True),
        (["reset"], True),
        ([b"HTTP/1.1 400 Bad", "close"], False),
        ([b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nhalf", "close"], False),
        ([b"SSH-2.0\r\n\r\n", "close"], False),
    ],
)
def test_an_end_is_unanswered_only_before_any_byte(
    steps: list[bytes | str], unanswered: bool
) -> None:
    with ScriptedServer([steps]) as server:
        reply = exchange(Target("127.0.0.1", server.port), Request("/v2", body=b"{}"), 5)
    assert reply.outcome in ("closed", "reset")
    assert reply.unanswered is unanswered


def test_an_answer_past_the_bound_is_not_unanswered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("binproto.cli._wire.MAX_ANSWER", 16)
    with ScriptedServer([[b"x" * (1 << 17), "close"]]) as server:
        reply = exchange(Target("127.0.0.1", server.port), Request("/v2", body=b"{}"), 5)
    assert reply.outcome == "closed" and "longer than" in reply.detail
    assert not reply.unanswered


async def _refuse(request: InferRequest) -> dict[str, object]:
    raise InferenceError("refused")


def test_a_disagreement_on_a_valid_request_is_reduced() -> None:
    # Every valid request: 200 here, 400 there. Its reproducer is sent in one
    # write, as the reduction makes it, and still gets both answers.
    refuses = V2Server([Model("echo", _refuse)])
    with running_binproto_server("asyncio") as a, running("asyncio", refuses) as b:
        here, there = Target("127.0.0.1", a), Target("127.0.0.1", b.port)
        report = fuzz(here, "echo", SPECS, seed=2, timeout=5, against=there, max_requests=60)
        found = report.findings["disagreement"]
        assert found.detail == "200 here, 400 there"
        assert found.reduced is not None
        assert found.reduced.segments == () and not found.reduced.chunked
        assert exchange(here, found.reduced, 5).status == 200
        assert exchange(there, found.reduced, 5).status == 400


def test_against_reports_a_disagreement() -> None:
    bools = [TensorSpec("flags", "BOOL", [-1])]
    with running_binproto_server("asyncio") as good, running_faulty_server("bool-byte-2") as bad:
        report = fuzz(
            Target("127.0.0.1", good),
            "echo",
            bools,
            seed=0,
            timeout=5,
            against=Target("127.0.0.1", bad),
            max_requests=400,
            reduce_budget=1,
        )
    assert set(report.findings) == {"disagreement"}
    assert report.findings["disagreement"].detail.startswith("4")  # (binproto refused)


def test_cli_exit_status_and_findings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with running_binproto_server("asyncio") as port:
        argv = ["fuzz", f"http://127.0.0.1:{port}", "--model", "echo", "--echo"]
        assert main([*argv, "--max-requests", "40", "--out", str(tmp_path / "a")]) == 0
    assert "no findings" in capsys.readouterr().out
    with running_faulty_server("500-bad-header-length") as port:
        argv = ["fuzz", f"http://127.0.0.1:{port}", "--model", "echo", "--seed", "0"]
        # Hypothesis also draws constants from the modules the process has
        # imported, so a seed's requests differ between pytest-xdist workers:
        # room for the bad header length to come up in any of them.
        assert main([*argv, "--max-requests", "400", "--out", str(tmp_path / "b")]) == 1
    out = capsys.readouterr().out
    assert "FINDING 5xx" in out and str(tmp_path / "b") in out
