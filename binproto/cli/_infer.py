"""The ``infer`` command: send an inference request to a V2 server from
``.npy``/``.npz`` files, print a short table of the outputs, and save them."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from .._errors import RemoteProtocolError
from ._commands import UsageError, _echo, _load, _run, _value

__all__ = ["add_infer", "outputs_table"]

#: Values shown per output in the table.
SHOWN = 5


def _first(array: np.ndarray[Any, Any]) -> str:
    flat = array.reshape(-1)[:SHOWN]
    values = [_value(v.item() if isinstance(v, np.generic) else v) for v in flat]
    more = ", ..." if array.size > SHOWN else ""
    return ", ".join(values) + more


def outputs_table(outputs: dict[str, np.ndarray[Any, Any]], datatypes: dict[str, str]) -> str:
    """The outputs as a table: name, datatype, shape, bytes and first values."""
    rows = [("output", "datatype", "shape", "bytes", "values")]
    for name, array in outputs.items():
        nbytes = array.nbytes if array.dtype != object else sum(len(b) for b in array.flat)
        rows.append(
            (name, datatypes.get(name, "?"), str(list(array.shape)), str(nbytes), _first(array))
        )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row[:4], widths, strict=True))
        + "  "
        + row[4]
        for row in rows
    )


async def _send(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, str]]:
    from binproto.adapters.asyncio import Client

    loaded = [_load(spec) for spec in args.tensors]
    inputs = dict(loaded)
    if len(inputs) != len(loaded):
        raise UsageError("input names given more than once")
    outputs = [n for n in (args.outputs or "").split(",") if n] or None
    async with Client(args.url, timeout=args.timeout) as client:
        async with client.stream(
            args.model,
            inputs,
            outputs=outputs,
            binary_data_output=not args.json_outputs,
            model_version=args.model_version,
        ) as response:
            arrays = await response.tensors()
            header = response.header
    datatypes = {t.name: t.datatype for t in header.tensors} if header is not None else {}
    return arrays, datatypes


def _infer(args: argparse.Namespace) -> int:
    import asyncio

    from binproto.adapters.h11 import HTTPError

    try:
        arrays, datatypes = asyncio.run(_send(args))
    except HTTPError as exc:
        _echo(f"binproto infer: the server answered {exc}", err=True)
        return 1
    except RemoteProtocolError as exc:
        _echo(f"binproto infer: {exc}", err=True)
        return 1
    _echo(outputs_table(arrays, datatypes))
    if args.output:
        np.savez(args.output, **arrays)
    return 0


def add_infer(subparsers: Any) -> None:
    """Register ``infer``: send a request to a server and show its outputs."""
    p = subparsers.add_parser(
        "infer",
        help="send an inference request to a V2 server and print its outputs",
        description="Send arrays from .npy/.npz files to a model of a V2 server"
        " (binproto serve, Triton, KServe) and print a table of the outputs: name,"
        " datatype, shape, bytes and first values. Outputs come back binary unless"
        " --json-outputs is given.",
    )
    p.add_argument("url", metavar="URL", help="the server's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("model", metavar="MODEL", help="the model's name")
    p.add_argument(
        "tensors",
        nargs="+",
        metavar="NAME=PATH",
        help="an input: name=file.npy, or name=file.npz:key",
    )
    p.add_argument("-o", "--output", metavar="FILE.npz", help="save the outputs to a .npz file")
    p.add_argument("--outputs", metavar="NAMES", help="comma-separated outputs to ask for")
    p.add_argument(
        "--json-outputs", action="store_true", help="ask for outputs as JSON, not binary"
    )
    p.add_argument("--model-version", metavar="V", help="the model version")
    p.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        metavar="S",
        help="seconds to wait for the server at each step (default 300)",
    )
    p.set_defaults(func=_run(_infer))
