"""``binproto check URL``: run the battery of :mod:`._cases` against a server.

Reads the server's and the models' metadata, sends each case's request on a
fresh connection within a deadline, and judges the answer. Writes each
request's bytes to a reproducer directory, prints a table, and writes JSON
and HTML reports on request. The exit status is 1 when a MUST case fails
(with ``--strict``, any case), 2 when the server cannot be read at all.
"""

from __future__ import annotations

import argparse
import fnmatch
import html
import json
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._decode import decode_request, decode_response
from .._errors import ProtocolError
from .._http import HEADER_LENGTH_NAME as HL
from .._raw import TensorSpec
from ._cases import CASES, Case, Context, ModelInfo
from ._wire import Reply, Request, Target, exchange

__all__ = ["Outcome", "add_check", "judge", "load_context", "run_check"]


@dataclass
class Outcome:
    """The verdict on one case."""

    id: str
    family: str
    clause: str
    level: str
    expect: str
    summary: str
    result: str  # "pass", "fail" or "n/a"
    seen: str = ""  # the status, or what happened instead
    seconds: float = 0.0
    detail: str = ""
    request_file: str = ""
    curl: str = ""


def _get_json(target: Target, path: str, timeout: float) -> tuple[Reply, Any]:
    reply = exchange(target, Request(path, method="GET"), timeout)
    try:
        return reply, json.loads(reply.body) if reply.status == 200 else None
    except ValueError:
        return reply, None


def load_context(target: Target, models: list[str], timeout: float) -> Context:
    """The server's metadata and each model's; raises ValueError when a
    model's metadata cannot be read."""
    ctx = Context()
    reply, server = _get_json(target, "/v2", timeout)
    if reply.outcome == "unreachable":
        raise ValueError(f"{target.url}: {reply.detail}")
    ctx.server = server if isinstance(server, dict) else {}
    for name in models:
        reply, meta = _get_json(target, f"/v2/models/{name}", timeout)
        if not isinstance(meta, dict):
            raise ValueError(f"cannot read the metadata of model {name!r}: {reply.describe()}")
        inputs = []
        for item in meta.get("inputs") or []:
            try:
                inputs.append(TensorSpec(item["name"], item["datatype"], item["shape"]))
            except Exception:  # (a model's own metadata quirk: the input is left out)
                continue
        outputs = tuple(str(o["name"]) for o in meta.get("outputs") or [] if "name" in o)
        ctx.models.append(ModelInfo(name, tuple(inputs), outputs))
    return ctx


def _same(want: np.ndarray[Any, Any], got: np.ndarray[Any, Any]) -> bool:
    if want.shape != got.shape or want.dtype != got.dtype:
        return False
    if want.dtype == object:
        return [bytes(x) for x in want.ravel()] == [bytes(x) for x in got.ravel()]
    if want.dtype.kind == "f":  # (a NaN's payload does not survive JSON: any NaN is one)
        return bool(np.array_equal(want, got, equal_nan=True))
    return want.tobytes() == got.tobytes()


def _match(name: str, inputs: dict[str, Any]) -> str | None:
    """The input an identity model's output stands for (same name, or INPUTn for OUTPUTn)."""
    if name in inputs:
        return name
    alias = "INPUT" + name.removeprefix("OUTPUT") if name.startswith("OUTPUT") else None
    return alias if alias in inputs else None


def echo_problem(request: Request, answer: Any) -> str | None:
    """What differs between the request's inputs and the answer's outputs, or None."""
    headers = dict((k.lower(), v) for k, v in request.headers)
    length = headers.get(HL.lower())
    if length == "0":
        return None  # (a raw request's input is the model's: not compared)
    sent = decode_request(
        request.body,
        header_length=None if length is None else int(length),
        content_encoding=headers.get("content-encoding"),
    ).tensors
    for name, got in answer.tensors.items():
        source = _match(name, sent)
        if source is None:
            return f"output {name!r} matches no input"
        if not _same(sent[source], np.asarray(got)):
            return f"output {name!r} is not input {source!r}"
    return None


def judge(case: Case, request: Request, reply: Reply, *, echo: bool = False) -> tuple[str, str]:
    """The result (pass, fail, n/a) of ``case`` given its answer, and why."""
    if reply.outcome != "answered":
        if case.expect == "refuse-or-close" and reply.unanswered:
            return "pass", reply.detail
        return "fail", reply.detail or reply.outcome
    status = reply.status or 0
    text = reply.body[:200].decode("utf-8", "replace")
    if status >= 500:
        return (
            "fail",
            f"a {status}, a server error, to a request expected {case.expect}: {text}",
        )
    if case.expect.startswith("status:"):
        want = int(case.expect.split(":")[1])
        return ("pass", "") if status == want else ("fail", f"expected {want}: {text}")
    if case.expect in ("refuse", "refuse-or-close"):
        if 400 <= status < 500:
            return "pass", text
        return "fail", f"expected a 4xx, got {status}: {text}"
    if case.expect == "coding" and 400 <= status < 500:
        return "n/a", f"refused ({status}): the server does not take this coding: {text}"
    if status != 200:
        return "fail", f"expected 200, got {status}: {text}"
    if case.expect == "listed":
        try:
            listed = json.loads(reply.body).get("extensions") or []
        except (ValueError, AttributeError):
            return "fail", "the server metadata is not a JSON object"
        ok = "binary_tensor_data" in listed
        return ("pass", "") if ok else ("fail", f"extensions are {listed}")
    return _check_answer(case, request, reply, echo)


def _check_answer(case: Case, request: Request, reply: Reply, echo: bool) -> tuple[str, str]:
    coding = reply.header("content-encoding")
    accepted = dict((k.lower(), v) for k, v in request.headers).get("accept-encoding", "identity")
    if coding not in (None, "identity") and coding not in accepted:
        return "fail", f"answer coded {coding!r}, the client accepts {accepted!r}"
    length = reply.header(HL)
    try:
        answer = decode_response(
            reply.body,
            header_length=None if length is None else int(length),
            content_encoding=coding,
        )
    except (ProtocolError, ValueError) as exc:
        return "fail", f"the answer does not decode: {exc}"
    if case.verify is not None and (problem := case.verify(answer, request)):
        return "fail", problem
    if echo and (problem := echo_problem(request, answer)):
        return "fail", problem
    return "pass", ""


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)


def run_check(
    target: Target,
    ctx: Context,
    *,
    timeout: float = 5.0,
    echo: bool = False,
    only: list[str] | None = None,
    out: Path | None = None,
) -> list[Outcome]:
    """Run every case (or those whose id matches a glob of ``only``)."""
    outcomes = []
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    for case in CASES:
        if only and not any(fnmatch.fnmatchcase(case.id, pattern) for pattern in only):
            continue
        o = Outcome(case.id, case.family, case.clause, case.level, case.expect, case.summary, "n/a")
        built = case.build(ctx)
        if isinstance(built, str):
            o.detail = built
            outcomes.append(o)
            continue
        if out is not None:
            base = out / _slug(case.id)
            base.with_suffix(".http").write_bytes(built.wire(target))
            base.with_suffix(".body").write_bytes(built.body)
            o.request_file = str(base.with_suffix(".http"))
            o.curl = built.curl(target, str(base.with_suffix(".body")))
        reply = exchange(target, built, timeout)
        o.result, o.detail = judge(case, built, reply, echo=echo)
        o.seen, o.seconds = reply.describe(), round(reply.elapsed, 4)
        outcomes.append(o)
    return outcomes


def failed(outcomes: list[Outcome], strict: bool) -> list[Outcome]:
    """The failures that set the exit status: MUST ones (with ``strict``, all)."""
    return [o for o in outcomes if o.result == "fail" and (strict or o.level == "MUST")]


def summary(outcomes: list[Outcome]) -> dict[str, int]:
    """Counts by result and level."""
    counts = {"pass": 0, "fail": 0, "n/a": 0, "MUST fail": 0, "SHOULD fail": 0}
    for o in outcomes:
        counts[o.result] += 1
        if o.result == "fail":
            counts[f"{o.level} fail"] += 1
    return counts


def table(outcomes: list[Outcome]) -> str:
    """The terminal table."""
    rows = [("RESULT", "LEVEL", "CASE", "SEEN", "TIME", "DETAIL")]
    for o in outcomes:
        detail = " ".join(o.detail.split())[:70]
        rows.append((o.result.upper(), o.level, o.id, o.seen, f"{o.seconds:.3f}s", detail))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r[:5], widths, strict=True)) + "  " + r[5]
        for r in rows
    )


def html_report(url: str, ctx: Context, outcomes: list[Outcome]) -> str:
    """A standalone HTML page of the results."""
    colors = {"pass": "#cfc", "fail": "#fcc", "n/a": "#eee"}
    rows = []
    for o in outcomes:
        cells = [
            o.result.upper(),
            o.level,
            o.id,
            o.family,
            o.clause,
            o.summary,
            o.expect,
            o.seen,
            f"{o.seconds:.3f}",
            o.detail,
            o.curl,
        ]
        tds = "".join(f"<td>{html.escape(c)}</td>" for c in cells)
        rows.append(f'<tr style="background:{colors[o.result]}">{tds}</tr>')
    heads = "".join(
        f"<th>{h}</th>"
        for h in (
            "Result",
            "Level",
            "Case",
            "Family",
            "Clause",
            "Checks",
            "Expect",
            "Seen",
            "Seconds",
            "Detail",
            "Reproduce",
        )
    )
    counts = ", ".join(f"{k}: {v}" for k, v in summary(outcomes).items())
    models = ", ".join(m.name for m in ctx.models) or "none"
    return (
        "<!doctype html><meta charset=utf-8><title>binproto check</title>"
        "<style>body{font-family:sans-serif}td,th{border:1px solid #999;padding:2px 6px;"
        "font-size:13px;vertical-align:top}table{border-collapse:collapse}</style>"
        f"<h1>binproto check {html.escape(url)}</h1><p>Models: {html.escape(models)}."
        f" {html.escape(counts)}.</p><table><tr>{heads}</tr>{''.join(rows)}</table>"
    )


def _check(args: argparse.Namespace) -> int:
    try:
        target = Target.parse(args.url)
        ctx = load_context(target, args.model, args.timeout)
    except ValueError as exc:
        print(f"binproto check: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    outcomes = run_check(target, ctx, timeout=args.timeout, echo=args.echo, only=args.case, out=out)
    print(table(outcomes))
    counts = summary(outcomes)
    print(
        f"\n{counts['pass']} passed, {counts['fail']} failed ({counts['MUST fail']} MUST,"
        f" {counts['SHOULD fail']} SHOULD), {counts['n/a']} not applicable;"
        f" reproducers in {out}/"
    )
    if args.json:
        report = {
            "url": target.url,
            "server": ctx.server,
            "models": [m.name for m in ctx.models],
            "summary": counts,
            "strict": args.strict,
            "cases": [asdict(o) for o in outcomes],
        }
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    if args.html:
        Path(args.html).write_text(html_report(target.url, ctx, outcomes))
    return 1 if failed(outcomes, args.strict) else 0


def add_check(subparsers: Any) -> None:
    """Register ``check``: the conformance suite for a V2 server's binary extension."""
    p = subparsers.add_parser(
        "check",
        help="check a V2 server's binary tensor data extension, case by case",
        description="Send a fixed battery of valid and malformed requests to a V2 server and"
        " judge each answer against the clause it comes from. Exit status 1 when a MUST case"
        " fails (with --strict, any case), 2 when the server or a model cannot be read.",
    )
    p.add_argument("url", help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="M",
        help="a model to send requests to (repeat for several)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="deadline of each request, connect to last answer byte (default 5)",
    )
    p.add_argument(
        "--echo", action="store_true", help="the models return their inputs: check the tensors too"
    )
    p.add_argument("--strict", action="store_true", help="SHOULD failures fail the run too")
    p.add_argument(
        "--case",
        action="append",
        metavar="GLOB",
        help="run only the cases whose id matches (repeatable)",
    )
    p.add_argument(
        "--out",
        default="binproto-check",
        metavar="DIR",
        help="where each request's bytes are written (default ./binproto-check)",
    )
    p.add_argument("--json", metavar="FILE", help="write the JSON report here")
    p.add_argument("--html", metavar="FILE", help="write the HTML report here")
    p.set_defaults(func=_check)
