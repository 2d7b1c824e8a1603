"""Server and model metadata as parsed objects, and the check of a request's
inputs against a model's metadata (no I/O: the clients fetch the metadata)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from binproto import EncodedBody, LocalProtocolError, RemoteProtocolError

__all__ = ["ModelMetadata", "ServerMetadata", "TensorMetadata", "check_body"]


def _fail(what: str, data: bytes) -> RemoteProtocolError:
    return RemoteProtocolError(f"the {what} is not a V2 metadata object: {data[:200]!r}")


def _object(data: bytes, what: str) -> dict[str, Any]:
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        raise _fail(what, data) from None
    if not isinstance(obj, dict):
        raise _fail(what, data)
    return obj


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


@dataclass(frozen=True)
class TensorMetadata:
    """One input or output a model declares: ``-1`` in ``shape`` is any size."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    @classmethod
    def parse(cls, obj: Any) -> TensorMetadata:
        """A tensor metadata object; RemoteProtocolError when it is not one."""
        if not isinstance(obj, dict):
            raise RemoteProtocolError(f"tensor metadata must be an object, got {obj!r:.200}")
        name, datatype, shape = obj.get("name"), obj.get("datatype"), obj.get("shape")
        if (
            not isinstance(name, str)
            or not isinstance(datatype, str)
            or not isinstance(shape, list)
            or not all(type(d) is int and d >= -1 for d in shape)
        ):
            raise RemoteProtocolError(f"bad tensor metadata {obj!r:.200}")
        return cls(name, datatype, tuple(shape))

    def accepts(self, shape: list[int]) -> bool:
        """Whether a tensor of ``shape`` fits this declaration."""
        return len(shape) == len(self.shape) and all(
            d == -1 or d == s for d, s in zip(self.shape, shape, strict=True)
        )


@dataclass(frozen=True)
class ModelMetadata:
    """A model's metadata (``GET /v2/models/{name}``)."""

    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorMetadata, ...]
    outputs: tuple[TensorMetadata, ...]

    @classmethod
    def parse(cls, data: bytes) -> ModelMetadata:
        """The metadata in a response body; RemoteProtocolError when it is not."""
        obj = _object(data, "model metadata")
        name, platform = obj.get("name"), obj.get("platform", "")
        versions = obj.get("versions", [])
        inputs, outputs = obj.get("inputs", []), obj.get("outputs", [])
        if not isinstance(name, str) or not isinstance(platform, str) or not _strings(versions):
            raise _fail("model metadata", data)
        if not isinstance(inputs, list) or not isinstance(outputs, list):
            raise _fail("model metadata", data)
        return cls(
            name,
            tuple(versions),
            platform,
            tuple(map(TensorMetadata.parse, inputs)),
            tuple(map(TensorMetadata.parse, outputs)),
        )


@dataclass(frozen=True)
class ServerMetadata:
    """A server's metadata (``GET /v2``)."""

    name: str
    version: str
    extensions: tuple[str, ...]

    @classmethod
    def parse(cls, data: bytes) -> ServerMetadata:
        """The metadata in a response body; RemoteProtocolError when it is not."""
        obj = _object(data, "server metadata")
        name, version = obj.get("name"), obj.get("version", "")
        extensions = obj.get("extensions", [])
        if not isinstance(name, str) or not isinstance(version, str) or not _strings(extensions):
            raise _fail("server metadata", data)
        return cls(name, version, tuple(extensions))


def check_body(model: ModelMetadata, body: EncodedBody) -> None:
    """Raise :class:`binproto.LocalProtocolError` when an encoded request's
    inputs do not fit ``model``'s metadata: an input it does not declare, a
    datatype other than the declared one, or a shape the declared one (``-1``
    for any size) does not allow. Inputs the request leaves out are not
    reported (metadata does not say which are optional), nor is anything
    when the model declares no inputs."""
    declared = {t.name: t for t in model.inputs}
    if not declared:
        return
    header = json.loads(body.json)
    problems = []
    for tensor in header.get("inputs", []):
        name, datatype, shape = tensor["name"], tensor["datatype"], tensor["shape"]
        spec = declared.get(name)
        if spec is None:
            problems.append(f"input '{name}' is not one of {sorted(declared)}")
            continue
        if datatype != spec.datatype:
            problems.append(f"input '{name}' is {datatype}, the model takes {spec.datatype}")
        if not spec.accepts(shape):
            problems.append(f"input '{name}' has shape {shape}, the model takes {list(spec.shape)}")
    if problems:
        raise LocalProtocolError(f"model '{model.name}': " + "; ".join(problems))
