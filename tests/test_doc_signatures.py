"""The signatures the docs quote are the code's (inspect.signature).

Every backticked call in README.md and docs/*.md that names a parameter
(``name=``, ``*`` or ``...``) is checked:

| The doc writes | Checked |
|---|---|
| a whole signature: ``f(a, b=1, *, c=None)`` | names, order, keyword-only, literal defaults |
| ``**options`` at its end | the code's remaining parameters are keyword-only |
| ``...`` or only keywords: ``V2Server(limits=...)`` | each keyword is a parameter |

A name binproto does not define must be listed in FOREIGN.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

SPAN = re.compile(r"`([^`]+)`")
CALL = re.compile(r"^(?:await |async with |with )?([A-Za-z_][\w.]*)\((.*)\)(?: as \w+)?:?$")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)

#: The module a section of docs/adapters.md is about, by its heading.
SECTIONS = {
    "h11": "binproto.adapters.h11",
    "asyncio": "binproto.adapters.asyncio",
    "trio": "binproto.adapters.trio",
    "ASGI": "binproto.adapters.asgi",
    "httpx": "binproto.adapters.httpx",
}
MODULES = ["binproto", "binproto.testing", *SECTIONS.values()]

#: What a doc calls an instance: ``client.infer`` is ``Client.infer``.
INSTANCES = {"client": "Client", "request": "InferRequest", "server": "V2Server"}

#: Calls the docs quote that are not binproto's: (doc, section, name).
FOREIGN = {
    ("interop.md", "*", "xfail"),
    ("interop.md", "*", "subprocess.Popen"),
    ("interop.md", "*", "run"),
    ("interop.md", "*", "np.array"),
    ("limits-and-errors.md", "*", "bytearray"),
    ("adapters.md", "httpx", "client.stream"),
    ("adapters.md", "httpx", "client.post"),
    ("serving.md", "*", "api.mount"),
}

#: Bare names the docs use for a method, by doc.
ALIASES = {
    ("testing.md", "parser"): "Body.parser",
    ("adapters.md", "stream"): "Client.stream",
    ("adapters.md", "infer"): "Client.infer",
}

#: Parameters a signature may leave out: trio's nursery.start() passes it.
HIDDEN = {"task_status"}


def quoted_calls() -> list[tuple[str, str, str]]:
    """(doc, section, call) of every backticked call that names a parameter."""
    found = []
    for doc in DOCS:
        section = ""
        for part in re.split(r"^## +(.*)$", FENCE.sub("", doc.read_text()), flags=re.MULTILINE):
            if "\n" not in part:  # a heading: what split captured
                section = part.strip()
                continue
            for span in SPAN.finditer(part):
                text = " ".join(span.group(1).split())
                match = CALL.match(text)
                if match and re.search(r"\w=|\*|\.\.\.", match.group(2)):
                    found.append((doc.name, section, text))
    return found


def resolve(doc: str, section: str, name: str) -> Callable[..., Any] | None:
    """The binproto callable ``name`` stands for, in the section's module first."""
    found = _lookup(doc, section, name)
    if found is None and (doc, name) in ALIASES:
        found = _lookup(doc, section, ALIASES[doc, name])
    return found


def _lookup(doc: str, section: str, name: str) -> Callable[..., Any] | None:
    first, _, rest = name.removeprefix("binproto.").partition(".")
    if rest:
        first = INSTANCES.get(first, first)
    if doc == "adapters.md" and section in SECTIONS:
        modules = [SECTIONS[section], "binproto"]
    else:
        modules = MODULES
    for module in modules:
        obj = getattr(importlib.import_module(module), first, None)
        if not getattr(obj, "__module__", "").startswith("binproto"):
            continue  # an import of the module's, such as numpy
        for attr in rest.split(".") if rest else []:
            obj = getattr(obj, attr, None)
        if callable(obj):
            return cast("Callable[..., Any]", obj)
    return None


def documented(call: str) -> tuple[ast.arguments | None, list[str]]:
    """The call as a ``def``'s parameters, if it parses as one; its keywords."""
    args = CALL.match(call).group(2)  # type: ignore[union-attr]
    # `host=` (a required keyword) is not Python.
    args = re.sub(r"=(?=\s*[,)]|$)", "", args)
    try:
        fn = ast.parse(f"def f({args}): pass").body[0]
    except SyntaxError:
        pass
    else:
        assert isinstance(fn, ast.FunctionDef)
        spec = fn.args
        return spec, [a.arg for a in [*spec.args, *spec.kwonlyargs]]
    # An example call: `f(..., c=1)`, `V2Server(limits=...)`.
    as_call = ast.parse(f"f({args})", mode="eval").body
    assert isinstance(as_call, ast.Call)
    return None, [k.arg for k in as_call.keywords if k.arg is not None]


def _literal(node: ast.expr | None) -> Any:
    try:
        return ast.literal_eval(node) if node is not None else inspect.Parameter.empty
    except ValueError:
        return ...  # not a literal (``Timeouts()``): not compared


CASES = [pytest.param(*c, id=f"{c[0]}:{c[2][:60]}") for c in quoted_calls()]


@pytest.mark.parametrize(("doc", "section", "call"), CASES)
def test_quoted_signature_is_the_codes(doc: str, section: str, call: str) -> None:
    name = CALL.match(call).group(1)  # type: ignore[union-attr]
    target = resolve(doc, section, name)
    if target is None:
        assert (doc, "*", name) in FOREIGN or (doc, section, name) in FOREIGN, (
            f"{name} is neither binproto's nor listed in FOREIGN"
        )
        return
    params = [
        p
        for p in inspect.signature(target).parameters.values()
        if p.name not in HIDDEN and p.name != "self"
    ]
    names = {p.name for p in params}
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params)
    spec, keywords = documented(call)
    for keyword in keywords:
        assert keyword in names or takes_any, f"{call}: {name} has no parameter {keyword!r}"
    # Only keywords with values is an example call (`V2Server(limits=...)`).
    bare = spec is not None and (
        len(spec.defaults) < len(spec.args) or spec.vararg or spec.kwonlyargs or spec.kwarg
    )
    if spec is None or not bare or "..." in call:
        return
    doc_params = [*spec.args, *([spec.vararg] if spec.vararg else []), *spec.kwonlyargs]
    code = [p for p in params if p.kind is not p.VAR_KEYWORD]
    if spec.kwarg and not takes_any:  # **options: the code's keyword-only rest
        rest = code[len(doc_params) :]
        assert all(p.kind is p.KEYWORD_ONLY for p in rest), call
        code = code[: len(doc_params)]
    assert [a.arg for a in doc_params] == [p.name for p in code], (
        f"{call}: the code's signature is {inspect.signature(target)}"
    )
    kw_code = {p.name for p in code if p.kind is p.KEYWORD_ONLY}
    assert {a.arg for a in spec.kwonlyargs} == kw_code, f"{call}: keyword-only differ"
    positional_defaults = spec.defaults[::-1]
    defaults = dict(zip([a.arg for a in spec.args][::-1], positional_defaults, strict=False))
    defaults |= {a.arg: d for a, d in zip(spec.kwonlyargs, spec.kw_defaults, strict=True) if d}
    for p in code:
        if p.kind is p.VAR_POSITIONAL:
            continue
        shown = _literal(defaults.get(p.name))
        if shown is ... or (shown is inspect.Parameter.empty and p.kind is p.KEYWORD_ONLY):
            continue  # `host=` in the doc: a keyword whose default it does not show
        assert shown == p.default, f"{call}: {p.name} defaults to {p.default!r}, not {shown!r}"
