"""``binproto fuzz URL --model M``: random requests for one model, judged one by one.

Requests come from the strategies of :mod:`binproto.testing` (valid ones and
mutated ones), sent in random segmentations, plain or chunked, with random
Accept-Encoding; some get a junk Inference-Header-Content-Length, some are cut
short and the client's side ended. Hypothesis draws them from ``--seed``, so
a seed replays the same requests. A finding is a 5xx, a close without an
answer, a hang (no answer before the deadline), a valid request refused, an
invalid one accepted, an answer that does not decode, wrong tensors
(``--echo``), or a disagreement with ``--against``. Each kind of finding is
reduced (a delta-minimisation of the body within a time budget) and saved as
a reproducer.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import re
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .._decode import decode_request, decode_response
from .._errors import ProtocolError
from .._http import HEADER_LENGTH_NAME as HL
from .._raw import TensorSpec
from ._check import echo_problem, load_context
from ._wire import Reply, Request, Target, exchange

__all__ = ["Finding", "FuzzReport", "add_fuzz", "fuzz", "parse_duration"]

#: Inputs for a model that declares none (binproto's echo model takes any).
DEFAULT_INPUTS = (
    TensorSpec("INPUT0", "FP32", [-1, 2]),
    TensorSpec("INPUT1", "INT64", [-1]),
    TensorSpec("INPUT2", "BYTES", [-1]),
    TensorSpec("INPUT3", "BOOL", [-1]),
    TensorSpec("INPUT4", "FP16", [-1]),
)
#: Values that are no Inference-Header-Content-Length.
JUNK_LENGTHS = ("-1", "abc", "", "1e3", "0x10", " ", "99999999999999999999999", "+-1")


@dataclass
class Finding:
    """One kind of fault, found by the request at ``index``."""

    kind: str
    detail: str
    index: int
    seen: str
    request: Request = field(repr=False)
    reduced: Request | None = field(default=None, repr=False)
    files: list[str] = field(default_factory=list)
    count: int = 1


@dataclass
class FuzzReport:
    """What a run did and found."""

    seed: int
    requests: int = 0
    seen: dict[str, int] = field(default_factory=dict)
    findings: dict[str, Finding] = field(default_factory=dict)
    seconds: float = 0.0


def parse_duration(text: str) -> float:
    """Seconds from ``60``, ``60s``, ``500ms``, ``2m`` or ``1h``."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h)?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 60s, 2m)")
    scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[match.group(2)]
    return float(match.group(1)) * scale


def _kind_of(reply: Reply) -> str | None:
    if reply.outcome == "timeout":
        return "hang"
    if reply.outcome in ("closed", "reset"):
        return "closed"
    if reply.outcome == "unreachable":
        return "unreachable"
    if (reply.status or 0) >= 500:
        return f"{reply.status}"
    return None


def _verdict(reply: Reply) -> str:
    """A class of answer two servers should agree on."""
    if reply.outcome != "answered":
        return reply.outcome
    status = reply.status or 0
    return "200" if status == 200 else f"{status // 100}xx"


def _agree(reply: Reply, other: Reply, expect: str) -> bool:
    """True when two servers' answers to one request agree. For a body cut
    short a 4xx and an end with no answer (a close or a reset) are one
    answer: some servers (uvicorn) take the client's half-close for a
    disconnect and close without answering."""
    if expect == "refuse-or-close":
        refused = [r.unanswered or _verdict(r) == "4xx" for r in (reply, other)]
        if any(refused):
            return all(refused)
    return _verdict(reply) == _verdict(other)


def judge(request: Request, reply: Reply, expect: str, echo: bool) -> tuple[str, str] | None:
    """The finding of one exchange: (kind, detail), or None.

    ``expect`` is ``"accept"`` (a valid request), ``"refuse"`` (a 4xx) or
    ``"refuse-or-close"`` (a body cut short: a 4xx or a close).
    """
    kind = _kind_of(reply)
    if expect == "refuse-or-close" and reply.unanswered:
        return None
    if kind is not None:
        return ("5xx" if kind.isdigit() else kind), f"{reply.describe()} {reply.detail}".strip()
    status = reply.status or 0
    text = reply.body[:160].decode("utf-8", "replace")
    if expect == "accept" and status != 200:
        return "refused-valid", f"{status}: {text}"
    if expect != "accept" and not 400 <= status < 500:
        return "accepted-invalid", f"{status}: {text}"
    if expect != "accept":
        return None
    length = reply.header(HL)
    try:
        answer = decode_response(
            reply.body,
            header_length=None if length is None else int(length),
            content_encoding=reply.header("content-encoding"),
        )
    except (ProtocolError, ValueError) as exc:
        return "bad-answer", str(exc)
    if _asked_binary(request):
        json_ones = [t.name for t in answer.header.tensors if t.binary_size is None]
        if json_ones:
            return "wrong-output-form", f"binary_data_output true, JSON outputs {json_ones}"
    if echo and (problem := echo_problem(request, answer)):
        return "wrong-tensors", problem
    return None


def _asked_binary(request: Request) -> bool:
    """True when the request asks every output binary (binary_data_output, no outputs)."""
    headers = {k.lower(): v for k, v in request.headers}
    length = headers.get(HL.lower())
    try:
        header = decode_request(
            request.body,
            header_length=None if length is None else int(length),
            content_encoding=headers.get("content-encoding"),
        ).header
    except (ProtocolError, ValueError):
        return False
    wanted = header.parameters.get("binary_data_output") is True
    return wanted and header.requested_outputs is None


def _strategy(specs: list[TensorSpec], encodings: tuple[str | None, ...]) -> Any:
    """The hypothesis strategy of (request, expect) pairs."""
    import hypothesis.strategies as st

    from ..testing import chunkings, invalid_model_requests, model_requests

    @st.composite
    def requests(draw: Any) -> tuple[Request, str]:
        family = draw(st.sampled_from(["valid", "valid", "invalid", "junk-length", "cut"]))
        if family == "invalid":
            case = draw(invalid_model_requests(specs, encodings=encodings))
        else:
            case = draw(model_requests(specs, encodings=encodings))
        headers = [(k, v) for k, v in case.headers() if k != "Content-Length"]
        expect = "accept" if family == "valid" else "refuse"
        body = case.body
        end_input = False
        if family == "junk-length":
            junk = draw(st.sampled_from(JUNK_LENGTHS))
            headers = [(k, v) for k, v in headers if k != HL] + [(HL, junk)]
        elif family == "cut":
            # Content-Length claims the whole body; part of it comes, then the end.
            headers.append(("Content-Length", str(len(body))))
            body = body[: draw(st.integers(0, max(len(body) - 1, 0)))]
            end_input, expect = True, "refuse-or-close"
        accept = draw(st.sampled_from([None, "gzip", "deflate", "identity"]))
        if accept is not None:
            headers.append(("Accept-Encoding", accept))
        pieces = draw(chunkings(body, max_cuts=6))
        chunked = family != "cut" and draw(st.booleans())
        if chunked:
            headers = [(k, v) for k, v in headers if k != "Content-Length"]
        request = Request(
            "",
            tuple(headers),
            body,
            segments=tuple(len(p) for p in pieces),
            chunked=chunked,
            end_input=end_input,
        )
        return request, expect

    return requests()


def _reduce(
    target: Target,
    request: Request,
    fails: Callable[[Request], bool],
    budget: float,
) -> Request:
    """A smaller request that still fails: one write and no chunking first,
    then pieces of the body removed (halves, quarters, ...) while it fails."""
    deadline = time.monotonic() + budget
    best = request
    # Each from the best so far: the second must not undo the first.
    simplifications: tuple[Callable[[Request], Request], ...] = (
        lambda r: replace(r, segments=()),
        lambda r: replace(r, chunked=False),
    )
    for simplify in simplifications:
        if time.monotonic() > deadline:
            return best
        simpler = simplify(best)
        if simpler != best and fails(simpler):
            best = simpler
    size = len(best.body) // 2
    while size >= 1 and time.monotonic() < deadline:
        at, progress = 0, False
        while at < len(best.body) and time.monotonic() < deadline:
            body = best.body[:at] + best.body[at + size :]
            candidate = replace(best, body=body, segments=())
            if fails(candidate):
                best, progress = candidate, True
            else:
                at += size
        if not progress:
            size //= 2
    return best


def _save(out: Path, target: Target, finding: Finding, seed: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stem = out / re.sub(r"[^A-Za-z0-9_.-]", "_", f"{finding.kind}-{finding.index}")
    for suffix, request in (("", finding.request), (".reduced", finding.reduced)):
        if request is None:
            continue
        path = Path(f"{stem}{suffix}")
        path.with_suffix(path.suffix + ".http").write_bytes(request.wire(target))
        path.with_suffix(path.suffix + ".body").write_bytes(request.body)
        finding.files.append(str(path.with_suffix(path.suffix + ".http")))
    shown = finding.reduced or finding.request
    suffix = ".reduced" if finding.reduced else ""
    meta = {
        "kind": finding.kind,
        "detail": finding.detail,
        "seen": finding.seen,
        "seed": seed,
        "index": finding.index,
        "curl": shown.curl(target, f"{stem}{suffix}.body"),
    }
    if shown.end_input:
        # curl cannot end its side early: the request as written, then a half-close.
        http = shlex.quote(f"{stem}{suffix}.http")
        meta["replay"] = f"nc -N {shlex.quote(target.host)} {target.port} < {http}"
    Path(f"{stem}.json").write_text(json.dumps(meta, indent=2) + "\n")


def fuzz(
    target: Target,
    model: str,
    specs: list[TensorSpec],
    *,
    duration: float = 60.0,
    seed: int = 0,
    timeout: float = 5.0,
    echo: bool = False,
    against: Target | None = None,
    out: Path | None = None,
    max_requests: int | None = None,
    reduce_budget: float = 10.0,
    encodings: tuple[str | None, ...] = (None, "gzip", "deflate"),
) -> FuzzReport:
    """Send random requests to ``model`` for ``duration`` seconds (or
    ``max_requests``); each kind of finding is reduced and saved to ``out``.
    ``encodings`` are the request bodies' content codings (None: none)."""
    from hypothesis import HealthCheck, Phase, find, settings
    from hypothesis.errors import NoSuchExample

    report = FuzzReport(seed)
    start = time.monotonic()
    path = f"/v2/models/{model}/infer"
    strategy = _strategy(specs, encodings)

    def disagreement(request: Request, reply: Reply, expect: str) -> str | None:
        """How ``against`` answers ``request`` otherwise, or None."""
        if against is None:
            return None
        other = exchange(against, request, timeout)
        if _agree(reply, other, expect):
            return None
        return f"{reply.describe()} here, {other.describe()} there"

    def send(request: Request, expect: str) -> tuple[Reply, tuple[str, str] | None]:
        reply = exchange(target, request, timeout)
        found = judge(request, reply, expect, echo)
        if found is None and (detail := disagreement(request, reply, expect)) is not None:
            found = "disagreement", detail
        return reply, found

    def over() -> bool:
        done = max_requests is not None and report.requests >= max_requests
        return done or time.monotonic() - start > duration

    def test(drawn: tuple[Request, str]) -> bool:
        """Send one request; True (stop) once the run is over."""
        if over():
            return True
        request, expect = replace(drawn[0], path=path), drawn[1]
        index = report.requests
        report.requests += 1
        reply, found = send(request, expect)
        report.seen[_verdict(reply)] = report.seen.get(_verdict(reply), 0) + 1
        if found is not None:
            kind, detail = found
            if kind in report.findings:
                report.findings[kind].count += 1
            else:
                report.findings[kind] = Finding(kind, detail, index, reply.describe(), request)
        return False

    # find() draws from a seeded Random: the same seed, the same requests.
    # Only its generate phase runs (the condition is the run, not a search).
    batch = 0
    while not over():
        config = settings(
            database=None,
            deadline=None,
            max_examples=1000,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        with contextlib.suppress(NoSuchExample):
            find(strategy, test, settings=config, random=random.Random(seed * 1_000_003 + batch))
        batch += 1
    for finding in report.findings.values():

        def fails(candidate: Request, kind: str = finding.kind) -> bool:
            expect = "refuse-or-close" if candidate.end_input else "refuse"
            if kind == "disagreement":
                # Judged against each other only: a valid request found
                # here would be an "accepted-invalid" to the judge.
                reply = exchange(target, candidate, timeout)
                return disagreement(candidate, reply, expect) is not None
            found = send(candidate, expect)[1]
            return found is not None and found[0] == kind

        if finding.kind in ("5xx", "hang", "closed", "disagreement"):
            # Only faults whatever the input are reduced: a body that loses
            # bytes may turn valid (or invalid) and the finding with it.
            finding.reduced = _reduce(target, finding.request, fails, reduce_budget)
        if out is not None:
            _save(out, target, finding, seed)
    report.seconds = time.monotonic() - start
    return report


def _fuzz(args: argparse.Namespace) -> int:
    try:
        import hypothesis  # noqa: F401
    except ImportError:
        raise ModuleNotFoundError(
            "fuzz needs hypothesis: pip install 'binproto[testing]'"
        ) from None
    try:
        target = Target.parse(args.url)
        against = Target.parse(args.against) if args.against else None
        ctx = load_context(target, [args.model], args.timeout)
    except ValueError as exc:
        print(f"binproto fuzz: {exc}", file=sys.stderr)
        return 2
    specs = list(ctx.models[0].inputs) or list(DEFAULT_INPUTS)
    report = fuzz(
        target,
        args.model,
        specs,
        duration=args.duration,
        seed=args.seed,
        timeout=args.timeout,
        echo=args.echo,
        against=against,
        out=Path(args.out),
        max_requests=args.max_requests,
        encodings=args.encodings,
    )
    seen = ", ".join(f"{k}: {v}" for k, v in sorted(report.seen.items()))
    print(f"{report.requests} requests in {report.seconds:.1f} s (seed {report.seed}); {seen}")
    for f in report.findings.values():
        print(
            f"FINDING {f.kind} x{f.count} (first at request {f.index}): {f.seen} {f.detail[:100]}"
        )
        for path in f.files:
            print(f"  {path}")
    if not report.findings:
        print("no findings")
    return 1 if report.findings else 0


def add_fuzz(subparsers: Any) -> None:
    """Register ``fuzz``: random valid and mutated requests for one model."""
    p = subparsers.add_parser(
        "fuzz",
        help="send random valid and malformed requests for one model, report faults",
        description="Fuzz one model of a V2 server with requests drawn from its metadata"
        " (binproto.testing's strategies; needs binproto[testing]). Exit status 1 when"
        " something is found, 2 when the server or model cannot be read.",
    )
    p.add_argument("url", help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", required=True, metavar="M", help="the model to fuzz")
    p.add_argument(
        "--duration",
        type=parse_duration,
        default=60.0,
        metavar="TIME",
        help="how long to send requests (60s, 2m; default 60s)",
    )
    p.add_argument(
        "--max-requests",
        type=int,
        default=None,
        metavar="N",
        help="stop after N requests (default: no bound)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="the seed: the same seed sends the same requests"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="deadline of each request; no answer by then is a hang (default 5)",
    )
    p.add_argument(
        "--echo", action="store_true", help="the model returns its inputs: check the tensors too"
    )
    p.add_argument(
        "--against",
        metavar="URL2",
        help="send each request to this server too and report where they disagree",
    )
    p.add_argument(
        "--out",
        default="binproto-fuzz",
        metavar="DIR",
        help="where findings are saved (default ./binproto-fuzz)",
    )
    p.add_argument(
        "--encodings",
        type=_encodings,
        default=(None, "gzip", "deflate"),
        metavar="LIST",
        help="request codings to use, of identity, gzip, deflate (default all three)",
    )
    p.set_defaults(func=_fuzz)


def _encodings(text: str) -> tuple[str | None, ...]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names or not set(names) <= {"identity", "gzip", "deflate"}:
        raise argparse.ArgumentTypeError(f"codings are identity, gzip, deflate; got {text!r}")
    return tuple(None if n == "identity" else n for n in names)
