"""Replay the fuzz target's seed corpus and saved regression inputs."""

from __future__ import annotations

from pathlib import Path

import pytest

FUZZ_DIR = Path(__file__).resolve().parent / "fuzz"
INPUTS = sorted(
    p
    for d in ("corpus", "regressions")
    if (FUZZ_DIR / d).is_dir()
    for p in (FUZZ_DIR / d).iterdir()
)


@pytest.mark.parametrize("path", INPUTS, ids=[p.name for p in INPUTS])
def test_fuzz_input(path: Path) -> None:
    pytest.importorskip("atheris")  # the target's input format is atheris's
    import tests.fuzz.fuzz_parser as target

    target.test_one_input(path.read_bytes())
