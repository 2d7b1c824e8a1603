"""The ``inspect`` and ``encode`` commands of the ``binproto`` CLI.

``inspect`` streams a body through a :class:`~binproto.Parser` in 1 MiB
reads, so a body of any size is summarized in bounded memory: per tensor it
keeps the first few values and running min/max/mean, never the tensor.
``encode`` builds a body from ``.npy``/``.npz`` files with
:func:`binproto.encode_request` / :func:`binproto.encode_response` and writes
its buffers one after the other, never joined. (The benchmarks are no
command: they belong to a source checkout, ``python -m benchmarks.run``.)
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import math
import os
import secrets
import stat
import sys
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from .._bytes import BytesDecoder
from .._datatypes import DATATYPES
from .._errors import LocalProtocolError, ProtocolError
from .._events import NEED_DATA, HeaderParsed, MessageComplete, TensorChunk, TensorComplete
from .._header import InferenceHeader, Kind, TensorInfo
from .._http import HEADER_LENGTH_NAME, error_text, header_value, parser_from_headers
from .._parser import Parser

__all__ = [
    "TensorSummary",
    "add_encode",
    "add_inspect",
    "inspect_body",
    "parse_headers",
    "read_headers",
]

#: Bytes read from the input per ``receive_data`` call.
READ_SIZE = 1 << 20
#: Values shown per tensor.
FIRST = 8
#: Elements converted per step when computing statistics (bounds temporaries).
STAT_STEP = 1 << 20
#: Bytes of a BYTES tensor kept to show its first elements.
BYTES_PREFIX = 1 << 16


class UsageError(Exception):
    """A command-line mistake (bad file, bad argument): exit status 2."""


# -- headers files -------------------------------------------------------------


def read_headers(path: str) -> list[tuple[str, str]]:
    """Read HTTP headers from a file of ``Name: value`` lines.

    Lines without a colon (a request or status line) and blank lines are
    skipped, so a captured HTTP head works as well as a bare header list.
    """
    try:
        text = Path(path).read_text(encoding="latin-1")
    except OSError as exc:
        raise UsageError(f"cannot read headers file {path!r}: {exc.strerror}") from None
    return parse_headers(text)


def parse_headers(text: str) -> list[tuple[str, str]]:
    """The ``(name, value)`` pairs of ``Name: value`` lines (see :func:`read_headers`)."""
    pairs: list[tuple[str, str]] = []
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() and " " not in name.strip():
            pairs.append((name.strip(), value.strip()))
    return pairs


def _format_headers(headers: list[tuple[str, str]]) -> str:
    return "".join(f"{name}: {value}\n" for name, value in headers)


# -- value summaries -----------------------------------------------------------


def _scalar(value: Any) -> Any:
    """A JSON-friendly Python scalar for a numpy value."""
    if isinstance(value, (bytes, np.bytes_)):
        return repr(bytes(value))
    item = value.item() if isinstance(value, np.generic) else value
    if isinstance(item, float) and not math.isfinite(item):
        return str(item)
    return item


class TensorSummary:
    """First values and running statistics of one tensor, fed chunk by chunk.

    Memory is bounded whatever the tensor's size: a partial element carried
    between chunks, the first :data:`FIRST` values, and (BYTES) the first
    :data:`BYTES_PREFIX` bytes.
    """

    def __init__(self, info: TensorInfo) -> None:
        self.info = info
        self.first: list[Any] = []
        self.count = 0  # elements seen
        self.nan = 0
        self.true = 0  # BOOL elements that are true
        self.minimum: Any = None
        self.maximum: Any = None
        self._sum = 0.0
        self._carry = b""  # bytes of a partial element
        self._prefix = bytearray()  # BYTES: the tensor's first bytes
        itemsize = DATATYPES[info.datatype].itemsize
        self._itemsize = itemsize or 1
        self._dtype: np.dtype[Any]
        if info.datatype == "BF16":
            self._dtype = np.dtype("<u2")  # raw bits, widened to float32 below
        elif info.datatype == "BOOL":
            self._dtype = np.dtype(np.uint8)
        else:
            self._dtype = info.dtype

    def feed(self, data: memoryview) -> None:
        """Take the next bytes of the tensor."""
        if self.info.datatype == "BYTES":
            room = BYTES_PREFIX - len(self._prefix)
            if room > 0:
                self._prefix += data[:room]
            return
        size = self._itemsize
        if self._carry:
            need = size - len(self._carry)
            self._carry += bytes(data[:need])
            data = data[need:]
            if len(self._carry) == size:
                self._values(np.frombuffer(self._carry, dtype=self._dtype))
                self._carry = b""
        whole = len(data) - len(data) % size
        if whole:
            self._values(np.frombuffer(data[:whole], dtype=self._dtype))
        if whole < len(data):
            self._carry = bytes(data[whole:])

    def feed_array(self, array: np.ndarray[Any, Any]) -> None:
        """Take a whole tensor given as JSON data."""
        flat = array.reshape(-1)
        if self.info.datatype == "BYTES":
            self.first = [_scalar(x) for x in flat[:FIRST]]
            self.count = flat.size
            return
        if self.info.datatype == "BF16":
            flat = flat.astype(np.float32)
        elif self.info.datatype == "BOOL":
            flat = flat.astype(np.uint8)
        self._values(flat)

    def _values(self, values: np.ndarray[Any, Any]) -> None:
        for start in range(0, values.size, STAT_STEP):
            self._step(values[start : start + STAT_STEP])

    def _step(self, part: np.ndarray[Any, Any]) -> None:
        datatype = self.info.datatype
        if datatype == "BF16" and part.dtype != np.float32:
            part = (part.astype(np.uint32) << 16).view(np.float32)
        elif datatype == "FP16":
            part = part.astype(np.float32)
        if len(self.first) < FIRST:
            head = part[: FIRST - len(self.first)]
            if datatype == "BOOL":
                self.first += [bool(x) for x in head]
            else:
                self.first += [_scalar(x) for x in head]
        self.count += part.size
        if datatype == "BOOL":
            self.true += int(np.count_nonzero(part))
            return
        if part.dtype.kind == "f":
            nan = np.isnan(part)
            n_nan = int(np.count_nonzero(nan))
            if n_nan:
                self.nan += n_nan
                part = part[~nan]
        if not part.size:
            return
        low, high = part.min(), part.max()
        self.minimum = low if self.minimum is None else min(self.minimum, low)
        self.maximum = high if self.maximum is None else max(self.maximum, high)
        with np.errstate(invalid="ignore", over="ignore"):  # (inf and -inf sum to nan: said so)
            self._sum += float(np.sum(part, dtype=np.float64))

    def finish(self) -> None:
        """The tensor is complete: decode the first BYTES elements."""
        if self.info.datatype != "BYTES" or self.info.binary_size is None:
            return
        self.count = self.info.elements
        # The parser has checked the framing; the elements wholly inside the
        # kept prefix are the ones shown.
        shown = BytesDecoder(self.info).feed(bytes(self._prefix))[:FIRST]
        self.first = [_scalar(x) for x in shown]

    def as_dict(self) -> dict[str, Any]:
        """The summary as JSON-friendly values."""
        info = self.info
        where = (
            "binary"
            if info.binary_size is not None
            else "shared memory"
            if info.shared_memory
            else "json"
        )
        out: dict[str, Any] = {
            "index": info.index,
            "name": info.name,
            "datatype": info.datatype,
            "shape": list(info.shape),
            "bytes": info.binary_size if info.binary_size is not None else info.nbytes,
            "where": where,
            "first": self.first,
        }
        if info.datatype == "BOOL":
            out["true"] = self.true
        elif info.datatype != "BYTES" and self.minimum is not None:
            out["min"] = _scalar(self.minimum)
            out["max"] = _scalar(self.maximum)
            out["mean"] = _scalar(self._sum / (self.count - self.nan))  # (inf - inf: nan)
        if self.nan:
            out["nan"] = self.nan
        return out


# -- inspect -------------------------------------------------------------------


def _chunks(stream: IO[bytes]) -> Iterator[bytes]:
    while True:
        data = stream.read(READ_SIZE)
        if not data:
            return
        yield data


def _standard(name: str) -> Any:
    """``sys.stdout`` or ``sys.stderr`` for output the command must write: a
    process started with the stream closed (``>&-``) has None there."""
    stream = getattr(sys, name)
    if stream is None:
        what = {"stdout": "standard output", "stderr": "standard error"}[name]
        raise OSError(f"{what} is closed")
    return stream


def _open_input(path: str) -> tuple[IO[bytes], int | None]:
    """The body's stream and, for a regular file, its length."""
    if path == "-":
        if sys.stdin is None:  # started with stdin closed (<&-)
            raise UsageError("cannot read body '-': standard input is closed")
        return sys.stdin.buffer, None
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise UsageError(f"cannot read body {path!r}: {exc.strerror}") from None
    size = os.fstat(f.fileno()).st_size if os.path.isfile(path) else None
    return f, size


def inspect_body(
    parser: Parser, chunks: Iterator[bytes]
) -> tuple[InferenceHeader | None, list[TensorSummary], ProtocolError | None, int]:
    """Feed ``parser`` a body chunk by chunk and summarize it.

    Returns the header (None if the body failed before it), a summary per
    completed tensor, the protocol error that ended the body (or None), and
    the body bytes parsed.
    """
    header: InferenceHeader | None = None
    summaries: list[TensorSummary] = []
    current: TensorSummary | None = None
    try:
        feed = iter(chunks)
        done = False
        while not done:
            event = parser.next_event()
            if event is NEED_DATA:
                parser.receive_data(next(feed, b""))
            elif type(event) is TensorChunk:
                if current is None or current.info.index != event.index:
                    assert header is not None
                    current = TensorSummary(header.tensors[event.index])
                current.feed(event.data)
            elif type(event) is TensorComplete:
                if current is None or current.info.index != event.index:
                    current = TensorSummary(event.info)
                    if event.info.array is not None:
                        current.feed_array(event.info.array)
                current.finish()
                summaries.append(current)
                current = None
            elif type(event) is HeaderParsed:
                header = event.header
            elif type(event) is MessageComplete:
                done = True
    except ProtocolError as exc:
        return header, summaries, exc, parser.bytes_parsed
    return header, summaries, None, parser.bytes_parsed


def _finite(obj: Any) -> Any:
    """``obj`` with every non-finite float (a peer's NaN, Infinity, 1e999) as
    the string ``"nan"``, ``"inf"`` or ``"-inf"``: strict JSON has no such numbers."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def _abbreviated(obj: Any, indent: int = 0) -> str:
    """Pretty JSON whose long lists of values are cut after a few items."""
    pad = "  " * indent
    if isinstance(obj, dict) and obj:
        items = [f"{pad}  {json.dumps(k)}: {_abbreviated(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(obj, list) and any(isinstance(x, dict) for x in obj):
        items = [f"{pad}  {_abbreviated(v, indent + 1)}" for v in obj]
        return "[\n" + ",\n".join(items) + f"\n{pad}]"
    if isinstance(obj, list) and len(obj) > 16:
        shown = ", ".join(json.dumps(x) for x in obj[:16])
        return f"[{shown}, ... ({len(obj) - 16} more)]"
    return json.dumps(obj)


# C0 and C1 control characters and DEL, each as a \x escape; the Unicode
# line separators and the bidirectional formatting characters (which make a
# terminal show the text that follows in another order), each as a \u escape.
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))}
_CONTROLS.update(
    (c, f"\\u{c:04x}")
    for c in (
        0x061C,
        0x200E,
        0x200F,
        0x2028,
        0x2029,
        *range(0x202A, 0x202F),
        *range(0x2066, 0x206A),
    )
)


def _shown(text: str) -> str:
    """``text`` from the peer, safe on a terminal: its control characters
    escaped, so that it can neither move the cursor, forge lines, nor reorder
    what is shown after it."""
    return text.translate(_CONTROLS)


#: Characters of a name or value (as sent, before escaping) shown on the
#: terminal; a longer one is cut.
SHOWN_CHARS = 60


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return _shown(_cut(str(v)))


def _cut(text: str) -> str:
    # A BYTES element may run to 64 KiB, a name to the header's size. (Cut
    # before it is escaped: its own characters are counted, no escape split.)
    if len(text) > SHOWN_CHARS:
        return f"{text[:SHOWN_CHARS]}... ({len(text)} characters)"
    return text


def _describe(summary: dict[str, Any]) -> str:
    lines = [
        f"  [{summary['index']}] {_shown(_cut(summary['name']))}  {summary['datatype']}"
        f"  shape {summary['shape']}  {summary['bytes']} bytes ({summary['where']})"
    ]
    if summary["first"]:
        lines.append("      first: " + ", ".join(_value(v) for v in summary["first"]))
    keys = ("min", "max", "mean", "true", "nan")
    stats = [f"{key} {_value(summary[key])}" for key in keys if key in summary]
    if stats:
        lines.append("      " + "  ".join(stats))
    return "\n".join(lines)


def _echo(text: str, *, err: bool = False) -> None:
    """Print ``text`` on stdout (stderr with ``err``), escaping what the stream
    cannot encode: names and messages come from the peer, and a JSON string may
    hold a lone surrogate. A stream closed when the process started is None:
    nothing is printed (print() would fall back to stdout)."""
    stream = sys.stderr if err else sys.stdout
    if stream is None:
        return
    encoding = getattr(stream, "encoding", None) or "utf-8"
    print(text.encode(encoding, "backslashreplace").decode(encoding), file=stream)


def _error_dict(exc: ProtocolError) -> dict[str, Any]:
    return {
        "type": type(exc).__name__,
        "message": exc.msg,
        "offset": exc.offset,
        "status_hint": exc.status_hint,
    }


def _error_line(exc: ProtocolError) -> str:
    where = f" at byte {exc.offset}" if exc.offset is not None else ""
    # Worded and cut as the servers' error answers are (it may quote a name as
    # long as the header).
    text = error_text(exc.msg)
    return f"{type(exc).__name__}{where} (status hint {exc.status_hint}): {_shown(text)}"


def _message_headers(args: argparse.Namespace, size: int | None) -> list[tuple[str, str]]:
    """The body's HTTP headers: from --headers, amended by --header-length and
    --encoding, with the file's length as Content-Length when none is given."""
    headers = read_headers(args.headers) if args.headers else []
    if args.header_length is not None:
        headers.append((HEADER_LENGTH_NAME, str(args.header_length)))
    if args.encoding is not None:
        headers = [(n, v) for n, v in headers if n.lower() != "content-encoding"]
        headers.append(("Content-Encoding", args.encoding))
    if size is not None and header_value(headers, "Content-Length") is None:
        headers.append(("Content-Length", str(size)))
    return headers


def status_of(path: str) -> int | None:
    """The status of the last HTTP status line (``HTTP/1.1 200 OK``) in a
    headers file, as ``curl -D`` saves them (after any ``100 Continue``);
    None when it has none (a request's head, or bare headers)."""
    try:
        text = Path(path).read_text(encoding="latin-1")
    except OSError as exc:
        raise UsageError(f"cannot read headers file {path!r}: {exc.strerror}") from None
    status = None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].startswith("HTTP/") and parts[1].isdigit():
            status = int(parts[1])
    return status


def _error_answer(stream: IO[bytes], status: int) -> int:
    """Report a saved error response (its body is no inference response)."""
    text = stream.read(1000).decode("utf-8", "replace")
    _echo(f"the saved response is HTTP {status}: {_shown(text.strip())}", err=True)
    return 1


def _inspect(args: argparse.Namespace) -> int:
    _standard("stdout")  # where the report goes
    status = status_of(args.headers) if args.headers else None
    kind: Kind = args.kind or ("response" if status is not None else "request")
    stream, size = _open_input(args.body)
    try:
        if kind == "response" and status is not None and status >= 300:
            return _error_answer(stream, status)
        try:
            headers = _message_headers(args, size)
            parser = parser_from_headers(kind, headers)
        except ProtocolError as exc:
            return _report(args, None, [], exc, 0)
        header, summaries, error, parsed = inspect_body(parser, _chunks(stream))
    finally:
        if args.body != "-":
            stream.close()
    return _report(args, header, summaries, error, parsed)


def _report(
    args: argparse.Namespace,
    header: InferenceHeader | None,
    summaries: list[TensorSummary],
    error: ProtocolError | None,
    parsed: int,
) -> int:
    tensors = [s.as_dict() for s in summaries]
    if args.json:
        out = {
            "header": header.raw if header is not None else None,
            "header_length": header.header_length if header is not None else None,
            "tensors": tensors,
            "body_bytes": parsed,
            "error": _error_dict(error) if error is not None else None,
        }
        _echo(json.dumps(_finite(out), indent=2, allow_nan=False))
    else:
        if header is not None:
            print(f"header ({header.header_length} bytes):")
            _echo(_abbreviated(header.raw))
            print(f"{'inputs' if header.kind == 'request' else 'outputs'}:")
            for t in tensors:
                _echo(_describe(t))
        if error is None:
            print(f"body: {parsed} bytes, complete")
    if error is not None:
        _echo(_error_line(error), err=True)
        return 1
    return 0


def add_inspect(subparsers: Any) -> None:
    """Register ``inspect``: summarize a body, or report its first fault."""
    p = subparsers.add_parser(
        "inspect",
        help="print a body's JSON header and a summary of each tensor",
        description="Parse a request or response body of the binary tensor data extension"
        " and print its JSON header and, per tensor, name, datatype, shape, bytes and"
        " a summary of its values. A malformed body ends with the exact error and the"
        " byte offset where it was found (exit status 1).",
    )
    p.add_argument("body", metavar="BODY", help="file holding the body, or - for stdin")
    length = p.add_mutually_exclusive_group()
    length.add_argument(
        "--header-length",
        type=int,
        metavar="N",
        help=f"the {HEADER_LENGTH_NAME} (default: none, the body is plain JSON)",
    )
    length.add_argument(
        "--headers",
        metavar="FILE",
        help=f"file of HTTP headers ('Name: value' lines) giving {HEADER_LENGTH_NAME},"
        " Content-Encoding and Content-Length",
    )
    p.add_argument(
        "--kind",
        choices=("request", "response"),
        default=None,
        help="whether the body is an inference request or a response (default: a"
        " response when the --headers file has a status line, as curl -D saves it,"
        " else a request)",
    )
    p.add_argument(
        "--encoding", metavar="CODING", help="Content-Encoding of the body (gzip, deflate)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    p.set_defaults(func=_run(_inspect))


# -- encode --------------------------------------------------------------------


def _load(spec: str) -> tuple[str, np.ndarray[Any, Any]]:
    """``name=path.npy`` or ``name=path.npz[:key]`` → (name, array)."""
    name, sep, source = spec.partition("=")
    if not sep or not name or not source:
        raise UsageError(f"expected name=path.npy or name=path.npz:key, got {spec!r}")
    path, key = source, None
    head, colon, tail = source.rpartition(":")
    if colon and head.endswith(".npz"):
        path, key = head, tail
    try:
        loaded = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:  # (EOF: an empty file)
        raise UsageError(f"cannot load {path!r}: {exc or type(exc).__name__}") from None
    if isinstance(loaded, np.ndarray):
        if key is not None:
            raise UsageError(f"{path!r} is a .npy file: it has no key {key!r}")
        return name, loaded
    with loaded:
        keys = list(loaded.files)
        if key is None:
            if len(keys) != 1:
                raise UsageError(f"{path!r} holds {keys}: say which, as {path}:KEY")
            key = keys[0]
        if key not in keys:
            raise UsageError(f"{path!r} has no array {key!r} (it has {keys})")
        # A member is read only now: it may be corrupt, truncated or hold
        # objects, and numpy hands back a member that is no .npy file as bytes.
        try:
            array = loaded[key]
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
            raise UsageError(
                f"cannot load {key!r} of {path!r}: {exc or type(exc).__name__}"
            ) from None
        if not isinstance(array, np.ndarray):
            raise UsageError(f"{key!r} of {path!r} is not a .npy array")
        return name, array


def _encode(args: argparse.Namespace) -> int:
    from .._compression import compress_buffers
    from .._encode import encode_request, encode_response

    loaded = [_load(spec) for spec in args.tensors]
    arrays = dict(loaded)
    if len(arrays) != len(loaded):
        names = [name for name, _ in loaded]
        twice = sorted({n for n in names if names.count(n) > 1})
        raise UsageError(f"input names given more than once: {twice}")
    json_names = {n for n in (args.json_inputs or "").split(",") if n}
    unknown = json_names - set(arrays)
    if unknown:
        raise UsageError(f"--json-inputs names {sorted(unknown)} that are not given")
    binary = set(arrays) - json_names
    wanted = [n for n in (args.outputs or "").split(",") if n] or None
    asked = True if args.binary_outputs else False if args.json_outputs else None
    if args.kind == "request":
        body = encode_request(
            arrays,
            binary=binary,
            model_name=args.model_name,
            id=args.id,
            outputs=wanted,
            binary_data_output=asked,
        )
    elif wanted is not None or asked is not None:
        raise UsageError("--outputs, --binary-outputs and --json-outputs are for a request")
    else:
        body = encode_response(
            arrays, model_name=args.model_name or "model", id=args.id, binary=binary
        )
    headers = list(body.headers)
    pieces: Any = body.buffers
    if args.encoding:
        pieces = compress_buffers(body.buffers, args.encoding)
    if args.output in (None, "-"):
        written = _write_pieces(_standard("stdout").buffer, pieces)
    else:
        written = _write_file(args.output, pieces)
    if args.encoding:
        headers = [(n, str(written) if n == "Content-Length" else v) for n, v in headers]
        headers.append(("Content-Encoding", args.encoding))
    text = _format_headers(headers)
    if args.headers_out:
        _write_file(args.headers_out, [text.encode("latin-1")])
    else:
        _standard("stderr").write(text)
    return 0


def _write_pieces(out: IO[bytes], pieces: Iterable[Any]) -> int:
    """Write the buffers one after the other; the bytes written."""
    written = 0
    for piece in pieces:
        out.write(piece)
        written += len(memoryview(piece))
    out.flush()
    return written


def _write_file(path: str, pieces: Iterable[Any]) -> int:
    """Write the buffers to ``path`` through a temporary file beside it, put in
    place only once whole: a write that fails (a full disk, a file size limit)
    leaves no half-written file, and a file already at ``path`` as it was,
    with its mode. Written in place instead: a device or pipe (/dev/null), a
    file with other hard links (they keep sharing it), a file of another
    owner or group or with setuid/setgid/sticky bits (a new file would not
    keep them), and a file in a directory no new file can be made in."""
    if os.path.exists(path) and not os.path.isfile(path):
        return _write_in_place(path, pieces)  # (open() refuses a directory)
    target = os.path.realpath(path)  # a symlink's file is replaced, not the link
    try:
        old = os.stat(target)
    except FileNotFoundError:
        old = None
    except OSError as exc:  # (a symlink loop, say)
        raise OSError(exc.errno, exc.strerror, path) from None
    if old is not None:
        if not os.access(target, os.W_OK):  # as open() would refuse it
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        special = old.st_mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX)
        theirs = hasattr(os, "geteuid") and (old.st_uid, old.st_gid) != (
            os.geteuid(),
            os.getegid(),
        )
        if old.st_nlink > 1 or special or theirs:
            # A new file would split its links, or take our owner (another
            # user's file, or root's over a user's) and its special bits.
            return _write_in_place(path, pieces)
    name = f".{os.path.basename(target)}.{secrets.token_hex(6)}.tmp"
    temporary = os.path.join(os.path.dirname(target), name)
    try:
        # 0666 less the umask, as open() makes a new file (the umask is not read)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except PermissionError:
        if old is None:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path) from None
        return _write_in_place(path, pieces)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, path) from None  # (named as given)
    try:
        with os.fdopen(fd, "wb") as f:
            written = _write_pieces(f, pieces)
        if old is not None:
            os.chmod(temporary, stat.S_IMODE(old.st_mode))  # the mode of the file it replaces
        os.replace(temporary, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if isinstance(exc, OSError):
            raise OSError(exc.errno, exc.strerror, path) from None
        raise
    return written


def _write_in_place(path: str, pieces: Iterable[Any]) -> int:
    with open(path, "wb") as out:
        return _write_pieces(out, pieces)


def add_encode(subparsers: Any) -> None:
    """Register ``encode``: build a body from .npy/.npz files."""
    p = subparsers.add_parser(
        "encode",
        help="build a request or response body from .npy/.npz files",
        description="Encode arrays from .npy/.npz files as a body of the binary tensor"
        " data extension. Writes the body (to stdout by default) and its HTTP headers"
        " (to stderr unless --headers-out is given).",
    )
    p.add_argument(
        "tensors",
        nargs="+",
        metavar="NAME=PATH",
        help="a tensor: name=file.npy, or name=file.npz:key (the key may be left out"
        " when the file holds one array)",
    )
    p.add_argument(
        "--kind",
        choices=("request", "response"),
        default="request",
        help="build an inference request or a response (default request)",
    )
    p.add_argument(
        "--json-inputs",
        metavar="NAMES",
        help="comma-separated tensor names sent as JSON data instead of binary",
    )
    p.add_argument(
        "--outputs",
        metavar="NAMES",
        help="comma-separated outputs the request asks for (default: every output)",
    )
    wanted = p.add_mutually_exclusive_group()
    wanted.add_argument(
        "--binary-outputs",
        action="store_true",
        help="ask for binary outputs (binary_data_output: true)",
    )
    wanted.add_argument(
        "--json-outputs",
        action="store_true",
        help="ask for JSON outputs (binary_data_output: false)",
    )
    p.add_argument("--model-name", help="model_name in the JSON header")
    p.add_argument("--id", help="id in the JSON header")
    p.add_argument("--encoding", choices=("gzip", "deflate"), help="compress the body")
    p.add_argument("-o", "--output", metavar="BODY", help="file to write the body to (- stdout)")
    p.add_argument("--headers-out", metavar="FILE", help="file to write the HTTP headers to")
    p.set_defaults(func=_run(_encode))


def _run(command: Any) -> Any:
    """Wrap a command so usage mistakes print one line and exit with status 2."""

    def run(args: argparse.Namespace) -> int:
        try:
            result: int = command(args)
        except (UsageError, LocalProtocolError) as exc:
            _echo(f"binproto {args.command}: {exc}", err=True)
            return 2
        return result

    return run
