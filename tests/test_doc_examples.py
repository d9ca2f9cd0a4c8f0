"""Every ```python block of README.md and docs/*.md runs, or says why it cannot.

The blocks of one page run in order, in one namespace, in a temporary working directory (so
a block may use the names an earlier block of the same page defined). A block may be
preceded by one marker, an HTML comment on the line before it:

* ``<!-- setup: NAME (...) -->``: run ``tests/doc_fixtures.py``'s ``NAME()`` first and add
  the names it returns (stand-ins for the reader's model and data);
* ``<!-- run by: tests/PATH.py -->``: a dedicated test runs the block (and checks more than
  that it runs); here it is checked that the test reads the block's section;
* ``<!-- not run: REASON -->``: not run here; the reason is required.

A fence whose language is not exactly ``python`` but looks like Python (``py``,
``python3``, ``pycon``) fails the test, so no example escapes the collector.
"""

import contextlib
import io
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests import doc_fixtures

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"^<!--\s*(setup|run by|not run):\s*(.*?)\s*-->$")


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    code: str
    section: str  # the nearest heading above the block
    kind: str | None  # None, "setup", "run by", "not run"
    arg: str

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def parse(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").split("\n")
    blocks, section, i = [], "", 0
    while i < len(lines):
        ln = lines[i]
        fence = re.match(r"^(`{3,})\s*([\w+-]*)", ln)
        if fence is None:
            heading = re.match(r"^#{1,6} (.*)$", ln)
            if heading:
                section = heading.group(1).strip()
            i += 1
            continue
        ticks, lang = fence.group(1), fence.group(2).lower()
        end = i + 1
        while end < len(lines) and not lines[end].startswith(ticks):
            end += 1
        if lang in ("py", "python3", "pycon", "ipython"):
            raise AssertionError(f"{page.name}:{i + 1}: fence '{lang}': write ```python so the block is run")
        if lang == "python":
            prev = i - 1
            while prev >= 0 and not lines[prev].strip():
                prev -= 1
            m = MARKER.match(lines[prev].strip()) if prev >= 0 else None
            blocks.append(
                Block(
                    page,
                    i + 1,
                    "\n".join(lines[i + 1 : end]),
                    section,
                    m.group(1) if m else None,
                    m.group(2) if m else "",
                )
            )
        i = end + 1
    return blocks


def _stray_markers(page: Path) -> list[str]:
    """Markers not directly above a python block (a typo would otherwise hide a block)."""
    lines = page.read_text(encoding="utf-8").split("\n")
    bad = []
    for i, ln in enumerate(lines):
        if ln.strip().startswith("<!--") and re.search(r"(setup|run by|not run)\s*:", ln):
            nxt = i + 1
            while nxt < len(lines) and not lines[nxt].strip():
                nxt += 1
            if not MARKER.match(ln.strip()) or nxt >= len(lines) or not lines[nxt].startswith("```python"):
                bad.append(f"{page.name}:{i + 1}: {ln.strip()}")
    return bad


ALL = [b for p in PAGES for b in parse(p)]


def test_the_pages_hold_python_examples():
    assert len(ALL) >= 10, [b.where() for b in ALL]
    assert any(b.page.name == "README.md" and b.kind is None for b in ALL), "README.md: no example is run"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_markers_are_well_formed(page):
    assert _stray_markers(page) == []
    for b in parse(page):
        if b.kind == "not run":
            assert len(b.arg) >= 10, f"{b.where()}: 'not run' needs its reason"
        elif b.kind == "setup":
            name = b.arg.split()[0] if b.arg else ""
            assert callable(getattr(doc_fixtures, name, None)), (
                f"{b.where()}: no fixture '{name}' in tests/doc_fixtures.py"
            )
        elif b.kind == "run by":
            test_file = ROOT / b.arg.split()[0]
            assert test_file.is_file(), f"{b.where()}: {test_file} does not exist"
            # The dedicated test reads the block from its section (readme_examples.example).
            assert f'example("{b.section}")' in test_file.read_text(encoding="utf-8"), (
                f"{b.where()}: {b.arg} does not run example({b.section!r})"
            )


def test_run_by_blocks_are_the_ones_the_dedicated_tests_read():
    from tests.neuron_sift.integrations.readme_examples import example

    for b in ALL:
        if b.kind == "run by":
            assert example(b.section).strip() == b.code.strip(), b.where()


RUNNABLE_PAGES = sorted({b.page for b in ALL if b.kind in (None, "setup")})


@pytest.mark.parametrize("page", RUNNABLE_PAGES, ids=lambda p: p.name)
def test_page_examples_run(page, tmp_path, monkeypatch, one_thread):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    namespace = {"__name__": "__main__"}
    for b in parse(page):
        if b.kind in ("run by", "not run"):
            continue
        if b.kind == "setup":
            namespace.update(getattr(doc_fixtures, b.arg.split()[0])())
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                exec(compile(b.code, b.where(), "exec"), namespace)
            except Exception as e:  # name the block in the failure
                raise AssertionError(f"the example at {b.where()} failed: {type(e).__name__}: {e}") from e
