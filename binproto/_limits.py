"""Configurable bounds on what a peer may make binproto hold or process."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ._errors import LocalProtocolError

__all__ = ["Limits"]

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Bounds checked against claims (header lengths, ``binary_data_size``,
    ``Content-Length``) and against buffered bytes, before any work is done, so
    the outcome never depends on how a body is chunked.

    A body, tensor or tensor count over its limit is answered with status hint
    413; JSON nested deeper than ``max_json_depth`` with 400.

    Attributes:
        max_header_bytes: largest JSON header (Triton's default HTTP input
            limit): the only part of a body binproto buffers.
        max_tensors: most tensors (inputs or outputs) in one message, and most
            requested outputs.
        max_tensor_bytes: largest ``binary_data_size`` of a single tensor.
        max_body_bytes: largest (decoded) body.
        max_json_depth: deepest nesting of JSON arrays and objects in the header.
        max_json_values: most JSON values (numbers, strings, arrays, objects,
            ...) in the header, counted from its bytes before it is parsed.
            Each value becomes a Python object: this bounds the header's
            memory and parse time, which its size alone does not.
        max_bytes_elements: most BYTES elements in one message, over all
            its tensors (each becomes a Python ``bytes`` object).
        max_json_output_elements: most elements a response may write as
            JSON ``data`` (the encoder's bound: JSON text is several times
            the binary size and slow to write). Past it, ask for binary
            outputs.
        max_decompressed_bytes: most bytes a compressed body may expand to.
            Below 4 GiB, so a gzip trailer (its size modulo 2**32) that
            matches the header's claim is the body's true size, or the body
            passes this limit while it is inflated.
        max_decompression_ratio: most decompressed bytes per compressed byte.
            The first 1 MiB of a body is always allowed; past it, a body may
            expand to this many times its compressed ``content_length``, or,
            when that is unknown, this many times the compressed bytes
            decompressed so far (counted in 16 KiB blocks, so the outcome does
            not depend on chunking). The default, 1100, sits just above
            deflate's own maximum of about 1032:1, so no well-formed body is
            refused by ratio alone (zero-filled tensors, common as padding and
            masks, compress over 1000:1 at level 6); ``max_decompressed_bytes``
            is what bounds a bomb. Lower it (e.g. 100) to refuse highly
            compressible bodies early.
    """

    max_header_bytes: int = 64 * MiB
    max_tensors: int = 4096
    max_tensor_bytes: int = 32 * GiB
    max_body_bytes: int = 64 * GiB
    max_json_depth: int = 100
    max_json_values: int = 512 * 1024
    max_bytes_elements: int = 2 * 1024 * 1024
    max_json_output_elements: int = 2 * 1024 * 1024
    max_decompressed_bytes: int = 512 * MiB
    max_decompression_ratio: float = 1100.0

    def __post_init__(self) -> None:
        for name in (
            "max_header_bytes",
            "max_tensors",
            "max_tensor_bytes",
            "max_body_bytes",
            "max_json_depth",
            "max_json_values",
            "max_bytes_elements",
            "max_json_output_elements",
            "max_decompressed_bytes",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise LocalProtocolError(
                    f"Limits.{name} must be a non-negative integer, got {value!r}"
                )
        ratio = self.max_decompression_ratio
        if (
            isinstance(ratio, bool)
            or not isinstance(ratio, (int, float))
            or not 0 < ratio < math.inf  # (a body's allowance is an int of it)
        ):
            raise LocalProtocolError(
                f"Limits.max_decompression_ratio must be a positive, finite number, got {ratio!r}"
            )
