"""The examples in examples/ run, against binproto's own server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import binproto
from binproto.adapters.asyncio import Client, V2Server, start_server
from binproto.adapters.h11 import HTTPError

from .servers import running

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

#: An example that warns (numpy overflow in a cast, say) fails its test.
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")


def load(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` as a module."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@contextmanager
def serving(server: V2Server | None = None) -> Iterator[int]:
    """Run binproto's asyncio server in a thread; yield its port."""
    with running("asyncio", server or V2Server()) as served:
        yield served.port


# -- asyncio_server.py -----------------------------------------------------------


def test_asyncio_server_demo_runs() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "asyncio_server.py"), "--demo"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    x = np.arange(6, dtype=np.float32)
    assert result.stdout.splitlines() == [
        "scale x: [[0.0, 3.0, 6.0], [9.0, 12.0, 15.0]]",
        f"crc32 x: {zlib.crc32(x.tobytes())}",
    ]


def test_asyncio_server_models() -> None:
    example = load("asyncio_server")
    rng = np.random.default_rng(1)
    big = rng.integers(0, 255, 3 * 1024 * 1024 + 5, dtype=np.uint8)
    ints = np.arange(-3, 3, dtype=np.int32)

    async def calls() -> tuple[dict[str, Any], dict[str, Any]]:
        server = await start_server(example.make_server(), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server, Client("127.0.0.1", port) as client:
            crcs = await client.infer(
                "crc32",
                {"big": big, "empty": np.zeros(0, np.float32), "words": [b"ab", b"c"]},
                binary_data_output=True,
            )
            scaled = await client.infer("scale", {"i": ints}, parameters={"factor": -2.0})
            with pytest.raises(HTTPError) as exc:
                await client.infer("scale", {"w": [b"text"]})
            assert exc.value.status == 400 and "scale takes numbers" in exc.value.message
            # A factor the input's datatype cannot hold is refused, not cast or wrapped.
            for factor, data in (
                (1.5, ints),
                (-2, ints.astype(np.uint8)),
                (2**40, ints),
                (1e6, ints.astype(np.float16)),
            ):
                with pytest.raises(HTTPError) as exc:
                    await client.infer("scale", {"i": data}, parameters={"factor": factor})
                assert exc.value.status == 400 and "is no" in exc.value.message
        return crcs, scaled

    crcs, scaled = asyncio.run(calls())
    assert int(crcs["big_crc32"][0]) == zlib.crc32(big.tobytes())
    assert int(crcs["empty_crc32"][0]) == 0
    # BYTES travel length-prefixed: the CRC covers the wire form.
    assert int(crcs["words_crc32"][0]) == zlib.crc32(b"\x02\x00\x00\x00ab\x01\x00\x00\x00c")
    assert scaled["i"].dtype == np.int32
    assert scaled["i"].tolist() == [6, 4, 2, 0, -2, -4]


# -- h11_sync_client.py ----------------------------------------------------------


def test_h11_sync_client_streams_both_ways() -> None:
    example = load("h11_sync_client")
    x = np.random.default_rng(2).standard_normal((512, 1024)).astype(np.float32)  # 2 MiB
    words = np.array([b"\xff\x00", b"", b"plain"], dtype=object)
    with serving() as port:
        result = example.infer("127.0.0.1", port, "echo", {"x": x, "w": words})
        with pytest.raises(HTTPError) as exc:
            example.infer("127.0.0.1", port, "missing", {"x": x})
    assert np.array_equal(result.outputs["x"], x)
    assert result.outputs["w"].tolist() == words.tolist()
    # The response came in many pieces, each parsed as it arrived.
    assert result.chunks > 1
    assert result.body_bytes > x.nbytes
    assert exc.value.status == 404


def test_h11_sync_client_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    example = load("h11_sync_client")
    with serving() as port:
        example.main(["--port", str(port), "--elements", "100000"])
    out = capsys.readouterr().out
    assert "echoed 400000 bytes" in out and out.rstrip().endswith("identical")


# -- stream_to_memmap.py ---------------------------------------------------------


def test_stream_to_memmap_from_the_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    example = load("stream_to_memmap")
    elements = 1 << 21  # 8 MiB
    with serving() as port:
        example.main(["--port", str(port), "--elements", str(elements), "--out", str(tmp_path)])
    out = capsys.readouterr().out
    stored = np.load(tmp_path / "x.npy", mmap_mode="r")
    assert isinstance(stored, np.memmap)
    assert np.array_equal(stored, np.arange(elements, dtype=np.float32))
    # Most bytes were written into the memory map by the kernel, not copied.
    in_place, copied = (int(w) for w in out.splitlines()[-1].split() if w.isdigit())
    assert in_place + copied == elements * 4
    assert in_place > elements * 4 // 2


def test_stream_to_memmap_from_a_saved_body(tmp_path: Path) -> None:
    example = load("stream_to_memmap")
    arrays: dict[str, Any] = {
        "f": np.linspace(-1, 1, 300_000).reshape(1000, 300),
        "b": np.array([[True, False], [False, True]]),
        "e": np.zeros((0, 4), dtype=np.int16),
        "s": np.array([b"x", b"\xfe\xff", b""], dtype=object),
    }
    bits = np.array([0x3F80, 0xC020], dtype=np.uint16)  # 1.0 and -2.5 in bfloat16
    tensors = [binproto.Tensor(n, a) for n, a in arrays.items()]
    tensors.append(binproto.Tensor("h", bits, datatype="BF16"))
    body = binproto.encode_response(tensors, model_name="m")
    (tmp_path / "resp.bin").write_bytes(bytes(body))
    out = tmp_path / "out"
    example.main(
        [
            "--body",
            str(tmp_path / "resp.bin"),
            "--header-length",
            str(body.header_length),
            "--out",
            str(out),
        ]
    )
    for name in ("f", "b", "e"):
        assert np.array_equal(np.load(out / f"{name}.npy"), arrays[name])
    assert isinstance(np.load(out / "f.npy", mmap_mode="r"), np.memmap)
    assert np.load(out / "s.npy", allow_pickle=True).tolist() == arrays["s"].tolist()
    stored_bits = np.load(out / "h.npy")
    assert stored_bits.dtype == np.dtype("<u2") and stored_bits.tolist() == bits.tolist()


@pytest.mark.parametrize("name", ["../escaped", "an absolute path", "sub/x", "..", "a\x00b"])
def test_stream_to_memmap_writes_no_file_a_peers_tensor_name_points_elsewhere(
    tmp_path: Path, name: str
) -> None:
    example = load("stream_to_memmap")
    if name == "an absolute path":
        name = str(tmp_path / "abs")
    body = binproto.encode_response({name: np.ones(4, np.float32)}, model_name="m")
    (tmp_path / "resp.bin").write_bytes(bytes(body))
    out = tmp_path / "box" / "out"
    with pytest.raises(binproto.RemoteProtocolError, match="cannot name a file"):
        example.from_body(tmp_path / "resp.bin", body.header_length, out)
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert written == [tmp_path / "resp.bin"]


def test_stream_to_memmap_reports_a_truncated_body(tmp_path: Path) -> None:
    example = load("stream_to_memmap")
    body = binproto.encode_response({"f": np.ones(1000, np.float32)}, model_name="m")
    (tmp_path / "cut.bin").write_bytes(bytes(body)[:-10])
    with pytest.raises(binproto.RemoteProtocolError) as exc:
        example.from_body(tmp_path / "cut.bin", body.header_length, tmp_path / "out")
    # The header's claims are checked against the file's length before any tensor byte.
    assert exc.value.offset == body.header_length


def test_stream_to_memmap_takes_a_request_body_when_told(tmp_path: Path) -> None:
    x = np.arange(12, dtype=np.float32)
    body = binproto.encode_request({"x": x})
    (tmp_path / "req.bin").write_bytes(bytes(body))
    argv = ["--body", str(tmp_path / "req.bin"), "--header-length", str(body.header_length)]
    script = str(Path(__file__).resolve().parent.parent / "examples" / "stream_to_memmap.py")
    # Taken for a response: one line saying what is wrong and what to try, no traceback.
    wrong = subprocess.run(
        [sys.executable, script, *argv, "--out", str(tmp_path / "a")],
        capture_output=True,
        text=True,
    )
    assert wrong.returncode == 1 and "Traceback" not in wrong.stderr
    assert "add --kind request" in wrong.stderr
    load("stream_to_memmap").main([*argv, "--out", str(tmp_path / "b"), "--kind", "request"])
    assert np.array_equal(np.load(tmp_path / "b" / "x.npy"), x)
