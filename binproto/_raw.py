"""Raw binary requests (Inference-Header-Content-Length: 0).

The body is the bytes of the model's single input, and nothing else: its
name, datatype and shape come from the model, described by a
:class:`TensorSpec`. The parser synthesizes the header such a request stands
for, with ``binary_data_output`` set, since every output of a raw request is
returned binary.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ._datatypes import DATATYPES
from ._errors import LocalProtocolError, RemoteProtocolError
from ._header import MAX_ARRAY_BYTES, MAX_DIMS, InferenceHeader, TensorInfo
from ._limits import Limits

__all__ = ["TensorSpec", "raw_header"]

_U32 = 2**32


class TensorSpec:
    """A model input as the model's metadata describes it.

    Args:
        name: the input's name.
        datatype: its datatype (``"FP32"``, ``"BYTES"``, ...).
        shape: its shape, ``-1`` for a variable dimension (any sequence of ints).
        batched: True when the model batches: the leading dimension is the
            batch, which a raw request fixes to 1.

    Used by ``Parser(..., header_length=0, raw_input=spec)``: at most one
    dimension other than the batch may be variable; it is deduced from the
    body's length. A BYTES input must have shape ``[1]`` (batch aside): the
    body is the one element, without a length prefix. Immutable and hashable.
    """

    __slots__ = ("batched", "datatype", "name", "shape")

    name: str
    datatype: str
    shape: tuple[int, ...]
    batched: bool

    def __init__(
        self, name: str, datatype: str, shape: Sequence[int], batched: bool = False
    ) -> None:
        if not isinstance(name, str):
            raise LocalProtocolError(f"TensorSpec name must be a str, got {name!r}")
        if not isinstance(datatype, str) or datatype not in DATATYPES:
            raise LocalProtocolError(f"TensorSpec: unknown datatype {datatype!r}")
        try:
            dims = tuple(shape)
            valid = all(type(d) is int and d >= -1 for d in dims)
        except TypeError:  # not a sequence
            dims, valid = (), False
        if not valid:
            raise LocalProtocolError(f"TensorSpec shape must hold integers >= -1, got {shape!r}")
        # What numpy cannot make an array of, whatever the body's length.
        if len(dims) > MAX_DIMS:
            raise LocalProtocolError(
                f"TensorSpec shape has {len(dims)} dimensions, more than the {MAX_DIMS} supported"
            )
        if batched and not dims:
            raise LocalProtocolError("a batched TensorSpec needs a leading batch dimension")
        itemsize = DATATYPES[datatype].dtype.itemsize  # (BYTES: an object pointer)
        fixed = dims[1:] if batched else dims  # (a raw request's batch is 1)
        if math.prod(d for d in fixed if d > 0) * itemsize > MAX_ARRAY_BYTES:
            raise LocalProtocolError(f"TensorSpec shape {list(dims)} is too large for an array")
        for attr, value in (
            ("name", name),
            ("datatype", datatype),
            ("shape", dims),
            ("batched", bool(batched)),
        ):
            object.__setattr__(self, attr, value)

    def __setattr__(self, attr: str, value: object) -> None:
        raise AttributeError("TensorSpec is immutable")

    def _key(self) -> tuple[str, str, tuple[int, ...], bool]:
        return (self.name, self.datatype, self.shape, self.batched)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TensorSpec) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (
            f"TensorSpec({self.name!r}, {self.datatype!r}, {list(self.shape)!r},"
            f" batched={self.batched})"
        )

    @property
    def request_shape(self) -> tuple[int, ...]:
        """The shape with the batch dimension fixed to 1."""
        return (1, *self.shape[1:]) if self.batched else self.shape

    def _problem(self) -> str | None:
        """Why a raw request cannot describe this input (Triton's words), or None."""
        shape = self.request_shape
        if self.datatype == "BYTES":
            rest = shape[1:] if self.batched else shape
            if rest != (1,):
                return "For BYTE datatype raw input, the model must have input shape [1]"
        elif shape.count(-1) > 1:
            return (
                f"The shape of the raw input '{self.name}' can not be deduced because"
                " there are more than one variable-sized dimension"
            )
        return None

    @property
    def needs_length(self) -> bool:
        """True when the body's length decides the tensor's shape or size."""
        if self._problem() is not None:
            return False
        return self.datatype == "BYTES" or -1 in self.request_shape


def raw_header(
    spec: TensorSpec, body_length: int | None, limits: Limits
) -> tuple[InferenceHeader, bytes]:
    """The header a raw request body of ``body_length`` bytes stands for.

    Returns the header and the bytes to emit before the body's (a BYTES
    element's 4-byte length prefix, else ``b""``). ``body_length`` may be None
    only when the shape is fixed. Raises :class:`RemoteProtocolError` when the
    input cannot be sent raw or the body's length does not fit it.
    """
    problem = spec._problem()
    if problem is not None:
        raise RemoteProtocolError(problem, offset=0)
    dt = DATATYPES[spec.datatype]
    shape = spec.request_shape
    prefix = b""
    if dt.itemsize is None:  # BYTES: the body is the one element
        assert body_length is not None
        if body_length >= _U32:
            raise RemoteProtocolError(
                f"raw BYTES input '{spec.name}' of {body_length} bytes does not fit a"
                " 4-byte length prefix",
                status_hint=413,
                offset=0,
            )
        prefix = body_length.to_bytes(4, "little")
        size = body_length + 4
    else:
        fixed = math.prod(d for d in shape if d != -1) * dt.itemsize
        if -1 in shape:
            assert body_length is not None
            if fixed == 0:
                raise RemoteProtocolError(
                    f"The shape of the raw input '{spec.name}' can not be deduced because"
                    " its other dimensions hold no elements",
                    offset=0,
                )
            if body_length % fixed:
                raise RemoteProtocolError(
                    f"unexpected total byte size {body_length} for raw input"
                    f" '{spec.name}': expecting a multiple of {fixed}"
                    f" ({spec.datatype}, shape {list(shape)})",
                    offset=0,
                )
            shape = tuple(body_length // fixed if d == -1 else d for d in shape)
        size = fixed if body_length is None or -1 not in spec.request_shape else body_length
        if body_length is not None and body_length != size:
            raise RemoteProtocolError(
                f"input byte size mismatch for input '{spec.name}'. Expected {size},"
                f" got {body_length}",
                offset=0,
            )
    if size > limits.max_tensor_bytes:
        raise RemoteProtocolError(
            f"raw input '{spec.name}' of {size} bytes exceeds the limit of"
            f" {limits.max_tensor_bytes} bytes",
            status_hint=413,
            offset=0,
        )
    params: dict[str, Any] = {"binary_data_size": size}
    info = TensorInfo(
        index=0,
        name=spec.name,
        datatype=spec.datatype,
        shape=shape,
        parameters=params,
        binary_size=size,
        data=None,
        nbytes=size,
    )
    request_params = {"binary_data_output": True}
    raw = {
        "inputs": [
            {
                "name": spec.name,
                "shape": list(shape),
                "datatype": spec.datatype,
                "parameters": dict(params),
            }
        ],
        "parameters": dict(request_params),
    }
    header = InferenceHeader(
        kind="request",
        id=None,
        model_name=None,
        model_version=None,
        parameters=request_params,
        tensors=(info,),
        requested_outputs=None,
        raw=raw,
        header_length=0,
    )
    return header, prefix
