"""One call shape for every binproto client, for the tests against Triton.

``infer(kind, port, model, inputs, ...)`` sends one inference request with the
client ``kind`` (:data:`CLIENTS`) to 127.0.0.1 and returns the outputs as
arrays; an error status raises :class:`binproto.adapters.h11.HTTPError`.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

import binproto

HOST = "127.0.0.1"
ROOT = Path(__file__).resolve().parents[2]

#: binproto's clients: the asyncio client (in-place receive, and streams), the
#: trio client, the httpx adapter (sync and async) and the h11 example client.
CLIENTS = ("asyncio", "asyncio-streams", "trio", "httpx", "httpx-async", "h11-example")

#: The clients that can compress a request body.
COMPRESSING_CLIENTS = ("asyncio", "asyncio-streams", "trio")

Arrays = dict[str, np.ndarray[Any, Any]]


def _example(name: str) -> ModuleType:
    module_name = f"example_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, ROOT / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def infer(
    kind: str,
    port: int,
    model: str,
    inputs: Mapping[str, Any],
    *,
    binary_data_output: bool = True,
    outputs: list[str | binproto.RequestedOutput] | None = None,
    binary: bool = True,
    accept_encoding: str | None = None,
    request_encoding: str | None = None,
) -> Arrays:
    """One inference request with the client ``kind``; the outputs by name."""
    if request_encoding is not None and kind not in COMPRESSING_CLIENTS:
        raise ValueError(f"the {kind} client does not compress requests")
    options: dict[str, Any] = {
        "binary_data_output": binary_data_output,
        "outputs": outputs,
        "binary": binary,
    }
    if kind == "h11-example":
        if outputs is not None or not binary or accept_encoding is not None:
            raise ValueError("the h11 example client takes only binary_data_output")
        result = _example("h11_sync_client").infer(
            HOST, port, model, inputs, binary_data_output=binary_data_output
        )
        out: Arrays = result.outputs
        return out
    if kind in ("httpx", "httpx-async"):
        import httpx

        from binproto.adapters import httpx as adapter

        headers = {} if accept_encoding is None else {"Accept-Encoding": accept_encoding}
        url = f"http://{HOST}:{port}"
        if kind == "httpx":
            with httpx.Client(base_url=url, timeout=60) as client:
                message = adapter.infer(client, model, inputs, headers=headers, **options)
        else:

            async def go_httpx() -> binproto.DecodedMessage:
                async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                    return await adapter.ainfer(client, model, inputs, headers=headers, **options)

            message = asyncio.run(go_httpx())
        return dict(message.tensors)
    if kind == "trio":
        import trio

        from binproto.adapters import trio as trio_adapter

        async def go_trio() -> Arrays:
            async with trio_adapter.Client(
                HOST,
                port,
                timeout=60,
                accept_encoding=accept_encoding,
                request_encoding=request_encoding,
            ) as client:
                return await client.infer(model, inputs, **options)

        return trio.run(go_trio)

    from binproto.adapters import asyncio as aio_adapter

    async def go() -> Arrays:
        zero_copy = kind == "asyncio"
        async with aio_adapter.Client(
            HOST,
            port,
            zero_copy=zero_copy,
            timeout=60,
            accept_encoding=accept_encoding,
            request_encoding=request_encoding,
        ) as client:
            return await client.infer(model, inputs, **options)

    return asyncio.run(go())
