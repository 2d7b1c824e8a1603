"""binproto's asyncio and trio clients call the live KServe server.

Binary inputs and outputs through the real adapters: the request goes out as
binproto's unjoined buffer list, KServe answers with chunked transfer encoding
and a lower-case Inference-Header-Content-Length, and the client assembles the
outputs. What KServe cannot carry is a strict expected failure, as in
test_kserve_live.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

import binproto
from binproto.adapters.h11 import HTTPError

from ..helpers import arrays_equal
from .kserve_peer import KServePeer
from .samples import DATATYPES, sample, utf8_bytes

CLIENTS = ("asyncio", "asyncio-streams", "trio")


def run_with_client(kind: str, peer: KServePeer, fn: Callable[[Any], Awaitable[Any]]) -> Any:
    """Run ``fn(client)`` with a binproto client of ``kind`` connected to ``peer``."""
    if kind == "trio":
        trio = pytest.importorskip("trio")
        from binproto.adapters import trio as adapter

        async def go_trio() -> Any:
            async with adapter.Client(peer.host, peer.port, timeout=30) as client:
                return await fn(client)

        return trio.run(go_trio)

    from binproto.adapters import asyncio as aio_adapter

    async def go() -> Any:
        zero_copy = kind == "asyncio"
        async with aio_adapter.Client(
            peer.host, peer.port, zero_copy=zero_copy, timeout=30
        ) as client:
            return await fn(client)

    return asyncio.run(go())


@pytest.fixture(params=CLIENTS)
def client_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


def kserve_arrays() -> dict[str, np.ndarray[Any, Any]]:
    return {
        f"in_{dt}": (utf8_bytes() if dt == "BYTES" else sample(dt)).reshape(2, 2)
        for dt in DATATYPES
        if dt != "BF16"
    }


def bf16_arrays() -> dict[str, np.ndarray[Any, Any]]:
    return {"in_BF16": sample("BF16")}


def non_utf8_arrays() -> dict[str, np.ndarray[Any, Any]]:
    return {"in_BYTES": sample("BYTES")}


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(kserve_arrays, id="every-supported-datatype"),
        pytest.param(
            bf16_arrays,
            id="BF16",
            marks=pytest.mark.xfail(
                strict=True,
                raises=HTTPError,
                reason="KServe has no BF16 numpy mapping: 400 'invalid datatype None'",
            ),
        ),
        pytest.param(
            non_utf8_arrays,
            id="BYTES-not-utf8",
            marks=pytest.mark.xfail(
                strict=True,
                raises=HTTPError,
                reason="KServe turns binary BYTES into JSON strings: 500 for non-UTF-8",
            ),
        ),
    ],
)
def test_binary_in_binary_out(
    kserve_server: KServePeer, client_kind: str, make: Callable[[], dict[str, Any]]
) -> None:
    arrays = make()
    got = run_with_client(
        client_kind,
        kserve_server,
        lambda c: c.infer(kserve_server.model, arrays, binary_data_output=True),
    )
    assert list(got) == list(arrays)
    for name, arr in arrays.items():
        assert arrays_equal(got[name], arr), name


def test_zero_size(kserve_server: KServePeer, client_kind: str) -> None:
    arrays = {f"z_{n}": a[:0] for n, a in kserve_arrays().items()}
    arrays["after"] = np.arange(3, dtype=np.float64)
    got = run_with_client(
        client_kind,
        kserve_server,
        lambda c: c.infer(kserve_server.model, arrays, binary_data_output=True),
    )
    for name, arr in arrays.items():
        assert got[name].shape == arr.shape, name
        assert arrays_equal(got[name], arr), name


def test_mixed_json_binary_and_listed_outputs(kserve_server: KServePeer, client_kind: str) -> None:
    arrays: dict[str, np.ndarray[Any, Any]] = {
        "i": np.arange(6, dtype=np.int32).reshape(2, 3),
        "s": utf8_bytes(),
        "f": np.array([0.5, -1.25], dtype=np.float32),
    }
    outputs = [
        binproto.RequestedOutput("f", binary_data=True),
        binproto.RequestedOutput("s", binary_data=False),
        binproto.RequestedOutput("i", binary_data=True),
    ]

    async def call(client: Any) -> Any:
        async with client.stream(
            kserve_server.model, arrays, outputs=outputs, binary={"s", "f"}
        ) as response:
            tensors = await response.tensors()
            return response.header, tensors

    header, got = run_with_client(client_kind, kserve_server, call)
    assert [t.name for t in header.tensors] == ["f", "s", "i"]
    assert [t.binary_size is not None for t in header.tensors] == [True, False, True]
    for name, arr in arrays.items():
        assert arrays_equal(got[name], arr), name


def test_plain_json_request(kserve_server: KServePeer, client_kind: str) -> None:
    """binproto labels a JSON-only body application/json, which KServe requires."""
    arrays: dict[str, np.ndarray[Any, Any]] = {
        "i": np.array([[1, 2], [3, 4]], dtype=np.int64),
        "s": utf8_bytes(),
    }
    got = run_with_client(
        client_kind,
        kserve_server,
        lambda c: c.infer(kserve_server.model, arrays, binary=False),
    )
    for name, arr in arrays.items():
        assert arrays_equal(got[name], arr), name


def test_event_stream_of_a_chunked_response(kserve_server: KServePeer, client_kind: str) -> None:
    """Events arrive in order from KServe's chunked body; the header length is honoured."""
    arr = np.arange(1000, dtype=np.float32)

    async def call(client: Any) -> list[Any]:
        async with client.stream(
            kserve_server.model, {"x": arr}, binary_data_output=True
        ) as response:
            headers = dict(response.http.headers)
            assert headers.get(b"transfer-encoding") == b"chunked"
            assert b"content-length" not in headers
            return [event async for event in response]

    events = run_with_client(client_kind, kserve_server, call)
    assert isinstance(events[0], binproto.HeaderParsed)
    assert isinstance(events[-1], binproto.MessageComplete)
    data = b"".join(bytes(e.data) for e in events if isinstance(e, binproto.TensorChunk))
    assert data == arr.tobytes()


def test_kserve_errors_raise(kserve_server: KServePeer, client_kind: str) -> None:
    async def call(client: Any) -> Any:
        return await client.infer("no-such-model", {"x": np.ones(2, np.int8)})

    with pytest.raises(HTTPError) as err:
        run_with_client(client_kind, kserve_server, call)
    assert err.value.status == 404
    assert err.value.message == "Model with name no-such-model does not exist."


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="kserve#5907: KServe answers a listed output without binary_data in JSON even with"
    " binary_data_output true",
)
def test_listed_output_follows_binary_data_output(
    kserve_server: KServePeer, client_kind: str
) -> None:
    arr = np.arange(4, dtype=np.int16)

    async def call(client: Any) -> Any:
        async with client.stream(
            kserve_server.model, {"x": arr}, outputs=["x"], binary_data_output=True
        ) as response:
            await response.tensors()
            return response.header

    header = run_with_client(client_kind, kserve_server, call)
    assert header.tensor("x").binary_size is not None
