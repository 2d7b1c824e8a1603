"""The Ray environment, ``.venv-ray/``, that tests/test_ray_serve.py runs
tests/ray_check.py in (see tests/environments.py).

Ray pulls protobuf 7, which the test extra's kserve and grpcio-tools refuse.
It holds binproto's ``ray-test`` extra. ``BINPROTO_RAY_VENV`` names another
place.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from .environments import ROOT, build

VENV = Path(os.environ.get("BINPROTO_RAY_VENV") or ROOT / ".venv-ray")


def ray_environment() -> Path:
    """The Python of ``.venv-ray/``, built first when missing or out of date."""
    wanted = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    return build(VENV, wanted, lambda source: [f"{source}[ray-test]"])
