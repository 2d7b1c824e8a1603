"""What the cases of ``binproto check`` are made of: models, plans, cases.

A :class:`Plan` is a request under construction for one model, built from
its metadata (:class:`ModelInfo`); a :class:`Case` turns a :class:`Context`
into a request, or says why it does not apply. The battery is in
:mod:`._cases`.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._datatypes import DATATYPES
from .._http import HEADER_LENGTH_NAME as HL
from .._raw import TensorSpec
from ._wire import Request

__all__ = [
    "BINARY_ONLY",
    "Builder",
    "Case",
    "Context",
    "ModelInfo",
    "Plan",
    "Verifier",
    "sample",
    "wire",
]

#: Datatypes with no JSON form: always sent binary.
BINARY_ONLY = ("FP16", "BF16")


@dataclass(frozen=True)
class ModelInfo:
    """A model as its metadata describes it. ``inputs`` empty: it declares
    none, and is taken to accept any (binproto's echo model)."""

    name: str
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[str, ...] = ()

    @property
    def free(self) -> bool:
        """True when the model declares no inputs."""
        return not self.inputs


@dataclass
class Context:
    """What ``check`` knows of the server before the cases run."""

    server: dict[str, Any] = field(default_factory=dict)
    models: list[ModelInfo] = field(default_factory=list)

    def pick(self, datatype: str) -> ModelInfo | None:
        """A model with an input of ``datatype`` (a declared one first)."""
        for m in self.models:
            if any(s.datatype == datatype for s in m.inputs):
                return m
        return next((m for m in self.models if m.free), None)

    def first(self) -> ModelInfo | None:
        """A model for cases that need any: FP32 if there is one."""
        return self.pick("FP32") or (self.models[0] if self.models else None)


def sample(datatype: str, shape: Sequence[int]) -> np.ndarray[Any, Any]:
    """Fixed values of ``datatype``: 1, 0, 2, ... (BOOL alternating, BYTES b"ab", b"")."""
    count = int(np.prod(shape, dtype=np.int64))
    if datatype == "BYTES":
        arr = np.empty(count, dtype=object)
        arr[:] = [b"ab" if i % 2 == 0 else b"" for i in range(count)]
        return arr.reshape(shape)
    if datatype == "BOOL":
        flags: np.ndarray[Any, Any] = np.arange(count) % 2 == 0
        return flags.reshape(shape)
    dtype = DATATYPES[datatype].dtype
    values = np.arange(1, count + 1) % 100
    if datatype == "BF16":
        bits = (np.arange(count, dtype=np.float32) + 1).view(np.uint32) >> 16
        return bits.astype("<u2").view(dtype).reshape(shape)
    return values.astype(dtype).reshape(shape)


def wire(datatype: str, arr: np.ndarray[Any, Any]) -> bytes:
    """A tensor's binary form."""
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(x)) + bytes(x) for x in arr.ravel())
    return np.ascontiguousarray(arr).tobytes()


@dataclass
class Plan:
    """A request under construction: its inputs, their bytes, its top-level keys.

    ``entries[0]`` is the subject: the input a case changes.
    """

    model: ModelInfo
    entries: list[dict[str, Any]]
    payloads: list[bytes]
    arrays: dict[str, np.ndarray[Any, Any]]
    top: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def make(
        cls, model: ModelInfo, datatype: str = "FP32", *, binary: bool = True, side: int = 2
    ) -> Plan:
        """Every declared input of ``model`` (the first of ``datatype`` as
        subject), or one input ``INPUT0`` of ``datatype`` for a model that
        declares none. Variable dimensions are ``side``."""
        specs = list(model.inputs) or [TensorSpec("INPUT0", datatype, [-1])]
        specs.sort(key=lambda s: s.datatype != datatype)
        plan = cls(model, [], [], {})
        for spec in specs:
            shape = [side if d < 0 else d for d in spec.shape]
            arr = sample(spec.datatype, shape)
            entry: dict[str, Any] = {"name": spec.name, "datatype": spec.datatype, "shape": shape}
            if binary or spec.datatype in BINARY_ONLY:
                data = wire(spec.datatype, arr)
                entry["parameters"] = {"binary_data_size": len(data)}
                plan.payloads.append(data)
            else:
                flat = (
                    [bytes(x).decode() for x in arr.ravel()] if spec.datatype == "BYTES" else None
                )
                entry["data"] = flat if flat is not None else arr.ravel().tolist()
                plan.payloads.append(b"")
            plan.entries.append(entry)
            plan.arrays[spec.name] = arr
        return plan

    @property
    def subject(self) -> dict[str, Any]:
        """The input the case changes."""
        return self.entries[0]

    def set_payload(self, data: bytes, size: int | str | None = None) -> None:
        """Replace the subject's bytes, and its binary_data_size: ``size`` (even
        of the wrong type) or their length."""
        self.payloads[0] = data
        self.subject.setdefault("parameters", {})["binary_data_size"] = (
            len(data) if size is None else size
        )

    def header(self) -> bytes:
        """The JSON header."""
        return json.dumps({"inputs": self.entries, **self.top}, separators=(",", ":")).encode()

    def body(self) -> tuple[bytes, int]:
        """The body and its JSON header's length."""
        js = self.header()
        return js + b"".join(self.payloads), len(js)

    def outputs(self) -> list[str]:
        """The output names to ask for: the model's first declared output,
        else (a model that declares none) the subject's name."""
        return [self.model.outputs[0]] if self.model.outputs else [self.subject["name"]]

    def path(self) -> str:
        """The model's infer path."""
        return f"/v2/models/{self.model.name}/infer"

    def request(self, *, hl_delta: int = 0, **kw: Any) -> Request:
        """A binary request of this plan (a header length off by ``hl_delta``)."""
        body, length = self.body()
        headers = [(HL, str(length + hl_delta)), ("Content-Type", "application/octet-stream")]
        return Request(self.path(), tuple(headers) + tuple(kw.pop("extra", ())), body, **kw)

    def json_request(self, body: bytes | None = None) -> Request:
        """A plain JSON request (no Inference-Header-Content-Length)."""
        return Request(
            self.path(),
            (("Content-Type", "application/json"),),
            self.header() if body is None else body,
        )


#: A case's builder: the request, or why the case does not apply.
Builder = Callable[[Context], "Request | str"]
#: An extra check of an accepted answer: what is wrong with it, or None.
Verifier = Callable[[Any, Request], "str | None"]


@dataclass(frozen=True)
class Case:
    """One case of the battery."""

    id: str
    family: str
    clause: str
    level: str  # "MUST" or "SHOULD"
    expect: str
    summary: str
    build: Builder = field(repr=False)
    verify: Verifier | None = field(default=None, repr=False)
