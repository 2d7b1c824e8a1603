"""The one exception family binproto raises for protocol faults."""

from __future__ import annotations

__all__ = ["LocalProtocolError", "ProtocolError", "RemoteProtocolError"]


class ProtocolError(Exception):
    """Base class of every protocol fault binproto reports.

    ``status_hint`` is the HTTP status a server should answer with (400 for a
    malformed body, 413 for a body over a limit, 415 for an unknown content
    encoding, 500 for a local fault). ``offset`` is the byte offset in the
    (decoded) body where the fault was found, or ``None`` when the fault is not
    tied to a position.
    """

    def __init__(self, msg: str, *, status_hint: int = 400, offset: int | None = None) -> None:
        super().__init__(msg)
        self.msg = msg
        self.status_hint = status_hint
        self.offset = offset

    def __str__(self) -> str:
        if self.offset is None:
            return self.msg
        return f"{self.msg} (at byte {self.offset})"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.msg!r}, status_hint={self.status_hint},"
            f" offset={self.offset})"
        )


class RemoteProtocolError(ProtocolError):
    """The peer sent something that breaks the protocol or a configured limit."""


class LocalProtocolError(ProtocolError):
    """The caller used the API in a way the protocol does not allow."""

    def __init__(self, msg: str, *, status_hint: int = 500, offset: int | None = None) -> None:
        super().__init__(msg, status_hint=status_hint, offset=offset)
