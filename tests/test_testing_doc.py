"""The example in docs/testing.md runs, and binproto.testing is importable lazily."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parents[1] / "docs" / "testing.md"


def example_code() -> str:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    assert len(blocks) == 1
    return str(blocks[0])


def test_docs_example_fuzzes_the_toy_handler() -> None:
    namespace: dict[str, Any] = {}
    exec(compile(example_code(), str(DOC), "exec"), namespace)
    namespace["test_handler_accepts_valid_requests"]()
    namespace["test_handler_rejects_invalid_requests"]()


def test_docs_example_catches_a_broken_handler() -> None:
    # The example's tests can fail: a handler that ignores the content
    # encoding is caught.
    namespace: dict[str, Any] = {}
    code = example_code().replace(
        "content_encoding=binproto.content_encoding_from(headers)", "content_encoding=None"
    )
    assert code != example_code(), "the example no longer reads Content-Encoding this way"
    exec(compile(code, str(DOC), "exec"), namespace)
    try:
        namespace["test_handler_accepts_valid_requests"]()
    except AssertionError:
        return
    raise AssertionError("a handler ignoring Content-Encoding passed")


def test_import_binproto_does_not_import_hypothesis() -> None:
    code = "import sys, binproto; assert 'hypothesis' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
