"""The throughput benchmark's Triton row: wrk's request to Triton is answered."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from benchmarks import bench_throughput
from tests.interop.triton_peer import TritonPeer


@pytest.mark.slow
@pytest.mark.serial  # a request rate, beside nothing else
@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed")
def test_the_benchmark_request_is_answered_by_triton(triton: TritonPeer, tmp_path: Path) -> None:
    path, input_name = bench_throughput.ENDPOINTS["triton"]
    assert path.split("/")[3] in triton.models
    script = bench_throughput.write_request(tmp_path, 4096, input_name)
    result = bench_throughput.wrk(triton.port, script, 2, 1, path)
    assert result.rps > 0 and result.errors == 0
