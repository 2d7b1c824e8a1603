"""The V2 application: models, routes, and the answers to each V2 endpoint.

Nothing here reads or writes a connection. binproto's HTTP/1.1 servers
(:class:`~binproto.adapters._server.V2Server`) and the ASGI app
(:class:`~binproto.adapters.asgi.V2App`) both answer through
:class:`V2Application`: the same models, output policy, error statuses and
wording (Triton's) on every way to serve.
"""

from __future__ import annotations

import functools
import urllib.parse
from collections.abc import AsyncIterable, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

import binproto
from binproto import (
    BodyClaims,
    BodyWriter,
    EncodedBody,
    InferenceHeader,
    Limits,
    LocalProtocolError,
    Tensor,
    TensorSpec,
)
from binproto._assemble import Destinations
from binproto._encode import json_output_elements
from binproto._parser import DEFAULT_LIMITS

from ._intake import (
    THREAD_JSON,
    BodyBudget,
    BodySource,
    InferenceError,
    MessageBody,
)

__all__ = [
    "DISCARD_LIMIT",
    "AsgiHead",
    "Handler",
    "HandlerResult",
    "InferRequest",
    "Model",
    "RequestHead",
    "Route",
    "StreamingResponse",
    "V2Application",
    "echo_model",
    "route",
]

#: Most body bytes read and dropped after an error, so the client sees the answer.
DISCARD_LIMIT = 256 * 1024 * 1024


class RequestHead(Protocol):
    """What a handler may read of a request's head (``h11.Request`` has it)."""

    @property
    def method(self) -> bytes:
        """The method, e.g. ``b"POST"``."""

    @property
    def target(self) -> bytes:
        """The request target: the path and query."""

    @property
    def headers(self) -> Sequence[tuple[bytes, bytes]]:
        """The header fields, names lower-cased."""


@dataclass(frozen=True, slots=True)
class AsgiHead:
    """A request head read from an ASGI scope (see :class:`RequestHead`)."""

    method: bytes
    target: bytes
    headers: Sequence[tuple[bytes, bytes]]
    #: The ASGI connection scope, for what the head does not say (client, root_path).
    scope: Mapping[str, Any]


@dataclass
class InferRequest:
    """An inference request as a handler sees it.

    ``body`` gives the request body's events on demand (``async for event in
    request.body``) or every tensor at once (``await request.tensors()``);
    ``header`` is the parsed JSON header (read before the handler is called).
    """

    model: Model
    version: str | None
    #: The request's head: its method, target and headers (an
    #: ``h11.Request`` under binproto's servers, whose requests with the same
    #: head may share one; an :class:`AsgiHead` under :class:`~binproto.adapters.asgi.V2App`).
    http: RequestHead
    header: InferenceHeader
    body: MessageBody

    async def tensors(self, destinations: Destinations = None) -> dict[str, np.ndarray[Any, Any]]:
        """Every input as a numpy array (see :meth:`MessageBody.tensors`)."""
        return await self.body.tensors(destinations)


@dataclass
class StreamingResponse:
    """A response whose tensor bytes a handler produces as it goes.

    ``writer`` is a :class:`binproto.BodyWriter` for the response header;
    ``chunks`` yields ``(tensor index, buffer)`` pairs in body order.
    """

    writer: BodyWriter
    chunks: AsyncIterable[tuple[int, Any]]


#: What a handler returns: outputs by name (encoded with the request's output
#: policy), an already encoded body, or a streaming response.
HandlerResult = Mapping[str, Any] | Sequence[Tensor] | EncodedBody | StreamingResponse
Handler = Callable[[InferRequest], Awaitable[HandlerResult]]


@dataclass
class Model:
    """A model the server serves: its name, versions, metadata and handler.

    The handler gets an :class:`InferRequest` and returns a mapping of output
    names to arrays (or lists, or :class:`binproto.Tensor`), an encoded body,
    or a :class:`StreamingResponse`; it may raise :class:`InferenceError`.
    """

    name: str
    handler: Handler
    versions: Sequence[str] = ("1",)  # (a str is one version, not its characters)
    inputs: Sequence[Mapping[str, Any]] = ()
    outputs: Sequence[Mapping[str, Any]] = ()
    platform: str = "binproto"

    def raw_input(self) -> TensorSpec | None:
        """What a raw binary request's body stands for: the model's one
        declared input (its ``name``, ``datatype`` and ``shape``, ``-1`` for a
        variable dimension); None when it declares none or several."""
        if len(self.inputs) != 1:
            return None
        (spec,) = self.inputs
        try:
            return TensorSpec(spec["name"], spec["datatype"], spec["shape"])
        except KeyError as exc:
            raise LocalProtocolError(f"model '{self.name}' input metadata has no {exc}") from None

    def __post_init__(self) -> None:
        if isinstance(self.versions, str):
            raise LocalProtocolError(
                f"Model versions are a sequence of strings, got the string {self.versions!r}"
            )
        self.versions = tuple(self.versions)

    def metadata(self) -> dict[str, Any]:
        """The model metadata object (``GET /v2/models/{name}``)."""
        return {
            "name": self.name,
            "versions": list(self.versions),
            "platform": self.platform,
            "inputs": [dict(t) for t in self.inputs],
            "outputs": [dict(t) for t in self.outputs],
        }


async def _echo(request: InferRequest) -> Mapping[str, Any]:
    tensors = await request.tensors()
    header = request.header
    wanted = header.requested_outputs
    names = [o.name for o in wanted] if wanted is not None else list(tensors)
    outputs: dict[str, Any] = {}
    for name in names:
        if name not in tensors:
            raise InferenceError(
                f"unexpected inference output '{name}' for model '{request.model.name}'"
            )
        info = header.tensor(name)
        outputs[name] = binproto.Tensor(name, tensors[name], datatype=info.datatype)
    return outputs


def _encode_response(
    result: Any, model_name: str, version: str | None, header: InferenceHeader, most: int
) -> EncodedBody:
    """A handler's outputs, encoded as the answer to ``header``."""
    return binproto.encode_response(
        result,
        model_name=model_name,
        model_version=version,
        id=header.id,
        request=header,
        max_json_elements=most,
    )


def _unknown_outputs(header: InferenceHeader, result: Any) -> list[str]:
    """The outputs the request asks for that ``result`` (outputs by name, or a
    sequence of :class:`binproto.Tensor`) does not hold."""
    wanted = header.requested_outputs
    if wanted is None:
        return []
    if isinstance(result, Mapping):
        given = set(result)
    elif isinstance(result, Sequence) and all(isinstance(t, Tensor) for t in result):
        given = {t.name for t in result}
    else:
        return []  # (the encoder says what is wrong with it)
    return [o.name for o in wanted if o.name not in given]


def echo_model(name: str = "echo") -> Model:
    """The built-in model: each input comes back as the output of the same name."""
    return Model(name=name, handler=_echo)


@dataclass(frozen=True, slots=True)
class Route:
    """Where a request goes: ``kind`` and, for model routes, the model and version."""

    kind: str  # "server", "live", "ready", "model", "model_ready", "infer", "not_found"
    model: str | None = None
    version: str | None = None
    method: str = "GET"  #: the method the route accepts


#: The ``Allow`` header of a route's 405, by the method the route accepts.
_ALLOWED = {"GET": "GET, HEAD", "POST": "POST"}


def route(method: str, target: str) -> Route:
    """Route a request target (a path with an optional query) to an endpoint."""
    try:
        path = urllib.parse.urlsplit(target).path
    except ValueError:  # e.g. "//[": not a target any endpoint has
        return Route("not_found")
    parts = [urllib.parse.unquote(p) for p in path.strip("/").split("/")]
    if parts == ["v2"]:
        return Route("server")
    if parts == ["v2", "health", "live"]:
        return Route("live")
    if parts == ["v2", "health", "ready"]:
        return Route("ready")
    if len(parts) >= 3 and parts[:2] == ["v2", "models"] and parts[2]:
        name = parts[2]
        rest = parts[3:]
        version = None
        if len(rest) >= 2 and rest[0] == "versions" and rest[1]:
            version = rest[1]
            rest = rest[2:]
        if not rest:
            return Route("model", name, version)
        if rest == ["ready"]:
            return Route("model_ready", name, version)
        if rest == ["infer"]:
            return Route("infer", name, version, method="POST")
    return Route("not_found")


#: Targets up to this long have their routes remembered (see _route_of).
_REMEMBERED_TARGET = 256


@functools.lru_cache(maxsize=256)
def _remembered_route(target: str) -> Route:
    return route("", target)


def _route_of(target: str) -> Route:
    """``route(target)``; a server sees the same few targets again and again,
    so the routes of the last 256 short ones are kept (a few dozen KiB at most)."""
    if len(target) <= _REMEMBERED_TARGET:
        return _remembered_route(target)
    return route("", target)


class V2Application:
    """The models a server serves, and its answer to each V2 route.

    The HTTP layer routes a request (:func:`route`), checks its method, and
    calls :meth:`get` for the GET routes or :meth:`infer` for inference. An
    :class:`InferenceError` raised by either is the answer to send (its
    status and Triton's wording).

    Args:
        models: the models to serve.
        name: the server's name in its metadata.
        limits: the limits for request bodies (None: binproto's defaults).
    """

    def __init__(
        self, models: Sequence[Model], *, name: str = "binproto", limits: Limits | None = None
    ) -> None:
        self.name = name
        self.limits = limits
        self._models = {m.name: m for m in models}

    def add_model(self, model: Model) -> None:
        """Serve one more model (replacing one of the same name)."""
        self._models[model.name] = model

    @property
    def models(self) -> Mapping[str, Model]:
        """The models served, by name."""
        return self._models

    def metadata(self) -> dict[str, Any]:
        """The server metadata object (``GET /v2``)."""
        return {
            "name": self.name,
            "version": binproto.__version__,
            "extensions": ["binary_tensor_data"],
        }

    def get(self, r: Route) -> dict[str, Any]:
        """The JSON object a GET route answers (not ``not_found`` nor ``infer``)."""
        if r.kind == "server":
            return self.metadata()
        if r.kind in ("live", "ready"):
            return {r.kind: True}  # (KServe's clients read the field)
        model = self.model(r)
        if r.kind == "model_ready":
            return {"name": model.name, "ready": True}
        return model.metadata()

    def model(self, r: Route) -> Model:
        """The model (and version) ``r`` names, or a 404 with Triton's wording."""
        assert r.model is not None
        model = self._models.get(r.model)
        if model is None:
            raise InferenceError(f"Request for unknown model: '{r.model}' is not found", 404)
        if r.version is not None and r.version not in model.versions:
            raise InferenceError(
                f"Request for unknown model: '{r.model}' version {r.version} is not found", 404
            )
        return model

    async def infer(
        self,
        http: RequestHead,
        claims: BodyClaims,
        r: Route,
        reader: BodySource,
        budget: BodyBudget | None = None,
    ) -> tuple[MessageBody, Any]:
        """Answer an inference request: its body (read from ``reader``) and
        the handler's result, encoded (an :class:`~binproto.EncodedBody`) or
        a :class:`StreamingResponse`. The body is read to its end before
        this returns, unless the handler streams its answer.

        ``claims`` are what the head says of the body
        (:func:`binproto.body_claims`); ``budget`` is the process's
        :class:`BodyBudget`, or None. Raises :class:`InferenceError` or
        :class:`binproto.ProtocolError` for the error response to send.
        """
        model = self.model(r)
        raw_input = None
        if claims.header_length == 0:  # a raw binary request: the body is the one input
            raw_input = model.raw_input()
            if raw_input is None:
                raise InferenceError(
                    "a raw binary request is the bytes of a model's one input: model"
                    f" '{model.name}' declares {len(model.inputs)} inputs"
                )
            claims.check_raw_length(raw_input)
        if budget is not None:  # (a known model: a request for none takes no memory)
            reader.budget = budget
            # Its Content-Length, or the JSON header a compressed body inflates
            # to before it is parsed, when that is more.
            if reader.remaining is not None:
                budget.claim(reader, max(reader.remaining, claims.header_length or 0))
        body = MessageBody("request", claims, reader, limits=self.limits, raw_input=raw_input)
        header = await body.read_header()
        if budget is not None:  # what the header announces, before those bytes are read
            budget.claim(reader, header.header_length + header.binary_size)
        shared = [t.name for t in header.tensors if t.shared_memory]
        if shared:
            raise InferenceError(f"shared memory is not supported here (inputs {shared})")
        classified = [
            o.name
            for o in header.requested_outputs or ()
            if "classification" in (o.parameters or {})
        ]
        if classified:  # (an extension this server does not list: not the tensor in its place)
            raise InferenceError(f"classification is not supported here (outputs {classified})")
        request = InferRequest(model, r.version, http, header, body)
        try:
            result = await model.handler(request)
        except Exception:
            remaining = reader.remaining
            if (
                not body.complete
                and not body.failed
                and reader.failed is None
                and remaining is not None
                and remaining <= DISCARD_LIMIT
            ):
                # A fault in the body comes first, whatever the handler said;
                # but a body too big to read for it (a claim the server could
                # not allocate, say) is refused with the handler's answer now,
                # and one that stalled (the reader's fault) is not waited for again.
                await body.drain()
            raise
        if not body.complete:
            await body.drain()
        if isinstance(result, (StreamingResponse, EncodedBody)):
            return body, result
        return body, await self.encode(request, result, to_thread=reader.to_thread)

    async def encode(
        self,
        request: InferRequest,
        result: Any,
        *,
        to_thread: Callable[..., Awaitable[Any]] | None = None,
    ) -> EncodedBody:
        """A handler's outputs encoded with the request's output policy. An
        output the request asks for that the model did not give is the
        client's fault: a 400 with Triton's wording. A big JSON answer is
        encoded in ``to_thread``, when given."""
        header = request.header
        model = request.model
        unknown = _unknown_outputs(header, result)
        if unknown:  # the client asked for what the model does not give: its fault (400)
            raise InferenceError(
                f"unexpected inference output '{unknown[0]}' for model '{model.name}'"
            )
        version = request.version
        if version is None and model.versions:
            version = model.versions[0]
        limits = self.limits if self.limits is not None else DEFAULT_LIMITS
        most = limits.max_json_output_elements
        if to_thread is not None and (
            request.body.header_in_thread or json_output_elements(result, header) >= THREAD_JSON
        ):
            # JSON text is written a slice at a time, each slice a pass in C:
            # in a thread, the event loop runs between slices.
            encode = functools.partial(_encode_response, result, model.name, version, header, most)
            body: EncodedBody = await to_thread(encode)
            return body
        return _encode_response(result, model.name, version, header, most)
