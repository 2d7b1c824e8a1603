"""TensorAssembler recognizes chunks received straight into its target memory."""

from __future__ import annotations

import numpy as np

from binproto import Parser, TensorAssembler

from .helpers import make_body


def _setup() -> tuple[bytes, int, np.ndarray[tuple[int], np.dtype[np.float32]]]:
    x = np.arange(4096, dtype="<f4")
    header = {
        "outputs": [
            {
                "name": "x",
                "shape": [4096],
                "datatype": "FP32",
                "parameters": {"binary_data_size": x.nbytes},
            }
        ]
    }
    body, hl = make_body(header, x.tobytes())
    return body, hl, x


def _drain(p: Parser, asm: TensorAssembler) -> None:
    for ev in p.events():
        asm.feed(ev)


def test_slices_of_the_target_are_not_copied() -> None:
    body, hl, x = _setup()
    p = Parser("response", header_length=hl, content_length=len(body))
    asm = TensorAssembler()
    p.receive_data(body[:hl])
    _drain(p, asm)
    payload = memoryview(body)[hl:]
    off = 0
    while (region := p.next_tensor_region()) is not None:
        index, offset, count = region
        view = asm.target(index)[offset : offset + min(count, 5000)]
        view[:] = payload[off : off + len(view)]  # as recv_into would
        off += len(view)
        p.receive_data(view)
        _drain(p, asm)
    assert asm.bytes_in_place == x.nbytes and asm.bytes_copied == 0
    np.testing.assert_array_equal(asm.tensors["x"], x)


def test_writable_chunks_of_other_buffers_are_copied() -> None:
    body, hl, x = _setup()
    p = Parser("response", header_length=hl, content_length=len(body))
    asm = TensorAssembler()
    scratch = bytearray(body)  # writable, but not the assembler's memory
    view = memoryview(scratch)
    for a in range(0, len(scratch), 3000):
        p.receive_data(view[a : a + 3000])
        _drain(p, asm)
    assert asm.bytes_copied == x.nbytes and asm.bytes_in_place == 0
    np.testing.assert_array_equal(asm.tensors["x"], x)


def test_a_destination_array_receives_in_place_too() -> None:
    body, hl, x = _setup()
    dest = np.zeros(4096, dtype="<f4")
    p = Parser("response", header_length=hl, content_length=len(body))
    asm = TensorAssembler({"x": dest})
    p.receive_data(body[:hl])
    _drain(p, asm)
    region = p.next_tensor_region()
    assert region is not None
    index, offset, count = region
    view = asm.target(index)[offset : offset + count]
    view[:] = body[hl:]
    p.receive_data(view)
    _drain(p, asm)
    assert asm.tensors["x"] is dest and asm.bytes_in_place == x.nbytes
    np.testing.assert_array_equal(dest, x)
