"""Differential validation: the same malformed and edge-case requests to Triton
and to binproto's reference server (with the same identity models).

Both must accept a case or both refuse it, except for the cases listed in
``differential_cases.DIFFERENCES``, which must disagree as listed: a new
disagreement fails, and so does a listed one that went away. binproto never
answers a client's fault with a 5xx.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from .differential_cases import CASES, DIFFERENCES, Case
from .triton_peer import TritonPeer

DOC = Path(__file__).resolve().parents[2] / "docs" / "interop.md"


def send(port: int, case: Case) -> httpx.Response:
    """POST the case's body, as is, to the case's model on 127.0.0.1:port."""
    headers = {"Content-Type": "application/octet-stream", **case.headers}
    return httpx.post(
        f"http://127.0.0.1:{port}/v2/models/{case.model}/infer",
        content=case.body,
        headers=headers,
        timeout=60,
    )


def test_the_table_is_large_and_its_ids_unique() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) >= 60
    assert len(set(ids)) == len(ids)
    assert set(DIFFERENCES) <= set(ids)


def test_where_both_refuse_triton_answers_500_to_33_client_faults(
    triton: TritonPeer, binproto_identity: int
) -> None:
    # docs/interop.md's table of statuses: Triton's 500 where binproto says 400.
    pairs = [
        (send(triton.port, c).status_code, send(binproto_identity, c).status_code) for c in CASES
    ]
    assert pairs.count((500, 400)) == 33, sorted(set(pairs))


def test_every_listed_difference_is_documented() -> None:
    text = DOC.read_text()
    for case_id in DIFFERENCES:
        assert f"`{case_id}`" in text, case_id


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_triton_and_binproto_agree(triton: TritonPeer, binproto_identity: int, case: Case) -> None:
    theirs = send(triton.port, case)
    ours = send(binproto_identity, case)
    assert ours.status_code < 500, ours.text
    triton_accepts = theirs.status_code == 200
    binproto_accepts = ours.status_code == 200
    seen = (
        f"Triton {theirs.status_code} {theirs.text[:200]!r};"
        f" binproto {ours.status_code} {ours.text[:200]!r}"
    )
    if case.id in DIFFERENCES:
        assert triton_accepts != binproto_accepts, f"listed difference went away: {seen}"
        expected = DIFFERENCES[case.id]
        assert ("Triton accepts" in expected) == triton_accepts, seen
    else:
        assert triton_accepts == binproto_accepts, seen
    if binproto_accepts:
        assert ours.headers.get("content-type") in ("application/json", "application/octet-stream")
