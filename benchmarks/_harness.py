"""Shared helpers for the benchmark modules: run mode, interleaved timing, rows.

Every workload module exposes ``run(quick: bool) -> list[dict]``. The runner
(``python -m benchmarks.run``) calls it in a fresh process per module, so peak
RSS figures are per module, and sets ``BINPROTO_BENCH_MODE`` to ``full``,
``quick`` or ``tiny`` (a few KiB, one repeat: for the smoke test) before it
does. Modules that know the tiny mode read it with :func:`mode`.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["MODE_ENV", "Row", "interleave", "median", "mode", "pick", "row"]

MODE_ENV = "BINPROTO_BENCH_MODE"

Row = dict[str, Any]


def mode(quick: bool) -> str:
    """``"full"``, ``"quick"`` or ``"tiny"``: the runner's mode, else from ``quick``."""
    value = os.environ.get(MODE_ENV)
    if value in ("full", "quick", "tiny"):
        return value
    return "quick" if quick else "full"


def pick(current: str, *, full: Any, quick: Any, tiny: Any) -> Any:
    """The value for the current mode."""
    return {"full": full, "quick": quick, "tiny": tiny}[current]


def median(values: list[float]) -> float:
    """Median of a non-empty list."""
    return statistics.median(values)


def interleave(
    cases: Mapping[str, Callable[[], object]],
    repeats: int,
    *,
    setup: Callable[[], object] | None = None,
    warmup: bool = True,
) -> dict[str, list[float]]:
    """Time each case ``repeats`` times, round-robin, and return seconds per case.

    The machine's speed drifts, so compared cases alternate within each round
    rather than running back to back; ratios are best taken per round (see
    :func:`row`). The garbage collector is paused while a case runs. ``setup``
    runs untimed before each case (e.g. to reset a destination).
    """
    times: dict[str, list[float]] = {name: [] for name in cases}
    if warmup:
        for fn in cases.values():
            if setup is not None:
                setup()
            fn()
    for r in range(repeats):
        # Alternate the order each round so no case always runs first.
        names = list(cases) if r % 2 == 0 else list(reversed(list(cases)))
        for name in names:
            if setup is not None:
                setup()
            gc.collect()
            gc.disable()
            try:
                t0 = time.perf_counter()
                cases[name]()
                t1 = time.perf_counter()
            finally:
                gc.enable()
            times[name].append(t1 - t0)
    return times


def row(
    workload: str,
    impl: str,
    samples: list[float],
    *,
    nbytes: int | None = None,
    baseline: str | None = None,
    baseline_samples: list[float] | None = None,
    min_ratio: float | None = None,
    per: float = 1.0,
    **extra: Any,
) -> Row:
    """One result row: the median of ``samples`` seconds per operation.

    ``per`` divides each sample (a sample that timed ``per`` operations).
    ``ratio`` is the speed relative to ``baseline`` (> 1: faster than it),
    the median of the per-round ratios when both have the same number of
    samples. ``min_ratio`` sets ``target`` (its text) and ``met`` (whether the
    ratio reached it); other targets are passed as ``target=`` and ``met=``.
    """
    secs = [s / per for s in samples]
    out: Row = {
        "workload": workload,
        "impl": impl,
        "seconds": median(secs),
        "min_seconds": min(secs),
        "samples": secs,
        "repeats": len(secs),
    }
    if nbytes is not None:
        out["bytes"] = nbytes
        out["gbps"] = nbytes / out["seconds"] / 1e9 if out["seconds"] > 0 else None
    if baseline is not None and baseline_samples is not None:
        base = [s / per for s in baseline_samples]
        out["baseline"] = baseline
        out["baseline_seconds"] = median(base)
        if len(base) == len(secs):
            out["ratio"] = median([b / s for b, s in zip(base, secs, strict=True) if s > 0])
        else:
            out["ratio"] = median(base) / out["seconds"]
    if min_ratio is not None:
        out["target"] = f">= {min_ratio:g}x"
        out["met"] = bool(out.get("ratio") is not None and out["ratio"] >= min_ratio)
    out.update(extra)
    return out
