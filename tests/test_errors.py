"""The exception family: status hints, byte offsets, text."""

from __future__ import annotations

import pytest

from binproto import LocalProtocolError, ProtocolError, RemoteProtocolError


def test_remote_faults_default_to_400_and_local_ones_to_500() -> None:
    assert RemoteProtocolError("bad").status_hint == 400
    assert LocalProtocolError("misuse").status_hint == 500
    assert RemoteProtocolError("big", status_hint=413).status_hint == 413


def test_both_are_protocol_errors_and_neither_is_the_other() -> None:
    remote, local = RemoteProtocolError("r"), LocalProtocolError("l")
    assert isinstance(remote, ProtocolError) and isinstance(local, ProtocolError)
    assert not isinstance(remote, LocalProtocolError)
    assert not isinstance(local, RemoteProtocolError)


def test_the_offset_is_shown_in_the_text() -> None:
    exc = RemoteProtocolError("unexpected end of body", offset=17)
    assert (exc.msg, exc.offset) == ("unexpected end of body", 17)
    assert str(exc) == "unexpected end of body (at byte 17)"
    assert str(RemoteProtocolError("no position")) == "no position"
    assert str(RemoteProtocolError("at the start", offset=0)) == "at the start (at byte 0)"


def test_repr_names_the_class_hint_and_offset() -> None:
    exc = LocalProtocolError("misuse", offset=3)
    assert repr(exc) == "LocalProtocolError('misuse', status_hint=500, offset=3)"


def test_the_hint_and_offset_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        RemoteProtocolError("bad", 413)  # type: ignore[call-arg]
