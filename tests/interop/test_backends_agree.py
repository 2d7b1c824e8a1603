"""binproto's own servers answer the differential table alike.

Each case of ``differential_cases.CASES`` (malformed and edge-case requests,
byte for byte) goes to the reference server with Triton's identity models on
every backend: asyncio receiving in place and through streams, trio receiving
in place and through streams, V2App under uvicorn, sent whole and in two writes with a pause
between them. A body taken whole and decoded at once, and one parsed as it
arrives, must meet the same checks: every backend and both ways give the same
status and the same bytes back (the answer, or the error's message), and none
a 5xx. Needs no Triton.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import httpx
import pytest

from .binproto_servers import running_identity_server
from .differential_cases import CASES, Case
from .triton_peer import DATATYPES, SINGLE_INPUT_MODEL, model_name

BACKENDS = ("asyncio", "asyncio-streams", "trio", "trio-streams", "uvicorn")


@pytest.fixture(scope="module")
def ports() -> Iterator[dict[str, int]]:
    pytest.importorskip("trio")
    models = [*map(model_name, DATATYPES), SINGLE_INPUT_MODEL]
    with contextlib.ExitStack() as stack:
        yield {b: stack.enter_context(running_identity_server(models, b)) for b in BACKENDS}


def _split(body: bytes) -> Iterator[bytes]:
    """The body in two writes, the second after a pause: the server has only
    the first part when it starts on the request, so it parses as it goes."""
    yield body[: len(body) // 2]
    time.sleep(0.005)
    yield body[len(body) // 2 :]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_every_backend_answers_alike(ports: dict[str, int], case: Case) -> None:
    headers = {
        "Content-Type": "application/octet-stream",
        "Content-Length": str(len(case.body)),
        **case.headers,
    }
    answers = {}
    for backend, port in ports.items():
        for how in ("whole", "split"):
            r = httpx.post(
                f"http://127.0.0.1:{port}/v2/models/{case.model}/infer",
                content=case.body if how == "whole" or len(case.body) < 2 else _split(case.body),
                headers=headers,
                timeout=60,
            )
            assert r.status_code < 500, (backend, how, r.text)
            answers[backend, how] = (r.status_code, r.content)
    assert len(set(answers.values())) == 1, answers
