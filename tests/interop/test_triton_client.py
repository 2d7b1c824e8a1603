"""binproto's pooled asyncio client and ``binproto infer`` against a real
Triton: binary outputs by default, the health and metadata helpers, the
check of inputs against Triton's own metadata, and the command line."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from binproto import LocalProtocolError
from binproto.adapters.asyncio import Client
from binproto.cli import main

from .triton_peer import TritonPeer, model_name

FP32 = model_name("FP32")


def test_the_pooled_client_against_triton(triton: TritonPeer) -> None:
    x = np.arange(1 << 20, dtype=np.float32)  # 4 MiB: Triton answers binary

    async def run() -> None:
        async with Client(triton.url, max_connections=4) as c:
            await c.wait_until_ready(30, model=FP32)
            assert await c.server_live() and await c.model_ready(FP32)
            server = await c.server_metadata()
            assert "binary_tensor_data" in server.extensions
            meta = await c.model_metadata(FP32)
            first = meta.inputs[0]
            assert (first.name, first.datatype, first.shape) == ("INPUT0", "FP32", (-1,))
            outs = await asyncio.gather(
                *(c.infer(FP32, {"INPUT0": x + i}, check=True) for i in range(8))
            )
            assert all(np.array_equal(o["OUTPUT0"], x + i) for i, o in enumerate(outs))
            assert c.open_connections <= 4
            async with c.stream(FP32, {"INPUT0": x[:4]}) as response:
                await response.tensors()
                assert response.header is not None
                assert response.header.tensor("OUTPUT0").binary_size == 16
            with pytest.raises(LocalProtocolError, match="INPUT0' is FP64, the model takes FP32"):
                await c.infer(FP32, {"INPUT0": x.astype(np.float64)}, check=True)

    asyncio.run(run())


def test_binproto_infer_against_triton(
    triton: TritonPeer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    x = np.linspace(0, 1, 10, dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out.npz"
    for flags in ([], ["--json-outputs"]):
        argv = ["infer", triton.url, FP32, f"INPUT0={tmp_path / 'x.npy'}", "-o", str(out)]
        assert main([*argv, *flags]) == 0
        rows = capsys.readouterr().out.splitlines()
        assert rows[1].split()[:4] == ["OUTPUT0", "FP32", "[10]", "40"]
        with np.load(out) as saved:
            assert np.array_equal(saved["OUTPUT0"], x)
    assert main(["infer", triton.url, "nowhere", f"INPUT0={tmp_path / 'x.npy'}"]) == 1
    assert "the server answered HTTP 4" in capsys.readouterr().err
