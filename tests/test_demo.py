"""``python -m binproto demo``: sizes, both paths end to end, the echo check."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from binproto.adapters.asyncio import InferRequest, Model, V2Server, start_server
from binproto.cli import _demo, main

MiB = 1024 * 1024


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4096", 4096),
        ("512KiB", 512 * 1024),
        ("64MiB", 64 * MiB),
        ("64mib", 64 * MiB),
        ("1GiB", 1024 * MiB),
        ("1G", 1024 * MiB),
        ("1GB", 10**9),
        ("1.5 MiB", 3 * MiB // 2),
        ("2KB", 2000),
    ],
)
def test_parse_size(text: str, size: int) -> None:
    assert _demo.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "MiB", "-1MiB", "1 XB", "1e9", "one"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        _demo.parse_size(text)


def test_format_size() -> None:
    assert _demo.format_size(12) == "12 B"
    assert _demo.format_size(64 * MiB) == "64.0 MiB"
    assert _demo.format_size(1024 * MiB) == "1.00 GiB"
    assert _demo.format_size(1536) == "1.50 KiB"


def test_bad_size_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--size", "lots"])
    assert exc.value.code == 2
    assert "not a size" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--size", "0"], "must be positive"),
        (["--size", "6"], "multiple of 4 bytes, got 6"),
        (["--chunk", "0"], "must be positive"),
    ],
)
def test_sizes_that_cannot_be_run_are_usage_errors(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["demo", *argv])
    out, err = capsys.readouterr()
    assert exc.value.code == 2
    assert out == "" and says in err  # refused before the banner


def test_size_must_hold_whole_fp32_elements() -> None:
    with pytest.raises(ValueError, match="multiple of 4"):
        _demo.run_demo(1023)


def test_both_paths_echo_the_tensor_and_report(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["demo", "--size", "2MiB", "--chunk", "16KiB"])
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = out.splitlines()
    assert "2.00 MiB FP32 tensor" in lines[0] and "16.0 KiB client reads" in lines[0]
    assert lines[1].split()[:3] == ["path", "round", "trip"]
    assert lines[2].startswith("streaming ") and lines[3].startswith("whole-body ")
    # Progress went to stderr (not a terminal here: whole lines).
    assert "[streaming] sent 2.00 MiB / 2.00 MiB  received 2.00 MiB / 2.00 MiB" in err
    assert "[whole-body] sent 2.00 MiB / 2.00 MiB  received 2.00 MiB / 2.00 MiB" in err


@pytest.mark.slow
@pytest.mark.serial  # compares peak memory
@pytest.mark.skipif(_demo.peak_rss() is None, reason="needs /proc/<pid>/status")
def test_streaming_path_keeps_less_in_memory() -> None:
    size = 48 * MiB
    # In a fresh process: in this one, memory earlier tests freed but kept
    # resident would absorb the client's allocations and hide its peak.
    code = (
        "import json, sys\n"
        "from binproto.cli._demo import run_demo\n"
        f"results = run_demo({size}, 256 * 1024)\n"
        "json.dump([[r.path, r.nbytes, r.client_peak, r.server_peak] for r in results], sys.stdout)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    streaming, whole = (
        _demo.DemoResult(path, nbytes, 0.0, client, server)
        for path, nbytes, client, server in json.loads(out.stdout)
    )
    assert (streaming.path, whole.path) == ("streaming", "whole-body")
    assert streaming.nbytes == whole.nbytes == size
    for r in (streaming, whole):
        assert r.client_peak is not None and r.server_peak is not None
    assert streaming.client_peak is not None and whole.client_peak is not None
    assert streaming.server_peak is not None and whole.server_peak is not None
    # Whole-body: the server holds the body's pieces and their join (2x); the
    # client the tensor sent, the pieces and their join (3x). Streaming: the
    # server holds the assembled tensor (1x); the client only the tensor sent.
    assert whole.server_peak - streaming.server_peak > size // 2
    assert whole.client_peak - streaming.client_peak > size
    assert streaming.server_peak < 2 * size + 200 * MiB


async def _corrupting_echo(request: InferRequest) -> dict[str, Any]:
    tensors = await request.tensors()
    out = tensors["x"].copy()
    out[len(out) // 2] += 1
    return {"x": out}


@pytest.mark.parametrize("client", ["streaming", "whole-body"])
def test_a_wrong_echo_is_detected(client: str) -> None:
    x = np.arange(50_000, dtype=np.float32)

    async def scenario() -> None:
        server = await start_server(V2Server(models=[Model("echo", _corrupting_echo)]))
        port = server.sockets[0].getsockname()[1]
        async with server:
            progress = _demo.Progress(None, client, x.nbytes)
            run = _demo._streaming_client if client == "streaming" else _demo._whole_body_client
            await run(port, x, progress, 4096)

    with pytest.raises(_demo.DemoError, match="differ"):
        asyncio.run(scenario())


# Servers that answer the demo wrongly, each a script printing its port.
_SERVE = (
    "async def run():\n"
    "    server = await start()\n"
    "    print('PORT', server.sockets[0].getsockname()[1], flush=True)\n"
    "    await server.serve_forever()\n"
    "asyncio.run(run())\n"
)
_FAILING_ECHO = (
    "import asyncio\n"
    "from binproto.adapters.asyncio import Model, V2Server, start_server\n"
    "async def fail(request):\n"
    "    raise RuntimeError('the model failed')\n"
    "def start():\n"
    "    return start_server(V2Server(models=[Model('echo', fail)]), port=0)\n"
) + _SERVE
_NOT_HTTP = (
    "import asyncio\n"
    "async def answer(reader, writer):\n"
    "    writer.write(b'garbage\\r\\n\\r\\n')\n"
    "    while await reader.read(1 << 16):\n"
    "        pass  # the whole request, so that the client reads the answer\n"
    "    writer.close()\n"
    "def start():\n"
    "    return asyncio.start_server(answer, '127.0.0.1', 0)\n"
) + _SERVE


@pytest.mark.parametrize(
    ("path", "script", "says"),
    [
        ("streaming", _FAILING_ECHO, "HTTP 500"),
        ("streaming", _NOT_HTTP, "garbage"),
        ("whole-body", _NOT_HTTP, "not HTTP/1.1"),
    ],
    ids=["http-error", "streaming-not-http", "whole-body-not-http"],
)
def test_a_server_that_answers_wrongly_is_one_line(
    path: str,
    script: str,
    says: str,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    real_start = _demo._start_server

    def start(which: str, chunk: int) -> tuple[subprocess.Popen[bytes], int]:
        if which != path:
            return real_start(which, chunk)
        proc = subprocess.Popen(
            [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        assert proc.stdout is not None
        return proc, int(proc.stdout.readline().split()[1])

    monkeypatch.setattr(_demo, "_start_server", start)
    code = main(["demo", "--size", "64KiB", "--quiet"])
    err = capfd.readouterr().err
    assert code == 1
    assert err.count("\n") == 1 and err.startswith("binproto demo: ") and says in err, err


def test_progress_lines_are_throttled() -> None:
    out = io.StringIO()
    progress = _demo.Progress(out, "p", 100, interval=3600)
    for _ in range(1000):
        progress.add(sent=1, received=1)
    progress.close()
    lines = out.getvalue().splitlines()
    # The first update draws, the rest fall inside the interval; close draws once.
    assert len(lines) == 2
    assert lines[-1].startswith("[p] sent 100 B / 100 B  received 100 B / 100 B")


def test_cli_modules_import_no_io_library() -> None:
    code = (
        "import sys, binproto, binproto.cli, binproto.cli._commands, binproto.cli._demo\n"
        "binproto.cli.build_parser()\n"
        "print(sorted({'asyncio', 'socket', 'h11', 'trio', 'httpx'} & set(sys.modules)))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
