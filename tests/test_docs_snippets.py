"""Every self-contained Python snippet of ``docs/getting-started.md`` runs and prints something to learn from.

A snippet is self-contained when it starts with an import (the others are fragments). Each
runs in a fresh interpreter with ``-W error``, as the README's snippets do in
``test_examples.py``: it must exit with code 0, print something, never print the same line
twice (the page's first snippet printed ``tensor(256.)`` eight times: CartPole's reward sum is
always the batch size), and leave nothing unclosed for a finalizer to warn about.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "getting-started.md"
RUN_TIMEOUT = 120


def page_snippets() -> list[tuple[str, str]]:
    """``(section heading, code)`` of each self-contained python block of the page."""
    snippets, heading = [], ""
    for match in re.finditer(r"^## ([^\n]+)$|^```python\n(.*?)^```$", PAGE.read_text(), re.S | re.M):
        if match.group(1):
            heading = match.group(1)
        elif match.group(2).startswith(("import ", "from ")):
            snippets.append((heading, match.group(2)))
    return snippets


def test_the_page_has_its_snippets() -> None:
    # Guards the extraction: the async, blocking and vector-env sections each have one.
    headings = [heading for heading, _ in page_snippets()]
    assert headings == ["Collect in an async program", "Collect in a plain script", "Several environments at once"]


@pytest.mark.timeout(RUN_TIMEOUT + 30)
@pytest.mark.parametrize("snippet", [code for _, code in page_snippets()], ids=[h for h, _ in page_snippets()])
def test_snippet_runs_and_prints_something_to_learn_from(snippet: str) -> None:
    proc = subprocess.run([sys.executable, "-W", "error", "-c", snippet], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines, "the snippet printed nothing"
    assert len(set(lines)) == len(lines), proc.stdout  # no line repeated verbatim
    # A warning raised in a finalizer (an unclosed collector's ResourceWarning) is only printed.
    assert "Exception ignored" not in proc.stderr, proc.stderr[-3000:]


SERVER_PAGE = ROOT / "docs" / "inference-server.md"


@pytest.mark.timeout(RUN_TIMEOUT + 30)
def test_the_inference_server_page_snippet_runs() -> None:
    (code,) = re.findall(r"^```python\n(.*?)^```$", SERVER_PAGE.read_text(), re.S | re.M)
    proc = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert sorted(lines[:3]) == [f"{i} torch.Size([2]) 0" for i in range(3)] and lines[3:] == ["3"], proc.stdout
    assert "Exception ignored" not in proc.stderr, proc.stderr[-3000:]


CENTRAL_PAGE = ROOT / "docs" / "central-inference.md"


@pytest.mark.timeout(RUN_TIMEOUT + 30)
def test_the_central_inference_page_snippet_runs() -> None:
    code = re.findall(r"^```python\n(.*?)^```$", CENTRAL_PAGE.read_text(), re.S | re.M)[0]
    proc = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    envs = "[0, 1, 2, 3, 4, 5, 6, 7]"
    assert proc.stdout.splitlines() == [f"256 frames so far, from envs {envs}", f"512 frames so far, from envs {envs}"]
    assert "Exception ignored" not in proc.stderr, proc.stderr[-3000:]
