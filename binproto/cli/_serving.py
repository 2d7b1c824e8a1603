"""``binproto serve``: the user's models, on one process or many, or under uvicorn.

With ``--workers N`` the parent process opens the listening sockets and
starts N worker processes (``binproto serve ... --fd FD``), each serving on
one of them: with ``SO_REUSEPORT`` (Linux, the BSDs) each worker has its
own socket on the same port and the kernel spreads connections among them;
elsewhere they share one socket. The parent only watches: SIGTERM or
Ctrl-C stops every worker; a worker that dies is replaced, unless workers
keep dying (then everything stops, with a message).
"""

from __future__ import annotations

import importlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["ModelsError", "load_models", "open_listeners", "supervise", "uvicorn_app"]

#: A worker that dies is replaced; more than this many deaths in
#: :data:`DEATH_WINDOW` seconds per worker stops the server.
DEATHS_PER_WORKER = 3
DEATH_WINDOW = 30.0
#: Seconds the workers have to stop after SIGTERM before they are killed.
STOP_GRACE = 4.0
#: The environment variable that tells uvicorn's workers which models to serve.
MODELS_ENV = "BINPROTO_SERVE_MODELS"


class ModelsError(Exception):
    """``MODULE:ATTR`` does not name models to serve (the message says why)."""


def load_models(spec: str | None, *, call: bool = True) -> list[Any]:
    """The models ``MODULE:ATTR`` names: a Model, a sequence of Model, or a
    function (no arguments) returning either; the ``echo`` model when None.
    ``MODULE`` is imported from the current directory too, as uvicorn does.
    ``call=False`` checks a function is there without calling it (a parent
    of workers: each worker loads its own models), and returns ``[]`` for it."""
    from binproto.adapters._app import Model, echo_model

    if spec is None:
        return [echo_model()]
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ModelsError(f"models are named MODULE:ATTR (e.g. mymodels:MODELS), got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelsError(f"cannot import {module_name!r}: {exc}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ModelsError(f"{module_name!r} has no attribute {attr!r}") from None
    if callable(obj) and not isinstance(obj, Model):
        if not call:
            return []
        obj = obj()  # a factory: called in each process
    models = [obj] if isinstance(obj, Model) else list(obj) if isinstance(obj, Sequence) else None
    if not models or not all(isinstance(m, Model) for m in models):
        raise ModelsError(
            f"{spec} must be a Model, a list of Model, or a function returning them;"
            f" got {type(obj).__name__}"
        )
    return models


def open_listeners(host: str, port: int, workers: int) -> list[socket.socket]:
    """Listening sockets on ``host``:``port`` for ``workers`` processes: one
    each with ``SO_REUSEPORT``, else one shared. Port 0 picks one port for all."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    reuse_port = hasattr(socket, "SO_REUSEPORT")
    sockets: list[socket.socket] = []
    try:
        for _ in range(workers if reuse_port else 1):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            port = sock.getsockname()[1]  # (port 0: the others take the one picked)
            sock.listen(1024)
            sock.set_inheritable(True)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _stop(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every worker; kill those still running after :data:`STOP_GRACE` s."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def supervise(argv: Sequence[str], sockets: Sequence[socket.socket], workers: int) -> int:
    """Run ``workers`` processes of ``python -m binproto serve *argv --fd FD``
    until SIGTERM or Ctrl-C (then stop them all: 0); a worker that exits is
    replaced, unless workers keep exiting (then stop them all: 1)."""

    def start(index: int) -> subprocess.Popen[bytes]:
        sock = sockets[index % len(sockets)]
        fd = sock.fileno()
        cmd = [sys.executable, "-m", "binproto", "serve", *argv, "--fd", str(fd)]
        return subprocess.Popen(cmd, pass_fds=[fd], stdin=subprocess.DEVNULL)

    def terminate(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, terminate)
    procs: list[subprocess.Popen[bytes]] = []
    deaths: list[float] = []
    try:
        procs = [start(i) for i in range(workers)]
        while True:
            time.sleep(0.1)
            for i, proc in enumerate(procs):
                status = proc.poll()
                if status is None:
                    continue
                now = time.monotonic()
                deaths = [t for t in deaths if now - t < DEATH_WINDOW] + [now]
                if len(deaths) > DEATHS_PER_WORKER * workers:
                    print(
                        f"binproto serve: workers keep exiting (the last, pid {proc.pid},"
                        f" with status {status}); stopping",
                        file=sys.stderr,
                        flush=True,
                    )
                    _stop(procs)
                    return 1
                print(
                    f"binproto serve: worker {proc.pid} exited with status {status};"
                    " starting another",
                    file=sys.stderr,
                    flush=True,
                )
                procs[i] = start(i)
    except KeyboardInterrupt:
        _stop(procs)
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        for sock in sockets:
            sock.close()


def uvicorn_app() -> Any:
    """The V2App of the models named in ``$BINPROTO_SERVE_MODELS`` (uvicorn's
    app factory for ``binproto serve --uvicorn``: called in each worker)."""
    from binproto.adapters.asgi import V2App

    spec = os.environ.get(MODELS_ENV) or None
    budget = os.environ.get(MODELS_ENV + "_BUDGET")
    return V2App(
        load_models(spec),
        compress_responses=os.environ.get(MODELS_ENV + "_COMPRESS", "1") == "1",
        max_body_bytes_in_flight=int(budget) if budget else None,
    )
