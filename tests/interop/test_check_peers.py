"""``binproto check`` and ``binproto fuzz`` against real peers: KServe's server
and Triton. Their known faults are reported as failures, and nothing else."""

from __future__ import annotations

from binproto.cli._check import Outcome, load_context, run_check
from binproto.cli._fuzz import DEFAULT_INPUTS, fuzz
from binproto.cli._wire import Target, exchange

from .kserve_peer import KServePeer
from .triton_peer import DATATYPES, SINGLE_INPUT_MODEL, TritonPeer, model_name

#: What KServe's server (0.21) fails: 5xx for malformed sizes, shapes and
#: JSON (numpy and struct errors), client faults accepted (bytes after the
#: last tensor, BOOL bytes 2 and 255, a lower-case datatype, an absurd size),
#: Content-Encoding ignored, no BF16, a huge Content-Length waited for, and
#: no binary_tensor_data in /v2.
KSERVE_FAILS = {
    "binary-size-a-string",
    "binary-size-beyond-shape",
    "binary-size-huge",
    "binary-size-negative",
    "binary-size-short-of-shape",
    "body-shorter-than-sizes",
    "bool-byte-2",
    "bool-byte-255",
    "bytes-after-the-last-tensor",
    "bytes-fewer-elements-than-shape",
    "bytes-length-overruns",
    "bytes-more-elements-than-shape",
    "bytes-truncated-length-prefix",
    "content-length-huge",
    "datatype-bf16-binary",
    "datatype-lower-case",
    "gzip-label-plain-body",
    "header-length-not-a-number",
    "json-inputs-not-a-list",
    "json-not-an-object",
    "server-metadata",
    "shape-huge",
    "shape-over-uint64",
    "unknown-coding",
}
#: It takes no content coding: gzip and deflate bodies are refused (n/a).
KSERVE_NA = {"gzip-request", "deflate-request", "raw-single-input", "raw-several-inputs"}

#: What Triton accepts that a correct server refuses (docs/interop.md): BOOL
#: bytes other than 0 and 1, and invalid UTF-8 in the JSON.
TRITON_ACCEPTS = {"bool-byte-2", "bool-byte-255", "json-invalid-utf8"}


def _failed(outcomes: list[Outcome]) -> set[str]:
    return {o.id for o in outcomes if o.result == "fail"}


def test_check_kserve(kserve_server: KServePeer) -> None:
    target = Target(kserve_server.host, kserve_server.port)
    outcomes = run_check(target, load_context(target, ["echo"], 5), timeout=3, echo=True)
    assert _failed(outcomes) == KSERVE_FAILS
    assert {o.id for o in outcomes if o.result == "n/a"} == KSERVE_NA
    # Its 500s are numpy's and struct's errors, reported as server errors.
    fives = {o.id for o in outcomes if o.seen == "500"}
    assert {"binary-size-short-of-shape", "bytes-length-overruns"} <= fives


def test_fuzz_kserve_finds_its_500s(kserve_server: KServePeer) -> None:
    target = Target(kserve_server.host, kserve_server.port)
    report = fuzz(
        target,
        "echo",
        list(DEFAULT_INPUTS),
        seed=0,
        timeout=5,
        max_requests=150,
        encodings=(None,),
        reduce_budget=5,
    )
    five = report.findings["5xx"]
    assert five.reduced is not None
    assert exchange(target, five.reduced, 5).status == 500


def test_check_triton(triton: TritonPeer) -> None:
    target = Target(triton.host, triton.port)
    models = [*map(model_name, DATATYPES), SINGLE_INPUT_MODEL]
    outcomes = run_check(target, load_context(target, models, 10), timeout=10, echo=True)
    by_id = {o.id: o for o in outcomes}
    # Triton's known faults are failures: a 500 for a binary_data_size of the
    # wrong JSON type (docs/interop.md), and what it accepts.
    assert by_id["binary-size-a-string"].result == "fail"
    assert by_id["binary-size-a-string"].seen == "500"
    assert TRITON_ACCEPTS <= _failed(outcomes)
    # Every valid request is served right, raw ones too (its identity models
    # declare their inputs); BF16 has no model (the python backend has no BF16).
    valid = [o for o in outcomes if o.expect in ("accept", "coding", "listed")]
    assert [(o.id, o.seen, o.detail) for o in valid if o.result == "fail"] == []
    assert by_id["raw-single-input"].result == "pass"
    assert by_id["raw-several-inputs"].result == "pass"
    assert by_id["datatype-bf16-binary"].result == "n/a"


def test_fuzz_triton(triton: TritonPeer) -> None:
    target = Target(triton.host, triton.port)
    ctx = load_context(target, [model_name("FP32")], 10)
    report = fuzz(
        target,
        model_name("FP32"),
        list(ctx.models[0].inputs),
        seed=0,
        timeout=10,
        echo=True,
        max_requests=150,
        reduce_budget=5,
    )
    # Triton's faults are server errors and client faults accepted, nothing else.
    assert set(report.findings) <= {"5xx", "accepted-invalid"}
