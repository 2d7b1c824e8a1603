"""Models for the ``binproto serve MODULE:ATTR`` tests: each answers with
the id of the process that served it."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from binproto.adapters.server import InferRequest, Model, echo_model


async def _pid(request: InferRequest) -> dict[str, Any]:
    await request.tensors()
    return {"pid": np.array([os.getpid()], dtype=np.int64)}


MODELS = [Model("pid", _pid), echo_model()]


def make_models() -> list[Model]:
    """A factory: called in each process."""
    return [Model("pid", _pid)]


NOT_MODELS = 42


def noting_models() -> list[Model]:
    """A factory that appends the id of each process calling it to the file
    ``$BINPROTO_TEST_CALLS`` names."""
    with open(os.environ["BINPROTO_TEST_CALLS"], "a") as f:
        f.write(f"{os.getpid()}\n")
    return [Model("pid", _pid)]


def v2app() -> Any:
    """:data:`MODELS` as an ASGI app (``V2App``), for gunicorn and uvicorn."""
    from binproto.adapters.asgi import V2App

    return V2App(MODELS)


#: The same, built at import (what ``gunicorn tests.cli_models:app`` serves).
app = v2app()


def failing_models() -> list[Model]:
    """A factory that fails in every worker: each one exits as it starts."""
    raise RuntimeError("these models cannot be made")
