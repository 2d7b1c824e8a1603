"""binproto over h11: HTTP/1.1 messages in, parser events out, and back.

h11 is Sans-IO like binproto, so this module is too (except
:func:`receive_body_into`, a small blocking helper for plain sockets). It does
three things:

* build a :class:`binproto.Parser` from an ``h11.Request`` / ``h11.Response``
  (the header length, ``Content-Length`` and ``Content-Encoding`` come from the
  HTTP headers) and feed it ``h11.Data`` / ``h11.EndOfMessage`` events;
* turn an encoded body into the bytes to write, through an ``h11.Connection``,
  without joining tensor buffers: the head goes through ``Connection.send``;
  the JSON header and each tensor buffer through
  ``Connection.send_with_data_passthrough``, which hands back the very object
  it was given (as byte views), ready for ``socket.sendmsg`` or ``writelines``;
* the same for a compressed body (:func:`send_compressed`), a piece at a time;
* V2 error bodies (``{"error": "..."}``) for a :class:`binproto.ProtocolError`.

Typical server loop::

    event = conn.next_event()                 # an h11.Request
    parser = parser_for(event)
    while True:
        event = conn.next_event()             # h11.Data / h11.EndOfMessage
        for ev in receive_events(parser, event):
            ...
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote

try:
    import h11
except ModuleNotFoundError as exc:  # an optional dependency: say which extra brings it
    from binproto.adapters import missing_extra

    raise missing_extra(exc, "h11") from None

import binproto
from binproto import (
    Event,
    Limits,
    LocalProtocolError,
    Parser,
    ProtocolError,
    RemoteProtocolError,
)
from binproto._header import Kind
from binproto._http import HeaderFields, content_length_from, error_body
from binproto._util import as_byte_view, whole_number

from ._intake import header_rest, receive_target

if TYPE_CHECKING:
    from binproto import EncodedBody

__all__ = [
    "PIECE",
    "HTTPError",
    "ResponseFramer",
    "Sender",
    "body_pieces",
    "content_length_of",
    "error_message",
    "error_response",
    "feed",
    "fields_of",
    "has_both_lengths",
    "header_rest",
    "infer_path",
    "json_response",
    "parser_for",
    "receive_body_into",
    "receive_events",
    "receive_target",
    "remote_error",
    "request_for",
    "response_for",
    "send_body",
    "send_compressed",
    "send_data",
    "send_message",
]


#: The largest piece of a tensor buffer handed to a writer at once. Writers that
#: keep what the kernel did not take (asyncio on Python < 3.12 copies it) then
#: hold at most this much extra.
PIECE = 1 << 20


class Sender(Protocol):
    """What the ``send_*`` helpers write a message through: an
    ``h11.Connection``, or a :class:`ResponseFramer` for a server's responses."""

    def send(self, event: h11.Event) -> bytes | None:
        """The bytes of ``event``, joined."""

    def send_with_data_passthrough(self, event: h11.Event) -> list[bytes] | None:
        """The pieces of ``event``, an ``h11.Data``'s data passed through as it is."""


_CLOSE = (b"Connection", b"close")


def _connection_tokens(headers: Iterable[tuple[bytes, bytes]]) -> set[bytes]:
    """The tokens of a head's Connection headers, lower-cased (``close``,
    ``keep-alive``, ...)."""
    return {
        token.strip(b" \t").lower()
        for name, value in headers
        if name.lower() == b"connection"
        for token in value.split(b",")
    } - {b""}


class ResponseFramer:
    """Frames a server's response to one request as h11 would.

    h11 parses the request head; the response then needs only framing: a
    status line and headers, the body as it is (``Content-Length``) or in
    chunks (``Transfer-Encoding: chunked``; to an HTTP/1.0 client, the body
    ends when the connection closes), and ``Connection: close`` when the
    connection will not serve another request. h11's send path does the same
    with a state machine around every event, several times the cost for a
    small response. It takes the same events (``h11.Response``, ``h11.Data``,
    ``h11.EndOfMessage``: see :class:`Sender`), and ``our_state`` moves as
    h11's would: ``SEND_RESPONSE``, ``SEND_BODY``, then ``DONE`` when the
    connection may serve another request, else ``MUST_CLOSE``.

    ``request`` is None when no request could be read (the head was refused):
    the answer then closes the connection.
    """

    def __init__(self, request: h11.Request | None) -> None:
        self.our_state: object = h11.SEND_RESPONSE
        self._head_only = request is not None and request.method == b"HEAD"
        self._http10 = request is None or request.http_version < b"1.1"
        self.keep_alive = request is not None and not self._http10
        if request is not None and b"close" in _connection_tokens(request.headers.raw_items()):
            self.keep_alive = False
        self._length: int | None = None  # body bytes still due (Content-Length)
        self._chunked = False

    @property
    def reusable(self) -> bool:
        """True once the response is complete and the connection may serve
        another request (``our_state`` is ``DONE``)."""
        return self.our_state is h11.DONE

    def send(self, event: h11.Event) -> bytes | None:
        """The bytes of ``event``, joined (None for an ``EndOfMessage`` that adds none)."""
        pieces = self.send_with_data_passthrough(event)
        return b"".join(pieces) if pieces else None

    def send_with_data_passthrough(self, event: h11.Event) -> list[Any] | None:
        """The pieces of ``event``; an ``h11.Data``'s data is passed through
        unjoined. Raises ``h11.LocalProtocolError`` for an event out of order or
        body bytes beyond the declared ``Content-Length``, as h11 does."""
        kind = type(event)
        if kind is h11.Response and self.our_state is h11.SEND_RESPONSE:
            assert isinstance(event, h11.Response)
            return [self.send_head(event.status_code, event.headers.raw_items(), event.reason)]
        if kind is h11.Data and self.our_state is h11.SEND_BODY:
            assert isinstance(event, h11.Data)
            return self._data(event.data)
        if kind is h11.EndOfMessage and self.our_state is h11.SEND_BODY:
            return self._end()
        raise h11.LocalProtocolError(f"can't send {kind.__name__} in state {self.our_state}")

    def send_response(
        self, status: int, body: EncodedBody, headers: Iterable[tuple[str, str]] = ()
    ) -> list[Any]:
        """The pieces of a whole response carrying ``body`` (its framing headers
        and ``headers`` in the head): what ``send_message(framer,
        response_for(status, body, headers=headers), body)`` gives, without
        building h11 events for headers binproto made itself."""
        pairs = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in _header_list(body, headers)]
        out: list[Any] = [self.send_head(status, pairs)]
        for piece in body_pieces(body):
            out.extend(self._data(piece))
        out.extend(self._end())
        return out

    def send_head(
        self, status: int, headers: Iterable[tuple[bytes, bytes]], reason: bytes = b""
    ) -> bytes:
        """The status line and header lines of the response (framing headers
        added as h11 would). Raises ``h11.LocalProtocolError`` once a head was sent."""
        if self.our_state is not h11.SEND_RESPONSE:
            raise h11.LocalProtocolError(f"can't send Response in state {self.our_state}")
        headers = list(headers)
        lowered = [name.lower() for name, _ in headers]
        if status in (204, 304):
            self._length = 0  # never a body, whatever the headers say (RFC 9110 6.4.1)
        elif b"content-length" in lowered and b"transfer-encoding" not in lowered:
            self._length = (
                0 if self._head_only else int(headers[lowered.index(b"content-length")][1])
            )
        else:
            # A body of unknown length, or one the caller framed with
            # Transfer-Encoding (which beats Content-Length, dropped then):
            # chunked, or to an HTTP/1.0 client ended by the close.
            if b"transfer-encoding" in lowered:
                coding = headers[lowered.index(b"transfer-encoding")][1]
                if coding.strip().lower() != b"chunked":
                    raise h11.LocalProtocolError("Only Transfer-Encoding: chunked is supported")
            framing = (b"content-length", b"transfer-encoding")
            headers = [
                pair for pair, name in zip(headers, lowered, strict=True) if name not in framing
            ]
            if not self._http10:  # (to HTTP/1.0, keep_alive is False already)
                headers.append((b"Transfer-Encoding", b"chunked"))
                self._chunked = not self._head_only
        if not self.keep_alive:
            # The connection closes whatever the response says: as h11 does,
            # its Connection header is rewritten, with close, without keep-alive.
            if b"connection" in lowered:
                tokens = (_connection_tokens(headers) - {b"keep-alive"}) | {b"close"}
                headers = [pair for pair in headers if pair[0].lower() != b"connection"]
                headers.extend((b"Connection", token) for token in sorted(tokens))
            else:
                headers.append(_CLOSE)
        elif b"connection" in lowered and b"close" in _connection_tokens(headers):
            self.keep_alive = False  # the response closes it (its header left as written)
        self.our_state = h11.SEND_BODY
        lines = [b"HTTP/1.1 %d %s\r\n" % (status, reason)]
        lines.extend(b"%s: %s\r\n" % pair for pair in headers)
        lines.append(b"\r\n")
        return b"".join(lines)

    def _end(self) -> list[bytes]:
        if self._length:
            raise h11.LocalProtocolError("Too little data for declared Content-Length")
        self.our_state = h11.DONE if self.keep_alive else h11.MUST_CLOSE
        return [b"0\r\n\r\n"] if self._chunked else []

    def _data(self, data: Any) -> list[Any]:
        n = len(data)
        if self._head_only or not n:
            return []
        if self._length is not None:
            self._length -= n
            if self._length < 0:
                raise h11.LocalProtocolError("Too much data for declared Content-Length")
            return [data]
        if self._chunked:
            return [b"%x\r\n" % n, data, b"\r\n"]
        return [data]


class HTTPError(Exception):
    """A V2 endpoint answered with an error status.

    ``status`` is the HTTP status; ``message`` the ``"error"`` of the V2 error
    body (or the body itself when it is not one).
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


def _headers(event: h11.Request | h11.Response) -> list[tuple[bytes, bytes]]:
    return list(event.headers)


def fields_of(event: h11.Request | h11.Response | HeaderFields) -> HeaderFields:
    """The header fields of a message head, read once (see
    :class:`binproto.HeaderFields`); given fields are returned as they are."""
    if isinstance(event, HeaderFields):
        return event
    # raw_items() is a plain list; iterating h11's Headers goes item by item.
    return HeaderFields(event.headers.raw_items())


def remote_error(exc: h11.ProtocolError, offset: int | None = None) -> RemoteProtocolError:
    """h11's complaint about the peer's HTTP, as binproto's error (with h11's
    status hint, and the body offset it was found at when given)."""
    return RemoteProtocolError(str(exc), status_hint=exc.error_status_hint, offset=offset)


def content_length_of(event: h11.Request | h11.Response | HeaderFields) -> int | None:
    """The ``Content-Length`` of a message head (h11 has validated it), or None.

    None also beside a ``Transfer-Encoding``, which frames the body instead
    (h11 reads it so; RFC 9112, section 6.3). ``event`` may be the head's
    :func:`fields_of`.
    """
    return content_length_from(fields_of(event))


def has_both_lengths(event: h11.Request | h11.Response | HeaderFields) -> bool:
    """True when the head carries both ``Content-Length`` and
    ``Transfer-Encoding``: a request a server must refuse or answer and then
    close (RFC 9112, section 6.1), as a peer may mean either framing.
    ``event`` may be the head's :func:`fields_of`."""
    fields = fields_of(event)
    return fields.get("content-length") is not None and fields.get("transfer-encoding") is not None


def parser_for(
    event: h11.Request | h11.Response,
    *,
    limits: Limits | None = None,
    strict_bool: bool = True,
    fields: HeaderFields | None = None,
) -> Parser:
    """A :class:`binproto.Parser` for the body of ``event``.

    A request gets a request parser, a response a response parser. The
    ``Inference-Header-Content-Length``, ``Content-Length`` and
    ``Content-Encoding`` headers configure it (read from ``fields`` when
    given: the head's :func:`fields_of`). Raises
    :class:`binproto.RemoteProtocolError` for bad values of those headers
    (status hint 415 for an unsupported content coding).
    """
    kind: Kind = "request" if isinstance(event, h11.Request) else "response"
    headers = fields if fields is not None else fields_of(event)
    return binproto.parser_from_headers(kind, headers, limits=limits, strict_bool=strict_bool)


def feed(parser: Parser, event: h11.Data | h11.EndOfMessage) -> None:
    """Give the parser the body bytes of an ``h11.Data`` (``EndOfMessage``: the end)."""
    if type(event) is h11.Data:
        parser.receive_data(event.data)
    else:
        parser.receive_data(b"")


def receive_events(parser: Parser, event: h11.Data | h11.EndOfMessage) -> Iterator[Event]:
    """Feed an h11 body event to the parser and yield the events it completes.

    Yields nothing once the message is complete (an ``EndOfMessage`` after a
    ``Content-Length`` body already ended it).
    """
    feed(parser, event)
    yield from parser.events()


def _buffers(body: EncodedBody | Sequence[Any]) -> Sequence[Any]:
    return body.buffers if hasattr(body, "buffers") else body


def body_pieces(body: EncodedBody | Sequence[Any]) -> Iterator[memoryview]:
    """The byte views ``body`` goes out as: each non-empty buffer (the JSON
    header included, which may be large), cut into views of at most
    :data:`PIECE` bytes. Nothing is copied."""
    for buf in _buffers(body):
        view = as_byte_view(buf)
        for start in range(0, len(view), PIECE):
            yield view[start : start + PIECE]


def send_data(conn: Sender, buf: Any) -> list[Any]:
    """The pieces to write for body bytes ``buf``, passed through, not copied.

    ``buf`` (any C-contiguous buffer) goes out as byte views of at most
    :data:`PIECE` bytes, plus whatever framing h11 adds (chunk headers).
    """
    out: list[Any] = []
    for piece in body_pieces([buf]):
        # h11 takes any object with a len() here and passes it through as is.
        pieces = conn.send_with_data_passthrough(h11.Data(data=piece))  # type: ignore[arg-type]
        assert pieces is not None
        out.extend(pieces)
    return out


def send_body(conn: Sender, body: EncodedBody | Sequence[Any]) -> list[Any]:
    """The pieces to write for the body ``body`` (a head has been sent).

    Every buffer goes through ``conn.send_with_data_passthrough``, so the
    list holds the body's memory itself (as byte views of at most
    :data:`PIECE` bytes: :func:`body_pieces`), never a copy. Ends the
    message. Write the pieces in order, e.g. with ``socket.sendmsg`` or one
    ``write`` each.
    """
    out: list[Any] = []
    for piece in body_pieces(body):
        pieces = conn.send_with_data_passthrough(h11.Data(data=piece))  # type: ignore[arg-type]
        assert pieces is not None
        out.extend(pieces)
    tail = conn.send(h11.EndOfMessage())
    if tail:
        out.append(tail)
    return out


def send_message(
    conn: Sender,
    head: h11.Request | h11.Response,
    body: EncodedBody | Sequence[Any] = (),
) -> list[Any]:
    """The pieces to write for a whole message: its head, then :func:`send_body`."""
    first = conn.send(head)
    assert first is not None
    return [first, *send_body(conn, body)]


def _header_list(
    body: EncodedBody | None, extra: Iterable[tuple[str, str]], encoding: str | None = None
) -> list[Any]:
    headers: list[tuple[str, str]] = []
    if body is not None:
        for k, v in body.headers:
            # A compressed body's length is not known before it is sent.
            if encoding is not None and str(k).lower() == "content-length":
                continue
            headers.append((str(k), str(v)))
    if encoding is not None:
        headers.append(("Content-Encoding", encoding))
    headers.extend(extra)
    return headers


def infer_path(model_name: str, model_version: str | None = None) -> str:
    """The path of a model's V2 inference endpoint (names are URL-quoted).

    Raises :class:`binproto.LocalProtocolError` for a name or version that is
    not a ``str``.
    """
    if not isinstance(model_name, str) or not isinstance(model_version, (str, type(None))):
        raise LocalProtocolError(
            f"a model name and version are strings, got {model_name!r} and {model_version!r}"
        )
    path = f"/v2/models/{quote(model_name, safe='')}"
    if model_version:
        path += f"/versions/{quote(model_version, safe='')}"
    return path + "/infer"


def request_for(
    target: str,
    body: EncodedBody | None,
    *,
    host: str = "localhost",
    method: str = "POST",
    headers: Iterable[tuple[str, str]] = (),
    encoding: str | None = None,
) -> h11.Request:
    """An ``h11.Request`` head for ``body`` (its framing headers included).

    With ``encoding`` (``"gzip"`` or ``"deflate"``) the head is for the body
    compressed (:func:`send_compressed`): ``Content-Encoding`` and chunked
    framing instead of ``Content-Length``.
    """
    extra = [("Host", host), *headers]
    if body is None and method == "POST":
        extra.append(("Content-Length", "0"))
    if encoding is not None:
        extra.append(("Transfer-Encoding", "chunked"))
    return h11.Request(method=method, target=target, headers=_header_list(body, extra, encoding))


def response_for(
    status: int,
    body: EncodedBody | None,
    *,
    headers: Iterable[tuple[str, str]] = (),
    encoding: str | None = None,
) -> h11.Response:
    """An ``h11.Response`` head for ``body`` (its framing headers included).

    With ``encoding`` the head is for the body compressed
    (:func:`send_compressed`): ``Content-Encoding`` and no ``Content-Length``,
    so h11 frames it with chunked transfer coding (or, for an HTTP/1.0 peer,
    by closing the connection).
    """
    return h11.Response(status_code=status, headers=_header_list(body, headers, encoding))


def send_compressed(
    conn: Sender, body: EncodedBody | Sequence[Any], encoding: str, *, level: int = 1
) -> Iterator[list[Any]]:
    """The pieces to write for ``body`` compressed with ``encoding``, a batch at a time.

    A head from :func:`request_for` / :func:`response_for` with the same
    ``encoding`` has been sent. The body goes through
    :func:`binproto.compress_buffers` (``level`` as there), and each batch
    holds one compressed piece with h11's framing: write a batch before taking
    the next, so the compressed body is never held whole. The last batch ends
    the message.
    """
    held: list[Any] = []
    for piece in binproto.compress_buffers(_buffers(body), encoding, level=level):
        if held:
            yield held
        held = send_data(conn, piece)
    tail = conn.send(h11.EndOfMessage())
    if tail:
        held.append(tail)
    yield held


def error_response(
    error: ProtocolError | str, status: int | None = None
) -> tuple[h11.Response, bytes]:
    """A V2 error response: the head and the ``{"error": "..."}`` body.

    The status is ``status``, else the error's ``status_hint``, else 400;
    a 503 says ``Retry-After: 1``. The message quotes at most 1 KiB of what the peer sent (see
    :func:`binproto._http.error_text`).
    """
    if isinstance(error, ProtocolError):
        code = status if status is not None else error.status_hint
    else:
        code = status if status is not None else 400
    payload = error_body(error)
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(payload)))]
    if code == 503:  # busy, not broken: say when to come back
        headers.append(("Retry-After", "1"))
    return h11.Response(status_code=code, headers=headers), payload


def json_response(payload: Any, status: int = 200) -> tuple[h11.Response, bytes]:
    """A JSON response: the head and the encoded body."""
    data = json.dumps(payload).encode()
    head = h11.Response(
        status_code=status,
        headers=[("Content-Type", "application/json"), ("Content-Length", str(len(data)))],
    )
    return head, data


def error_message(status: int, body: bytes) -> HTTPError:
    """An :class:`HTTPError` from an error response's status and body."""
    message = body.decode("utf-8", "replace")
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, or nested past Python's stack
        pass
    else:
        if isinstance(obj, dict) and isinstance(obj.get("error"), str):
            message = obj["error"]
    return HTTPError(status, message)


def receive_body_into(
    sock: socket.socket,
    conn: h11.Connection,
    parser: Parser,
    assembler: binproto.TensorAssembler,
    *,
    chunk_size: int = 1 << 16,
) -> None:
    """Receive a body into ``assembler`` over a blocking socket, zero-copy.

    Call after ``conn`` returned the message head and ``parser`` was built for
    it (:func:`parser_for`). Bytes h11 has already buffered go through h11
    first. After that, for a ``Content-Length`` body without a content
    encoding, binary tensor bytes go from the kernel straight into the tensor's
    memory with ``recv_into`` (see :meth:`binproto.Parser.next_tensor_region`);
    everything else is read in pieces of ``chunk_size``. Returns when the
    message is complete; raises :class:`binproto.RemoteProtocolError` on a bad
    body or a peer that closed early.

    h11 never sees the bytes read this way, so ``conn`` cannot go on to the
    next request/response cycle: start a new ``h11.Connection`` for it.
    """
    size = whole_number(chunk_size, "chunk_size", positive=True)
    try:
        _receive_body_into(sock, conn, parser, assembler, size)
    except h11.RemoteProtocolError as exc:  # bad chunked framing, or an early close
        raise remote_error(exc, parser.bytes_parsed) from None


def _receive_body_into(
    sock: socket.socket,
    conn: h11.Connection,
    parser: Parser,
    assembler: binproto.TensorAssembler,
    chunk_size: int,
) -> None:
    from binproto import NEED_DATA, MessageComplete

    def drain() -> bool:
        while True:
            event = parser.next_event()
            if event is NEED_DATA:
                return False
            assembler.feed(event)
            if type(event) is MessageComplete:
                return True

    # First what h11 holds already.
    delivered = 0
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            break
        if type(event) is h11.Data:
            delivered += len(event.data)
            parser.receive_data(event.data)
            if drain():
                return
        elif type(event) is h11.EndOfMessage:
            parser.receive_data(b"")
            if not drain():
                raise RemoteProtocolError("the body ended early", offset=parser.bytes_parsed)
            return
        elif isinstance(event, (h11.Request, h11.Response, h11.InformationalResponse)):
            raise LocalProtocolError(
                f"receive_body_into is called after the message head; conn returned a"
                f" {type(event).__name__}"
            )
        else:  # ConnectionClosed
            raise RemoteProtocolError(
                "the peer closed the connection before the end of the body",
                offset=parser.bytes_parsed,
            )
    content_length = parser.content_length
    if content_length is None:
        # Chunked or compressed framing: h11 must see every byte.
        while True:
            data = sock.recv(chunk_size)
            conn.receive_data(data)
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    break
                if type(event) is h11.Data:
                    parser.receive_data(event.data)
                elif type(event) is h11.EndOfMessage:
                    parser.receive_data(b"")
                else:
                    raise RemoteProtocolError(
                        "the connection closed in the body", offset=parser.bytes_parsed
                    )
                if drain():
                    return
    remaining = content_length - delivered
    scratch = bytearray(chunk_size)
    while remaining:
        target = receive_target(parser, assembler)
        if target is not None:
            view = target[:remaining]
        else:
            # Stop at the end of the JSON header, so tensor bytes go in place.
            size = min(chunk_size, remaining, header_rest(parser, content_length - remaining))
            view = memoryview(scratch)[:size]
        n = sock.recv_into(view)
        if not n:
            parser.receive_data(b"")
            drain()
            raise RemoteProtocolError(
                "the connection closed in the body", offset=parser.bytes_parsed
            )
        remaining -= n
        parser.receive_data(view[:n])
        if drain():
            return
    if not drain():
        raise RemoteProtocolError("the body ended early", offset=parser.bytes_parsed)
