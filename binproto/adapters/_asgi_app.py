"""V2App: the V2 application as a complete ASGI app.

The same :class:`~binproto.adapters.server.Model` objects that
:class:`~binproto.adapters._server.V2Server` serves, served by any ASGI
server (uvicorn, gunicorn with uvicorn workers) or mounted in
Starlette or FastAPI. Answers come from
:class:`~binproto.adapters._app.V2Application`: the statuses and bodies are
those of binproto's own servers.
"""

from __future__ import annotations

import json
import logging
import urllib.parse
from collections.abc import Sequence
from typing import Any

import binproto
from binproto import (
    EncodedBody,
    Limits,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    body_claims,
)
from binproto._http import HeaderFields

from ._app import (
    _ALLOWED,
    DISCARD_LIMIT,
    AsgiHead,
    Model,
    StreamingResponse,
    V2Application,
    _route_of,
    echo_model,
)
from ._asgi_reader import AsgiBodyReader, ClientDisconnected
from ._intake import WHOLE_BODY, BodyBudget, InferenceError, drains_for_answer
from ._streams import seconds_or_none
from .asgi import (
    CHUNK_SIZE,
    Message,
    Receive,
    Scope,
    Send,
    WriterResponse,
    _encoded_headers,
    _encoded_pieces,
    _request_fields,
    _scope_fields,
    _send_pieces,
    error_response,
)

__all__ = ["V2App"]

log = logging.getLogger("binproto.asgi")


def _target(scope: Scope) -> str:
    """The request target below where the app is mounted: a path that
    :func:`~binproto.adapters._app.route` reads as binproto's servers do."""
    root = scope.get("root_path", "") or ""
    raw = scope.get("raw_path")
    if not root and isinstance(raw, bytes):
        return raw.decode("latin-1")
    path: str = scope.get("path", "")
    if root and path.startswith(root):  # (Starlette >= 0.33 keeps the prefix in path)
        path = path[len(root) :]
    return urllib.parse.quote(path)


class V2App:
    """binproto's V2 server as an ASGI application.

    Serves ``GET /v2``, ``/v2/health/live`` and ``/ready``, model metadata
    and readiness, and ``POST /v2/models/{name}[/versions/{v}]/infer`` for
    the same :class:`~binproto.adapters.server.Model` objects as
    :class:`~binproto.adapters._server.V2Server`, with the same statuses and
    error bodies. Run it under uvicorn (``uvicorn module:app``), under
    gunicorn with uvicorn workers, or mount it in Starlette or FastAPI
    (``app.mount("/", V2App(models))``).

    Handlers get an :class:`~binproto.adapters.server.InferRequest`:
    ``await request.tensors()`` or ``async for event in request.body``, read
    as the body arrives. Responses are sent as views of the outputs' memory
    (see :class:`~binproto.adapters.asgi.EncodedResponse`), compressed when
    the client accepts it, as ``V2Server`` does.

    Timeouts: the ASGI server's (uvicorn: keep-alive), and ``body_timeout``
    (asyncio servers only, uvicorn among them). A body
    that ends early, or a client that leaves, ends the request without an
    answer.

    Args:
        models: the models to serve (default: the built-in ``echo`` model).
        limits: limits for request bodies.
        name: the server's name in ``GET /v2``.
        compress_responses: compress inference responses when the client
            accepts it; False never compresses.
        compression_level: zlib's level for them (0 to 9).
        max_body_bytes_in_flight: the request body bytes this app's requests
            may hold at once (a :class:`~binproto.adapters.server.BodyBudget`),
            or None for no bound. Each process has its own app, so each
            worker of a multi-process server its own budget.
        body_timeout: the longest wait for more of a request body, in
            seconds (inactivity, not a deadline: a slow body that keeps
            moving is read), as ``V2Server``'s ``Timeouts.body``. Past it the
            request is answered 408 and the connection closed. None: no
            bound. Checked every second (or a quarter of it, when less).
        views: send response bodies as views of the outputs' memory (no
            copy; uvicorn takes them). False sends ``bytes``,
            as the ASGI spec says, for servers that pass messages between
            processes (Ray Serve pickles them): each body is then copied.
    """

    def __init__(
        self,
        models: Sequence[Model] | None = None,
        *,
        limits: Limits | None = None,
        name: str = "binproto",
        compress_responses: bool = True,
        compression_level: int = 1,
        max_body_bytes_in_flight: int | None = None,
        views: bool = True,
        body_timeout: float | None = 30.0,
    ) -> None:
        if models is None:
            models = [echo_model()]
        level = compression_level
        if type(level) is not int or not 0 <= level <= 9:
            raise LocalProtocolError(f"compression_level must be 0..9, got {level!r}")
        #: The V2 application answering (models, routes, statuses).
        self.app = V2Application(models, name=name, limits=limits)
        self.compress_responses = compress_responses
        self.compression_level = level
        most = max_body_bytes_in_flight
        self._budget = BodyBudget(most) if most is not None else None
        self.views = views
        #: The longest wait for more of a request body (seconds), or None.
        self.body_timeout = seconds_or_none(body_timeout, "body_timeout")

    @property
    def body_bytes_in_flight(self) -> int:
        """The body bytes the requests in flight hold of the budget (0 without one)."""
        return self._budget.held if self._budget is not None else 0

    def add_model(self, model: Model) -> None:
        """Serve one more model."""
        self.app.add_model(model)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer one ASGI connection scope (``http``; ``lifespan`` is acknowledged)."""
        kind = scope["type"]
        if kind == "lifespan":
            await _lifespan(receive, send)
            return
        if kind != "http":
            raise LocalProtocolError(f"V2App serves HTTP, not {kind!r}")
        if not self.views:
            send = _bytes_bodies(send)
        target = _target(scope)
        r = _route_of(target)
        method: str = scope["method"]
        try:
            fields = _request_fields(scope)  # (HTTP/1.0 with Transfer-Encoding: 400)
            if "transfer-encoding" in fields and fields.get("content-length") is not None:
                # Two framings (uvicorn's h11 server takes the chunks): a proxy in
                # front may have meant the other and smuggled a request into the body.
                await _error(scope, receive, send, _BOTH_LENGTHS, close=True)
                return
            if (
                r.kind != "not_found"
                and method != r.method
                and (method, r.method) != ("HEAD", "GET")
            ):
                raise InferenceError(f"method {method} not allowed", 405, allow=_ALLOWED[r.method])
            if r.kind == "not_found":
                await error_response("Not Found", 404)(scope, receive, send)
            elif r.kind == "infer":
                await self._infer(scope, receive, send, r, target, fields)
            else:
                await _json(send, self.app.get(r))
        except (ProtocolError, InferenceError) as exc:  # (a header repeated unlike itself, say)
            await _error(scope, receive, send, exc)

    async def _infer(
        self, scope: Scope, receive: Receive, send: Send, r: Any, target: str, fields: HeaderFields
    ) -> None:
        headers = scope.get("headers", ())
        head = AsgiHead(scope["method"].encode(), target.encode("latin-1"), headers, scope)
        reader: AsgiBodyReader | None = None
        try:
            claims = body_claims(fields)
            reader = AsgiBodyReader(receive, claims.content_length, self.body_timeout)
            length = claims.content_length
            if (
                length is not None
                and length <= WHOLE_BODY
                and claims.content_encoding is None
                and "expect" not in fields  # (a receive would invite the body)
            ):
                await reader.prime()
            _, result = await self.app.infer(head, claims, r, reader, self._budget)
            if isinstance(result, StreamingResponse):
                await _stream(scope, receive, send, result, target)
                return
            assert isinstance(result, EncodedBody)
            coding = self._encoding(headers) if "accept-encoding" in fields else None
            # What EncodedResponse sends, without making one for each request.
            pieces = _encoded_pieces(
                result.buffers, result.content_length, coding, self.compression_level, CHUNK_SIZE
            )
            await _send_pieces(send, pieces, 200, _encoded_headers(result, coding))
        except ClientDisconnected:
            return  # nobody to answer (logged by the reader)
        except (ProtocolError, InferenceError) as exc:
            if isinstance(exc, LocalProtocolError):  # a handler's misuse: the server's fault
                log.error("error while serving %s", target, exc_info=exc)
            await _error(scope, receive, send, exc, reader)
        except Exception as exc:  # a handler failed: the server's fault
            log.error("error while serving %s", target, exc_info=exc)
            await _error(
                scope, receive, send, InferenceError(f"internal error: {exc}", 500), reader
            )
        finally:
            if reader is not None and reader.budget is not None:
                reader.budget.release(reader)

    def _encoding(self, headers: Any) -> str | None:
        if not self.compress_responses:
            return None
        values = [v.decode("latin-1") for k, v in headers if k.lower() == b"accept-encoding"]
        return binproto.preferred_encoding(", ".join(values)) if values else None


async def _stream(
    scope: Scope, receive: Receive, send: Send, response: StreamingResponse, target: str
) -> None:
    """Send a handler's streamed answer. A fault before it starts (a writer
    that cannot start) is answered 500; one after it has begun ends it short
    (the server closes the connection): the client sees an incomplete body,
    never a wrong one."""
    started = False

    async def tracking(message: Message) -> None:
        nonlocal started
        started = True
        await send(message)

    try:
        await WriterResponse(response.writer, response.chunks)(scope, receive, tracking)
    except Exception as exc:
        if not started:
            raise
        log.error("error while streaming the answer to %s", target, exc_info=exc)


def _bytes_bodies(send: Send) -> Send:
    """``send`` with each body message's body as ``bytes`` (a copy of a view)."""

    async def send_bytes(message: Message) -> None:
        body = message.get("body")
        if body is not None and type(body) is not bytes:
            message = {**message, "body": bytes(body)}
        await send(message)

    return send_bytes


async def _json(send: Send, obj: Any) -> None:
    payload = json.dumps(obj).encode()  # (as binproto's servers write it)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload, "more_body": False})


#: The refusal of a request with both Content-Length and Transfer-Encoding (as V2Server's).
_BOTH_LENGTHS = RemoteProtocolError(
    "a request may not carry both Content-Length and Transfer-Encoding"
)


async def _error(
    scope: Scope,
    receive: Receive,
    send: Send,
    exc: ProtocolError | InferenceError,
    reader: AsgiBodyReader | None = None,
    *,
    close: bool = False,
) -> None:
    """Send a V2 error response; first read what the client still sends of
    its body (within bounds), so that it sees the answer. ``close`` asks the
    server to close the connection after it."""
    if reader is not None:
        if reader.budget is not None:  # a failed request holds no body
            reader.budget.release(reader)
            reader.budget = None
        expects = "expect" in _scope_fields(scope)
        remaining = reader.remaining
        if not drains_for_answer(exc, remaining) or reader.failed is not None:
            close = True  # (a body that stalled, or whose client left, is not read again)
        elif not (expects and not reader._received):
            if remaining is None or remaining <= DISCARD_LIMIT:
                # A body left unread (too long, or stalled) is not waited for again.
                if not await reader.discard():
                    close = True
    if isinstance(exc, InferenceError):
        response = error_response(exc.message, exc.status)
        if exc.allow is not None:
            response.raw_headers.append((b"allow", exc.allow.encode()))
    else:
        response = error_response(exc)
    if close:
        response.raw_headers.append((b"connection", b"close"))
    await response(scope, receive, send)


async def _lifespan(receive: Receive, send: Send) -> None:
    """Acknowledge the ASGI lifespan protocol's startup and shutdown."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
