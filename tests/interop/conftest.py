"""Fixtures of the interop suite: one live KServe echo server per session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .binproto_servers import BACKENDS, running_binproto_server
from .kserve_peer import KServePeer, running_kserve


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
