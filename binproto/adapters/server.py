"""binproto's V2 server and application: the names users import.

Write models here once; serve them with :class:`V2Server` (binproto's
HTTP/1.1 servers: :mod:`binproto.adapters.asyncio`, :mod:`binproto.adapters.trio`)
or with :class:`binproto.adapters.asgi.V2App` (any ASGI server)::

    from binproto.adapters.server import InferRequest, Model

    async def double(request: InferRequest):
        tensors = await request.tensors()
        return {"y": tensors["x"] * 2}

    models = [Model("double", double)]

:class:`V2Server` needs h11 (``binproto[h11]``); the other names do not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._app import (
    AsgiHead,
    Handler,
    HandlerResult,
    InferRequest,
    Model,
    RequestHead,
    Route,
    StreamingResponse,
    V2Application,
    echo_model,
    route,
)
from ._intake import BodyBudget, BodySource, InferenceError, MessageBody

if TYPE_CHECKING:
    from ._server import Timeouts, V2Server

__all__ = [
    "AsgiHead",
    "BodyBudget",
    "BodySource",
    "Handler",
    "HandlerResult",
    "InferRequest",
    "InferenceError",
    "MessageBody",
    "Model",
    "RequestHead",
    "Route",
    "StreamingResponse",
    "Timeouts",
    "V2Application",
    "V2Server",
    "echo_model",
    "route",
]


def __getattr__(name: str) -> Any:
    # The HTTP/1.1 server needs h11: imported only when asked for.
    if name in ("V2Server", "Timeouts"):
        from . import _server

        return getattr(_server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
