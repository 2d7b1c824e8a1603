"""Fixtures for every test."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

if sys.platform != "win32":
    import fcntl

try:
    from .servers import ALL_BACKENDS, ASYNCIO_BACKENDS, BACKENDS
except ModuleNotFoundError as exc:  # (the h11 extra missing: no server to run)
    if exc.name != "h11":
        raise
    ALL_BACKENDS = ASYNCIO_BACKENDS = BACKENDS = []


@pytest.fixture(scope="module", params=ALL_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Each way to serve the V2 application (tests/servers.py's ALL_BACKENDS).

    For what the application answers. A module's ``server`` fixture serves
    its models on it with :func:`tests.servers.serving`.
    """
    return str(request.param)


@pytest.fixture(scope="module", params=BACKENDS)
def http_backend(request: pytest.FixtureRequest) -> str:
    """Each of binproto's own HTTP/1.1 servers (tests/servers.py's BACKENDS).

    For what their HTTP loops do themselves (timeouts, framing, buffers).
    """
    return str(request.param)


@pytest.fixture(scope="module", params=ASYNCIO_BACKENDS)
def asyncio_backend(request: pytest.FixtureRequest) -> str:
    """The asyncio server in place, through streams, and on uvloop.

    For the asyncio adapter's own transports (tests/test_asyncio.py).
    """
    return str(request.param)


@pytest.fixture(autouse=True)
def _junk_in_kept_receive_buffers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Overwrite every receive buffer an asyncio server keeps again with junk
    before it is kept: a view of one that is still in use (a buffer given
    back too soon) then reads junk, and the test reading it fails, instead
    of passing until another request happens to land in the buffer. (Servers
    run in this process: not those a test starts as a command.)"""
    try:
        from binproto.adapters import asyncio as adapter
    except ImportError:  # (the h11 extra missing: no server to watch)
        yield
        return
    give = adapter._ReceiveBuffers.give

    def junk_then_give(self: adapter._ReceiveBuffers, buf: bytearray) -> None:
        buf[:] = b"\xa5" * len(buf)  # (the same length: not resized, views stay valid)
        give(self, buf)

    monkeypatch.setattr(adapter._ReceiveBuffers, "give", junk_then_give)
    yield


@pytest.fixture(autouse=True)
def _serial_tests_run_alone(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """Under pytest-xdist, a test marked ``serial`` runs while no other test does.

    Soaks and memory measurements must not share the CPU with heavy tests.
    Every test holds a lock file shared; a serial test holds it exclusively.
    A second lock, the gate, stops new tests from starting while a serial
    test waits, so the serial test is not starved. Without xdist, tests run
    one at a time anyway.
    """
    if "PYTEST_XDIST_WORKER" not in os.environ or sys.platform == "win32":
        yield
        return
    # The workers' base temporary directories share this parent.
    shared = tmp_path_factory.getbasetemp().parent
    serial = request.node.get_closest_marker("serial") is not None
    gate = _flock(shared / "serial.gate", exclusive=serial)
    if not serial:
        os.close(gate)  # through the gate: closing a descriptor drops its lock
    lock = _flock(shared / "serial.lock", exclusive=serial)
    try:
        yield
    finally:
        os.close(lock)
        if serial:
            os.close(gate)


def _flock(path: Path, *, exclusive: bool) -> int:
    """A descriptor of ``path`` holding its lock, exclusive or shared (blocks)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
    return fd
