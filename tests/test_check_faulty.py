"""``binproto check`` against a V2 server with one planted fault: exactly the
cases of that fault fail, and nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from binproto.cli import main
from binproto.cli._check import load_context, run_check
from binproto.cli._wire import Target

from .faulty_server import FAULTS, running_faulty_server

#: The cases each fault must fail (and only those).
EXPECTED = {
    "none": set(),
    "500-bad-header-length": {
        "header-length-negative",
        "header-length-not-a-number",
        "header-length-huge",
    },
    "bool-byte-2": {"bool-byte-2", "bool-byte-255"},
    # A body the JSON says is longer than Content-Length: the server waits on.
    "read-past-content-length": {"body-shorter-than-sizes", "binary-size-huge"},
    "hang-on-truncated": {"truncated-body-then-eof"},
    "json-outputs": {
        "binary-data-output-true",
        "output-binary-data-true",
        "bytes-binary-both-ways",
    },
    "bytes-prefix": {"bytes-binary-both-ways", "datatype-bytes-binary"},
    "501-unknown-coding": {"unknown-coding"},
}


def test_every_fault_has_its_expectation() -> None:
    assert set(EXPECTED) == set(FAULTS)


@pytest.mark.parametrize("fault", FAULTS)
def test_check_fails_exactly_the_planted_fault(fault: str) -> None:
    with running_faulty_server(fault) as port:
        target = Target("127.0.0.1", port)
        outcomes = run_check(target, load_context(target, ["echo"], 5), timeout=1.0, echo=True)
    failed = {o.id for o in outcomes if o.result == "fail"}
    assert failed == EXPECTED[fault]
    # A hang is reported as such, within the deadline.
    for o in outcomes:
        if o.seen == "timeout":
            assert 1.0 <= o.seconds < 4.0


def test_a_must_failure_fails_the_run(tmp_path: Path) -> None:
    with running_faulty_server("bool-byte-2") as port:
        argv = ["check", f"http://127.0.0.1:{port}", "--model", "echo", "--out", str(tmp_path)]
        assert main([*argv, "--case", "bool-*"]) == 1
        assert main([*argv, "--case", "valid-binary"]) == 0


def test_should_failures_fail_only_a_strict_run(tmp_path: Path) -> None:
    with running_faulty_server("501-unknown-coding") as port:
        argv = ["check", f"http://127.0.0.1:{port}", "--model", "echo", "--out", str(tmp_path)]
        assert main(argv) == 0
        assert main([*argv, "--strict"]) == 1
