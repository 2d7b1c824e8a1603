"""What the V2 application answers when a handler or a request goes wrong,
on every backend: handler faults, refused outputs, and raw binary requests
the model cannot take. Each test serves its model alone on each backend of
the ``backend`` matrix (conftest.py). (Routes, health, HEAD and 405:
test_app_everywhere.py.)
"""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator, Callable
from http import HTTPStatus
from typing import Any

import numpy as np
import pytest

import binproto
from binproto.adapters._server import (
    InferenceError,
    InferRequest,
    Model,
    StreamingResponse,
    V2Server,
    echo_model,
)

from .servers import connect, infer_bytes, running, until_closed


def _answer(backend: str, model: Model, wire: bytes) -> bytes:
    """What a server of ``model`` on ``backend`` sends for the request
    ``wire``, over one connection the client then half-closes."""
    with running(backend, V2Server([model])) as server, connect(server.port) as sock:
        sock.sendall(wire)
        sock.shutdown(socket.SHUT_WR)
        return until_closed(sock)


def _streaming(writer_of: Callable[[], binproto.BodyWriter]) -> Any:
    async def handler(request: InferRequest) -> StreamingResponse:
        await request.tensors()

        async def chunks() -> AsyncIterator[tuple[int, Any]]:
            yield 0, b"abcd"

        return StreamingResponse(writer_of(), chunks())

    return handler


def _response_header() -> dict[str, Any]:
    return {
        "model_name": "s",
        "outputs": [
            {"name": "y", "datatype": "UINT8", "shape": [4], "parameters": {"binary_data_size": 4}}
        ],
    }


def _started() -> binproto.BodyWriter:
    writer = binproto.BodyWriter(_response_header())
    writer.start()
    return writer


def _of_a_request() -> binproto.BodyWriter:
    header = _response_header()
    return binproto.BodyWriter({"inputs": header["outputs"]})


@pytest.mark.parametrize(
    ("writer_of", "fault"),
    [(_started, "start() was already called"), (_of_a_request, "needs a BodyWriter of a response")],
)
def test_a_streaming_writer_that_cannot_start_is_a_logged_500(
    backend: str,
    writer_of: Callable[[], binproto.BodyWriter],
    fault: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Refused before the response's head goes out: the client gets a 500
    # (not a closed connection, nor a request's body as the answer), logged.
    wire = infer_bytes({"x": np.zeros(4, dtype=np.float32)}, "/v2/models/s/infer")
    with caplog.at_level(logging.ERROR):
        sent = _answer(backend, Model("s", _streaming(writer_of)), wire)
    assert sent.startswith(b"HTTP/1.1 500 "), sent[:200]
    assert "error while serving /v2/models/s/infer" in caplog.text
    assert fault in caplog.text


def test_a_handlers_local_protocol_error_is_logged(
    backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def complex_output(request: InferRequest) -> dict[str, Any]:
        await request.tensors()
        return {"y": np.arange(3) + 1j}  # no V2 datatype: the encoder refuses it

    wire = infer_bytes({"x": np.zeros(4, dtype=np.float32)}, "/v2/models/c/infer")
    with caplog.at_level(logging.ERROR):
        sent = _answer(backend, Model("c", complex_output), wire)
    assert sent.startswith(b"HTTP/1.1 500 "), sent[:200]
    assert "error while serving /v2/models/c/infer" in caplog.text
    assert "no V2 datatype" in caplog.text


def test_an_inference_error_takes_any_integer_status() -> None:
    assert InferenceError("gone", HTTPStatus.NOT_FOUND).status == 404
    assert type(InferenceError("gone", np.int64(410)).status) is int  # type: ignore[arg-type, unused-ignore]


@pytest.mark.parametrize("status", [304, 204, 200, 100, 600, "404", True])
def test_an_inference_error_without_an_error_status_is_a_logged_500(
    backend: str, status: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # A 304 or 204 carries no body, so the error's JSON would be read as the
    # start of the next response: refused where it is raised.
    async def not_modified(request: InferRequest) -> dict[str, Any]:
        raise InferenceError("not modified", status)

    wire = infer_bytes({"x": np.zeros(4, dtype=np.float32)}, "/v2/models/n/infer")
    with caplog.at_level(logging.ERROR):
        sent = _answer(backend, Model("n", not_modified), wire * 2)
    assert sent.startswith(b"HTTP/1.1 500 "), sent[:200]
    assert sent.count(b"HTTP/1.1 500 ") == 2  # and the connection serves the next one
    assert "HTTP error status, 400-599" in caplog.text


def test_an_output_the_model_does_not_give_is_the_clients_400(
    backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def one_output(request: InferRequest) -> dict[str, Any]:
        await request.tensors()
        return {"y": np.zeros(2, dtype=np.float32)}

    x = np.zeros(4, dtype=np.float32)
    wire = infer_bytes({"x": x}, "/v2/models/o/infer", outputs=["nope"])
    with caplog.at_level(logging.WARNING):
        sent = _answer(backend, Model("o", one_output), wire)
    assert sent.startswith(b"HTTP/1.1 400 "), sent[:200]
    assert b"unexpected inference output 'nope' for model 'o'" in sent
    assert caplog.text == ""  # the client's mistake: nothing for the server's log


def test_model_versions_are_a_sequence_not_a_string() -> None:
    async def nothing(request: InferRequest) -> dict[str, Any]:
        return {}

    with pytest.raises(binproto.LocalProtocolError, match="the string '12'"):
        Model("m", nothing, versions="12")
    assert Model("m", nothing, versions=["12"]).versions == ("12",)


async def _double_x(request: InferRequest) -> dict[str, Any]:
    tensors = await request.tensors()
    return {"y": np.asarray(tensors["x"]) * 2}


_ONE_INPUT = Model(
    "single",
    _double_x,
    inputs=[{"name": "x", "datatype": "FP32", "shape": [-1]}],
    outputs=[{"name": "y", "datatype": "FP32", "shape": [-1]}],
)


def _raw_request(body: bytes, *, chunked: bool = False, model: str = "single") -> bytes:
    head = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\n"
        "Inference-Header-Content-Length: 0\r\nContent-Type: application/octet-stream\r\n"
    ).encode()
    if chunked:
        return head + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


@pytest.mark.parametrize(
    ("model", "wire", "status", "message"),
    [
        (echo_model(), _raw_request(b"\0" * 8, model="echo"), 400, b"declares 0 inputs"),
        (_ONE_INPUT, _raw_request(b"\0" * 8, chunked=True), 411, b"needs Content-Length"),
        (_ONE_INPUT, _raw_request(b"\0" * 7), 400, b"expecting a multiple of 4"),
    ],
    ids=["no declared input", "no length", "not whole elements"],
)
def test_a_raw_binary_request_the_model_cannot_take_is_refused(
    backend: str, model: Model, wire: bytes, status: int, message: bytes
) -> None:
    sent = _answer(backend, model, wire)
    assert sent.startswith(b"HTTP/1.1 %d " % status), sent[:300]
    assert message in sent
