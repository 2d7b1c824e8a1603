"""Models and sample tensors that server tests share.

The models run on every backend (asyncio, trio, V2App under uvicorn),
except ``gate``, which waits on an asyncio event.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import ml_dtypes
import numpy as np

import binproto
from binproto import TensorChunk, TensorComplete, TensorInfo
from binproto.adapters._server import (
    InferenceError,
    InferRequest,
    Model,
    StreamingResponse,
    echo_model,
)

__all__ = [
    "BINARY_ONLY",
    "NON_UTF8",
    "NUMERIC",
    "RECORDER",
    "UTF8",
    "Gate",
    "Ramp",
    "Recorder",
    "as_bytes",
    "binary_expected",
    "same",
    "server_models",
]


class Recorder:
    """What the ``into`` model saw: the assembler's counters and the destination."""

    def __init__(self) -> None:
        self.copied = -1
        self.in_place = -1
        self.destination: np.ndarray[Any, Any] | None = None
        self.result: np.ndarray[Any, Any] | None = None


RECORDER = Recorder()


async def _into(request: InferRequest) -> dict[str, Any]:
    """Receive the one input into an array allocated here; report the counters."""

    def destination(info: TensorInfo) -> np.ndarray[Any, Any]:
        RECORDER.destination = np.empty(info.shape, dtype=info.dtype)
        return RECORDER.destination

    tensors = await request.tensors(destination)
    asm = request.body.assembler
    assert asm is not None
    RECORDER.copied = asm.bytes_copied
    RECORDER.in_place = asm.bytes_in_place
    (RECORDER.result,) = tensors.values()
    return {"copied": np.array([asm.bytes_copied]), "in_place": np.array([asm.bytes_in_place])}


async def _events(request: InferRequest) -> dict[str, Any]:
    """Count the events of the body as they are read (the streaming handler API)."""
    counts = {"chunks": 0, "complete": 0}
    async for event in request.body:
        if type(event) is TensorChunk:
            counts["chunks"] += 1
        elif type(event) is TensorComplete:
            counts["complete"] += 1
    return {k: np.array([v], dtype=np.int64) for k, v in counts.items()}


class Ramp:
    """How far the ``ramp`` model's producer has got (elements handed to the server)."""

    produced = 0


async def _ramp(request: InferRequest) -> StreamingResponse:
    """Stream ``n`` FP32 values 0..n-1 in pieces; ``fail_at`` breaks the stream there."""
    tensors = await request.tensors()
    n = int(tensors["n"][0])
    fail_at = int(tensors["fail_at"][0]) if "fail_at" in tensors else -1
    header = {
        "model_name": "ramp",
        "outputs": [
            {
                "name": "y",
                "datatype": "FP32",
                "shape": [n],
                "parameters": {"binary_data_size": 4 * n},
            }
        ],
    }

    async def pieces() -> AsyncIterator[tuple[int, Any]]:
        step = 100_000
        for start in range(0, n, step):
            if start == fail_at:
                raise RuntimeError("the producer failed")
            Ramp.produced = start
            yield 0, np.arange(start, min(n, start + step), dtype=np.float32)

    return StreamingResponse(binproto.BodyWriter(header), pieces())


class Gate:
    """Holds the ``gate`` model's handler after the request header, until opened."""

    event: asyncio.Event | None = None


async def _gate(request: InferRequest) -> dict[str, Any]:
    Gate.event = asyncio.Event()
    await Gate.event.wait()
    tensors = await request.tensors()
    return {"n": np.array([tensors["x"].nbytes], dtype=np.int64)}


async def _misuse(request: InferRequest) -> dict[str, Any]:
    """Take a tensor event, then ask for assembled tensors: API misuse."""
    while type(await request.body.next_event()) is not TensorChunk:
        pass
    return await request.tensors()


async def _fail(request: InferRequest) -> Any:
    await request.tensors()
    raise InferenceError("the model refuses this input", 422)


async def _boom(request: InferRequest) -> Any:
    raise RuntimeError("kaput")


async def _probe(request: InferRequest) -> Any:
    """Echo the inputs and say how many of their bytes were received in place."""
    tensors = await request.tensors()
    assembler = request.body.assembler
    assert assembler is not None
    return {**tensors, "in_place": np.array([assembler.bytes_in_place], dtype=np.int64)}


def server_models() -> list[Model]:
    """The models server tests call.

    | model | does |
    |---|---|
    | ``echo`` | answers its inputs |
    | ``into`` | receives into its own array; says what was copied (RECORDER) |
    | ``events`` | counts body events; versions 1 and 2 |
    | ``ramp`` | streams ``n`` FP32 values; breaks at ``fail_at`` |
    | ``gate`` | waits for ``Gate.event`` (asyncio only) |
    | ``misuse`` | takes an event, then asks for tensors: a 500 |
    | ``fail`` | refuses with 422 |
    | ``boom`` | raises RuntimeError: a 500 |
    | ``probe`` | echoes; says how many bytes came in place |
    """
    return [
        echo_model(),
        Model("into", _into),
        Model("events", _events, versions=("1", "2")),
        Model("ramp", _ramp),
        Model("gate", _gate),
        Model("misuse", _misuse),
        Model("fail", _fail),
        Model("boom", _boom),
        Model("probe", _probe),
    ]


NUMERIC: list[tuple[str, np.ndarray[Any, Any]]] = [
    ("BOOL", np.array([[True, False, True], [False, False, True]])),
    ("UINT8", np.array([0, 1, 255], dtype=np.uint8)),
    ("UINT16", np.array([0, 65535], dtype=np.uint16)),
    ("UINT32", np.array([0, 2**32 - 1], dtype=np.uint32)),
    ("UINT64", np.array([0, 2**64 - 1], dtype=np.uint64)),
    ("INT8", np.array([-128, 127], dtype=np.int8)),
    ("INT16", np.array([-(2**15), 2**15 - 1], dtype=np.int16)),
    ("INT32", np.arange(-6, 6, dtype=np.int32).reshape(3, 4)),
    ("INT64", np.array([-(2**63), 2**63 - 1], dtype=np.int64)),
    ("FP32", np.array([0.5, -1.25, 3e38], dtype=np.float32)),
    ("FP64", np.array([[1e-300, -2.5]], dtype=np.float64)),
]
#: Datatypes JSON cannot carry: always sent binary.
BINARY_ONLY: list[tuple[str, np.ndarray[Any, Any]]] = [
    ("FP16", np.array([1.5, -2.0, 65504], dtype=np.float16)),
    ("BF16", np.array([1.0, -2.5, 3.0], dtype=ml_dtypes.bfloat16)),
]
NON_UTF8 = np.array([b"\xff\xfe", b"", b"ok", b"\x00\x80"], dtype=np.object_)
UTF8 = np.array([b"hello", "h\u00e9".encode(), b""], dtype=np.object_)


def as_bytes(arr: np.ndarray[Any, Any]) -> list[bytes]:
    """The elements of a BYTES array as ``bytes`` (clients give ``str`` or ``bytes``)."""
    return [x if isinstance(x, bytes) else str(x).encode() for x in arr.ravel()]


def same(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any]) -> bool:
    """Same shape, dtype and bytes (NaN, -0.0 and BF16 compared bit for bit)."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    if want.dtype == object:
        return [bytes(x) for x in got.ravel()] == [bytes(x) for x in want.ravel()]
    return got.tobytes() == want.tobytes()


def binary_expected(datatype: str, binary: bool) -> bool:
    """Whether an output travels binary: as asked, but FP16 and BF16 always do."""
    return binary or datatype in ("FP16", "BF16")
