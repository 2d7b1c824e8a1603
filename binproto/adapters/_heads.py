"""The request heads binproto's HTTP/1.1 server remembers (see :class:`KnownHeads`)."""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import h11

from binproto import HeaderFields
from binproto._http import CREDENTIAL_HEADERS, KeptOnSecondSight

__all__ = [
    "REMEMBERED_HEADER_LINES",
    "REMEMBERED_HEADS",
    "REMEMBERED_HEAD_BYTES",
    "Head",
    "KnownHeads",
]


#: Where a request head ends: its first empty line (as h11 finds it).
_HEAD_END = re.compile(rb"\n\r?\n")


def _split_at_head_end(data: Any) -> tuple[Any, Any]:
    """``data`` cut after the first empty line in it: what h11 needs to end
    the head it is reading, and the rest (a view, not a copy). h11 would copy
    the rest into its buffer, and the body reader out of it again; a body
    sent with its head skips both. No empty line: all of ``data``, and
    ``b""``. (An empty line that spans two reads is missed: h11 then holds
    what follows it, which the body reader takes from it, as before.)"""
    found = _HEAD_END.search(data)
    if found is None or found.end() == len(data):
        return data, b""
    view = memoryview(data)
    return view[: found.end()], view[found.end() :]


class Head(NamedTuple):
    """A request head as the server read it."""

    request: h11.Request  #: what h11 read from it
    fields: HeaderFields  #: its header fields (:func:`~binproto.adapters.h11.fields_of`)
    ahead: Any  #: bytes received past its end that h11 was not given (see _split_at_head_end)


#: Longest request head remembered, in bytes (see KnownHeads).
REMEMBERED_HEAD_BYTES = 1024
#: Most header lines a remembered head has.
REMEMBERED_HEADER_LINES = 32
#: Most heads a server remembers at once by default (``V2Server.remembered_heads``):
#: under 1 MiB at the very most.
REMEMBERED_HEADS = 64
#: Headers of a head that is never remembered (those that carry credentials among them).
_NOT_REMEMBERED = (*CREDENTIAL_HEADERS, "transfer-encoding", "expect", "upgrade")


class KnownHeads:
    """The requests h11 read from the last few request heads, by their bytes.

    A client sends the same head again and again: the same target, headers
    and body length. What h11 reads from a head depends on its bytes alone
    when the connection held nothing else; and past the head the server uses
    h11 for nothing when the body is framed by ``Content-Length`` (read
    around h11: see :class:`BodyReader`) and no ``Expect: 100-continue``
    waits for an answer: the connection is then as it was before the head.
    Such a head, received whole into an empty connection, is remembered the
    second time h11 reads it (the first time only its hash is noted: a head
    that never comes again, a body length new each time, costs a set entry,
    not a kept request); when its bytes come again, its request (the same
    ``h11.Request`` object) is reused and h11 is not given them. As precautions, heads that
    ask for a protocol switch (``Upgrade``, ``CONNECT``) or carry
    ``Transfer-Encoding`` are read each time, and heads carrying credentials
    (``Authorization``, ``Proxy-Authorization``, ``Cookie``) are never kept:
    the heads are shared by the server's connections, and a known head is
    answered sooner. Up to ``capacity`` heads are kept (0: none), and the
    hashes of up to :data:`~binproto._http.SEEN_PER_KEPT` times as many seen
    once (see :class:`~binproto._http.KeptOnSecondSight`).
    """

    def __init__(self, capacity: int = REMEMBERED_HEADS) -> None:
        self.capacity = capacity
        self._heads: KeptOnSecondSight[bytes, tuple[h11.Request, HeaderFields]] = (
            KeptOnSecondSight()
        )

    def get(self, head: bytes) -> tuple[h11.Request, HeaderFields] | None:
        """The request h11 read from ``head`` before, and its fields; or None."""
        return self._heads.get(head)

    def remember(self, head: bytes, request: h11.Request, fields: HeaderFields) -> None:
        """Keep ``request``, which h11 read from ``head`` alone (given it whole,
        in an empty connection, which holds nothing more), and its ``fields``
        (:func:`~binproto.adapters.h11.fields_of`), when it qualifies.
        (The server offers only heads of at most :data:`REMEMBERED_HEAD_BYTES` bytes:
        a longer one is not copied to be looked up.)"""
        if not self.capacity or not self._heads.seen_before(head, self.capacity):
            return
        if len(request.headers) > REMEMBERED_HEADER_LINES or request.method == b"CONNECT":
            return
        if "content-length" not in fields or any(name in fields for name in _NOT_REMEMBERED):
            return
        self._heads.keep(head, (request, fields), self.capacity)
