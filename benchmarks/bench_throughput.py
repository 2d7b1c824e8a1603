"""Serving throughput: requests per second and p99 latency under ``wrk``.

Each server runs in its own process on 127.0.0.1; ``wrk`` (Debian package
``wrk``: ``apt-get install wrk``) posts the same FP32 echo request (4 KiB,
64 KiB or 1 MiB of tensor bytes, binary output asked for) over keep-alive
connections, one thread, 8 or 64 connections. Servers are measured in
interleaved rounds (every server once per round, in turn) so the machine's
drift hits them alike; the table gives each server's median req/s and p99, and
its median per-round ratio to the floor under it:

- the h11 floor (``asyncio.Protocol`` + h11, fixed answer) for binproto's own
  servers, which parse HTTP with h11;
- a trivial ASGI app under uvicorn for binproto's ASGI apps under uvicorn
  (the bare echo of the adapter's pieces, and ``V2App``);
- and, as a server of its own, the h11 floor doing the echo with binproto's
  codec and nothing else (``h11-codec``), compared with the h11 floor: the
  most any h11 server doing this echo with this codec reaches, so the gap
  between it and binproto's servers is their own machinery;
- and the same for uvicorn: the trivial ASGI app doing the echo with
  binproto's codec and nothing else (``asgi-codec``), compared with the
  trivial app;
- and, also compared with the h11 floor, the same floor on trio
  (``h11-trio-floor``): what trio's event loop costs per request, the ceiling
  of binproto's trio server.

The floors and the other servers: :mod:`benchmarks.floor_servers`. KServe
runs when installed; a real Triton (the ``tritonserver`` of the
``nvidia-pytriton`` wheel, with a python-backend identity model, see
``tests/interop/triton_peer.py``) when it can run here (the test extra
installs it; it also needs Debian's ``python3-numpy``), compared with the h11
floor. Run alone with ``python -m benchmarks.bench_throughput``
(``--quick`` for 2 s rounds on one body size).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import binproto

from ._harness import Row, mode, pick, row

ROOT = Path(__file__).resolve().parent.parent
KSERVE_ECHO = ROOT / "tests" / "interop" / "kserve_echo_server.py"

#: Which floor each server is compared with.
FLOOR_OF = {
    "h11-codec": "h11-floor",
    "h11-trio-floor": "h11-floor",
    "binproto-asyncio": "h11-floor",
    "binproto-trio": "h11-floor",
    "binproto-asgi": "asgi-floor",
    "binproto-v2app": "asgi-floor",
    "asgi-codec": "asgi-floor",
    "binproto-cpu2": "binproto-cpu1",
    "triton": "h11-floor",
    "kserve": "asgi-floor",
}


def _uvicorn(app: str) -> list[str]:
    options = "--host 127.0.0.1 --port {port} --log-level warning --no-access-log --backlog 2048"
    return [sys.executable, "-m", "uvicorn", app, *options.split()]


#: The command of each server; ``{port}`` is filled in.
COMMANDS: dict[str, list[str]] = {
    "bare-asyncio": [sys.executable, "-m", "benchmarks.floor_servers", "bare", "{port}"],
    "h11-floor": [sys.executable, "-m", "benchmarks.floor_servers", "h11", "{port}"],
    "asgi-floor": _uvicorn("benchmarks.floor_servers:asgi_app"),
    "asgi-codec": _uvicorn("benchmarks.floor_servers:asgi_codec_app"),
    "h11-codec": [sys.executable, "-m", "benchmarks.floor_servers", "h11-codec", "{port}"],
    "h11-trio-floor": [sys.executable, "-m", "benchmarks.floor_servers", "h11-trio", "{port}"],
    "binproto-asyncio": [sys.executable, "-m", "binproto", "serve", "--port", "{port}"],
    "binproto-trio": [
        sys.executable,
        "-m",
        "binproto",
        "serve",
        *"--backend trio --port {port}".split(),
    ],
    "binproto-asgi": _uvicorn("benchmarks.floor_servers:binproto_asgi_app"),
    "binproto-v2app": _uvicorn("benchmarks.floor_servers:v2app"),
    # V2App on two uvicorn workers: both cores, as Triton's threads use them.
    "binproto-v2app-2w": [*_uvicorn("benchmarks.floor_servers:v2app"), "--workers", "2"],
    # A model of ~1 ms of CPU a request, on one process and on two.
    "binproto-cpu1": [
        *(sys.executable, "-m", "binproto", "serve", "benchmarks.floor_servers:cpu_models"),
        *"--port {port}".split(),
    ],
    "binproto-cpu2": [
        *(sys.executable, "-m", "binproto", "serve", "benchmarks.floor_servers:cpu_models"),
        *"--workers 2 --port {port}".split(),
    ],
    # KServe serves on a listening socket it inherits ({fd}).
    "kserve": [sys.executable, str(KSERVE_ECHO), "--fd", "{fd}", "--model", "echo"],
}


@dataclass
class Result:
    """One wrk run: requests per second, p99 latency in seconds, and errors;
    the CPU cores the server used and the machine left idle meanwhile (None
    where /proc does not tell)."""

    rps: float
    p99: float
    errors: int
    server_cores: float | None = None
    idle_cores: float | None = None


#: The process of the server listening on each port (see ``running``).
PIDS: dict[int, int] = {}


def _ticks(fields: list[str]) -> float:
    return sum(map(int, fields)) / os.sysconf("SC_CLK_TCK")


def tree_cpu(pid: int) -> float | None:
    """CPU seconds (user and system) of process ``pid`` and its children
    (a server's workers), from /proc; None elsewhere."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    total = 0.0
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # (gone meanwhile)
        if int(entry) == pid or int(fields[1]) == pid:  # itself, or a child
            total += _ticks(fields[11:13])  # utime, stime
    return total


def idle_cpu() -> float | None:
    """CPU seconds all cores have spent idle since boot, from /proc; None elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    return _ticks(fields[4:6])  # idle, iowait


def _ready(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
            return s.recv(64).startswith(b"HTTP/1.1 ")  # any answer: it is up
    except OSError:
        return False


@contextmanager
def running(
    name: str, command: Sequence[str], timeout: float = 60, root: Path = ROOT
) -> Iterator[int]:
    """Start ``command`` on a free port, in the checkout ``root``; yield the
    port once it answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    port = sock.getsockname()[1]
    argv = [p.replace("{port}", str(port)).replace("{fd}", str(sock.fileno())) for p in command]
    inherit = "{fd}" in " ".join(command)
    if not inherit:
        sock.close()  # the server binds the port itself
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.Popen(
        argv,
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        pass_fds=[sock.fileno()] if inherit else [],
    )
    if inherit:
        sock.close()  # the child has its own copy
    PIDS[port] = proc.pid
    try:
        deadline = time.monotonic() + timeout
        while not _ready(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start ({' '.join(argv)})")
            time.sleep(0.1)
        yield port
    finally:
        PIDS.pop(port, None)
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


#: Where each server's echo model is, and its input's name (default: binproto's echo).
ENDPOINTS = {"triton": ("/v2/models/identity_fp32/infer", "INPUT0")}
ECHO = ("/v2/models/echo/infer", "input0")


def write_request(directory: Path, tensor_bytes: int, input_name: str = "input0") -> Path:
    """A wrk Lua script posting an FP32 echo request of ``tensor_bytes``."""
    body = binproto.encode_request(
        {input_name: np.arange(tensor_bytes // 4, dtype=np.float32)}, binary_data_output=True
    )
    path = directory / f"body-{input_name}-{tensor_bytes}.bin"
    with open(path, "wb") as f:
        for buf in body.buffers:
            f.write(buf)
    script = directory / f"post-{input_name}-{tensor_bytes}.lua"
    script.write_text(
        f'local f = io.open("{path}", "rb")\n'
        "wrk.body = f:read('*a')\n"
        "f:close()\n"
        'wrk.method = "POST"\n'
        'wrk.headers["Content-Type"] = "application/octet-stream"\n'
        f'wrk.headers["Inference-Header-Content-Length"] = "{body.header_length}"\n'
    )
    return script


_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def parse_wrk(text: str) -> Result:
    """Requests/sec, the 99% latency and the error count of wrk's report."""
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))  # type: ignore[union-attr]
    m = re.search(r"99%\s+([\d.]+)(us|ms|s)\b", text)
    p99 = float(m.group(1)) * _UNITS[m.group(2)] if m else float("nan")
    errors = 0
    for pattern in (r"Non-2xx or 3xx responses:\s+(\d+)", r"Socket errors:.*?timeout (\d+)"):
        e = re.search(pattern, text)
        if e:
            errors += int(e.group(1))
    return Result(rps, p99, errors)


def wrk(port: int, script: Path, connections: int, seconds: float, path: str = ECHO[0]) -> Result:
    """One wrk run against an echo model's infer endpoint (``path``), with
    the CPU the server (when started by ``running``) and the machine's idle
    cores had meanwhile: on a shared machine a server gets what others leave."""
    url = f"http://127.0.0.1:{port}{path}"
    pid = PIDS.get(port)
    cpu_before = tree_cpu(pid) if pid is not None else None
    idle_before = idle_cpu()
    start = time.monotonic()
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency", "-s", str(script), url],
        capture_output=True,
        text=True,
        check=True,
        timeout=seconds + 30,
    )
    result = parse_wrk(out.stdout)
    elapsed = time.monotonic() - start
    cpu_after = tree_cpu(pid) if pid is not None else None
    idle_after = idle_cpu()
    if cpu_before is not None and cpu_after is not None:
        result.server_cores = (cpu_after - cpu_before) / elapsed
    if idle_before is not None and idle_after is not None:
        result.idle_cores = (idle_after - idle_before) / elapsed
    return result


#: Servers also compared with a real Triton, when it runs: the least ratio
#: of their request rate to Triton's (``vs_triton``, median per round).
TRITON_TARGETS = {
    "binproto-v2app": 1.3,
    "binproto-v2app-2w": None,
    "binproto-asyncio": None,
    "asgi-codec": None,
}

#: Servers also compared with the codec floor of their layer: what their own
#: machinery costs beside the codec's work (``vs_codec``, median per round).
CODEC_FLOOR_OF = {
    "binproto-asyncio": "h11-codec",
    "binproto-asgi": "asgi-codec",
    "binproto-v2app": "asgi-codec",
}

#: The least ratio to the floor each of binproto's servers should reach.
TARGETS = {
    "binproto-asyncio": 0.6,
    "binproto-trio": 0.5,
    "binproto-asgi": 0.35,
    "binproto-v2app": 0.5,
    "binproto-cpu2": 1.6,
}


def measure(
    servers: dict[str, int],
    scripts: dict[int, dict[str, Path]],
    connections: Sequence[int],
    rounds: int,
    seconds: float,
) -> list[Row]:
    """Interleaved rounds over every server, for each body size and connection
    count (``scripts``: by body size, then by input name). A row's ``seconds``
    is per request (1 / req/s), so its ``ratio`` to the floor is the ratio of
    their request rates."""
    rows: list[Row] = []
    for size, by_input in scripts.items():
        for conns in connections:
            samples: dict[str, list[Result]] = {name: [] for name in servers}
            for _ in range(rounds):
                for name, port in servers.items():
                    path, input_name = ENDPOINTS.get(name, ECHO)
                    samples[name].append(wrk(port, by_input[input_name], conns, seconds, path))
            for name, results in samples.items():
                # A server of another revision (name@REV) is compared as its own.
                kind = name.partition("@")[0]
                floor = FLOOR_OF.get(kind)
                base = samples.get(floor) if floor is not None else None
                extra: dict[str, Any] = {}
                for other, theirs in samples.items():
                    if other.startswith(kind + "@") and other != name:
                        # Per round: this revision's request rate over the other's.
                        ratios = [a.rps / b.rps for a, b in zip(results, theirs, strict=True)]
                        extra[f"vs_{other.partition('@')[2]}"] = round(statistics.median(ratios), 3)
                triton = samples.get("triton")
                if name in TRITON_TARGETS and triton is not None:
                    ratios = [a.rps / b.rps for a, b in zip(results, triton, strict=True)]
                    extra["vs_triton"] = round(statistics.median(ratios), 3)
                    least = TRITON_TARGETS[name]
                    if least is not None:
                        extra["triton_target"] = f">= {least}x triton"
                        extra["triton_met"] = "yes" if extra["vs_triton"] >= least else "no"
                codec = samples.get(CODEC_FLOOR_OF.get(name, ""))
                if codec is not None:
                    ratios = [a.rps / b.rps for a, b in zip(results, codec, strict=True)]
                    extra["vs_codec"] = round(statistics.median(ratios), 3)
                cores = [r.server_cores for r in results if r.server_cores is not None]
                if cores:
                    # Requests per CPU second: what the server does with the CPU it got.
                    extra["server_cores"] = round(statistics.median(cores), 2)
                    per_core = [r.rps / r.server_cores for r in results if r.server_cores]
                    extra["rps_per_core"] = round(statistics.median(per_core)) if per_core else None
                idle = [r.idle_cores for r in results if r.idle_cores is not None]
                if idle:
                    extra["idle_cores"] = round(statistics.median(idle), 2)
                rows.append(
                    row(
                        f"echo {size // 1024} KiB FP32, {conns} connections",
                        name,
                        [1 / r.rps for r in results],
                        baseline=floor if base is not None else None,
                        baseline_samples=[1 / r.rps for r in base] if base is not None else None,
                        min_ratio=TARGETS.get(name) if base is not None else None,
                        rps=round(statistics.median(r.rps for r in results)),
                        p99_ms=round(statistics.median(r.p99 for r in results) * 1e3, 2),
                        errors=sum(r.errors for r in results),
                        **extra,
                    )
                )
    return rows


def available(names: Sequence[str] | None) -> dict[str, list[str]]:
    """The servers to measure: those asked for (default all), less those
    whose software is missing here."""
    chosen = {n: c for n, c in COMMANDS.items() if names is None or n in names}
    # (Importing kserve would parse this process's command line: only look.)
    if importlib.util.find_spec("kserve") is None:
        chosen.pop("kserve", None)
    return chosen


@contextmanager
def checkout(rev: str, directory: Path) -> Iterator[Path]:
    """This repository at git revision ``rev``, in a temporary worktree."""
    path = directory / "revision"
    added = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev],
        capture_output=True,
        text=True,
        check=False,
    )
    if added.returncode:
        raise RuntimeError(f"no worktree of {rev!r}: {added.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
            check=False,
            capture_output=True,
        )


def run(
    quick: bool,
    names: Sequence[str] | None = None,
    against: str | None = None,
    *,
    rounds: int | None = None,
    seconds: float | None = None,
    connections: Sequence[int] | None = None,
) -> list[Row]:
    """Measure every available server; the runner's entry point. With
    ``against`` (a git revision), binproto's servers of that revision run too,
    in the same interleaved rounds, as ``NAME@REV`` (each current server's row
    then has ``vs_REV``: its request rate over theirs, median per round)."""
    current = mode(quick)
    if shutil.which("wrk") is None:
        reason = "wrk is not installed (apt-get install wrk)"
        print(f"throughput: {reason}", file=sys.stderr)
        return [{"workload": "serving throughput", "impl": "not measured", "note": reason}]
    sizes = pick(current, full=[4096, 65536, 1 << 20], quick=[4096], tiny=[4096])
    if connections is None:
        connections = pick(current, full=[8, 64], quick=[8], tiny=[8])
    if rounds is None:
        rounds = pick(current, full=2, quick=2, tiny=1)
    if seconds is None:
        seconds = pick(current, full=3, quick=2, tiny=1)
    commands = available(names)
    if current == "tiny":  # the smoke test: one floor and one server, briefly
        commands = {n: c for n, c in commands.items() if n in ("h11-floor", "binproto-asyncio")}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        inputs = {name for _, name in (ECHO, *ENDPOINTS.values())}
        scripts = {
            size: {name: write_request(Path(tmp), size, name) for name in inputs} for size in sizes
        }
        servers = {name: stack.enter_context(running(name, cmd)) for name, cmd in commands.items()}
        if against is not None:
            if not any(name.startswith("binproto-") for name in commands):
                raise RuntimeError("--against compares binproto's servers: none was chosen")
            old = stack.enter_context(checkout(against, Path(tmp)))
            for name, cmd in commands.items():
                if name.startswith("binproto-"):
                    label = f"{name}@{against}"
                    servers[label] = stack.enter_context(running(label, cmd, root=old))
        if current != "tiny" and (names is None or "triton" in names):
            port = _triton(stack, Path(tmp) / "triton")
            if port is not None:
                servers["triton"] = port
        return measure(servers, scripts, connections, rounds, seconds)


def _triton(stack: ExitStack, workdir: Path) -> int | None:
    """Start a real Triton with an FP32 identity model; its HTTP port, or
    None (and why, on stderr) when it cannot run here."""
    sys.path.insert(0, str(ROOT))
    try:
        from tests.interop.triton_peer import start_triton, triton_unavailable
    finally:
        sys.path.remove(str(ROOT))
    reason = triton_unavailable()
    if reason is not None:
        print(f"throughput: no Triton row: {reason}", file=sys.stderr)
        return None
    workdir.mkdir()
    peer = stack.enter_context(start_triton(workdir, datatypes=("FP32",), single_input=False))
    return peer.port


def main() -> None:
    """Print the table of ``run``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one size, 8 connections, 2 s rounds")
    parser.add_argument("--server", action="append", help="only these servers (repeatable)")
    parser.add_argument(
        "--against",
        metavar="REV",
        help="also run binproto's servers of git revision REV, in the same rounds",
    )
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default: 2)")
    parser.add_argument("--seconds", type=float, help="seconds of each wrk run")
    parser.add_argument(
        "--connections", type=int, action="append", help="connection counts (repeatable)"
    )
    args = parser.parse_args()
    chosen = {"rounds": args.rounds, "seconds": args.seconds, "connections": args.connections}
    for r in run(args.quick, args.server, args.against, **chosen):
        if "rps" not in r:
            print(r)
            continue
        ratio = f"{r['ratio']:.2f}x {r['baseline']}" if r.get("ratio") is not None else ""
        versus = "".join(f"  {v}x {k[3:]}" for k, v in r.items() if k.startswith("vs_"))
        cpu = ""
        if r.get("server_cores") is not None:
            cpu = f"  {r['server_cores']} cores ({r['rps_per_core']} req/s a core)"
        if r.get("idle_cores") is not None:
            cpu += f"  idle {r['idle_cores']}"
        print(
            f"{r['workload']:36} {r['impl']:18} {r['rps']:>8} req/s  "
            f"p99 {r['p99_ms']:>7} ms  {ratio}{versus}{cpu}  errors={r['errors']}"
        )


if __name__ == "__main__":
    main()
