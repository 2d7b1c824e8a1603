"""Fixtures of the interop suite: one live KServe echo server and one Triton
server per session, and binproto's reference servers."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from .binproto_servers import BACKENDS, running_binproto_server, running_identity_server
from .kserve_peer import KServePeer, running_kserve
from .triton_peer import (
    DATATYPES,
    SINGLE_INPUT_MODEL,
    TritonPeer,
    model_name,
    start_triton,
    triton_unavailable,
)

#: Set (by .ci/run) where Triton must run: the Triton tests then fail, not skip.
REQUIRE_TRITON = "BINPROTO_REQUIRE_TRITON"

HERE = Path(__file__).resolve().parent

#: The session's live peers: each test using one runs on the worker that
#: started it, so pytest-xdist starts each peer once, not once per worker.
PEERS = {"triton", "kserve_server"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test of this folder ``interop``; keep live-peer tests together."""
    for item in items:
        if not item.path.is_relative_to(HERE):
            continue
        item.add_marker(pytest.mark.interop)
        if PEERS & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.xdist_group("peers"))


@pytest.fixture(scope="session")
def kserve_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KServePeer]:
    """A real ``kserve.ModelServer`` with the echo model, on 127.0.0.1 and a free port.

    Started once for the session, terminated at its end. Its log is kept in the
    session's temporary directory and shown if it fails to start.
    """
    pytest.importorskip("kserve")
    log: Path = tmp_path_factory.mktemp("kserve") / "server.log"
    try:
        with running_kserve(log=log) as peer:
            yield peer
    except RuntimeError as exc:
        tail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
        raise RuntimeError(f"{exc}\n--- KServe server log ---\n{tail}") from exc


@pytest.fixture(scope="session", params=BACKENDS)
def binproto_server(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    """binproto's reference server (echo model) on 127.0.0.1: (backend, port)."""
    backend: str = request.param
    if backend == "trio":
        pytest.importorskip("binproto.adapters.trio")
    else:
        pytest.importorskip("binproto.adapters.asyncio")
    with running_binproto_server(backend) as port:
        yield backend, port


@pytest.fixture(scope="session")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonPeer]:
    """A real Triton Inference Server (nvidia-pytriton's binary) on 127.0.0.1.

    Serves the identity model of every datatype (``triton_peer.model_name``).
    The binary comes from ``.venv-triton/``, built on first use. Started once
    for the session and stopped at its end; if it does not become ready the
    error holds its log. Skipped, with the reason, where Triton cannot run (not
    Linux x86_64, no numpy 1 in the system's Python, no package index to
    install the wheel from), unless ``BINPROTO_REQUIRE_TRITON`` is set.
    """
    reason = triton_unavailable()
    if reason is not None:
        if os.environ.get(REQUIRE_TRITON):
            pytest.fail(f"{REQUIRE_TRITON} is set but Triton cannot run: {reason}")
        pytest.skip(reason)
    with start_triton(tmp_path_factory.mktemp("triton")) as peer:
        yield peer


@pytest.fixture(scope="session")
def binproto_identity() -> Iterator[int]:
    """binproto's asyncio server with Triton's identity models: its port."""
    with running_identity_server([*map(model_name, DATATYPES), SINGLE_INPUT_MODEL]) as port:
        yield port
