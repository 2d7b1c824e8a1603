"""What a body costs at the object-count limits' defaults: memory and time.

Byte limits do not bound the objects a small body becomes. ``Limits`` counts
them instead: ``max_json_values`` (512 Ki) and ``max_bytes_elements``
(2 Mi). Each case builds a body just under one default limit, then decodes
it in a fresh process and reports the peak resident memory above what the
process held before the decode (Linux: the peak is reset through
``/proc/self/clear_refs`` first) and the time:

- **JSON values**: a header of one-member objects (``[{"k": "v"}, ...]``),
  decoded whole;
- **BYTES elements, whole**: two-byte elements (one-byte ``bytes`` are
  shared), ``decode_request``;
- **BYTES elements, parser**: the same through ``Parser`` and
  ``TensorAssembler``, as a streaming server reads it.

docs/limits-and-errors.md quotes these figures as the worst case within the
defaults.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from ._harness import Row, mode, pick, row

ROOT = Path(__file__).resolve().parent.parent

#: Run in a fresh interpreter: ``case`` and ``scale`` (a divisor of the counts).
_CHILD = r"""
import json, sys, time
import binproto

case, scale = sys.argv[1], int(sys.argv[2])
limits = binproto.Limits()

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

if case == "json":
    # Each object's { and comma count, and the header's own 4 (two { [ and a comma).
    objects = (limits.max_json_values - 4) // 2 // scale
    raw = json.dumps({"inputs": [], "x": [{"k": "v"}] * objects}).encode()
    body, hl = raw, None
else:
    elements = (limits.max_bytes_elements - 1) // scale
    blob = b"\2\0\0\0xy" * elements  # two-byte elements (one-byte ones are shared)
    header = {"inputs": [{"name": "s", "datatype": "BYTES", "shape": [elements],
                          "parameters": {"binary_data_size": len(blob)}}]}
    raw = json.dumps(header).encode()
    body, hl = raw + blob, len(raw)

def decode():
    if case != "bytes-parser":
        return binproto.decode_request(body, header_length=hl)
    parser = binproto.Parser("request", header_length=hl, content_length=len(body))
    assembler = binproto.TensorAssembler()
    parser.receive_data(body)
    parser.receive_data(b"")
    while type(event := parser.next_event()) is not binproto.MessageComplete:
        assembler.feed(event)
    return assembler.tensors

open("/proc/self/clear_refs", "w").write("5")  # the peak starts again from here
before = status("VmRSS")
start = time.perf_counter()
try:
    kept = decode()
except binproto.RemoteProtocolError as exc:  # (the values' header is refused once parsed)
    kept = exc
seconds = time.perf_counter() - start
print(json.dumps({"peak_bytes": status("VmHWM") - before, "seconds": seconds}))
"""

CASES = {
    "json": "512 Ki JSON values (one-member objects), decoded whole",
    "bytes-whole": "2 Mi two-byte BYTES elements, decoded whole",
    "bytes-parser": "2 Mi two-byte BYTES elements, parser and assembler",
}


def measure(case: str, scale: int) -> dict[str, Any]:
    """Peak memory above the process's (bytes) and seconds of one decode."""
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, case, str(scale)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def run(quick: bool) -> list[Row]:
    """One row per case: seconds, and the peak memory in the notes."""
    if not sys.platform.startswith("linux"):
        reason = "reads /proc"
        return [{"workload": "cost limits", "impl": "not measured", "note": reason}]
    scale = pick(mode(quick), full=1, quick=1, tiny=64)
    repeats = pick(mode(quick), full=3, quick=1, tiny=1)
    rows = []
    for case, workload in CASES.items():
        runs = [measure(case, scale) for _ in range(repeats)]
        peak = max(r["peak_bytes"] for r in runs)
        rows.append(
            row(
                workload,
                "binproto",
                [r["seconds"] for r in runs],
                peak_extra_bytes=peak,
                peak_extra_mib=round(peak / (1 << 20), 1),
            )
        )
    return rows


if __name__ == "__main__":
    for r in run("--quick" in sys.argv):
        print(f"{r['workload']:52} {r['seconds']:7.3f} s  peak {r['peak_extra_mib']} MiB")
