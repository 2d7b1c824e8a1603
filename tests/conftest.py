"""Fixtures for every test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


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
