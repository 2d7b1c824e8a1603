"""Reading and writing the extension's HTTP headers."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Hashable, Iterable, Mapping
from typing import Generic, NamedTuple, TypeVar

from ._compression import normalize_encoding, unsupported_encoding
from ._errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from ._header import Kind
from ._limits import Limits
from ._parser import Parser
from ._raw import TensorSpec
from ._readers import check_lengths
from ._util import whole_number

__all__ = [
    "CONTENT_ENCODING_NAME",
    "CREDENTIAL_HEADERS",
    "HEADER_LENGTH_NAME",
    "MAX_ERROR_BODY",
    "MAX_ERROR_TEXT",
    "SEEN_PER_KEPT",
    "TE_IN_HTTP_1_0",
    "BodyClaims",
    "HeaderFields",
    "Headers",
    "KeptOnSecondSight",
    "body_claims",
    "content_encoding_from",
    "content_length_from",
    "error_body",
    "error_text",
    "header_length_from",
    "header_value",
    "message_headers",
    "parser_from_headers",
    "preferred_encoding",
    "raw_message_headers",
]

HEADER_LENGTH_NAME = "Inference-Header-Content-Length"

#: Headers that carry credentials: what was read from headers with one of
#: them is never kept for other requests (see :class:`KeptOnSecondSight`).
CREDENTIAL_HEADERS = ("authorization", "proxy-authorization", "cookie")
#: Keys seen once whose hashes a :class:`KeptOnSecondSight` notes, per value it keeps.
SEEN_PER_KEPT = 16

_K = TypeVar("_K", bound=Hashable)
_V = TypeVar("_V")


class KeptOnSecondSight(Generic[_K, _V]):
    """What was read from bytes that come again and again (a request head,
    a header list), kept by those bytes from the second time they come.

    The first time only a key's hash is noted: a key that never comes again
    (a request id in it, a new body length) costs a set entry, not a kept
    value. Up to ``capacity`` values are kept and the hashes of
    :data:`SEEN_PER_KEPT` times as many keys; when either is full it is
    cleared (simplest, and safe from threads racing to drop one entry). The
    capacity is given with each call, so that a bound its user reads at run
    time applies at once.
    """

    def __init__(self) -> None:
        self.kept: dict[_K, _V] = {}  #: the values kept, by key
        self.seen: set[int] = set()  #: hashes of keys seen once

    def get(self, key: _K) -> _V | None:
        """The value kept for ``key``, or None."""
        return self.kept.get(key)

    def seen_before(self, key: _K, capacity: int) -> bool:
        """Note ``key``; True when it was noted before, and its value may be
        kept (:meth:`keep`) if it qualifies."""
        noted = hash(key)  # (a bytes key's: cached by the lookup that missed)
        seen = self.seen
        if noted in seen:
            return True
        if len(seen) >= SEEN_PER_KEPT * capacity:
            seen.clear()
        seen.add(noted)
        return False

    def keep(self, key: _K, value: _V, capacity: int) -> None:
        """Keep ``value`` for ``key``."""
        kept = self.kept
        if len(kept) >= capacity:
            kept.clear()
        kept[key] = value


# Longer than any body anyone will send: 2**53, also exact in a JSON number.
_ABSURD = 2**53


# The whitespace HTTP allows around a field's value (RFC 9110 5.6.3): not
# every character str.strip() takes (a no-break space before "12" is no
# Content-Length of 12).
_OWS = " \t"


def _text(value: str | bytes) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


def _not_text(name: object, value: object) -> LocalProtocolError:
    return LocalProtocolError(f"header names and values are str or bytes, got {name!r}: {value!r}")


class HeaderFields:
    """A message's header fields, read once: values by lower-cased name
    (``str`` or ``bytes``, as latin-1; each value is decoded and stripped when
    it is looked up).

    Pass it wherever :data:`Headers` are taken to look up several headers of
    one message without reading every header each time (a server reads
    Content-Length, Transfer-Encoding, Content-Encoding and
    Inference-Header-Content-Length of each request). A name repeated with
    different values is an error when it is looked up, as with
    :func:`header_value`. :func:`body_claims` of the same fields reads them
    once and keeps its result with them.
    """

    __slots__ = ("_claims", "_raw", "_repeats")

    def __init__(
        self,
        headers: Mapping[str, str]
        | Mapping[bytes, bytes]
        | Iterable[tuple[str, str]]
        | Iterable[tuple[bytes, bytes]],
    ) -> None:
        # Only the names are read here; a value is decoded when it is looked
        # up (a server reads four of a request's headers, of any number).
        raw: dict[str, str | bytes] = {}
        repeats: dict[str, list[str | bytes]] = {}
        items: Iterable[tuple[str | bytes, str | bytes]]
        if isinstance(headers, (list, tuple)):  # (before the slower Mapping check)
            items = headers
        else:
            items = headers.items() if isinstance(headers, Mapping) else headers
        for key, value in items:
            if type(key) is bytes:  # (as servers give them: the cheapest test first)
                name = key.decode("latin-1").lower()
            elif isinstance(key, str):
                name = key.lower()
            else:
                raise _not_text(key, value)
            if type(value) is not bytes and not isinstance(value, (str, bytes)):
                raise _not_text(key, value)
            if name in raw:
                repeats.setdefault(name, []).append(value)
            else:
                raw[name] = value
        self._raw = raw
        self._repeats = repeats
        self._claims: BodyClaims | None = None  # (see body_claims)

    def __contains__(self, name: object) -> bool:
        """True when header ``name`` (any case) is present."""
        return isinstance(name, str) and name.lower() in self._raw

    def get(self, name: str) -> str | None:
        """The value of header ``name`` (any case), or None when absent.

        Raises :class:`RemoteProtocolError` (400) when the header is repeated
        with different values.
        """
        return self._value(name.lower(), name)

    def _value(self, wanted: str, name: str) -> str | None:
        """:meth:`get` of a lower-cased name (``name`` as errors spell it)."""
        value = self._raw.get(wanted)
        if value is None:
            return None
        text = _text(value).strip(_OWS)
        if self._repeats and wanted in self._repeats:
            for other in self._repeats[wanted]:
                if _text(other).strip(_OWS) != text:
                    raise RemoteProtocolError(
                        f"conflicting {name} headers: {text!r} and {_text(other).strip(_OWS)!r}"
                    )
        elif value is not text:
            self._raw[wanted] = text  # decoded once: a server reads a kept head's fields again
        return text


#: Any header collection: a mapping, an iterable of (name, value) pairs, or
#: :class:`HeaderFields`.
Headers = (
    Mapping[str, str]
    | Mapping[bytes, bytes]
    | Iterable[tuple[str, str]]
    | Iterable[tuple[bytes, bytes]]
    | HeaderFields
)


def header_value(headers: Headers, name: str) -> str | None:
    """The value of header ``name`` (case-insensitive), or None when absent.

    Repeated headers with different values are an error (status hint 400).
    """
    return _fields(headers).get(name)


def _fields(headers: Headers) -> HeaderFields:
    return headers if isinstance(headers, HeaderFields) else HeaderFields(headers)


def header_length_from(headers: Headers, *, content_length: int | None = None) -> int | None:
    """Read Inference-Header-Content-Length from any header mapping or list of pairs.

    Names match case-insensitively; names and values may be ``str`` or ``bytes``.
    Returns None when the header is absent (the body is plain JSON). Raises
    :class:`RemoteProtocolError` for a value that is not a decimal integer, is
    negative, is absurdly large, or exceeds ``content_length`` when given.
    """
    return _header_length(_fields(headers), content_length)


def _size(digits: str) -> int:
    """The value of ASCII decimal ``digits``, :data:`_ABSURD` past 20 of them.
    Leading zeros are no size, and are not parsed (``int()`` refuses a string of
    over 4,300 digits, zeros included)."""
    significant = digits.lstrip("0")
    return int(significant or "0") if len(significant) <= 20 else _ABSURD


def _header_length(fields: HeaderFields, content_length: int | None) -> int | None:
    text = fields._value("inference-header-content-length", HEADER_LENGTH_NAME)
    if text is None:
        return None
    digits = text[1:] if text[:1] in "+-" else text
    if not digits.isascii() or not digits.isdigit():
        raise RemoteProtocolError(f"Unable to parse {HEADER_LENGTH_NAME}, got: {text}")
    value = _size(digits)
    if text[:1] == "-" and value:
        value = -1  # out of range below, whatever its size
    if value >= _ABSURD:
        raise RemoteProtocolError(
            f"{HEADER_LENGTH_NAME} is absurdly large, got: {text}", status_hint=413
        )
    if value < 0 or (content_length is not None and value > content_length):
        bound = "Content-Length" if content_length is None else str(content_length)
        past = ""
        if content_length is not None and value > content_length:
            past = f" (a header longer than the {content_length}-byte body, which ends there)"
        raise RemoteProtocolError(
            f"inference header size should be in range (0, {bound}), got: {text}{past}",
            offset=content_length if past else 0,
        )
    return value


def raw_message_headers(
    header_length: int | None, content_length: int
) -> list[tuple[bytes, bytes]]:
    """The HTTP headers that frame a body this extension's way, as ASGI
    servers and h11 take them: lower-cased names and values as bytes.

    ``header_length`` is the JSON header's length when binary tensors follow
    it, None for a plain JSON body. Returns inference-header-content-length
    (only when binary), content-length, and content-type
    (``application/octet-stream`` with binary tensors, else ``application/json``).
    """
    length = b"%d" % whole_number(content_length, "content_length")
    if header_length is None:
        return [(b"content-length", length), _JSON_TYPE]
    return [
        (
            b"inference-header-content-length",
            b"%d" % whole_number(header_length, "header_length"),
        ),
        (b"content-length", length),
        _BINARY_TYPE,
    ]


_JSON_TYPE = (b"content-type", b"application/json")
_BINARY_TYPE = (b"content-type", b"application/octet-stream")


def message_headers(header_length: int | None, content_length: int) -> list[tuple[str, str]]:
    """The headers of :func:`raw_message_headers` as ``str`` pairs, names
    capitalized: Inference-Header-Content-Length (only when binary),
    Content-Length and Content-Type. (Made directly, not converted: a server
    writes them for every response.)"""
    length = str(whole_number(content_length, "content_length"))
    if header_length is None:
        return [("Content-Length", length), ("Content-Type", "application/json")]
    return [
        (HEADER_LENGTH_NAME, str(whole_number(header_length, "header_length"))),
        ("Content-Length", length),
        ("Content-Type", "application/octet-stream"),
    ]


CONTENT_ENCODING_NAME = "Content-Encoding"


def content_encoding_from(headers: Headers) -> str | None:
    """Read Content-Encoding from any header mapping or list of pairs.

    Returns ``"gzip"`` or ``"deflate"``, or None when the header is absent or
    says ``identity`` (the value to pass as ``content_encoding=``). A list of
    codings is accepted when at most one of them is not ``identity``. Raises
    :class:`RemoteProtocolError` with status hint 415 for any other coding,
    naming the supported ones (answer with ``Accept-Encoding: gzip, deflate``).
    """
    return _content_encoding(_fields(headers))


def _content_encoding(fields: HeaderFields) -> str | None:
    text = fields._value("content-encoding", CONTENT_ENCODING_NAME)
    if text is None:
        return None
    codings = [c for c in (normalize_encoding(p) for p in text.split(",") if p.strip()) if c]
    if len(codings) > 1:
        raise unsupported_encoding(text)
    return codings[0] if codings else None


def content_length_from(headers: Headers) -> int | None:
    """Read Content-Length from any header mapping or list of pairs.

    None when it is absent, and when Transfer-Encoding is present: the body
    is then framed by its transfer coding, and a Content-Length beside it
    does not count (RFC 9112, section 6.3). Raises
    :class:`RemoteProtocolError` for a value that is not a decimal integer
    (negative ones included) or is absurdly large.
    """
    return _content_length(_fields(headers))


def _content_length(fields: HeaderFields) -> int | None:
    text = fields._value("content-length", "Content-Length")
    if text is None or fields._value("transfer-encoding", "Transfer-Encoding") is not None:
        return None
    if not text.isascii() or not text.isdigit():
        raise RemoteProtocolError(f"invalid Content-Length: {text!r}")
    value = _size(text)
    if value >= _ABSURD:
        raise RemoteProtocolError(f"Content-Length is absurdly large, got: {text}", status_hint=413)
    return value


#: A plain JSON header at least this long is parsed off the event loop
#: (:meth:`BodyClaims.slow_header_from`).
SLOW_HEADER = 1 << 20
#: A compressed JSON header at least this long is inflated and parsed off
#: the event loop.
SLOW_COMPRESSED_HEADER = 1 << 16


class BodyClaims(NamedTuple):
    """What a message's HTTP headers say about its body (:func:`body_claims`).

    Attributes:
        content_length: Content-Length (the body's length on the wire), or None.
        content_encoding: ``"gzip"``, ``"deflate"`` or None.
        header_length: Inference-Header-Content-Length, or None (plain JSON).
    """

    content_length: int | None
    content_encoding: str | None
    header_length: int | None

    def check(self, limits: Limits, *, raw_input: TensorSpec | None = None) -> None:
        """Refuse lengths ``limits`` do not allow, before any body byte is read:
        the length checks a parser built from these claims makes first (a raw
        binary request, ``header_length`` 0, is refused without ``raw_input``,
        the model's one input; see also :meth:`check_raw_length`). An empty
        body passes: its fault, no JSON header, is found by parsing it."""
        body_length = self.content_length if self.content_encoding is None else None
        length = self.header_length if self.header_length is not None else body_length
        check_lengths(
            self.header_length,
            self.content_length,
            body_length,
            length,
            limits,
            raw=raw_input is not None,
        )
        self.check_raw_length(raw_input)

    def slow_header_from(self) -> int | None:
        """The body bytes from which its JSON header may take long enough to
        inflate or parse to slow an event loop, or None when it never may.

        A server runs the parser in a worker thread from there until the
        header is parsed: a compressed header of
        :data:`SLOW_COMPRESSED_HEADER` bytes or more, or of a length known
        only once inflated, from its first byte (it is inflated and parsed
        in the step that has its bytes); a plain one of :data:`SLOW_HEADER`
        bytes or more once all of it is in; one that ends with the body
        (plain JSON, chunked) once :data:`SLOW_HEADER` bytes are in.
        """
        hl = self.header_length
        if self.content_encoding is not None:
            return 1 if hl is None or hl >= SLOW_COMPRESSED_HEADER else None
        length = hl if hl is not None else self.content_length
        if length is None:
            return SLOW_HEADER
        return length if length >= SLOW_HEADER else None

    def check_raw_length(self, raw_input: TensorSpec | None) -> None:
        """Refuse a raw binary request for ``raw_input`` whose shape or size
        its length gives, sent without Content-Length (411): the peer's fault,
        which a parser made without ``content_length`` would take for its
        caller's."""
        if (
            raw_input is not None
            and self.header_length == 0
            and raw_input.needs_length
            and self.content_length is None
            and self.content_encoding is None
        ):
            raise RemoteProtocolError(
                f"a raw request for input '{raw_input.name}' needs Content-Length: the"
                " body's length gives the input's shape or size",
                status_hint=411,
                offset=0,
            )


def body_claims(headers: Headers) -> BodyClaims:
    """Read Content-Length, Content-Encoding and Inference-Header-Content-Length.

    With a coding, Content-Length counts the compressed bytes and does not
    bound the header length. Raises :class:`RemoteProtocolError` for bad
    values of those headers (status hint 415 for an unsupported content
    coding), as :func:`content_length_from`, :func:`content_encoding_from`
    and :func:`header_length_from` do. Given :class:`HeaderFields`, the claims
    are read once and kept with them (a server reuses the fields of a head
    that comes again, and then its claims).
    """
    fields = _fields(headers)  # read once, looked up four times
    claims = fields._claims
    if claims is None:
        content_length = _content_length(fields)
        encoding = _content_encoding(fields)
        body_length = content_length if encoding is None else None
        header_length = _header_length(fields, body_length)
        claims = fields._claims = BodyClaims(content_length, encoding, header_length)
    return claims


def parser_from_headers(
    kind: Kind,
    headers: Headers,
    *,
    limits: Limits | None = None,
    strict_bool: bool = True,
    raw_input: TensorSpec | None = None,
) -> Parser:
    """A :class:`Parser` for a body whose HTTP headers are ``headers``.

    ``headers`` is any header mapping or list of (name, value) pairs, ``str`` or
    ``bytes``. Inference-Header-Content-Length gives the header length,
    Content-Length the body's length on the wire and Content-Encoding its
    coding (:func:`body_claims`). With a coding, Content-Length counts the
    compressed bytes: it is passed on as ``content_length`` (the parser ends
    the compressed input there) but does not bound the header length.
    ``kind``, ``limits``, ``strict_bool`` and ``raw_input`` are passed to the
    parser.

    Raises :class:`RemoteProtocolError` for bad values of those headers
    (status hint 415 for an unsupported content coding).
    """
    claims = body_claims(headers)
    claims.check_raw_length(raw_input)
    return Parser(
        kind,
        header_length=claims.header_length,
        content_length=claims.content_length,
        limits=limits,
        strict_bool=strict_bool,
        content_encoding=claims.content_encoding,
        raw_input=raw_input,
    )


# A q-value as RFC 9110 section 12.4.2 writes it: 0 to 1, at most three decimals.
_QVALUE = re.compile(r"(?:0(?:\.[0-9]{0,3})?|1(?:\.0{0,3})?)")


def preferred_encoding(accept_encoding: str | None) -> str | None:
    """The content coding to answer with, given a request's Accept-Encoding.

    The accepted coding with the highest q-value, gzip on a tie; None when
    neither gzip nor deflate is accepted (send the body as it is). A coding
    is accepted when listed (case-insensitively; ``x-gzip`` is gzip) with a
    q-value above 0 or none (1).
    ``br``, ``identity``, ``*`` and other codings are ignored, as are entries
    with a malformed q-value; a coding listed more than once takes its lowest
    q-value, so a refusal is never overridden. Never raises: a header binproto
    cannot read only means no compression.
    """
    if not accept_encoding:
        return None
    weights: dict[str, float] = {}
    for entry in accept_encoding.split(","):
        name, *params = (part.strip() for part in entry.split(";"))
        coding = name.lower()
        coding = "gzip" if coding == "x-gzip" else coding
        if coding not in ("gzip", "deflate"):
            continue
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                value = value.strip()
                q = float(value) if _QVALUE.fullmatch(value) else 0.0
        weights[coding] = min(q, weights.get(coding, q))
    gzip, deflate = weights.get("gzip", 0.0), weights.get("deflate", 0.0)
    if gzip > 0 and gzip >= deflate:
        return "gzip"
    return "deflate" if deflate > 0 else None


#: The refusal of an HTTP/1.0 request with Transfer-Encoding (RFC 9112,
#: section 6.1: a server must take its framing as faulty, answer 400 and close).
TE_IN_HTTP_1_0 = (
    "an HTTP/1.0 request may not carry Transfer-Encoding: its framing is faulty"
    " (RFC 9112, section 6.1)"
)


#: Most characters of an error message an error response carries (beside the
#: byte offset): a message quoting the peer's bytes quotes at most this much.
MAX_ERROR_TEXT = 1024

# A Python repr of bytes (h11 quotes what it refuses so): b'...' or
# bytearray(b'...'), in either quotes.
_BYTES_REPR = re.compile(r"""(bytearray\()?b('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")(?(1)\))""")


def _as_text(match: re.Match[str]) -> str:
    try:
        data = ast.literal_eval("b" + match.group(2))
    except (SyntaxError, ValueError):  # pragma: no cover - the pattern matches literals only
        return match.group(0)
    return repr(bytes(data).decode("utf-8", "backslashreplace")[: MAX_ERROR_TEXT + 1])


def _message(error: BaseException | str) -> tuple[str, str]:
    """``error``'s message, with the peer's bytes as text, and the byte offset
    to say after it (or "")."""
    offset = None
    if isinstance(error, ProtocolError):
        text, offset = error.msg, error.offset
    else:
        text = str(error)
    text = _BYTES_REPR.sub(_as_text, text)
    return text, "" if offset is None else f" (at byte {offset})"


def error_text(error: BaseException | str) -> str:
    """The message of an error response for ``error``.

    Bytes the peer sent appear as text, never as Python reprs of bytes
    objects, and the message is cut at :data:`MAX_ERROR_TEXT` characters, so
    an answer never echoes more than that of the peer's bytes. A
    :class:`ProtocolError`'s byte offset is kept.
    """
    text, at = _message(error)
    if len(text) > MAX_ERROR_TEXT:
        text = f"{text[:MAX_ERROR_TEXT]}... (cut at {MAX_ERROR_TEXT} characters)"
    return text + at


#: Most bytes of an error response's body, ``{"error": "..."}`` as sent.
MAX_ERROR_BODY = 1024


def _error_json(text: str) -> bytes:
    # UTF-8, not ASCII escapes: a non-ASCII character takes 2-4 bytes, not 6-12.
    return json.dumps({"error": text}, ensure_ascii=False).encode()


def error_body(error: BaseException | str) -> bytes:
    """The body of a V2 error response for ``error``: ``{"error": "..."}``,
    UTF-8 JSON of at most :data:`MAX_ERROR_BODY` bytes.

    The message is :func:`error_text`'s. When its JSON would be longer, the
    message is cut to fit, says so, and keeps the byte offset.
    """
    text, at = _message(error)
    # (No more characters than bytes fit. A lone surrogate has no UTF-8:
    # it is written as its escape, in text.)
    text = text[: MAX_ERROR_BODY + 1].encode("utf-8", "backslashreplace").decode("utf-8")
    body = _error_json(text + at)
    if len(body) <= MAX_ERROR_BODY:
        return body
    cut = f"... (cut to fit {MAX_ERROR_BODY} bytes)" + at
    # The longest head of the message that fits with the note (a JSON string
    # grows with its text: a binary search).
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(_error_json(text[:mid] + cut)) <= MAX_ERROR_BODY:
            lo = mid
        else:
            hi = mid - 1
    return _error_json(text[:lo] + cut)
