"""The command line and examples as a new user meets them: Ctrl-C, a core-only
install, a closed pipe, help texts. Each runs the command in a subprocess and
checks its exit status and that no traceback is printed."""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import binproto

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _default_sigint() -> None:
    # A shell that starts a job in the background makes it ignore SIGINT, and
    # Python keeps an ignored SIGINT ignored: give the child Ctrl-C back.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupted_after_start(argv: list[str], ready: bytes) -> subprocess.CompletedProcess[bytes]:
    """Start ``argv``, wait until its output holds ``ready``, press Ctrl-C."""
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_default_sigint,
    )
    assert proc.stdout is not None
    seen = b""
    deadline = time.monotonic() + 60
    while ready not in seen:
        line = proc.stdout.readline()
        if not line or time.monotonic() > deadline:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"did not start: {seen + out!r} {err!r}")
        seen += line
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    return subprocess.CompletedProcess(argv, proc.returncode, seen + out, err)


@pytest.mark.parametrize(
    ("argv", "ready"),
    [
        ([sys.executable, "-m", "binproto", "serve", "--port", "0"], b"serving"),
        (
            [sys.executable, "-m", "binproto", "serve", "--backend", "trio", "--port", "0"],
            b"serving",
        ),
        ([sys.executable, "examples/trio_server.py", "--port", "0"], b"serving"),
    ],
    ids=["serve-asyncio", "serve-trio", "trio-example"],
)
def test_ctrl_c_stops_a_server_quietly(argv: list[str], ready: bytes) -> None:
    result = _interrupted_after_start(argv, ready)
    assert result.returncode == 0, result.stderr
    assert b"Traceback" not in result.stderr and b"KeyboardInterrupt" not in result.stderr


@pytest.mark.skipif(not socket.has_ipv6, reason="needs IPv6")
def test_serve_brackets_an_ipv6_address_in_its_url() -> None:
    argv = [sys.executable, "-m", "binproto", "serve", "--host", "::1", "--port", "0"]
    result = _interrupted_after_start(argv, b"serving")
    assert result.returncode == 0, result.stderr
    assert b"serving V2 on http://[::1]:" in result.stdout, result.stdout


def test_ctrl_c_stops_the_fastapi_example_quietly() -> None:
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    argv = [sys.executable, "examples/fastapi_server.py", "--fd", str(sock.fileno())]
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=ENV,
        pass_fds=[sock.fileno()],
        stderr=subprocess.PIPE,
        preexec_fn=_default_sigint,
    )
    port = sock.getsockname()[1]
    sock.close()
    import httpx

    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready").status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert b"Traceback" not in err


# A core-only install: the adapters' libraries are absent (None in sys.modules
# makes their import fail as a missing module does).
_WITHOUT = "import sys\nfor m in ('h11', 'trio', 'httpx'): sys.modules[m] = None\n"


@pytest.mark.parametrize(
    "argv",
    [["serve", "--port", "0"], ["serve", "--backend", "trio", "--port", "0"], ["demo"]],
    ids=["serve", "serve-trio", "demo"],
)
def test_a_command_without_its_extra_names_it(argv: list[str]) -> None:
    code = _WITHOUT + "from binproto.cli import main\nsys.exit(main(sys.argv[1:]))"
    result = subprocess.run(
        [sys.executable, "-c", code, *argv], env=ENV, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert 'pip install "binproto[h11]"' in result.stderr


@pytest.mark.parametrize(
    ("module", "extra"),
    [("asyncio", "h11"), ("h11", "h11"), ("trio", "trio"), ("httpx", "httpx")],
)
def test_an_adapter_without_its_extra_names_it(module: str, extra: str) -> None:
    code = _WITHOUT + f"import binproto.adapters.{module}"
    result = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError: No module named")
    assert f'pip install "binproto[{extra}]"' in last


def test_inspect_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    inputs = {f"t{i}": np.arange(i + 3, dtype=np.float32) for i in range(200)}
    body = binproto.encode_request(inputs)
    path = tmp_path / "body.bin"
    path.write_bytes(b"".join(bytes(b) for b in body.buffers))
    command = (
        f"{sys.executable} -m binproto inspect {path}"
        f" --header-length {body.header_length} | head -1"
    )
    result = subprocess.run(
        ["bash", "-o", "pipefail", "-c", command], env=ENV, capture_output=True, text=True
    )
    assert result.stdout.count("\n") == 1
    assert result.stderr == ""
    assert result.returncode == 0


def test_every_option_of_encode_and_inspect_has_help() -> None:
    for command in ("encode", "inspect"):
        result = subprocess.run(
            [sys.executable, "-m", "binproto", command, "--help"],
            env=ENV,
            capture_output=True,
            text=True,
            check=True,
        )
        assert "whether the body" in result.stdout or "request or a response" in result.stdout


def test_clients_wait_300_seconds_at_most_by_default() -> None:
    import inspect

    from binproto.adapters import asyncio as aio
    from binproto.adapters import trio as trio_adapter
    from binproto.adapters._client import CLIENT_TIMEOUT

    assert CLIENT_TIMEOUT == 300
    for client in (aio.Client, trio_adapter.Client):
        assert inspect.signature(client).parameters["timeout"].default == CLIENT_TIMEOUT


@pytest.mark.parametrize(
    ("delta", "says"),
    [
        (-1, "the JSON header was cut off at byte"),
        (+1, "the JSON ends at byte"),
        (None, "binary data in the first"),
    ],
    ids=["one short", "one long", "no header length"],
)
def test_a_header_length_mistake_is_pointed_at(delta: int | None, says: str) -> None:
    body = binproto.encode_request({"x": np.arange(4, dtype=np.float32)})
    data = b"".join(bytes(b) for b in body.buffers)
    assert body.header_length is not None
    length = None if delta is None else body.header_length + delta
    with pytest.raises(binproto.RemoteProtocolError) as exc:
        binproto.decode_request(data, header_length=length)
    assert says in str(exc.value)
    assert "check Inference-Header-Content-Length" in str(exc.value)


def test_a_header_longer_than_the_body_says_where_the_body_ends() -> None:
    body = binproto.encode_request({"x": np.arange(4, dtype=np.float32)})
    data = b"".join(bytes(b) for b in body.buffers)
    with pytest.raises(binproto.RemoteProtocolError) as exc:
        binproto.decode_request(data, header_length=len(data) + 10)
    assert f"longer than the {len(data)}-byte body" in str(exc.value)
    assert exc.value.offset == len(data)


def test_inspect_without_the_header_length_points_at_it(tmp_path: Path) -> None:
    body = binproto.encode_request({"x": np.arange(4, dtype=np.float32)})
    path = tmp_path / "body.bin"
    path.write_bytes(b"".join(bytes(b) for b in body.buffers))
    result = subprocess.run(
        [sys.executable, "-m", "binproto", "inspect", str(path)],
        env=ENV,
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "Inference-Header-Content-Length" in result.stdout + result.stderr


def _cli(
    *args: str, cwd: Path = ROOT, file_limit: int | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the command; with ``file_limit``, files it writes are limited to that
    many bytes (writing more: EFBIG, as on a full disk; Python ignores the
    SIGXFSZ that would kill it)."""

    def limit_files() -> None:
        if file_limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))

    return subprocess.run(
        [sys.executable, "-m", "binproto", *args],
        cwd=cwd,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=limit_files,
    )


def _one_line_error(result: subprocess.CompletedProcess[str], command: str, says: str) -> None:
    assert result.returncode in (1, 2), result
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"binproto {command}"), result.stderr
    assert says in result.stderr, result.stderr


def test_bad_files_and_outputs_are_one_line_errors(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.arange(3, dtype=np.float32))
    (tmp_path / "empty.npy").write_bytes(b"")
    (tmp_path / "bad.npz").write_bytes(b"PK\x03\x04garbage")
    cases = [
        (["encode", "x=empty.npy", "-o", "o.bin"], "cannot load 'empty.npy'"),
        (["encode", "x=bad.npz", "-o", "o.bin"], "cannot load 'bad.npz'"),
        (["encode", "x=a.npy", "-o", "no/such/dir/o.bin"], "No such file or directory"),
        (["encode", "x=a.npy", "-o", "."], "Is a directory"),
        (["encode", "x=a.npy", "x=a.npy", "-o", "o.bin"], "given more than once: ['x']"),
    ]
    for argv, says in cases:
        _one_line_error(_cli(*argv, cwd=tmp_path), "encode", says)


def test_a_failed_encode_leaves_no_half_written_file(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.zeros(4096, dtype=np.float32))
    (tmp_path / "o.bin").write_bytes(b"earlier body")
    (tmp_path / "o.h").write_bytes(b"earlier headers")
    before = sorted(os.listdir(tmp_path))
    # A 16 KiB body over an 8 KiB limit: the write fails part way.
    result = _cli("encode", "x=a.npy", "-o", "o.bin", cwd=tmp_path, file_limit=8192)
    _one_line_error(result, "encode", "File too large: 'o.bin'")
    assert result.returncode == 1
    assert (tmp_path / "o.bin").read_bytes() == b"earlier body"
    # The headers file too (the body, to stdout, is no file).
    result = _cli("encode", "x=a.npy", "--headers-out", "o.h", cwd=tmp_path, file_limit=40)
    _one_line_error(result, "encode", "File too large: 'o.h'")
    assert (tmp_path / "o.h").read_bytes() == b"earlier headers"
    assert sorted(os.listdir(tmp_path)) == before  # no temporary file left behind
    # A successful encode replaces both, as a new file of the usual mode.
    done = _cli("encode", "x=a.npy", "-o", "o.bin", "--headers-out", "o.h", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "o.bin").stat().st_size > 16384
    assert "Content-Length: " in (tmp_path / "o.h").read_text()
    assert sorted(os.listdir(tmp_path)) == before
    assert (tmp_path / "o.bin").stat().st_mode & 0o777 == (
        tmp_path / "a.npy"
    ).stat().st_mode & 0o777


def test_an_encode_over_a_file_keeps_its_mode_and_its_hard_links(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.zeros(4, dtype=np.float32))
    private = tmp_path / "private.bin"
    private.write_bytes(b"old")
    private.chmod(0o600)
    done = _cli("encode", "x=a.npy", "-o", "private.bin", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert private.stat().st_mode & 0o777 == 0o600  # not made readable to others
    assert private.read_bytes().startswith(b"{")
    shared = tmp_path / "shared.bin"
    shared.write_bytes(b"old")
    os.link(shared, tmp_path / "other-name.bin")
    done = _cli("encode", "x=a.npy", "-o", "shared.bin", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "other-name.bin").read_bytes() == shared.read_bytes()
    assert shared.read_bytes().startswith(b"{")


def test_a_new_file_takes_the_umask_without_encode_changing_it(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.zeros(4, dtype=np.float32))
    done = subprocess.run(
        ["sh", "-c", f"umask 027 && exec {sys.executable} -m binproto encode x=a.npy -o new.bin"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "new.bin").stat().st_mode & 0o777 == 0o640


def test_encode_writes_through_a_symlink_and_into_a_device(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.zeros(4, dtype=np.float32))
    (tmp_path / "body.bin").write_bytes(b"old")
    (tmp_path / "link.bin").symlink_to("body.bin")
    done = _cli("encode", "x=a.npy", "-o", os.devnull, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert not os.path.isfile(os.devnull)  # written to, not replaced by a file
    done = _cli("encode", "x=a.npy", "-o", "link.bin", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "link.bin").is_symlink()
    assert (tmp_path / "body.bin").read_bytes().startswith(b"{")


@pytest.mark.parametrize(
    ("argv", "closed", "code", "says"),
    [
        (["encode", "x=a.npy"], ">&-", 1, "binproto encode: standard output is closed"),
        (
            ["inspect", "-"],
            "<&-",
            2,
            "binproto inspect: cannot read body '-': standard input is closed",
        ),
        (["inspect", "a.npy"], ">&-", 1, "binproto inspect: standard output is closed"),
        (["encode", "x=a.npy"], "2>&-", 1, ""),  # (no stderr to say it on)
    ],
)
def test_a_closed_standard_stream_is_one_line(
    argv: list[str], closed: str, code: int, says: str, tmp_path: Path
) -> None:
    np.save(tmp_path / "a.npy", np.zeros(4, dtype=np.float32))
    # The shell starts the command with the stream closed: sys.stdout etc. are None.
    command = [sys.executable, "-m", "binproto", *argv]
    result = subprocess.run(
        ["sh", "-c", f'exec "$@" {closed}', "sh", *command],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == code, result.stderr
    assert result.stderr.decode() == (says and says + "\n")
    if closed == "2>&-":  # stdout holds the body, and nothing else
        assert result.stdout.endswith(bytes(16)) and b"binproto" not in result.stdout


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_an_address_that_cannot_be_served_is_a_one_line_error(backend: str) -> None:
    _one_line_error(_cli("serve", "--port", "99999"), "serve", "a port is 0 to 65535")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        result = _cli("serve", "--backend", backend, "--port", port)
    _one_line_error(result, "serve", "in use")


def test_inspect_json_of_infinities_is_json(tmp_path: Path) -> None:
    np.save(tmp_path / "pn.npy", np.array([np.inf, -np.inf], dtype=np.float32))
    encoded = _cli("encode", "x=pn.npy", "-o", "pn.bin", "--headers-out", "pn.h", cwd=tmp_path)
    assert encoded.returncode == 0, encoded.stderr
    result = _cli("inspect", "pn.bin", "--headers", "pn.h", "--json", cwd=tmp_path)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    summary = json.loads(result.stdout, parse_constant=lambda token: pytest.fail(token))
    assert summary["tensors"][0]["mean"] == "nan"


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")
def test_an_encode_over_another_owners_or_a_setuid_file_keeps_owner_and_bits(
    tmp_path: Path,
) -> None:
    # A new file put in its place would be root's, with root's group, and
    # would carry the setuid bit to root.
    np.save(tmp_path / "a.npy", np.zeros(4, dtype=np.float32))
    theirs = tmp_path / "theirs.bin"
    theirs.write_bytes(b"old")
    os.chown(theirs, 12345, 12345)
    theirs.chmod(0o660)
    setuid = tmp_path / "setuid.bin"
    setuid.write_bytes(b"old")
    setuid.chmod(0o4755)
    for target in (theirs, setuid):
        before = target.stat()
        done = _cli("encode", "x=a.npy", "-o", target.name, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        after = target.stat()
        assert (after.st_uid, after.st_gid, after.st_mode) == (
            before.st_uid,
            before.st_gid,
            before.st_mode,
        )
        assert after.st_ino == before.st_ino and target.read_bytes().startswith(b"{")


def test_an_output_path_that_cannot_be_resolved_is_named_as_given(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.zeros(4, dtype=np.float32))
    (tmp_path / "loop1").symlink_to("loop2")
    (tmp_path / "loop2").symlink_to("loop1")
    result = _cli("encode", "x=a.npy", "-o", "loop1", cwd=tmp_path)
    _one_line_error(result, "encode", "'loop1'")
    assert str(tmp_path) not in result.stderr


def test_an_encode_over_a_file_where_os_has_no_user_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (Windows: no os.geteuid; the file is replaced as on any other platform)
    from binproto.cli import main

    np.save(tmp_path / "a.npy", np.zeros(4, dtype=np.float32))
    (tmp_path / "o.bin").write_bytes(b"old")
    before = (tmp_path / "o.bin").stat().st_ino
    monkeypatch.delattr(os, "geteuid")
    monkeypatch.delattr(os, "getegid")
    monkeypatch.chdir(tmp_path)
    assert main(["encode", "x=a.npy", "-o", "o.bin", "--headers-out", "o.h"]) == 0
    assert (tmp_path / "o.bin").read_bytes().startswith(b"{")
    assert (tmp_path / "o.bin").stat().st_ino != before  # a new file put in place
