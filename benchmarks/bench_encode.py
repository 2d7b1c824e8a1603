"""Encoder workloads: a large FP32 request, and a BYTES tensor of many short elements.

- **encode N FP32 request**: one FP32 input of N bytes (1 GiB full, 256 MiB
  quick) to a sendable body. binproto: ``encode_request`` (a buffer list whose
  tensor buffer is the array's own memory: ``writelines``/``sendmsg`` it);
  tritonclient: ``InferInput.set_data_from_numpy`` + ``generate_request_body``
  (one joined ``bytes``); KServe: ``InferInput.set_data_from_numpy`` +
  ``InferRequest.to_rest`` (one joined ``bytes``). Targets: ≥ 100x faster than
  tritonclient and no tensor copy (peak extra memory of the order of the JSON
  header, not of the tensor).
- **serialize BYTES**: 1,000,000 short elements (an object array) to the
  length-prefixed wire form: ``binproto.join_bytes`` (from the array's
  elements) vs ``tritonclient.utils.serialize_byte_tensor``. Target ≥ 3x.
- **encode BYTES request**: the same tensor through ``encode_request`` vs
  tritonclient's ``set_data_from_numpy`` + ``generate_request_body``.

Compared cases run interleaved, round by round (see ``_harness.interleave``).
Peak extra memory is measured in a separate untimed call per case with
``tracemalloc`` (numpy reports its allocations to it): the highest traced
memory during the call above what was traced before it, the result included.
"""

from __future__ import annotations

import sys
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np

import binproto

from ._harness import Row, interleave, mode, pick, row

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
MEMORY_TARGET = 64 * KiB  # the JSON header and a few Python objects


def peak_extra(fn: Callable[[], object]) -> int:
    """Peak bytes allocated while ``fn`` runs (its result included)."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        result = fn()
        peak = tracemalloc.get_traced_memory()[1]
        del result
    finally:
        tracemalloc.stop()
    return max(0, peak - base)


def _triton_request(name: str, arr: np.ndarray[Any, Any], datatype: str) -> tuple[bytes, Any]:
    import tritonclient.http as httpclient

    inp = httpclient.InferInput(name, list(arr.shape), datatype)
    inp.set_data_from_numpy(arr, binary_data=True)
    body, hl = httpclient.InferenceServerClient.generate_request_body([inp])
    return body, hl


def _import_kserve() -> Any:
    """KServe's ``infer_type`` module; importing ``kserve`` parses ``sys.argv``
    (its model server's flags), so it is imported with a bare argv."""
    saved = sys.argv
    sys.argv = saved[:1]
    try:
        from kserve.protocol import infer_type
    finally:
        sys.argv = saved
    return infer_type


def _kserve_request(name: str, arr: np.ndarray[Any, Any], datatype: str) -> Any:
    infer_type = _import_kserve()
    InferInput, InferRequest = infer_type.InferInput, infer_type.InferRequest
    inp = InferInput(name=name, shape=list(arr.shape), datatype=datatype)
    inp.set_data_from_numpy(arr, binary_data=True)
    return InferRequest(model_name="bench", infer_inputs=[inp], request_id="1").to_rest()


def _available(module: str) -> bool:
    try:
        if module == "kserve":
            _import_kserve()
        else:
            __import__(module)
    except ImportError:
        return False
    return True


def _size(n: int) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def fp32_rows(nbytes: int, repeats: int) -> list[Row]:
    """Encode one FP32 request of ``nbytes``: binproto vs tritonclient vs KServe."""
    arr = np.full(nbytes // 4, 1.5, dtype=np.float32)  # touched: real pages
    work = f"encode {_size(nbytes)} FP32 request"
    cases: dict[str, Callable[[], object]] = {
        "binproto": lambda: binproto.encode_request({"input0": arr}, id="1"),
    }
    if _available("tritonclient.http"):
        cases["tritonclient"] = lambda: _triton_request("input0", arr, "FP32")
    if _available("kserve"):
        cases["kserve"] = lambda: _kserve_request("input0", arr, "FP32")
    times = interleave(cases, repeats)
    memory = {name: peak_extra(fn) for name, fn in cases.items()}
    header = len(binproto.encode_request({"input0": arr}, id="1").json)
    rows: list[Row] = []
    base = "tritonclient" if "tritonclient" in cases else None
    for name in cases:
        extra: dict[str, Any] = {"peak_extra_bytes": memory[name], "header_bytes": header}
        if name == "binproto":
            extra["memory_target"] = f"<= {MEMORY_TARGET // KiB} KiB"
            extra["memory_met"] = memory[name] <= MEMORY_TARGET
        compare = name == "binproto" and base is not None
        rows.append(
            row(
                work,
                name,
                times[name],
                nbytes=nbytes,
                baseline=base if compare else None,
                baseline_samples=times[base] if compare and base else None,
                min_ratio=100.0 if compare else None,
                **extra,
            )
        )
        if name == "binproto" and "kserve" in cases:
            rows[-1]["ratio_vs_kserve"] = _ratio(times["kserve"], times["binproto"])
    return rows


def _ratio(base: list[float], ours: list[float]) -> float:
    ratios = sorted(b / s for b, s in zip(base, ours, strict=True) if s > 0)
    return ratios[len(ratios) // 2]


def bytes_rows(count: int, repeats: int) -> list[Row]:
    """Serialize and encode a BYTES tensor of ``count`` short elements."""
    arr = np.empty(count, dtype=object)
    arr[:] = [b"elem%d" % i for i in range(count)]
    rows: list[Row] = []
    have_triton = _available("tritonclient.http")

    serialize: dict[str, Callable[[], object]] = {
        "binproto.join_bytes": lambda: binproto.join_bytes(arr.ravel().tolist())
    }
    if have_triton:
        from tritonclient.utils import serialize_byte_tensor

        serialize["tritonclient.serialize_byte_tensor"] = lambda: serialize_byte_tensor(arr)
        a = binproto.join_bytes(arr.ravel().tolist()).tobytes()
        assert a == serialize_byte_tensor(arr).item(), "the two serializations differ"
    work = f"serialize BYTES {count:,} elements"
    rows += _compared(
        work, serialize, "binproto.join_bytes", "tritonclient.serialize_byte_tensor", repeats
    )

    encode: dict[str, Callable[[], object]] = {
        "binproto": lambda: binproto.encode_request({"text": arr}, id="1")
    }
    if have_triton:
        encode["tritonclient"] = lambda: _triton_request("text", arr, "BYTES")
    rows += _compared(
        f"encode BYTES request {count:,} elements", encode, "binproto", "tritonclient", repeats
    )
    return rows


def _compared(
    work: str, cases: dict[str, Callable[[], object]], ours: str, theirs: str, repeats: int
) -> list[Row]:
    """Time ``cases`` interleaved, with each one's peak extra memory; ``ours``
    is compared with ``theirs`` (when present) against the 3x target."""
    times = interleave(cases, repeats)
    memory = {name: peak_extra(fn) for name, fn in cases.items()}
    base = theirs if theirs in cases else None
    rows = []
    for name in cases:
        compare = name == ours and base is not None
        rows.append(
            row(
                work,
                name,
                times[name],
                baseline=base if compare else None,
                baseline_samples=times[base] if compare and base else None,
                min_ratio=3.0 if compare else None,
                peak_extra_bytes=memory[name],
            )
        )
    return rows


def run(quick: bool) -> list[Row]:
    """Run every encoder workload at the size of the current mode."""
    m = mode(quick)
    repeats = pick(m, full=5, quick=3, tiny=1)
    rows = fp32_rows(pick(m, full=1 * GiB, quick=256 * MiB, tiny=64 * KiB), repeats)
    rows += bytes_rows(pick(m, full=1_000_000, quick=1_000_000, tiny=1000), repeats)
    return rows


def main() -> None:
    """Run the quick workloads and print one line per row."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="1 GiB instead of 256 MiB")
    args = parser.parse_args()
    for r in run(quick=not args.full):
        ratio = f"  ratio {r['ratio']:.1f}x" if "ratio" in r else ""
        kserve = f" (vs KServe {r['ratio_vs_kserve']:.0f}x)" if "ratio_vs_kserve" in r else ""
        print(
            f"{r['workload']:<40} {r['impl']:<36} {r['seconds'] * 1e3:10.3f} ms"
            f"  peak extra {r.get('peak_extra_bytes', 0) / MiB:9.3f} MiB{ratio}{kserve}"
        )


if __name__ == "__main__":
    main()
