"""Shared helpers: byte views of any buffer, and the BOOL check."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import binproto
from binproto._util import as_byte_view, check_bool


def test_a_byte_view_is_a_view_not_a_copy() -> None:
    arr = np.arange(4, dtype=np.int32)
    view = as_byte_view(arr)
    assert view.format == "B" and view.ndim == 1 and len(view) == 16
    arr[0] = 7
    assert view[0] == 7


@pytest.mark.parametrize("shape", [(0,), (2, 0), (0, 3, 4)])
@pytest.mark.parametrize("dtype", [np.uint8, np.float32, np.float16])
def test_a_buffer_without_elements_is_an_empty_byte_view(
    shape: tuple[int, ...], dtype: type
) -> None:
    # memoryview itself cannot cast a view with a zero in its shape.
    array: np.ndarray[Any, Any] = np.zeros(shape, dtype=dtype)
    view = as_byte_view(array)
    assert view.format == "B" and view.ndim == 1 and len(view) == 0
    assert not view.readonly  # writable, as the array is
    array.flags.writeable = False
    assert as_byte_view(array).readonly


def test_an_object_array_is_refused_not_read_as_pointers() -> None:
    with pytest.raises(binproto.LocalProtocolError, match="Python objects"):
        as_byte_view(np.array([b"a", b"bc"], dtype=object))
    with pytest.raises(binproto.LocalProtocolError, match="Python objects"):
        binproto.Parser("request", header_length=None).receive_data(np.array([b"{}"], dtype=object))
    with pytest.raises(binproto.LocalProtocolError, match="Python objects"):
        as_byte_view(np.zeros(2, dtype=[("a", "u1"), ("b", "O")]))
    # A field named with an O holds no object: its bytes are taken.
    assert len(as_byte_view(np.zeros(2, dtype=[("Obj", "u1")]))) == 2


def test_a_strided_buffer_is_refused() -> None:
    with pytest.raises(binproto.LocalProtocolError, match="C-contiguous"):
        as_byte_view(np.arange(8, dtype=np.uint8)[::2])
    with pytest.raises(binproto.LocalProtocolError, match="bytes-like"):
        as_byte_view(3)


def test_a_released_view_is_misuse_wherever_it_is_given() -> None:
    view = memoryview(b"abcd")
    view.release()
    with pytest.raises(binproto.LocalProtocolError, match="released"):
        as_byte_view(view)
    parser = binproto.Parser("request", header_length=None)
    with pytest.raises(binproto.LocalProtocolError, match="released"):
        parser.receive_data(view)


def test_check_bool_points_at_the_first_bad_byte() -> None:
    check_bool(memoryview(b"\x00\x01\x01"), "input 'b'", 10)
    with pytest.raises(binproto.RemoteProtocolError, match="invalid BOOL value 2") as err:
        check_bool(memoryview(b"\x00\x01\x02\x05"), "input 'b'", 10)
    assert err.value.offset == 12
