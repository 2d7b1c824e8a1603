"""Run the benchmark suite: ``python -m benchmarks.run [--quick] [--only NAME]``.

Every workload module ``benchmarks/bench_*.py`` exposes ``run(quick: bool) ->
list[dict]``; each runs in its own process (so peak memory is per module),
after the raw baselines (memcpy, loopback socket) of this file. Workloads run
side by side with their baselines in the same process, interleaved; the runner
prints one table, writes it as JSON (``benchmarks/results/latest.json``) and
Markdown, and draws a PNG chart when matplotlib is installed.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import math
import os
import platform
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from ._harness import MODE_ENV, Row, interleave, mode, pick, row

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
# Modules in table order; any other benchmarks/bench_*.py runs after them.
ORDER = ["raw", "parser", "encode", "loopback", "asgi"]
TIMEOUT = {"full": 1200, "quick": 300, "tiny": 180}
README_START = "<!-- results:start -->"
README_END = "<!-- results:end -->"

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


# -- raw baselines -------------------------------------------------------------------


def _memcpy_rows(nbytes: int, repeats: int) -> list[Row]:
    src = np.empty(nbytes, dtype=np.uint8)
    src.fill(3)
    dst = np.empty(nbytes, dtype=np.uint8)
    dst.fill(0)  # both buffers faulted in: this is the copy alone
    times = interleave({"copyto": lambda: np.copyto(dst, src)}, repeats)
    return [
        row(f"memcpy {_size(nbytes)}", "np.copyto (preallocated)", times["copyto"], nbytes=nbytes)
    ]


def _loopback_once(src: memoryview, dst: memoryview) -> float:
    """Seconds to move ``src`` into ``dst`` over one TCP connection on 127.0.0.1."""
    n = len(src)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    received = 0
    ready = threading.Event()
    done = threading.Event()
    errors: list[BaseException] = []

    def receive() -> None:
        nonlocal received
        try:
            conn, _ = listener.accept()
            with conn:
                ready.set()
                while received < n:
                    got = conn.recv_into(dst[received:], n - received)
                    if not got:
                        break
                    received += got
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            ready.set()
            done.set()

    thread = threading.Thread(target=receive, daemon=True)
    thread.start()
    with socket.create_connection(("127.0.0.1", port)) as sender:
        ready.wait(10)
        t0 = time.perf_counter()
        sender.sendall(src)
        done.wait(120)
        t1 = time.perf_counter()
    thread.join(10)
    listener.close()
    if errors:
        raise errors[0]
    if received != n:
        raise RuntimeError(f"loopback moved {received} of {n} bytes")
    return t1 - t0


def _socket_rows(nbytes: int, repeats: int) -> list[Row]:
    src = np.empty(nbytes, dtype=np.uint8)
    src.fill(5)
    dst = np.empty(nbytes, dtype=np.uint8)
    dst.fill(0)
    s, d = src.data, dst.data
    _loopback_once(s, d)  # warm-up
    samples = [_loopback_once(s, d) for _ in range(repeats)]
    assert dst[-1] == 5
    return [
        row(
            f"loopback TCP {_size(nbytes)}",
            "socket sendall -> recv_into (2 threads)",
            samples,
            nbytes=nbytes,
        )
    ]


def run_raw(quick: bool) -> list[Row]:
    """Raw speed of this machine: memcpy and a loopback socket."""
    m = mode(quick)
    rows = _memcpy_rows(
        pick(m, full=1 * GiB, quick=256 * MiB, tiny=64 * KiB), pick(m, full=5, quick=3, tiny=1)
    )
    rows += _socket_rows(
        pick(m, full=256 * MiB, quick=64 * MiB, tiny=64 * KiB), pick(m, full=5, quick=3, tiny=1)
    )
    return rows


# -- modules and workers -----------------------------------------------------------------


def discover() -> list[str]:
    """Short names of the workload modules present, in table order."""
    present = {p.stem[len("bench_") :] for p in HERE.glob("bench_*.py")}
    names = [n for n in ORDER if n == "raw" or n in present]
    return names + sorted(present - set(ORDER))


def _peak_rss() -> int:
    # ru_maxrss is KiB on Linux, bytes on macOS.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def worker(name: str, run_mode: str, out: Path) -> int:
    """Run one module in this process and write its rows to ``out``."""
    os.environ[MODE_ENV] = run_mode
    t0 = time.perf_counter()
    result: dict[str, Any] = {"module": name}
    try:
        if name == "raw":
            rows = run_raw(run_mode != "full")
        else:
            module = importlib.import_module(f"benchmarks.bench_{name}")
            rows = module.run(run_mode != "full")
        result["rows"] = [_jsonable(r) for r in rows]
    except BaseException:
        result["error"] = traceback.format_exc()
    result["seconds"] = time.perf_counter() - t0
    result["peak_rss_bytes"] = _peak_rss()
    out.write_text(json.dumps(result))
    return 0 if "error" not in result else 1


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def run_module(name: str, run_mode: str) -> dict[str, Any]:
    """Run a module in a fresh interpreter; its stdout/stderr pass through."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        cmd = [sys.executable, "-m", "benchmarks.run", "--worker", name, "--mode", run_mode]
        cmd += ["--out", str(out)]
        env = dict(os.environ, **{MODE_ENV: run_mode})
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        t0 = time.perf_counter()
        # Its own session, so that on a timeout or Ctrl-C the servers a module
        # started go down with it.
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True)
        code: int | None = None
        try:
            code = proc.wait(timeout=TIMEOUT[run_mode])
        except subprocess.TimeoutExpired:
            pass
        finally:
            if code is None:
                _kill_group(proc)
        if out.exists():
            result: dict[str, Any] = json.loads(out.read_text())
        else:
            why = "timed out" if code is None else f"exited with status {code}"
            result = {"module": name, "error": f"worker {why} without results"}
        result.setdefault("seconds", time.perf_counter() - t0)
        return result


# -- rows: normalizing, table, chart -------------------------------------------------

_ALIASES = {
    "workload": ("workload", "name", "bench", "case", "benchmark"),
    "impl": ("impl", "implementation", "library", "variant", "who", "client", "server"),
    "seconds": ("seconds", "median_s", "time_s", "median_seconds", "time", "median"),
    "gbps": ("gbps", "throughput_gbps", "GBps", "gb_per_s", "gbytes_per_s"),
    "ratio": ("ratio", "speedup", "vs_baseline"),
    "met": ("met", "target_met", "ok", "passed"),
    "peak_rss_bytes": ("peak_rss_bytes", "peak_rss", "rss_bytes", "peak_extra_bytes"),
}
_SHOWN = {
    "group",
    "workload",
    "impl",
    "seconds",
    "min_seconds",
    "samples",
    "repeats",
    "bytes",
    "gbps",
    "ratio",
    "baseline",
    "baseline_seconds",
    "target",
    "met",
    "vs_raw",
    "raw",
}


def normalize(group: str, r: dict[str, Any]) -> dict[str, Any]:
    """Fill the standard fields of a row from the names modules commonly use."""
    out = dict(r)
    out["group"] = group
    for key, names in _ALIASES.items():
        if out.get(key) is None:
            for alias in names:
                if r.get(alias) is not None:
                    out[key] = r[alias]
                    break
    out.setdefault("workload", "?")
    out.setdefault("impl", "")
    if out.get("gbps") is None and _num(out.get("bytes")) and _num(out.get("seconds")):
        out["gbps"] = out["bytes"] / out["seconds"] / 1e9 if out["seconds"] > 0 else None
    return out


def _num(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def add_raw_ratios(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Set ``vs_raw`` (throughput / raw throughput) on every row with a throughput.

    Rows that move bytes over a socket (``raw: "socket"``, or in the loopback
    and ASGI groups) compare with the loopback socket, the others with memcpy.
    """
    raw: dict[str, float] = {}
    for r in rows:
        if r["group"] == "raw" and _num(r.get("gbps")):
            raw["socket" if "loopback" in str(r["workload"]) else "memcpy"] = r["gbps"]
    for r in rows:
        if r["group"] == "raw" or not _num(r.get("gbps")):
            continue
        kind = r.get("raw") or ("socket" if r["group"] in ("loopback", "asgi") else "memcpy")
        if kind in raw and raw[kind] > 0:
            r["raw"] = kind
            r["vs_raw"] = r["gbps"] / raw[kind]
    return raw


def _size(n: int) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def fmt_time(s: Any) -> str:
    if not _num(s):
        return ""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(s) >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def _fmt_num(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, int) and v >= 1 << 20:
        return f"{v / MiB:.0f} MiB"
    return str(v)


def _notes(r: dict[str, Any]) -> str:
    parts = []
    for k, v in r.items():
        if k in _SHOWN or isinstance(v, dict | list) or v is None:
            continue
        if k in ("peak_rss_bytes", "peak_rss", "rss_bytes", "peak_extra_bytes") and _num(v):
            parts.append(f"{k}={v / MiB:.0f} MiB")
        else:
            parts.append(f"{k}={_fmt_num(v)}")
    return ", ".join(parts)


COLUMNS = ["workload", "impl", "time", "GB/s", "x raw", "ratio", "target", "met", "notes"]


def table_cells(r: dict[str, Any]) -> list[str]:
    ratio = r.get("ratio")
    base = r.get("baseline")
    met = r.get("met")
    return [
        str(r["workload"]),
        str(r["impl"]),
        fmt_time(r.get("seconds")),
        f"{r['gbps']:.3g}" if _num(r.get("gbps")) else "",
        f"{r['vs_raw']:.3g}x {r['raw']}" if _num(r.get("vs_raw")) else "",
        (f"{ratio:.3g}x" + (f" vs {base}" if base else "")) if _num(ratio) else "",
        str(r.get("target") or ""),
        "" if met is None else ("yes" if met else "NO"),
        _notes(r),
    ]


def markdown_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        cells = [c.replace("|", "/") for c in table_cells(r)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def text_table(rows: list[dict[str, Any]]) -> str:
    cells = [COLUMNS] + [table_cells(r) for r in rows]
    # The notes column is left unpadded at the end of the line.
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS) - 1)]
    lines = []
    group = None
    for i, c in enumerate(cells):
        if i and rows[i - 1]["group"] != group:
            group = rows[i - 1]["group"]
            lines.append(f"-- {group} " + "-" * 60)
        lines.append("  ".join(x.ljust(w) for x, w in zip(c, widths, strict=False)) + "  " + c[-1])
    return "\n".join(lines)


def _label(r: dict[str, Any]) -> str:
    return textwrap.shorten(str(r["workload"]), 60) + "\n" + textwrap.shorten(str(r["impl"]), 60)


def draw_chart(rows: list[dict[str, Any]], machine: dict[str, Any], path: Path) -> str | None:
    """Draw the ratios and throughputs; return why not when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[bench]'): no chart"
    ratio_rows = [r for r in rows if _num(r.get("ratio"))]
    gbps_rows = [r for r in rows if _num(r.get("gbps")) and r["group"] != "raw"]
    height = 1.2 + 0.32 * (len(ratio_rows) + len(gbps_rows))
    fig, axes = plt.subplots(
        2,
        1,
        figsize=(12, max(height, 4)),
        gridspec_kw={"height_ratios": [max(len(ratio_rows), 1), max(len(gbps_rows), 1)]},
    )
    ax = axes[0]
    labels = [_label(r) for r in ratio_rows]
    values = [max(r["ratio"], 1e-3) for r in ratio_rows]
    colors = [
        "#999999" if r.get("met") is None else ("#2e7d32" if r["met"] else "#c62828")
        for r in ratio_rows
    ]
    y = list(range(len(ratio_rows)))
    ax.barh(y, values, color=colors)
    ax.set_yticks(y, labels, fontsize=6)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.axvline(1.0, color="black", linewidth=0.8)
    for yi, r, v in zip(y, ratio_rows, values, strict=True):
        ax.text(v, yi, f" {v:.3g}x", va="center", fontsize=6)
        target = str(r.get("target") or "")
        if target.startswith(">="):
            try:
                t = float(target[2:].strip().rstrip("x"))
            except ValueError:
                continue
            ax.plot([t, t], [yi - 0.4, yi + 0.4], color="black", linewidth=1.5)
    ax.set_title(
        "Speed relative to the baseline of the same run (green: target met, red: missed,"
        " black tick: target)",
        fontsize=8,
    )
    ax = axes[1]
    labels = [_label(r) for r in gbps_rows]
    y = list(range(len(gbps_rows)))
    ax.barh(y, [r["gbps"] for r in gbps_rows], color="#1565c0")
    ax.set_yticks(y, labels, fontsize=6)
    ax.invert_yaxis()
    ax.set_xscale("log")
    for r in rows:
        if r["group"] == "raw" and _num(r.get("gbps")):
            ax.axvline(r["gbps"], linestyle="--", color="#555555", linewidth=0.8)
            ax.text(r["gbps"], -0.6, f" {r['workload'].split()[0]}", fontsize=6)
    ax.set_title("Throughput, GB/s (dashed: memcpy and loopback socket)", fontsize=8)
    fig.suptitle(
        f"binproto benchmarks — {machine.get('cpu', '?')}, {machine.get('cores', '?')} cores,"
        f" Python {machine.get('python', '?')}, numpy {machine.get('numpy', '?')}",
        fontsize=9,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


# -- the machine -------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _mem_total() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def machine_info() -> dict[str, Any]:
    """What the numbers ran on."""
    try:
        usable: int | None = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        usable = os.cpu_count()
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "memory_bytes": _mem_total(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "binproto": _version("binproto"),
        "tritonclient": _version("tritonclient"),
        "kserve": _version("kserve"),
        # binproto parses JSON headers with orjson when it is installed.
        "orjson": _version("orjson"),
        "commit": _git("rev-parse", "--short", "HEAD"),
        "load_average_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def machine_line(m: dict[str, Any]) -> str:
    mem = f"{m['memory_bytes'] / GiB:.0f} GiB RAM" if m.get("memory_bytes") else "RAM ?"
    load = m.get("load_average_start")
    load_s = f", load average {load[0]:.2f} at start" if load else ""
    return (
        f"{m['cpu']}, {m['cores']} cores ({m['usable_cores']} usable), {mem}, {m['os']},"
        f" Python {m['python']}, numpy {m['numpy']}, tritonclient {m['tritonclient']},"
        f" kserve {m['kserve']}, orjson {m.get('orjson')},"
        f" binproto {m['binproto']} ({m['commit']}){load_s}; {m['date']}"
    )


def update_readme(path: Path, block: str) -> bool:
    """Replace the text between the results markers of ``path``."""
    text = path.read_text()
    start, end = text.find(README_START), text.find(README_END)
    if start < 0 or end < start:
        return False
    path.write_text(text[: start + len(README_START)] + "\n" + block + "\n" + text[end:])
    return True


# -- main ----------------------------------------------------------------------------


def publish(report: dict[str, Any], args: argparse.Namespace) -> None:
    """Write the JSON, the Markdown table, the chart, and benchmarks/README.md's table."""
    rows, machine = report["rows"], report["machine"]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    md = args.json.with_suffix(".md")
    block = (
        f"Machine: {machine_line(machine)}. Run: `{report['mode']}` mode,"
        f" {report['seconds']:.0f} s.\n\n{markdown_table(rows)}\n"
    )
    chart = None
    if not args.no_chart:
        chart = args.chart or args.json.with_suffix(".png")
        why = draw_chart(rows, machine, chart)
        print(why or f"wrote {chart}")
        if why:
            chart = None

    def with_chart(where: Path) -> str:
        """The block with the chart linked relative to the directory ``where``."""
        if chart is None or not chart.resolve().is_relative_to(where):
            return block
        return block + f"\n![benchmark chart]({chart.resolve().relative_to(where).as_posix()})\n"

    md.write_text(with_chart(HERE))
    print(f"wrote {args.json} and {md}")
    if args.update_readme:
        # The project's README quotes a few headline ratios by hand instead.
        readme = HERE / "README.md"
        if update_readme(readme, with_chart(readme.parent)):
            print(f"updated {readme}")
        else:
            print(f"{readme} has no results markers: not updated", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """The ``python -m benchmarks.run`` command."""
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.run", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats (~1 min)")
    ap.add_argument("--tiny", action="store_true", help="a few KiB, one repeat (smoke test)")
    ap.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help="run only this module (parser, encode, loopback, asgi, ...); repeatable;"
        " the raw baselines always run",
    )
    ap.add_argument("--json", type=Path, default=RESULTS / "latest.json", metavar="PATH")
    ap.add_argument(
        "--chart", type=Path, default=None, metavar="PATH", help="PNG (default: next to the JSON)"
    )
    ap.add_argument("--no-chart", action="store_true")
    ap.add_argument(
        "--update-readme",
        action="store_true",
        help="put the table in benchmarks/README.md",
    )
    ap.add_argument(
        "--replay", type=Path, metavar="JSON", help="redo table, chart and README from a saved run"
    )
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        return worker(args.worker, args.mode or "full", args.out)

    if args.replay:
        saved: dict[str, Any] = json.loads(args.replay.read_text())
        print(text_table(saved["rows"]))
        publish(saved, args)
        return 0

    run_mode = "tiny" if args.tiny else "quick" if args.quick else "full"
    names = discover()
    if args.only:
        wanted = {w.removeprefix("bench_") for item in args.only for w in item.split(",")}
        unknown = wanted - set(names)
        if unknown:
            ap.error(
                f"no benchmark module named {', '.join(sorted(unknown))} (have: {', '.join(names)})"
            )
        names = [n for n in names if n == "raw" or n in wanted]

    machine = machine_info()
    print(f"binproto benchmarks, {run_mode} mode, modules: {', '.join(names)}", flush=True)
    print(machine_line(machine), flush=True)
    t0 = time.perf_counter()
    modules = []
    rows: list[dict[str, Any]] = []
    for name in names:
        print(f"== {name} ...", flush=True)
        result = run_module(name, run_mode)
        status = "error" if "error" in result else f"{len(result.get('rows', []))} rows"
        print(f"== {name}: {status} in {result['seconds']:.1f} s", flush=True)
        if "error" in result:
            print(result["error"], file=sys.stderr, flush=True)
        modules.append({k: v for k, v in result.items() if k != "rows"})
        rows += [normalize(name, r) for r in result.get("rows", [])]
    raw = add_raw_ratios(rows)
    machine["load_average_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    total = time.perf_counter() - t0

    print()
    print(text_table(rows))
    print(f"\n{run_mode} run: {total:.0f} s on {machine_line(machine)}")

    report = {
        "mode": run_mode,
        "seconds": total,
        "machine": machine,
        "raw_gbps": raw,
        "modules": modules,
        "rows": rows,
    }
    publish(_jsonable(report), args)
    return 1 if any("error" in m for m in modules) else 0


if __name__ == "__main__":
    sys.exit(main())
