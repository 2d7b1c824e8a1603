"""Reading Inference-Header-Content-Length from HTTP headers."""

from __future__ import annotations

from typing import Any

import pytest

from binproto import RemoteProtocolError, header_length_from


@pytest.mark.parametrize(
    "headers",
    [
        {"Inference-Header-Content-Length": "42"},
        {"inference-header-content-length": "42"},
        [("INFERENCE-HEADER-CONTENT-LENGTH", " 42 ")],
        [(b"inference-header-content-length", b"42"), (b"content-length", b"100")],
        [("Inference-Header-Content-Length", "42"), ("inference-header-content-length", "42")],
    ],
)
def test_reads_header_in_any_case_and_form(headers: Any) -> None:
    assert header_length_from(headers) == 42


def test_absent_header_means_plain_json() -> None:
    assert header_length_from({"Content-Length": "5"}) is None
    assert header_length_from([]) is None


@pytest.mark.parametrize(
    ("value", "match", "status"),
    [
        ("abc", "Unable to parse Inference-Header-Content-Length, got: abc", 400),
        ("4.5", "Unable to parse", 400),
        ("", "Unable to parse", 400),
        ("-3", "should be in range", 400),
        ("1e3", "Unable to parse", 400),
        ("٣", "Unable to parse", 400),  # a non-ASCII digit
        ("99999999999999999999999", "absurdly large", 413),
        (str(2**53), "absurdly large", 413),
    ],
)
def test_bad_values(value: str, match: str, status: int) -> None:
    with pytest.raises(RemoteProtocolError, match=match) as info:
        header_length_from({"Inference-Header-Content-Length": value})
    assert info.value.status_hint == status


def test_larger_than_content_length() -> None:
    with pytest.raises(RemoteProtocolError, match=r"range \(0, 10\), got: 11"):
        header_length_from({"Inference-Header-Content-Length": "11"}, content_length=10)
    assert header_length_from({"Inference-Header-Content-Length": "10"}, content_length=10) == 10


def test_conflicting_repeats() -> None:
    with pytest.raises(RemoteProtocolError, match="conflicting"):
        header_length_from([("inference-header-content-length", "1"),
                            ("Inference-Header-Content-Length", "2")])  # fmt: skip
