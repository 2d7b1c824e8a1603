"""The ``binproto`` command line: ``binproto <command> ...`` or ``python -m binproto``.

The only part of the package that does file, socket and process I/O or
imports the adapters (each when its command runs). Commands are argparse
subcommands; each registers itself with a function ``add_<name>(subparsers)``
that sets ``func`` on its parser.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["build_parser", "main"]


def _serve(args: argparse.Namespace) -> int:
    # An IPv6 literal is bracketed in a URL (RFC 3986): http://[::1]:8000.
    host = f"[{args.host}]" if ":" in args.host else args.host
    workers = f" ({args.workers} workers)" if args.workers > 1 else ""

    def ready(port: int) -> None:
        print(f"binproto: serving V2 on http://{host}:{port}{workers}", flush=True)

    from ._serving import ModelsError, load_models, open_listeners, supervise

    parent = args.uvicorn or (args.workers > 1 and args.fd is None)
    try:
        # A parent of workers only checks them, once: a typo is one message.
        models = load_models(args.models, call=not parent)
    except ModelsError as exc:
        from ._commands import _echo

        _echo(f"binproto serve: {exc}", err=True)
        return 2
    if args.uvicorn:
        return _serve_uvicorn(args, ready)
    if args.workers > 1 and args.fd is None:
        sockets = open_listeners(args.host, args.port, args.workers)
        ready(sockets[0].getsockname()[1])
        return supervise(_worker_argv(args), sockets, args.workers)
    import socket

    sock = None if args.fd is None else socket.socket(fileno=args.fd)
    if sock is not None:
        ready = _quiet  # (a worker: the parent said where it serves)

    from binproto.adapters._server import Timeouts, V2Server

    timeouts = Timeouts(
        keep_alive=args.keep_alive_timeout or None,
        head=args.head_timeout or None,
        body=args.body_timeout or None,
        write=args.write_timeout or None,
    )
    server = V2Server(
        models,
        compress_responses=not args.no_compress,
        timeouts=timeouts,
        max_body_bytes_in_flight=args.max_body_bytes_in_flight,
    )

    if args.backend == "trio":
        from binproto.adapters import missing_extra

        try:
            import trio
        except ModuleNotFoundError as exc:
            raise missing_extra(exc, "trio") from None

        from binproto.adapters import trio as trio_adapter

        serve: Any = functools.partial(
            trio_adapter.serve,
            server,
            host=args.host,
            port=args.port,
            zero_copy=not args.streams,
            ready=ready,
        )
        if sock is not None:
            handler = trio_adapter.connection_handler(server, zero_copy=not args.streams)
            listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
            serve = functools.partial(trio.serve_listeners, handler, [listener])
        try:
            trio.run(serve)
        except BaseException as exc:
            # trio hands Ctrl-C on inside an exception group: stop quietly all the same.
            if not interrupted(exc):
                raise
        return 0

    import asyncio

    from binproto.adapters.asyncio import serve as serve_asyncio

    try:
        asyncio.run(
            serve_asyncio(
                server,
                host=args.host,
                port=args.port,
                zero_copy=not args.streams,
                ready=ready,
                sock=sock,
            )
        )
    except KeyboardInterrupt:
        pass
    return 0


def _quiet(port: int) -> None:
    """A worker's ``ready``: nothing to say."""


def _worker_argv(args: argparse.Namespace) -> list[str]:
    """The ``binproto serve`` arguments a worker runs with (without ``--fd``)."""
    argv = [] if args.models is None else [args.models]
    argv += ["--backend", args.backend]
    argv += ["--streams"] * args.streams + ["--no-compress"] * args.no_compress
    for flag in ("keep_alive_timeout", "head_timeout", "body_timeout", "write_timeout"):
        argv += ["--" + flag.replace("_", "-"), repr(getattr(args, flag))]
    if args.max_body_bytes_in_flight is not None:
        argv += ["--max-body-bytes-in-flight", str(args.max_body_bytes_in_flight)]
    return argv


def _serve_uvicorn(args: argparse.Namespace, ready: Any) -> int:
    """Serve the models through V2App under uvicorn (its workers, with
    httptools and uvloop when installed)."""
    try:
        import uvicorn
        from uvicorn.supervisors import Multiprocess
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "No module named 'uvicorn': binproto serve --uvicorn needs it"
            ' (pip install "uvicorn[standard]"; binproto[asgi] for the rest)'
        ) from None

    from ._serving import MODELS_ENV, open_listeners

    # uvicorn's workers build the app themselves: they read what to serve here.
    os.environ[MODELS_ENV] = args.models or ""
    os.environ[MODELS_ENV + "_COMPRESS"] = "0" if args.no_compress else "1"
    budget = args.max_body_bytes_in_flight
    os.environ[MODELS_ENV + "_BUDGET"] = "" if budget is None else str(budget)
    (sock,) = open_listeners(args.host, args.port, 1)
    config = uvicorn.Config(
        "binproto.cli._serving:uvicorn_app",
        factory=True,
        workers=args.workers,
        timeout_keep_alive=int(args.keep_alive_timeout) or 5,
        log_level="warning",
    )
    server = uvicorn.Server(config)
    ready(sock.getsockname()[1])
    try:
        if args.workers > 1:
            supervisor: Any = Multiprocess
            try:
                runner = supervisor(config, sockets=[sock])
            except TypeError:  # uvicorn before 0.30 is told what each worker runs
                runner = supervisor(config, target=server.run, sockets=[sock])
            runner.run()
        else:
            server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn shuts down on Ctrl-C, then raises it again
        pass
    return 0


def _port(text: str) -> int:
    """A TCP port number, 0 to 65535 (argparse's ``type``)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 to 65535, got {port}")
    return port


def add_serve(subparsers: Any) -> None:
    """Register ``serve``: run a V2 server with the user's models (or ``echo``)."""
    p = subparsers.add_parser(
        "serve",
        help="run a V2 inference server with your models (or the built-in echo model)",
        description="Run a V2 (KServe / Triton) HTTP server with the models MODULE:ATTR"
        " names (a Model, a list of Model, or a function returning them), or with the"
        " built-in 'echo' model: each input comes back as the output of the same name.",
    )
    p.add_argument(
        "models",
        nargs="?",
        default=None,
        metavar="MODULE:ATTR",
        help="the models to serve, e.g. mymodels:MODELS (default: the echo model)",
    )
    p.add_argument(
        "--workers",
        type=_workers,
        default=1,
        metavar="N",
        help="serve on N processes sharing the port (default 1); each has its own"
        " --max-body-bytes-in-flight",
    )
    p.add_argument(
        "--uvicorn",
        action="store_true",
        help="serve the models through binproto's ASGI app (V2App) under uvicorn",
    )
    # A worker's listening socket, inherited from the parent (--workers).
    p.add_argument("--fd", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=_port, default=8000, help="port (default 8000; 0 picks one)")
    p.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    p.add_argument(
        "--streams",
        action="store_true",
        help="read through plain streams instead of receiving tensors in place",
    )
    p.add_argument(
        "--no-compress",
        action="store_true",
        help="never compress responses, whatever the client's Accept-Encoding",
    )
    # The server's timeouts (see binproto.adapters._server.Timeouts); 0: no bound.
    for flag, default, what in (
        ("--keep-alive-timeout", 5.0, "idle time allowed between requests (then close)"),
        ("--head-timeout", 10.0, "deadline for a whole request head (then 408)"),
        ("--body-timeout", 30.0, "longest wait for more of a request body (then 408)"),
        ("--write-timeout", 30.0, "longest wait for a client to take response bytes (then close)"),
    ):
        p.add_argument(
            flag,
            type=_seconds,
            default=default,
            metavar="SECONDS",
            help=f"{what}; default {default:g}, 0 for no bound",
        )
    from ._demo import size_arg  # (sizes read as binproto demo reads them: 4GiB, 4096)

    p.add_argument(
        "--max-body-bytes-in-flight",
        type=size_arg,
        default=None,
        metavar="SIZE",
        help="request body bytes all connections of a process may hold at once (e.g."
        " 4GiB; each worker has its own); a request that would pass it while others"
        " are in flight is answered 503 with Retry-After: 1, one alone is always"
        " taken; default no bound",
    )
    p.set_defaults(func=_serve)


def _workers(text: str) -> int:
    """A number of worker processes, at least 1 (argparse's ``type``)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of workers: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"workers must be 1 or more, got {n}")
    return n


def _seconds(text: str) -> float:
    """A timeout flag's value: seconds, at least 0 (0: no bound)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"seconds must be 0 or more, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="binproto",
        description="Inspect, encode and serve Open Inference Protocol (KServe V2 / Triton)"
        " bodies with binary tensor data.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="command")
    subparsers.required = True
    add_serve(subparsers)
    from ._check import add_check
    from ._commands import add_encode, add_inspect
    from ._demo import add_demo
    from ._fuzz import add_fuzz
    from ._infer import add_infer

    add_demo(subparsers)
    add_inspect(subparsers)
    add_encode(subparsers)
    add_infer(subparsers)
    add_check(subparsers)
    add_fuzz(subparsers)
    return parser


def interrupted(exc: BaseException) -> bool:
    """True for a KeyboardInterrupt, or an exception group (trio's) holding only those."""
    if isinstance(exc, KeyboardInterrupt):
        return True
    inner: Sequence[BaseException] = getattr(exc, "exceptions", ())
    return bool(inner) and all(interrupted(e) for e in inner)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``binproto`` console script.

    A missing optional dependency is one line naming the extra to install
    (exit status 2); a reader that goes away (``binproto inspect BODY | head``)
    ends the command quietly.
    """
    args = build_parser().parse_args(argv)
    from ._commands import _echo  # (loaded by build_parser)

    try:
        result: int = args.func(args)
        if sys.stdout is not None:  # (None: started with stdout closed)
            sys.stdout.flush()
    except ModuleNotFoundError as exc:
        if "binproto[" not in str(exc):
            raise
        _echo(f"binproto {args.command}: {exc}", err=True)
        return 2
    except BrokenPipeError:
        # Nobody reads our output any more: point stdout at nothing so that the
        # interpreter's last flush does not complain, and stop.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except (OSError, MemoryError) as exc:
        # A file that cannot be opened or written, an address that cannot be
        # bound or resolved, more memory than there is: one line, not a traceback.
        reason = str(exc) or type(exc).__name__
        _echo(f"binproto {args.command}: {reason}", err=True)
        return 1
    return result
