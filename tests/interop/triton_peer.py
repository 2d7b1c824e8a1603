"""Run a real Triton Inference Server on 127.0.0.1 with identity models.

The ``nvidia-pytriton`` wheel bundles a ``tritonserver`` binary and its python
backend. It pins numpy < 2, so it lives apart from the test environment:
:func:`triton_environment` installs it, without its dependencies, in a
virtual environment of its own (``.venv-triton/``, tests/environments.py) on
first use. :func:`start_triton` runs that binary directly (pytriton's Python API is
never imported) on a model repository it writes: one python-backend identity
model per datatype, ``identity_<datatype>`` (``identity_fp32``,
``identity_bytes``...), with inputs ``INPUT0`` and optional ``INPUT1`` of any
1-D shape, returned as ``OUTPUT0`` and ``OUTPUT1``.

The python backend's stub embeds the system's libpython, so its models import
the system's numpy, which must be numpy 1 (Debian's ``python3-numpy``): with
numpy 2 the models read their inputs as zeros. :func:`triton_unavailable` says
why Triton cannot run on this machine, or None.

Usable outside pytest (the throughput benchmark starts it too)::

    with start_triton(Path(tmp)) as triton:
        url = triton.url  # http://127.0.0.1:PORT
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..environments import ROOT, Unavailable, build

#: Every datatype Triton's python backend carries (it has no BF16 in numpy).
DATATYPES = (
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BYTES",
)

#: The interpreter whose libpython and numpy the python backend's stub uses.
SYSTEM_PYTHON = "/usr/bin/python3"

#: The wheel that bundles Triton 2.51. Pinned: what Triton accepts changes
#: between releases (docs/interop.md).
TRITON_WHEEL = "nvidia-pytriton==0.7.0"

#: Where that wheel is installed; ``BINPROTO_TRITON_VENV`` names another place.
VENV = Path(os.environ.get("BINPROTO_TRITON_VENV") or ROOT / ".venv-triton")

_MODEL_PY = '''\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Each input INPUTn comes back as OUTPUTn, the same datatype and shape."""

    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = []
            for n in ("0", "1"):
                t = pb_utils.get_input_tensor_by_name(request, "INPUT" + n)
                if t is not None:
                    outputs.append(
                        pb_utils.Tensor("OUTPUT" + n, np.array(t.as_numpy(), copy=True))
                    )
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
'''


#: The model with a single input (INPUT0, FP32): Triton takes raw binary
#: requests (``Inference-Header-Content-Length: 0``) only for such models.
SINGLE_INPUT_MODEL = "single_fp32"


def model_name(datatype: str) -> str:
    """The identity model of ``datatype``: ``identity_fp32`` for FP32."""
    return f"identity_{datatype.lower()}"


def _config(datatype: str, name: str, inputs: int = 2) -> str:
    triton_type = "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"
    tensors = {
        "input": [("INPUT0", False), ("INPUT1", True)][:inputs],
        "output": [("OUTPUT0", False), ("OUTPUT1", False)][:inputs],
    }
    parts = [f'name: "{name}"', 'backend: "python"', "max_batch_size: 0"]
    for kind, entries in tensors.items():
        items = []
        for name, optional in entries:
            extra = " optional: true" if optional else ""
            items.append(f'  {{ name: "{name}" data_type: {triton_type} dims: [ -1 ]{extra} }}')
        parts.append(f"{kind} [\n" + ",\n".join(items) + "\n]")
    # One instance: a python-backend instance is a process, and cores are few.
    parts.append("instance_group [ { count: 1 kind: KIND_CPU } ]")
    return "\n".join(parts) + "\n"


def write_models(
    repo: Path, datatypes: Iterable[str] = DATATYPES, *, single_input: bool = True
) -> list[str]:
    """Write one identity model per datatype into ``repo`` (and, with
    ``single_input``, :data:`SINGLE_INPUT_MODEL`); return their names."""
    models = [(model_name(dt), dt, 2) for dt in datatypes]
    if single_input:
        models.append((SINGLE_INPUT_MODEL, "FP32", 1))
    for name, datatype, inputs in models:
        (repo / name / "1").mkdir(parents=True, exist_ok=True)
        (repo / name / "config.pbtxt").write_text(_config(datatype, name, inputs))
        (repo / name / "1" / "model.py").write_text(_MODEL_PY)
    return [name for name, _, _ in models]


@dataclass(frozen=True)
class TritonInstall:
    """Where the wheel's ``tritonserver`` is, and the stub that fits this system."""

    server: Path  #: the ``tritonserver`` binary
    libs: Path  #: its bundled shared libraries (``nvidia_pytriton.libs``)
    python_backend: Path  #: ``backends/python`` of the wheel
    stub: Path  #: ``triton_python_backend_stub`` for the system's Python


def triton_environment() -> Path:
    """The ``pytriton`` package folder in :data:`VENV`, installed first when
    missing or of another version (see tests/environments.py).

    Only the wheel is installed: its dependencies serve pytriton's Python
    API, which is never imported. Raises ``Unavailable`` when pip fails.
    """
    build(VENV, TRITON_WHEEL, lambda source: ["--no-deps", TRITON_WHEEL])
    found = sorted(VENV.glob("lib/python3*/site-packages/pytriton"))
    if not found:
        raise Unavailable(f"{TRITON_WHEEL} installed no pytriton package in {VENV}")
    return found[0]


def find_triton() -> TritonInstall | str:
    """The Triton pieces in :data:`VENV` (installed on first use), or the
    reason Triton cannot run here."""
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        return "Triton's binary (nvidia-pytriton) is built for Linux x86_64 only"
    probe = (
        "import sys, numpy; "
        "print(f'{sys.version_info[0]}.{sys.version_info[1]}', numpy.__version__)"
    )
    try:
        done = subprocess.run(
            [SYSTEM_PYTHON, "-c", probe], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"Triton's python backend needs the system Python ({SYSTEM_PYTHON}): {exc}"
    if done.returncode != 0:
        return (
            "Triton's python backend needs numpy 1 in the system Python"
            f" (apt-get install python3-numpy): {done.stderr.strip().splitlines()[-1:]}"
        )
    version, numpy_version = done.stdout.split()
    if not numpy_version.startswith("1."):
        return f"Triton's python backend needs numpy 1 in {SYSTEM_PYTHON}, found {numpy_version}"
    try:
        package = triton_environment()
    except Unavailable as exc:
        return f"no Triton environment ({VENV}): {exc}"
    home = package / "tritonserver"
    libs = package.parent / "nvidia_pytriton.libs"
    server = home / "bin" / "tritonserver"
    if not server.exists():
        return f"nvidia-pytriton has no tritonserver binary at {server}"
    stub = home / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.exists():
        return f"nvidia-pytriton has no python backend stub for the system's Python {version}"
    ldd = subprocess.run(
        ["ldd", str(stub)], capture_output=True, text=True, timeout=30, check=False
    )
    if "not found" in ldd.stdout:
        missing = [line.strip() for line in ldd.stdout.splitlines() if "not found" in line]
        return f"Triton's python backend stub cannot load: {missing}"
    return TritonInstall(server, libs, home / "backends" / "python", stub)


def triton_unavailable() -> str | None:
    """Why Triton cannot run on this machine, or None when it can."""
    found = find_triton()
    return found if isinstance(found, str) else None


@dataclass(frozen=True)
class TritonPeer:
    """A running Triton server."""

    host: str
    port: int  #: its HTTP port
    models: tuple[str, ...]  #: the models it serves
    log: Path  #: its log file
    pid: int

    @property
    def url(self) -> str:
        """``http://host:port``."""
        return f"http://{self.host}:{self.port}"

    @property
    def address(self) -> str:
        """``host:port``, as tritonclient takes it."""
        return f"{self.host}:{self.port}"


class TritonStartError(RuntimeError):
    """Triton did not become ready; the message ends with its log."""


def _free_ports(count: int) -> list[int]:
    """``count`` ports that were free on 127.0.0.1 a moment ago."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/v2/health/ready", timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _log_tail(log: Path, size: int = 6000) -> str:
    text = log.read_text(errors="replace") if log.exists() else "(no log)"
    return text[-size:]


@contextlib.contextmanager
def start_triton(
    workdir: Path,
    *,
    datatypes: Iterable[str] = DATATYPES,
    single_input: bool = True,
    timeout: float = 180.0,
    attempts: int = 3,
) -> Iterator[TritonPeer]:
    """Run Triton on 127.0.0.1 with an identity model per datatype (and, with
    ``single_input``, :data:`SINGLE_INPUT_MODEL`); stop it on exit.

    ``workdir`` receives the model repository, a copy of the python backend
    with its stub, and ``triton.log``. Waits until ``/v2/health/ready`` answers
    200 (``timeout`` seconds, else :class:`TritonStartError` holding the log).
    A port taken between choosing and binding it is retried ``attempts`` times.
    Raises :class:`TritonStartError` at once when Triton cannot run here.
    """
    found = find_triton()
    if isinstance(found, str):
        raise TritonStartError(found)
    repo = workdir / "models"
    models = tuple(write_models(repo, datatypes, single_input=single_input))
    # The backend directory is a copy, so the stub can sit beside the backend
    # without writing into the installed package.
    backends = workdir / "backends"
    python_backend = backends / "python"
    if not python_backend.exists():
        shutil.copytree(found.python_backend, python_backend)
        shutil.copy2(found.stub, python_backend / "triton_python_backend_stub")
    # The stub's embedded Python finds its prefix through PATH: with a virtual
    # environment's python first there, it would import that environment's
    # numpy (often numpy 2) instead of the system's.
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH", "PYTHONSTARTUP", "CONDA_PREFIX")
    }
    env.update(
        PATH=os.pathsep.join([os.path.dirname(SYSTEM_PYTHON), "/bin"]),
        LD_LIBRARY_PATH=os.pathsep.join(
            p for p in (str(found.libs), os.environ.get("LD_LIBRARY_PATH", "")) if p
        ),
        PYTHONPATH=str(python_backend),
        PYTHONNOUSERSITE="1",
    )
    for attempt in range(attempts):
        port, grpc_port, metrics_port = _free_ports(3)
        log = workdir / f"triton-{attempt}.log"
        command = [
            str(found.server),
            f"--model-repository={repo}",
            f"--backend-directory={backends}",
            "--http-address=127.0.0.1",
            f"--http-port={port}",
            f"--grpc-port={grpc_port}",
            f"--metrics-port={metrics_port}",
            "--allow-grpc=false",
            "--allow-metrics=false",
            "--log-verbose=0",
        ]
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its model stubs go with it, see _stop
            )
        peer = TritonPeer("127.0.0.1", port, models, log, proc.pid)
        try:
            deadline = time.monotonic() + timeout
            while not _ready(peer.url):
                if proc.poll() is not None:
                    text = _log_tail(log)
                    if "ddress already in use" in text and attempt + 1 < attempts:
                        break
                    raise TritonStartError(
                        f"tritonserver exited with {proc.returncode} before it was ready"
                        f"\n--- Triton log ({log}) ---\n{text}"
                    )
                if time.monotonic() > deadline:
                    raise TritonStartError(
                        f"tritonserver was not ready within {timeout:.0f} s"
                        f"\n--- Triton log ({log}) ---\n{_log_tail(log)}"
                    )
                time.sleep(0.25)
            else:
                yield peer
                return
        finally:
            _stop(proc)
    raise TritonStartError(f"no free port for tritonserver after {attempts} attempts")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop Triton: SIGTERM, then SIGKILL to its process group (its python
    backend stubs too) if it has not exited in 30 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
