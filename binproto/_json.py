"""JSON header decoding (strict UTF-8, bounded depth) and JSON tensor data."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from ._datatypes import DataType
from ._errors import RemoteProtocolError

__all__ = [
    "FAST_DUMPS",
    "FAST_LOADS",
    "check_values",
    "json_data_to_array",
    "loads_header",
    "refuse_repeated_keys",
]

# A JSON string token, unrolled so long strings do not backtrack.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)

# An escaped backslash (consumed whole, so the "u" after it is no escape), or a
# surrogate escape with the low surrogate escape that may follow it.
_SURROGATE = re.compile(rb"\\\\|\\u[dD][89a-fA-F][0-9a-fA-F]{2}(?:\\u[dD][c-fC-F][0-9a-fA-F]{2})?")


# Byte classes for the depth scan: 1 opens, -1 closes, 0 is anything else.
_STEP = np.zeros(256, dtype=np.int8)
_STEP[[0x5B, 0x7B]] = 1  # [ {
_STEP[[0x5D, 0x7D]] = -1  # ] }


# The quick route of the depth scan keeps quotes and brackets, braces as brackets
# (the full scan does not tell them apart either).
_STRUCTURE = bytes.maketrans(b"{}", b"[]")
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')
# Longest bracket skeleton the quick route takes: its cost is passes x length.
_QUICK_MAX = 1 << 16


def _max_depth(raw: bytes, limit: int) -> int:
    """Deepest nesting of arrays and objects in ``raw`` (strings ignored).

    ``limit`` caps the rounds of the quick route; past it, the full scan
    gives the exact depth for the error message.
    """
    if b"\\" in raw:
        # Escapes: blank every string token first, so an escaped quote cannot
        # be taken for a string's end.
        raw = _STRING.sub(b'""', raw)
    # Quick route (C-speed bytes methods): keep quotes and brackets, drop the
    # strings, which are now "" unless they hold a bracket. Left with only
    # brackets, the depth is the number of rounds of deleting innermost "[]"
    # pairs (one replace() deletes one level: it does not rescan what it joins).
    skeleton = raw.translate(_STRUCTURE, _NOT_STRUCTURE).replace(b'""', b"")
    if b'"' not in skeleton and len(skeleton) <= _QUICK_MAX:
        depth = 0
        while skeleton and depth <= limit:
            inner = skeleton.replace(b"[]", b"")
            if len(inner) == len(skeleton):
                break  # unbalanced: invalid JSON, which the scan below measures
            skeleton = inner
            depth += 1
        if not skeleton:
            return depth
    codes = np.frombuffer(raw, dtype=np.uint8)
    steps = _STEP[codes]
    where = np.flatnonzero(steps)
    if where.size == 0:
        return 0
    # Without escapes every quote opens or closes a string: a bracket after an
    # odd number of quotes is inside one.
    quotes = np.flatnonzero(codes == 0x22)
    outside = (np.searchsorted(quotes, where) & 1) == 0
    return int(max(0, np.cumsum(steps[where][outside], dtype=np.int64).max(initial=0)))


def _values_bound(raw: bytes) -> int:
    """An upper bound on the JSON values of ``raw``, from its bytes alone.

    Every value but the outermost follows a ``[`` (the first element of an
    array), a ``{`` (the first member of an object) or a ``,`` (any later
    one). Counting those gives the number of values, plus one for each empty
    array or object. Brackets and commas inside strings count too: the bound
    stays an upper bound, and a second count without strings refines it.
    """
    return 1 + raw.count(b",") + raw.count(b"[") + raw.count(b"{")


# Bytes of a header scanned per step of the count outside strings: between
# steps, other threads may take the interpreter lock.
_VALUES_PIECE = 1 << 20


def _values_outside_strings(raw: bytes) -> int:
    """:func:`_values_bound` counting only the commas and brackets outside
    strings, a piece at a time."""
    if b"\\" in raw:
        # Escaped backslashes, then escaped quotes, gone: every quote left
        # opens or closes a string. (A run of backslashes pairs up from its
        # start, as replace() takes them.)
        raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    count = 1
    inside = 0  # 1 when a piece starts inside a string
    for start in range(0, len(raw), _VALUES_PIECE):
        codes = np.frombuffer(raw, np.uint8, min(_VALUES_PIECE, len(raw) - start), start)
        quotes = np.flatnonzero(codes == 0x22)
        marks = np.flatnonzero((codes == 0x2C) | (codes == 0x5B) | (codes == 0x7B))
        # A mark after an even number of the piece's quotes is where the
        # piece started: outside a string, unless it started inside one.
        count += int(np.count_nonzero((np.searchsorted(quotes, marks) & 1) == inside))
        inside ^= quotes.size & 1
    return count


def check_values(raw: bytes, limit: int) -> None:
    """Refuse a header of more than ``limit`` JSON values (status hint 413),
    before it is parsed: each value becomes a Python object, so this bounds
    the memory and time its parsing takes."""
    # Each value counted takes a byte of its own: a header shorter than the
    # limit cannot pass it.
    if len(raw) < limit or _values_bound(raw) <= limit:
        return
    count = _values_outside_strings(raw)
    if count > limit:
        raise RemoteProtocolError(
            f"the JSON header holds up to {count} values, more than the limit of {limit}"
            " (max_json_values): send big tensors as binary data",
            status_hint=413,
            offset=0,
        )


class _DuplicateKey(Exception):
    """Raised from inside the decoder that refuses a repeated key."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook``: the object as a dict, refusing a repeated key."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return obj


# Built once: json.loads with arguments builds a decoder on every call.
_DECODER = json.JSONDecoder()


def _orjson(name: str) -> Callable[..., Any] | None:
    """orjson's function ``name`` when orjson (the ``fast`` extra) is installed."""
    try:
        import orjson
    except ImportError:
        return None
    function: Callable[..., Any] = getattr(orjson, name)
    return function


#: ``orjson.loads``, or None. :func:`loads_header` takes its result only where
#: it is the standard parser's; anything it refuses goes to the standard
#: parser, which decides.
FAST_LOADS: Callable[[bytes], Any] | None = _orjson("loads")

#: ``orjson.dumps``, or None. The encoder gives it only headers that hold no
#: float and no tensor data (see ``dumps_header``), which it writes byte for
#: byte as the standard encoder does; anything it refuses goes to the
#: standard encoder.
FAST_DUMPS: Callable[[Any], bytes] | None = _orjson("dumps")

#: Deepest nesting limit under which orjson parses: orjson takes up to 1024
#: levels, while the standard parser runs out of Python stack near 1000 (a
#: RecursionError, refused as too deep); below this both take every header
#: the depth check lets through.
FAST_MAX_DEPTH = 256

#: Longest header orjson parses: its working memory grows to about 14 times
#: a header's size (the standard parser's, a few times); the per-request cost
#: it cuts is that of small headers.
FAST_MAX = 1 << 16

# orjson reads an integer past 64 bits as a float; the standard parser keeps it
# an int. Such an integer has 19 digits or more: a header with a run of 19
# digits anywhere (in a string or a fraction too) goes to the standard parser.
# (Every digit becomes "0", everything else a space.)
_DIGITS_ONLY = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_LONG_DIGIT_RUN = b"0" * 19
# The decoder that refuses a repeated key: a Python call per JSON object, so
# it runs only when counting keys cannot rule a repeat out.
_UNIQUE_DECODER = json.JSONDecoder(object_pairs_hook=_unique_keys)


# Tokens of the duplicate-key scan: a key (a string and its colon), a bracket,
# or any other string (consumed whole, so brackets inside it are not counted).
_KEY_TOKENS = re.compile(
    rb'("[^"\\]*(?:\\.[^"\\]*)*")\s*:|[{}\[\]]|"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL
)


def _first_duplicate_key(raw: bytes) -> tuple[str, int] | None:
    """The first key (in document order) that repeats a key of its object, and
    the byte offset of its opening quote. ``raw`` is valid JSON."""
    stack: list[set[str] | None] = []
    for match in _KEY_TOKENS.finditer(raw):
        token = match.group()
        if token == b"{":
            stack.append(set())
        elif token == b"[":
            stack.append(None)
        elif token in (b"}", b"]"):
            stack.pop()
        elif match.group(1) is not None:
            keys = stack[-1]
            key = json.loads(match.group(1).decode("utf-8"))
            if keys is not None:
                if key in keys:
                    return key, match.start()
                keys.add(key)
    return None


def _check_surrogates(raw: bytes, kind: str) -> None:
    """Refuse a ``\\u`` escape of a surrogate that is not half of a pair: no
    UTF-8 can hold it, so it could be neither echoed nor stored as text."""
    for match in _SURROGATE.finditer(raw):
        escape = match.group()
        if escape == b"\\\\":
            continue
        if len(escape) != 12 or escape[3] not in b"89abAB":
            raise RemoteProtocolError(
                f"failed to parse the {kind} JSON buffer: The surrogate pair in string"
                f" is invalid (a lone surrogate escape {escape[:6].decode()})",
                offset=match.start(),
            )


_CHECK = "check Inference-Header-Content-Length"


def _length_hint(
    size: int, offset: int, *, extra: bool = False, binary: bool = False, nul: bool = False
) -> str:
    """What most likely went wrong when a JSON header of ``size`` bytes fails to
    parse at ``offset``: the header length that cut it (or Content-Encoding);
    ``nul``: the JSON is followed by a NUL byte (padding some clients add,
    which a parser of C strings takes for the end), with ``extra``."""
    if extra:
        hint = f"; the JSON ends at byte {offset} but the header is {size} bytes: {_CHECK}"
        if nul:  # (or a header length one too long, into tensor bytes that start with 0)
            hint += " (a NUL byte after the JSON is no whitespace: pad with spaces)"
        return hint
    if binary:
        return (
            f"; binary data in the first {size} bytes taken as the JSON header: {_CHECK}"
            " (and Content-Encoding, if the body is compressed)"
        )
    if offset >= size - 1:
        return f"; the JSON header was cut off at byte {size}: {_CHECK}"
    return ""


def loads_header(
    raw: bytes, *, max_depth: int, kind: str = "request", max_values: int | None = None
) -> Any:
    """Decode the JSON header ``raw`` (exactly the header's bytes).

    Accepts what real peers send: ``NaN``/``Infinity`` tokens. Rejects invalid
    UTF-8, a byte-order mark, trailing bytes, nesting deeper than ``max_depth``,
    and a ``\\u`` escape of a lone surrogate (it is no Unicode character). A
    repeated key is refused by :func:`refuse_repeated_keys`, given the decoded
    object's key count. A header of more than ``max_values`` JSON values is
    refused before it is parsed (:func:`check_values`).

    With orjson installed (the ``fast`` extra) orjson parses the headers of
    up to :data:`FAST_MAX` bytes, under a ``max_depth`` of at most
    :data:`FAST_MAX_DEPTH`, whose result is the standard parser's
    (:data:`FAST_LOADS`); the result, and every error, are the same either way.
    """
    if max_values is not None and len(raw) >= max_values:  # (shorter: within it)
        check_values(raw, max_values)
    # Each level of nesting takes two bytes (an opener and its closer), so a
    # header of at most twice the limit cannot pass it. Else count openers
    # cheaply (strings' brackets too, so never fewer than the nesting): only
    # a header with many brackets needs a scan.
    if len(raw) > 2 * max_depth and raw.count(b"[") + raw.count(b"{") > max_depth:
        depth = _max_depth(raw, max_depth)
        if depth > max_depth:
            raise RemoteProtocolError(
                f"JSON nesting is {depth} deep, deeper than the limit of {max_depth}",
                offset=0,
            )
    if (
        FAST_LOADS is not None
        and len(raw) <= FAST_MAX
        and max_depth <= FAST_MAX_DEPTH
        # (find, not "in": bytes' "in" first tries its operand as an int)
        and raw.translate(_DIGITS_ONLY).find(_LONG_DIGIT_RUN) < 0
    ):
        # orjson refuses what the standard parser refuses, and more: NaN and
        # Infinity tokens, numbers beyond float64, a lone surrogate escape.
        # Those, and every fault, are the standard parser's to decide.
        try:
            return FAST_LOADS(raw)
        except ValueError:
            pass
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        # Triton writes BYTES outputs raw into JSON strings, UTF-8 or not.
        hint = (
            "; or BYTES outputs that are not UTF-8, which have no JSON form:"
            " ask for binary outputs (binary_data_output)"
            if kind == "response"
            else ""
        )
        raise RemoteProtocolError(
            f"failed to parse the {kind} JSON buffer: invalid UTF-8 ({exc.reason})"
            + _length_hint(len(raw), exc.start, binary=True)
            + hint,
            offset=exc.start,
        ) from None
    try:
        if text.startswith("\ufeff"):  # as json.loads says it; JSONDecoder does not check
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        obj = _DECODER.decode(text)
    except RecursionError:  # under a limit deeper than the Python stack goes
        raise RemoteProtocolError(
            "JSON nesting is too deep to decode (past Python's recursion limit)", offset=0
        ) from None
    except json.JSONDecodeError as exc:
        offset = len(text[: exc.pos].encode("utf-8"))
        extra = exc.msg == "Extra data"
        nul = extra and raw[offset : offset + 1] == b"\0"
        raise RemoteProtocolError(
            f"failed to parse the {kind} JSON buffer: {exc.msg}"
            + _length_hint(len(raw), offset, extra=extra, nul=nul),
            offset=offset,
        ) from None
    except ValueError as exc:  # e.g. an integer literal over Python's digit limit
        raise RemoteProtocolError(
            f"failed to parse the {kind} JSON buffer: {exc}", offset=0
        ) from None
    if b"\\u" in raw:
        _check_surrogates(raw, kind)
    return obj


def refuse_repeated_keys(raw: bytes, keys: int, kind: str = "request") -> None:
    """Refuse the JSON text ``raw`` (valid, decoded) if an object of it repeats
    a key (JSON parsers disagree on which one counts); ``keys`` is how many
    keys its decoded objects hold: all of them, or some (fewer only costs a
    second decoding).

    Outside its strings, a JSON text has one colon per key it writes, and a
    decoded object keeps one entry per distinct key: when the text has no more
    colons than the objects have keys, no key was repeated.
    """
    if raw.count(b":") <= keys:
        return
    if _STRING.sub(b'""', raw).count(b":") <= keys:
        return  # the other colons were inside strings
    # Keys not counted, or a repeat: decode again, refusing a repeated key.
    try:
        _UNIQUE_DECODER.decode(raw.decode("utf-8"))
    except RecursionError:  # (a header the first decoding took, nested ~1000 deep)
        raise RemoteProtocolError(
            "JSON nesting is too deep to check for repeated keys", offset=0
        ) from None
    except _DuplicateKey as exc:
        found = _first_duplicate_key(raw)
        key, offset = found if found is not None else (exc.key, 0)
        raise RemoteProtocolError(
            f"failed to parse the {kind} JSON buffer: duplicate key {json.dumps(key)}",
            offset=offset,
        ) from None


def _flatten(data: Any, shape: tuple[int, ...], name: str, elements: int) -> list[Any]:
    """Row-major elements of ``data``, given nested exactly as ``shape`` or flat."""
    if not isinstance(data, list):
        raise RemoteProtocolError(f"Unable to parse 'data' for {name}: expected an array", offset=0)
    if not data or not isinstance(data[0], list):
        flat = data
    else:
        if len(shape) < 2 or len(data) != shape[0]:
            raise _bad_nesting(name, shape)
        flat = data
        for dim in shape[1:]:
            if not all(isinstance(x, list) and len(x) == dim for x in flat):
                raise _bad_nesting(name, shape)
            flat = list(itertools.chain.from_iterable(flat))
    if len(flat) != elements:
        raise RemoteProtocolError(
            f"unexpected number of elements in 'data' for {name}: shape"
            f" {list(shape)} holds {elements}, got {len(flat)}",
            offset=0,
        )
    return flat


def _bad_nesting(name: str, shape: tuple[int, ...]) -> RemoteProtocolError:
    return RemoteProtocolError(
        f"unexpected shape of 'data' for {name}: neither flat nor nested as {list(shape)}",
        offset=0,
    )


def _bad_value(name: str, datatype: str) -> RemoteProtocolError:
    return RemoteProtocolError(
        f"unable to parse 'data' for {name}: a value does not fit datatype {datatype}",
        offset=0,
    )


def json_data_to_array(
    data: Any, dt: DataType, shape: tuple[int, ...], name: str, elements: int
) -> np.ndarray[Any, Any]:
    """Convert a tensor's JSON ``data`` to an array of its dtype and shape.

    Integers must be JSON integers within the type's range; floats accept any
    JSON number (and NaN/Infinity); BOOL accepts only ``true``/``false``; BYTES
    accepts strings, which become their UTF-8 bytes.
    """
    flat = _flatten(data, shape, name, elements)
    kinds = set(map(type, flat))
    dtype = dt.dtype
    if dt.name == "BYTES":
        if not kinds <= {str}:
            raise _bad_value(name, dt.name)
        out = np.empty(len(flat), dtype=object)
        out[:] = [s.encode("utf-8", "surrogatepass") for s in flat]
        return out.reshape(shape)
    if dt.name == "BOOL":
        if not kinds <= {bool}:
            raise _bad_value(name, dt.name)
        return np.array(flat, dtype=np.bool_).reshape(shape)
    if dtype.kind in "iu" and dt.name != "BF16":  # (BF16's raw-bit uint16: numbers)
        if not kinds <= {int}:
            raise _bad_value(name, dt.name)
        if flat:
            info = np.iinfo(dtype)
            if min(flat) < info.min or max(flat) > info.max:
                raise _bad_value(name, dt.name)
        return np.array(flat, dtype=dtype).reshape(shape)
    # Floating point (FP16/FP32/FP64/BF16): any JSON number.
    if not kinds <= {int, float}:
        raise _bad_value(name, dt.name)
    try:
        values = np.array(flat, dtype=np.float64)
    except OverflowError:  # an integer beyond float64
        raise _bad_value(name, dt.name) from None
    if dt.name == "BF16":
        return _bf16_bits(values).view(dtype).reshape(shape)
    with np.errstate(over="ignore"):
        return values.astype(dtype).reshape(shape)


def _bf16_bits(values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The BF16 bit patterns of float64 ``values``: rounded to FP32, then to
    BF16's upper 16 bits, to nearest even (as ml_dtypes rounds them), NaN a
    quiet NaN of the same sign. The same bits whether or not ml_dtypes is
    installed (without it, BF16 arrays hold the raw bits as uint16)."""
    with np.errstate(over="ignore", invalid="ignore"):
        bits = values.astype(np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # (-inf's the largest: no overflow)
    rounded = np.where(np.isnan(values), ((bits >> 16) & 0x8000) | 0x7FC0, rounded)
    return rounded.astype("<u2")
