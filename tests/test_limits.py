"""Limits: defaults, validation of each field, immutability."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import binproto
from binproto import Limits, LocalProtocolError

# Every field but the ratio is a count of bytes, tensors or levels.
_INT_FIELDS = [f.name for f in dataclasses.fields(Limits) if f.name != "max_decompression_ratio"]


def test_defaults() -> None:
    limits = Limits()
    assert limits.max_header_bytes == 64 << 20  # Triton's default HTTP input limit
    assert limits.max_tensors == 4096
    assert limits.max_tensor_bytes == 32 << 30
    assert limits.max_body_bytes == 64 << 30
    assert limits.max_json_depth == 100
    assert limits.max_json_values == 1 << 19
    assert limits.max_bytes_elements == 2 << 20
    assert limits.max_json_output_elements == 2 << 20
    # Under 4 GiB: a gzip trailer that matches the claim is the true size.
    assert limits.max_decompressed_bytes == 512 << 20
    assert limits.max_decompression_ratio == 1100.0


@pytest.mark.parametrize("field", _INT_FIELDS)
@pytest.mark.parametrize("bad", [-1, 1.5, True, "10", None])
def test_integer_fields_must_be_non_negative_integers(field: str, bad: Any) -> None:
    with pytest.raises(LocalProtocolError, match=f"Limits.{field} must be a non-negative integer"):
        Limits(**{field: bad})


@pytest.mark.parametrize("field", _INT_FIELDS)
def test_zero_is_a_limit(field: str) -> None:
    assert getattr(Limits(**{field: 0}), field) == 0


@pytest.mark.parametrize("bad", [0, -2.0, True, "100", None, float("nan"), float("inf")])
def test_the_ratio_must_be_a_positive_finite_number(bad: Any) -> None:
    with pytest.raises(LocalProtocolError, match="max_decompression_ratio must be a positive"):
        Limits(max_decompression_ratio=bad)


def test_the_ratio_may_be_an_int_or_a_float() -> None:
    assert Limits(max_decompression_ratio=100).max_decompression_ratio == 100
    assert Limits(max_decompression_ratio=0.5).max_decompression_ratio == 0.5


def test_limits_are_frozen_keyword_only_and_compared_by_value() -> None:
    limits = Limits(max_tensors=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        limits.max_tensors = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        Limits(10)  # type: ignore[call-arg]
    assert limits == Limits(max_tensors=3) != Limits()
    assert dataclasses.replace(limits, max_tensors=5).max_tensors == 5


def test_a_parser_given_none_uses_the_defaults() -> None:
    assert binproto.Parser("request").limits == Limits()
