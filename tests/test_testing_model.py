"""The strategies for one model: valid requests are answered 200 with the
same tensors by binproto's echo server, mutated ones 4xx."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import binproto
from binproto.cli._wire import Request, Target, exchange
from binproto.testing import (
    MODEL_MUTATIONS,
    Body,
    invalid_model_requests,
    model_inputs,
    model_requests,
)

from .interop.binproto_servers import running_binproto_server

METADATA = {
    "name": "m",
    "inputs": [
        {"name": "x", "datatype": "FP32", "shape": [-1, 3]},
        {"name": "flags", "datatype": "BOOL", "shape": [2]},
        {"name": "text", "datatype": "BYTES", "shape": [-1]},
        {"name": "half", "datatype": "FP16", "shape": [-1]},
        {"name": "n", "datatype": "INT64", "shape": []},
    ],
}
SPECS = model_inputs(METADATA)
ENCODINGS = (None, "gzip", "deflate")


@pytest.fixture(scope="module")
def echo() -> Iterator[Target]:
    with running_binproto_server("asyncio") as port:
        yield Target("127.0.0.1", port)


def post(target: Target, case: Body) -> binproto.DecodedMessage | int:
    """POST the case to the echo model: the decoded answer, or its status."""
    headers = tuple((k, v) for k, v in case.headers() if k != "Content-Length")
    reply = exchange(target, Request("/v2/models/echo/infer", headers, case.body), 10)
    assert reply.outcome == "answered", reply.detail
    assert reply.status is not None
    if reply.status != 200:
        return reply.status
    length = reply.header(binproto.HEADER_LENGTH_NAME)
    return binproto.decode_response(
        reply.body,
        header_length=None if length is None else int(length),
        content_encoding=reply.header("content-encoding"),
    )


def test_model_inputs_reads_metadata_text_dicts_and_specs() -> None:
    assert [s.name for s in SPECS] == ["x", "flags", "text", "half", "n"]
    assert SPECS[0] == binproto.TensorSpec("x", "FP32", [-1, 3])
    assert model_inputs(json.dumps(METADATA)) == SPECS
    assert model_inputs(SPECS) == SPECS
    assert model_inputs({"name": "echo", "inputs": []}) == []


@settings(max_examples=40, deadline=None)
@given(case=model_requests(SPECS, encodings=ENCODINGS))
def test_valid_requests_come_back_whole(echo: Target, case: Body) -> None:
    # Each drawn shape fits the model's: fixed dimensions kept, -1 drawn.
    shapes = {e["name"]: e["shape"] for e in case.header["inputs"]}
    assert shapes["x"][1] == 3 and shapes["flags"] == [2] and shapes["n"] == []
    answer = post(echo, case)
    assert isinstance(answer, binproto.DecodedMessage), answer
    assert case.tensors_equal(answer.tensors)


@settings(max_examples=60, deadline=None)
@given(case=invalid_model_requests(SPECS, encodings=ENCODINGS))
def test_mutated_requests_are_refused(echo: Target, case: Body) -> None:
    assert not case.valid and case.mutation in MODEL_MUTATIONS
    status = post(echo, case)
    assert isinstance(status, int) and 400 <= status < 500, (case.mutation, status)


@pytest.mark.parametrize("mutation", MODEL_MUTATIONS)
def test_each_mutation_makes_a_body_binproto_refuses(mutation: str) -> None:
    # Decoded in process: every mutation, alone, gives a protocol error (the
    # ones that do not fit a draw fall back to a cut body).
    @settings(max_examples=30, deadline=None)
    @given(invalid_model_requests(SPECS, mutations=[mutation]))
    def check(case: Body) -> None:
        with pytest.raises(binproto.RemoteProtocolError):
            binproto.decode_request(
                case.body,
                header_length=case.header_length,
                content_encoding=case.content_encoding,
            )

    check()


def test_binary_and_binary_output_options() -> None:
    @settings(max_examples=20, deadline=None)
    @given(model_requests(SPECS, binary=True, binary_output=True), st.data())
    def check(case: Body, data: st.DataObject) -> None:
        assert all("data" not in e for e in case.header["inputs"])
        assert case.header["parameters"] == {"binary_data_output": True}
        assert case.header_length is not None

    check()

    @settings(max_examples=20, deadline=None)
    @given(model_requests(SPECS, binary=False))
    def json_only(case: Body) -> None:
        sent_binary = {e["name"] for e in case.header["inputs"] if "data" not in e}
        assert sent_binary == {"half"}  # (FP16 has no JSON form)
        assert not any(np.isnan(case.tensors["x"]).ravel())

    json_only()
