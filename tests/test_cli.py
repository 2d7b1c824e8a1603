"""The ``binproto`` command line: inspect and encode."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import binproto
from binproto.cli import _commands as _cli
from binproto.cli import main

ROOT = Path(__file__).resolve().parent.parent


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def inspect_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, Any, str]:
    code, out, err = run(["inspect", *argv, "--json"], capsys)
    return code, json.loads(out), err


@pytest.fixture
def arrays(tmp_path: Path) -> dict[str, np.ndarray[Any, Any]]:
    rng = np.random.default_rng(7)
    data: dict[str, np.ndarray[Any, Any]] = {
        "f32": rng.standard_normal((3, 5)).astype(np.float32),
        "i64": np.arange(-4, 6, dtype=np.int64).reshape(2, 5),
        "u8": np.array([9, 0, 255, 3], dtype=np.uint8),
        "flags": np.array([True, False, True, True]),
        "half": np.array([1.5, np.nan, -2.0], dtype=np.float16),
        "words": np.array([b"alpha", b"", b"\xffraw"]),
        "empty": np.zeros((0, 3), dtype=np.float32),
    }
    np.save(tmp_path / "f32.npy", data["f32"])
    rest = {k: v for k, v in data.items() if k != "f32"}
    np.savez(tmp_path / "many.npz", **rest)  # type: ignore[arg-type,unused-ignore]  # numpy 2's stub: allow_pickle
    return data


def encode_all(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> int:
    names = ["i64", "u8", "flags", "half", "words", "empty"]
    specs = [f"f32={tmp_path / 'f32.npy'}"] + [f"{n}={tmp_path / 'many.npz'}:{n}" for n in names]
    code, _, _ = run(
        [
            "encode",
            *specs,
            "-o",
            str(tmp_path / "body.bin"),
            "--headers-out",
            str(tmp_path / "body.headers"),
            *extra,
        ],
        capsys,
    )
    return code


def test_encode_then_inspect_round_trip(
    tmp_path: Path, arrays: dict[str, np.ndarray[Any, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert encode_all(tmp_path, capsys, "--json-inputs", "i64", "--model-name", "m") == 0
    headers = _cli.read_headers(str(tmp_path / "body.headers"))
    body = (tmp_path / "body.bin").read_bytes()
    assert dict(headers)["Content-Length"] == str(len(body))

    # The body is what the library itself decodes to the same arrays.
    decoded = binproto.decode_request(body, header_length=binproto.header_length_from(headers))
    assert decoded.header.model_name == "m"
    assert decoded.header.tensor("i64").binary_size is None  # sent as JSON data
    for name, array in arrays.items():
        got = decoded.tensors[name]
        assert got.shape == array.shape
        assert np.array_equal(got.astype(array.dtype), array, equal_nan=array.dtype.kind == "f")

    code, report, err = inspect_json(
        [str(tmp_path / "body.bin"), "--headers", str(tmp_path / "body.headers")], capsys
    )
    assert code == 0 and err == ""
    assert report["error"] is None
    assert report["body_bytes"] == len(body)
    assert report["header"] == decoded.header.raw
    by_name = {t["name"]: t for t in report["tensors"]}
    assert [t["name"] for t in report["tensors"]] == [
        "f32",
        "i64",
        "u8",
        "flags",
        "half",
        "words",
        "empty",
    ]

    f32 = by_name["f32"]
    assert (f32["datatype"], f32["shape"], f32["bytes"]) == ("FP32", [3, 5], 60)
    assert f32["first"] == pytest.approx(arrays["f32"].reshape(-1)[:8].tolist())
    assert f32["min"] == pytest.approx(float(arrays["f32"].min()))
    assert f32["max"] == pytest.approx(float(arrays["f32"].max()))
    assert f32["mean"] == pytest.approx(float(arrays["f32"].astype(np.float64).mean()))

    i64 = by_name["i64"]
    assert i64["where"] == "json"
    assert (i64["min"], i64["max"], i64["first"][:3]) == (-4, 5, [-4, -3, -2])
    assert by_name["u8"]["max"] == 255 and by_name["u8"]["mean"] == pytest.approx(66.75)
    assert by_name["flags"]["first"] == [True, False, True, True]
    assert by_name["flags"]["true"] == 3
    half = by_name["half"]
    assert (half["nan"], half["min"], half["max"]) == (1, -2.0, 1.5)
    assert by_name["words"]["first"] == [repr(b"alpha"), repr(b""), repr(b"\xffraw")]
    empty = by_name["empty"]
    assert (empty["shape"], empty["bytes"], empty["first"]) == ([0, 3], 0, [])
    assert "min" not in empty


def test_inspect_human_output(
    tmp_path: Path, arrays: dict[str, np.ndarray[Any, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert encode_all(tmp_path, capsys) == 0
    code, out, err = run(
        ["inspect", str(tmp_path / "body.bin"), "--headers", str(tmp_path / "body.headers")], capsys
    )
    assert code == 0 and err == ""
    assert '"datatype": "FP32"' in out
    assert "[0] f32  FP32  shape [3, 5]  60 bytes (binary)" in out
    assert "[3] flags  BOOL  shape [4]  4 bytes (binary)" in out
    assert "first: True, False, True, True" in out
    assert f"body: {(tmp_path / 'body.bin').stat().st_size} bytes, complete" in out


def test_inspect_reports_bool_fault_at_its_offset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    encoded = binproto.encode_request({"a": np.zeros(4, np.float32), "b": np.ones(6, np.bool_)})
    body = bytearray(bytes(encoded))
    assert encoded.header_length is not None
    bad = encoded.header_length + 16 + 4  # the fifth byte of 'b'
    body[bad] = 2
    (tmp_path / "bad.bin").write_bytes(body)
    code, report, err = inspect_json(
        [str(tmp_path / "bad.bin"), "--header-length", str(encoded.header_length)], capsys
    )
    assert code == 1
    assert report["error"]["offset"] == bad
    assert report["error"]["status_hint"] == 400
    assert "invalid BOOL value 2" in report["error"]["message"]
    assert f"RemoteProtocolError at byte {bad} (status hint 400)" in err
    # The header and the tensor completed before the fault are still shown.
    assert [t["name"] for t in report["tensors"]] == ["a"]
    assert report["header"]["inputs"][1]["name"] == "b"


def test_inspect_short_body_says_what_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    encoded = binproto.encode_request({"x": np.arange(100, dtype=np.float32)})
    body = bytes(encoded)
    (tmp_path / "short.bin").write_bytes(body[:-40])
    # The headers promise the full length; the file holds 40 bytes less.
    (tmp_path / "h.txt").write_text(
        "POST /v2/models/m/infer HTTP/1.1\n" + "".join(f"{n}: {v}\n" for n, v in encoded.headers)
    )
    code, report, _ = inspect_json(
        [str(tmp_path / "short.bin"), "--headers", str(tmp_path / "h.txt")], capsys
    )
    assert code == 1
    assert report["error"]["offset"] == len(body) - 40
    assert "expecting 40 additional bytes" in report["error"]["message"]
    assert report["tensors"] == []


def test_inspect_invalid_header_length_header(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "b.bin").write_bytes(b"{}")
    (tmp_path / "h.txt").write_text("Inference-Header-Content-Length: twelve\n")
    code, report, _ = inspect_json(
        [str(tmp_path / "b.bin"), "--headers", str(tmp_path / "h.txt")], capsys
    )
    assert code == 1
    assert "Unable to parse Inference-Header-Content-Length" in report["error"]["message"]
    assert report["header"] is None


def test_inspect_plain_json_response(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = {
        "model_name": "m",
        "outputs": [{"name": "y", "datatype": "INT32", "shape": [2, 2], "data": [[1, 2], [3, 9]]}],
    }
    (tmp_path / "r.json").write_text(json.dumps(doc))
    code, report, _ = inspect_json([str(tmp_path / "r.json"), "--kind", "response"], capsys)
    assert code == 0
    (y,) = report["tensors"]
    assert (y["where"], y["first"], y["min"], y["max"], y["mean"]) == (
        "json",
        [1, 2, 3, 9],
        1,
        9,
        3.75,
    )
    # The same body read as a request is missing its inputs: an error at byte 0.
    code, report, _ = inspect_json([str(tmp_path / "r.json")], capsys)
    assert code == 1 and report["error"]["offset"] == 0


def test_gzip_body_via_headers_and_via_flag(
    tmp_path: Path, arrays: dict[str, np.ndarray[Any, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert encode_all(tmp_path, capsys, "--encoding", "gzip") == 0
    headers = dict(_cli.read_headers(str(tmp_path / "body.headers")))
    compressed = (tmp_path / "body.bin").read_bytes()
    assert headers["Content-Encoding"] == "gzip"
    assert headers["Content-Length"] == str(len(compressed))
    plain = gzip.decompress(compressed)
    code, via_headers, _ = inspect_json(
        [str(tmp_path / "body.bin"), "--headers", str(tmp_path / "body.headers")], capsys
    )
    assert code == 0 and via_headers["body_bytes"] == len(plain)
    length = headers["Inference-Header-Content-Length"]
    code, via_flag, _ = inspect_json(
        [str(tmp_path / "body.bin"), "--header-length", length, "--encoding", "gzip"], capsys
    )
    assert code == 0 and via_flag == via_headers
    # Without the coding the compressed bytes are not a body: the header
    # length is over the (compressed) file's length.
    code, wrong, _ = inspect_json([str(tmp_path / "body.bin"), "--header-length", length], capsys)
    assert code == 1
    assert wrong["error"]["message"] == (
        f"inference header size should be in range (0, {len(compressed)}), got: {length}"
        f" (a header longer than the {len(compressed)}-byte body, which ends there)"
    )


def test_unknown_encoding_is_415(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "b.bin").write_bytes(b"{}")
    code, report, _ = inspect_json([str(tmp_path / "b.bin"), "--encoding", "br"], capsys)
    assert code == 1 and report["error"]["status_hint"] == 415


@pytest.mark.parametrize("size", [1, 3, 7, 4096])
def test_summary_does_not_depend_on_chunking(size: int) -> None:
    rng = np.random.default_rng(size)
    inputs: dict[str, Any] = {
        "a": rng.standard_normal(1000).astype(np.float64),
        "b": rng.integers(-5, 5, 333).astype(np.int16),
        "c": [b"x" * k for k in range(40)],
        "d": rng.standard_normal(20).astype(np.float16),
    }
    encoded = binproto.encode_request(inputs)
    body = bytes(encoded)

    def summarize(step: int) -> list[dict[str, Any]]:
        pieces = iter([body[i : i + step] for i in range(0, len(body), step)])
        parser = binproto.Parser("request", header_length=encoded.header_length)
        _, summaries, error, parsed = _cli.inspect_body(parser, pieces)
        assert error is None and parsed == len(body)
        return [s.as_dict() for s in summaries]

    def without_mean(summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in s.items() if k != "mean"} for s in summaries]

    whole, split = summarize(len(body)), summarize(size)
    assert without_mean(split) == without_mean(whole)
    # Means are float64 sums: equal up to rounding, whatever the chunking.
    for a, b in zip(split, whole, strict=True):
        assert a.get("mean", 0) == pytest.approx(b.get("mean", 0), rel=1e-12)
    assert whole[0]["mean"] == pytest.approx(float(inputs["a"].mean()))
    assert whole[2]["first"] == [repr(b"x" * k) for k in range(8)]


def test_statistics_of_a_tensor_larger_than_a_step() -> None:
    values = np.arange(_cli.STAT_STEP + 10, dtype=np.float32)
    values[-1] = -1.0
    encoded = binproto.encode_request({"v": values})
    header = binproto.decode_request(bytes(encoded), header_length=encoded.header_length).header
    summary = _cli.TensorSummary(header.tensors[0])
    summary.feed(values.view(np.uint8).data)
    out = summary.as_dict()
    assert out["min"] == -1.0 and out["max"] == float(_cli.STAT_STEP + 8)
    assert out["mean"] == pytest.approx(float(values.astype(np.float64).mean()))


def test_bf16_values_are_shown_as_floats(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    floats = np.array([1.0, -2.5, 3.0], dtype=np.float32)
    bits = (floats.view(np.uint32) >> 16).astype(np.uint16)  # exact in bfloat16
    encoded = binproto.encode_request([binproto.Tensor("b", bits, datatype="BF16")])
    (tmp_path / "b.bin").write_bytes(bytes(encoded))
    code, report, _ = inspect_json(
        [str(tmp_path / "b.bin"), "--header-length", str(encoded.header_length)], capsys
    )
    assert code == 0
    (b,) = report["tensors"]
    assert (b["datatype"], b["first"], b["min"], b["max"]) == ("BF16", [1.0, -2.5, 3.0], -2.5, 3.0)


def test_encode_response_kind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    np.save(tmp_path / "y.npy", np.arange(6, dtype=np.int32))
    code, _, err = run(
        ["encode", f"y={tmp_path / 'y.npy'}", "--kind", "response", "-o", str(tmp_path / "r.bin")],
        capsys,
    )
    assert code == 0
    # Without --headers-out the headers go to stderr.
    headers = _cli.parse_headers(err)
    decoded = binproto.decode_response(
        (tmp_path / "r.bin").read_bytes(), header_length=binproto.header_length_from(headers)
    )
    assert np.array_equal(decoded.tensors["y"], np.arange(6, dtype=np.int32))
    assert decoded.header.model_name == "model"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("novalue", "expected name=path.npy"),
        ("x={dir}/missing.npy", "cannot load"),
        ("x={dir}/many.npz", "say which"),
        ("x={dir}/many.npz:nope", "has no array 'nope'"),
    ],
)
def test_encode_usage_errors(
    spec: str,
    message: str,
    tmp_path: Path,
    arrays: dict[str, np.ndarray[Any, Any]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run(["encode", spec.format(dir=tmp_path), "-o", str(tmp_path / "o")], capsys)
    assert code == 2
    assert message in err


def _npz_member(path: Path, data: bytes) -> None:
    """An .npz file whose one member, a.npy, holds ``data`` (stored, not compressed)."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("a.npy", data)


def _npy_bytes(array: np.ndarray[Any, Any]) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=True)
    return out.getvalue()


@pytest.mark.parametrize(
    ("member", "message"),
    [
        (b"not a npy file", "'a' of"),
        (_npy_bytes(np.array([1, "x"], dtype=object)), "allow_pickle=False"),
        (_npy_bytes(np.arange(1000.0))[:200], "cannot load 'a' of"),
        (b"crc", "Bad CRC-32"),
    ],
    ids=["not-npy", "objects", "truncated", "bad-crc"],
)
def test_encode_refuses_an_npz_member_that_is_not_an_array(
    member: bytes, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "m.npz"
    if member == b"crc":
        _npz_member(path, _npy_bytes(np.arange(10.0)))
        raw = bytearray(path.read_bytes())
        raw[raw.index(b"\x93NUMPY") + 100] ^= 0xFF  # a byte of the stored data
        path.write_bytes(bytes(raw))
    else:
        _npz_member(path, member)
    code, _, err = run(["encode", f"t={path}", "-o", str(tmp_path / "o.bin")], capsys)
    assert code == 2, err
    assert len(err.splitlines()) == 1 and message in err, err
    assert str(path)[-20:] in err
    assert not (tmp_path / "o.bin").exists()


def test_encode_rejects_unknown_json_input(
    tmp_path: Path, arrays: dict[str, np.ndarray[Any, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(
        ["encode", f"f={tmp_path / 'f32.npy'}", "--json-inputs", "g", "-o", str(tmp_path / "o")],
        capsys,
    )
    assert code == 2 and "--json-inputs names ['g']" in err


def test_header_length_and_headers_exclude_each_other(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["inspect", "x", "--header-length", "1", "--headers", "h"])
    assert exc.value.code == 2
    capsys.readouterr()


def test_missing_body_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["inspect", str(tmp_path / "none.bin")], capsys)
    assert code == 2 and "cannot read body" in err


def test_subprocess_pipes_encode_into_inspect(tmp_path: Path) -> None:
    """The real entry point, with the body on stdin."""
    np.save(tmp_path / "x.npy", np.linspace(0, 1, 11, dtype=np.float64))
    encode = subprocess.run(
        [sys.executable, "-m", "binproto", "encode", f"x={tmp_path / 'x.npy'}"],
        capture_output=True,
        check=True,
    )
    headers = _cli.parse_headers(encode.stderr.decode())
    length = dict(headers)["Inference-Header-Content-Length"]
    inspect = subprocess.run(
        [sys.executable, "-m", "binproto", "inspect", "-", "--json", "--header-length", length],
        input=encode.stdout,
        capture_output=True,
        check=True,
    )
    (x,) = json.loads(inspect.stdout)["tensors"]
    assert (x["min"], x["max"], x["mean"]) == (0.0, 1.0, pytest.approx(0.5))


def test_bytes_summary_shows_only_elements_inside_the_kept_prefix() -> None:
    big = [bytes([k]) * 40_000 for k in range(3)]  # the second straddles the kept prefix
    encoded = binproto.encode_request({"s": big})
    parser = binproto.Parser("request", header_length=encoded.header_length)
    _, summaries, error, _ = _cli.inspect_body(parser, iter([bytes(encoded)]))
    assert error is None
    summary = summaries[0].as_dict()
    assert summary["first"] == [repr(big[0])]
    assert summaries[0].count == 3


def test_inspect_reports_lone_surrogates_in_peer_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # JSON may escape a lone surrogate, which is no character: the header is
    # refused at the escape, and the report itself is plain text.
    header = (
        b'{"inputs":[{"name":"a\\ud800","datatype":"INT32","shape":[1],"data":[1]},'
        b'{"name":"b\\udfff","datatype":"BOOL","shape":[1],'
        b'"parameters":{"binary_data_size":1}}]}'
    )
    (tmp_path / "s.bin").write_bytes(header + b"\x07")
    argv = ["inspect", str(tmp_path / "s.bin"), "--header-length", str(len(header))]
    code, _, err = run(argv, capsys)
    assert code == 1
    escape = header.index(b"\\ud800")
    assert f"at byte {escape}" in err
    assert "The surrogate pair in string is invalid" in err
    # A real process, whose stdout is strict UTF-8, too.
    done = subprocess.run(
        [sys.executable, "-m", "binproto", *argv],
        capture_output=True,
        env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"},
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert b"The surrogate pair in string is invalid" in done.stderr
    assert b"Traceback" not in done.stderr


def test_inspect_json_is_strict_json_whatever_the_header_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Python's JSON reader takes NaN, Infinity and 1e999 (inf) from a peer.
    tensor = '{"name":"x","datatype":"FP32","shape":[1],"data":[NaN]}'
    parameters = '{"p":Infinity,"n":-Infinity,"q":1e999}'
    path = tmp_path / "nan.json"
    path.write_text(f'{{"inputs":[{tensor}],"parameters":{parameters}}}')
    code, out, err = run(["inspect", str(path), "--json"], capsys)
    assert code == 0, err
    summary = json.loads(out, parse_constant=lambda token: pytest.fail(token))
    json.dumps(summary, allow_nan=False)  # raises on a non-finite number left anywhere
    assert summary["header"]["parameters"] == {"p": "inf", "n": "-inf", "q": "inf"}
    assert summary["header"]["inputs"][0]["data"] == ["nan"]


def test_inspect_escapes_the_peers_control_characters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def body(name: str, datatype: str) -> str:
        path = tmp_path / "b.json"
        tensor = {"name": name, "datatype": datatype, "shape": [1], "data": [1]}
        path.write_text(json.dumps({"inputs": [tensor]}))  # (JSON escapes the controls)
        return str(path)

    # A name that would clear the screen and forge a tensor line.
    forged = "x\x1b[2J\x1b[31mFAKE\n  [1] ok  FP32\x9b\x7f"
    code, out, err = run(["inspect", body(forged, "FP32")], capsys)
    assert code == 0, err
    assert "  [0] x\\x1b[2J\\x1b[31mFAKE\\x0a  [1] ok  FP32\\x9b\\x7f  FP32" in out
    # A datatype, quoted in the error line, that would turn the terminal red.
    code, out2, err = run(["inspect", body("x", "FP32\x1b[31m")], capsys)
    assert code == 1
    assert "invalid datatype 'FP32\\x1b[31m'" in err
    for text in (out, out2, err):
        assert not any((ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) < 0xA0 for c in text)
    # A name that would show what follows it right to left (and so hide it),
    # and one as long as the header allows: escaped, and cut short.
    code, out, err = run(["inspect", body("a\u202egnp.exe\u2066\u2028", "FP32")], capsys)
    assert code == 0, err
    assert "  [0] a\\u202egnp.exe\\u2066\\u2028  FP32" in out
    assert not any(c in out for c in "\u202e\u2066\u2028")
    code, out, err = run(["inspect", body("a\u202eb", "FP32"), "--json"], capsys)
    assert code == 0, err
    assert out.isascii() and json.loads(out)["tensors"][0]["name"] == "a\u202eb"
    code, out, err = run(["inspect", body("n" * 5000, "FP32")], capsys)
    assert code == 0, err
    assert f"  [0] {'n' * 60}... (5000 characters)  FP32" in out
    # Counted and cut as sent: 60 characters whole, escapes never split.
    code, out, err = run(["inspect", body("\u202e" * 60, "FP32")], capsys)
    assert code == 0, err
    assert "  [0] " + "\\u202e" * 60 + "  FP32" in out
    code, out, err = run(["inspect", body("n" * 59 + "\x1b" * 3, "FP32")], capsys)
    assert code == 0, err
    assert "  [0] " + "n" * 59 + "\\x1b... (62 characters)  FP32" in out
    # An error quoting a long name is cut as the servers' error answers are.
    code, out, err = run(["inspect", body("n" * 5000, "FP99")], capsys)
    assert code == 1
    line = next(line for line in err.splitlines() if "invalid datatype" in line)
    assert line.endswith("n... (cut at 1024 characters)") and len(line) < 1200


def test_inspect_cuts_long_values_short(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    np.save(tmp_path / "w.npy", np.array([b"a" * 60_000, b"short"]))
    body, headers = tmp_path / "w.bin", tmp_path / "w.h"
    encoded = ["encode", f"w={tmp_path / 'w.npy'}", "-o", str(body), "--headers-out", str(headers)]
    assert run(encoded, capsys)[0] == 0
    code, out, err = run(["inspect", str(body), "--headers", str(headers)], capsys)
    assert code == 0, err
    first = next(line for line in out.splitlines() if "first:" in line)
    shown = "b'" + "a" * 58
    assert first == f"      first: {shown}... (60003 characters), b'short'"


def test_there_is_no_bench_command(capsys: pytest.CaptureFixture[str]) -> None:
    # The benchmarks belong to a source checkout: python -m benchmarks.run there.
    with pytest.raises(SystemExit) as exc:
        main(["bench"])
    assert exc.value.code == 2
    assert "invalid choice: 'bench'" in capsys.readouterr().err


def test_help_is_plain_text() -> None:
    # No reStructuredText markup (``literal``) in what a terminal shows.
    for argv in (["--help"], ["inspect", "--help"], ["encode", "--help"], ["serve", "--help"]):
        result = subprocess.run(
            [sys.executable, "-m", "binproto", *argv], capture_output=True, text=True, check=True
        )
        assert "``" not in result.stdout and ":func:" not in result.stdout, argv
