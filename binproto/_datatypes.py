"""The V2 datatypes: wire names, element sizes and numpy dtypes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "BF16_DTYPE",
    "DATATYPES",
    "DTYPES",
    "FIXED_ITEMSIZES",
    "BF16BitsWarning",
    "DataType",
    "datatype_for_dtype",
    "datatype_of",
]


def _bf16_dtype() -> tuple[np.dtype[Any], bool]:
    try:
        import ml_dtypes
    except ImportError:  # the documented fallback: raw bfloat16 bits
        return np.dtype("<u2"), False
    return np.dtype(ml_dtypes.bfloat16), True


BF16_DTYPE, HAVE_ML_DTYPES = _bf16_dtype()


class BF16BitsWarning(UserWarning):
    """A BF16 tensor was read without ml_dtypes: its array holds the raw
    bfloat16 bits as ``uint16`` (1.5 reads as 16320), not numbers.

    Install ml_dtypes to get ``bfloat16`` arrays, or take the bits on purpose
    with ``warnings.simplefilter("ignore", binproto.BF16BitsWarning)``.
    """


def warn_bf16_bits(name: str) -> None:
    """Warn that BF16 tensor ``name`` is read as raw bits (no ml_dtypes)."""
    if not HAVE_ML_DTYPES:
        import warnings

        warnings.warn(
            f"BF16 tensor '{name}' is read as raw uint16 bits: install ml_dtypes for"
            " bfloat16 numbers",
            BF16BitsWarning,
            stacklevel=2,
        )


@dataclass(frozen=True, slots=True)
class DataType:
    """One V2 datatype.

    ``itemsize`` is the element size on the wire (``None`` for BYTES, whose
    elements are length-prefixed). ``dtype`` is the explicit little-endian numpy
    dtype arrays of this type decode to (``object`` for BYTES; for BF16,
    ``ml_dtypes.bfloat16`` when installed, else ``uint16`` holding the raw bits).
    """

    name: str
    itemsize: int | None
    dtype: np.dtype[Any]


def _table() -> dict[str, DataType]:
    fixed = {
        "BOOL": "?",
        "UINT8": "u1",
        "UINT16": "<u2",
        "UINT32": "<u4",
        "UINT64": "<u8",
        "INT8": "i1",
        "INT16": "<i2",
        "INT32": "<i4",
        "INT64": "<i8",
        "FP16": "<f2",
        "FP32": "<f4",
        "FP64": "<f8",
    }
    table = {
        name: DataType(name, np.dtype(code).itemsize, np.dtype(code))
        for name, code in fixed.items()
    }
    table["BF16"] = DataType("BF16", 2, BF16_DTYPE)
    table["BYTES"] = DataType("BYTES", None, np.dtype(object))
    return table


#: Every datatype of the protocol, by wire name.
DATATYPES: dict[str, DataType] = _table()

# Derived lookups for per-tensor hot paths (one dict lookup instead of two
# steps through DataType): each datatype's dtype, and each fixed-size one's
# element size.
DTYPES: dict[str, np.dtype[Any]] = {name: dt.dtype for name, dt in DATATYPES.items()}
FIXED_ITEMSIZES: dict[str, int] = {
    name: dt.itemsize for name, dt in DATATYPES.items() if dt.itemsize is not None
}

_BY_KIND_SIZE = {
    (dt.dtype.kind, dt.dtype.itemsize): dt
    for dt in DATATYPES.values()
    if dt.itemsize is not None and dt.name != "BF16"
}


def datatype_of(name: str) -> DataType | None:
    """Return the datatype with wire name ``name``, or None if there is none."""
    return DATATYPES.get(name)


def datatype_for_dtype(dtype: np.dtype[Any]) -> DataType | None:
    """Return the wire datatype of a numpy dtype, or None if it has none.

    Byte strings (``S``), unicode (``U``) and object arrays map to BYTES;
    ``ml_dtypes.bfloat16`` maps to BF16.
    """
    kind = dtype.kind
    if kind in "OSU":
        return DATATYPES["BYTES"]
    if kind == "V":  # (bfloat16's kind: no other dtype is compared with it)
        return DATATYPES["BF16"] if HAVE_ML_DTYPES and dtype == BF16_DTYPE else None
    return _BY_KIND_SIZE.get((kind, dtype.itemsize))
