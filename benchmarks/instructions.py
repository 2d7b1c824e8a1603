"""Instructions per 64 KiB chunk spent by the parser, counted by callgrind.

Times drift on a shared host; instruction counts do not. Each loop runs in
its own interpreter under ``valgrind --tool=callgrind``, over ``--chunks``
chunks (the same 64 KiB buffer stands for every chunk of one large tensor:
the parser never reads tensor bytes), and the count of an empty loop over
as many chunks is subtracted::

    python -m benchmarks.instructions            # events() and next_event()
    python -m benchmarks.instructions --chunks 50000

Needs valgrind (Debian's ``valgrind`` package).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np

import binproto

CHUNK = 64 * 1024


def _chunks(count: int) -> tuple[list[memoryview], int, int]:
    """A header chunk, then ``count`` views of one 64 KiB buffer."""
    size = CHUNK * count
    tensor = {"name": "x", "datatype": "UINT8", "shape": [size],
              "parameters": {"binary_data_size": size}}  # fmt: skip
    header = json.dumps({"outputs": [tensor]}).encode()
    piece = np.ones(CHUNK, dtype=np.uint8).data
    return [memoryview(header), *[piece] * count], len(header), len(header) + size


def loop(mode: str, count: int) -> None:
    """Run one loop: ``empty``, ``events`` or ``next_event``."""
    chunks, hl, total = _chunks(count)
    if mode == "empty":
        for _c in chunks:
            pass
        return
    p = binproto.Parser("response", header_length=hl, content_length=total)
    if mode == "events":
        for c in chunks:
            p.receive_data(c)
            for _ev in p.events():
                pass
    else:
        for c in chunks:
            p.receive_data(c)
            while (ev := p.next_event()) is not binproto.NEED_DATA:
                if type(ev) is binproto.MessageComplete:
                    break
    assert p.state is binproto.ParserState.DONE


def count_instructions(mode: str, count: int) -> int:
    """Instructions the whole interpreter ran for ``loop(mode, count)``."""
    cmd = [
        "valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
        sys.executable, "-m", "benchmarks.instructions", "--run", mode, "--chunks", str(count),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stderr
    found = re.search(r"Collected : (\d+)", out)
    if found is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{out[-2000:]}")
    return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    """The ``python -m benchmarks.instructions`` command."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.instructions")
    ap.add_argument("--chunks", type=int, default=200_000, help="chunks per loop")
    ap.add_argument("--run", help=argparse.SUPPRESS)  # one loop, inside valgrind
    args = ap.parse_args(argv)
    if args.run:
        loop(args.run, args.chunks)
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not installed", file=sys.stderr)
        return 1
    empty = count_instructions("empty", args.chunks)
    for mode in ("events", "next_event"):
        extra = count_instructions(mode, args.chunks) - empty
        print(f"{mode}: {extra / args.chunks:,.0f} instructions per chunk")
    return 0


if __name__ == "__main__":
    sys.exit(main())
