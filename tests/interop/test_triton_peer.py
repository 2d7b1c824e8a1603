"""The Triton start-up helper without a Triton: the model repository it writes,
and the reasons it gives where Triton cannot run."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from ..environments import Unavailable
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


def _system_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answer: str) -> None:
    """A system Python that says it is ``answer`` (version, numpy's version)."""
    fake = tmp_path / "python3"
    fake.write_text(f"#!/bin/sh\necho {answer}\n")
    fake.chmod(0o755)
    monkeypatch.setattr(triton_peer, "SYSTEM_PYTHON", str(fake))


def _no_package_index(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", "")


@linux_x86_64
def test_reason_when_the_environment_cannot_be_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _system_python(tmp_path, monkeypatch, "3.11 1.24.2")
    monkeypatch.setattr(triton_peer, "VENV", tmp_path / "venv")
    _no_package_index(monkeypatch)
    reason = triton_peer.triton_unavailable()
    assert reason is not None and reason.startswith("no Triton environment")
    # The reason names the step that failed, and pip's own words.
    assert "pip install" in reason and "No matching distribution" in reason
    assert not (tmp_path / "venv" / "binproto.stamp").exists()


def test_the_environment_is_reused_until_the_pin_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = tmp_path / "venv"
    package = venv / "lib" / "python3.11" / "site-packages" / "pytriton"
    package.mkdir(parents=True)
    (venv / "bin").mkdir()
    (venv / "bin" / "python").write_bytes(b"")
    (venv / "binproto.stamp").write_text(triton_peer.TRITON_WHEEL)
    monkeypatch.setattr(triton_peer, "VENV", venv)
    _no_package_index(monkeypatch)
    # Built with the pinned wheel: reused, pip never runs.
    assert triton_peer.triton_environment() == package
    # Another pin rebuilds it, which fails here without an index.
    monkeypatch.setattr(triton_peer, "TRITON_WHEEL", "nvidia-pytriton==0.0.0")
    with pytest.raises(Unavailable, match=r"nvidia-pytriton==0\.0\.0"):
        triton_peer.triton_environment()
    assert not package.exists()


def _fake_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "pytriton"
    (package / "tritonserver" / "bin").mkdir(parents=True)
    (package / "tritonserver" / "bin" / "tritonserver").write_bytes(b"")
    monkeypatch.setattr(triton_peer, "triton_environment", lambda: package)


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
    _system_python(tmp_path, monkeypatch, "3.11 2.4.0")
    reason = triton_peer.triton_unavailable()
    assert reason is not None and "needs numpy 1" in reason and "2.4.0" in reason


def test_start_triton_says_why_it_cannot_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triton_peer, "find_triton", lambda: "no Triton here")
    with pytest.raises(triton_peer.TritonStartError, match="no Triton here"):
        with triton_peer.start_triton(Path("/nonexistent")):
            pass
