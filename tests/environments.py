"""Virtual environments of their own, which some tests build from the
package index because what they hold conflicts with the test extra.

| Environment | Used by | Holds | Rebuilt when |
|---|---|---|---|
| ``.venv-np1/`` | tests/test_numpy1.py | numpy 1, binproto[all] | pyproject.toml changes |
| ``.venv-triton/`` | tests/interop/triton_peer.py | nvidia-pytriton (numpy < 2) | its pin changes |
| ``.venv-ray/`` | tests/test_ray_serve.py | Ray Serve (protobuf 7) | pyproject.toml changes |

Each is built on first use, by one process at a time (a file lock beside
it): the other pytest-xdist workers wait for that build and reuse it.
binproto is installed from a copy of the checkout, since a build writes
into its source folder, which another build may be using at the same time.

``.ci/run`` starts the builds beside its own install, one process each::

    python3 -m tests.environments numpy1
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class Unavailable(Exception):
    """The environment cannot be built here (no package index...)."""


def run(command: Sequence[str | Path], timeout: float) -> None:
    """Run ``command``; raise :class:`Unavailable` with pip's errors if it fails."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unavailable(f"{' '.join(map(str, command))}: {exc}") from exc
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        errors = [line.strip() for line in lines if "ERROR:" in line] or lines[-5:]
        raise Unavailable(f"{' '.join(map(str, command))} exited {done.returncode}: {errors}")


def python_of(venv: Path) -> Path:
    """The Python of the virtual environment ``venv``."""
    return venv / "bin" / "python"


def build(venv: Path, wanted: str, requirements: Callable[[Path], list[str]]) -> Path:
    """The Python of ``venv``, built first unless it was built for ``wanted``.

    ``requirements(source)`` gives pip's arguments; ``source`` is a copy of the
    checkout to install binproto from. Raises :class:`Unavailable`.
    """
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = venv / "binproto.stamp"  # what it was built for
        if python_of(venv).exists() and stamp.exists() and stamp.read_text() == wanted:
            return python_of(venv)
        shutil.rmtree(venv, ignore_errors=True)
        run([sys.executable, "-m", "venv", venv], timeout=120)
        with tempfile.TemporaryDirectory() as tmp:
            source = Path(tmp) / "binproto"
            shutil.copytree(ROOT / "binproto", source / "binproto")
            for name in ("pyproject.toml", "README.md", "LICENSE"):
                shutil.copy2(ROOT / name, source / name)
            pip: list[str | Path] = [python_of(venv), "-m", "pip", "install", "--quiet"]
            run([*pip, "--disable-pip-version-check", *requirements(source)], timeout=1200)
        stamp.write_text(wanted)
        return python_of(venv)


def main(argv: Sequence[str]) -> None:
    """Build the environments named in ``argv`` (``numpy1``, ``triton``, ``ray``)."""
    # Imported here: each builder's module imports this one.
    from tests import numpy1_env, ray_env
    from tests.interop import triton_peer

    builders: dict[str, Callable[[], Path]] = {
        "numpy1": numpy1_env.numpy1_environment,
        "triton": triton_peer.triton_environment,
        "ray": ray_env.ray_environment,
    }
    unknown = sorted(set(argv) - set(builders))
    if unknown:
        raise SystemExit(f"unknown environments {unknown}: choose from {sorted(builders)}")
    for name in argv:
        try:
            print(builders[name]())
        except Unavailable as exc:
            print(f"no {name} environment: {exc}", file=sys.stderr)


if __name__ == "__main__":
    # Through the module's importable name: the builders' modules import it
    # by that name, and their errors must be its Unavailable, not __main__'s.
    from tests.environments import main as _main

    _main(sys.argv[1:])
