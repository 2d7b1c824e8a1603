"""The Triton start-up helper without a Triton: the model repository it writes,
and the reasons it gives where Triton cannot run."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

import pytest

from . import triton_peer
from .triton_peer import DATATYPES, SINGLE_INPUT_MODEL, model_name, write_models

#: The reasons after the platform's: only reachable where the wheel exists.
linux_x86_64 = pytest.mark.skipif(
    sys.platform != "linux" or os.uname().machine != "x86_64",
    reason="Triton's binary is built for Linux x86_64 only",
)


def test_one_identity_model_per_datatype(tmp_path: Path) -> None:
    names = write_models(tmp_path)
    assert names == [*map(model_name, DATATYPES), SINGLE_INPUT_MODEL]
    for datatype in DATATYPES:
        config = (tmp_path / model_name(datatype) / "config.pbtxt").read_text()
        triton_type = "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"
        assert config.count(f"data_type: {triton_type}") == 4  # two inputs, two outputs
        assert 'name: "INPUT1"' in config and "optional: true" in config
        assert (tmp_path / model_name(datatype) / "1" / "model.py").exists()
    single = (tmp_path / SINGLE_INPUT_MODEL / "config.pbtxt").read_text()
    assert "INPUT1" not in single and "data_type: TYPE_FP32" in single


@linux_x86_64
def test_reason_when_the_wheel_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    reason = triton_peer.triton_unavailable()
    assert reason is not None and "nvidia-pytriton is not installed" in reason


def _fake_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "pytriton"
    (package / "tritonserver" / "bin").mkdir(parents=True)
    (package / "tritonserver" / "bin" / "tritonserver").write_bytes(b"")
    spec = importlib.machinery.ModuleSpec("pytriton", None, is_package=True)
    spec.submodule_search_locations = [str(package)]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec)


@linux_x86_64
def test_reason_when_the_system_python_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_wheel(tmp_path, monkeypatch)
    monkeypatch.setattr(triton_peer, "SYSTEM_PYTHON", str(tmp_path / "no-python3"))
    reason = triton_peer.triton_unavailable()
    assert reason is not None and "needs the system Python" in reason


@linux_x86_64
def test_reason_when_the_system_numpy_is_not_numpy_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_wheel(tmp_path, monkeypatch)
    fake = tmp_path / "python3"
    fake.write_text("#!/bin/sh\necho 3.11 2.4.0\n")
    fake.chmod(0o755)
    monkeypatch.setattr(triton_peer, "SYSTEM_PYTHON", str(fake))
    reason = triton_peer.triton_unavailable()
    assert reason is not None and "needs numpy 1" in reason and "2.4.0" in reason


def test_start_triton_says_why_it_cannot_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triton_peer, "find_triton", lambda: "no Triton here")
    with pytest.raises(triton_peer.TritonStartError, match="no Triton here"):
        with triton_peer.start_triton(Path("/nonexistent")):
            pass
