"""The code blocks of the documentation's guides (docs/*.md, then README.md), so that tests run
them as written. tests/test_doc_examples.py checks that each block marked
``<!-- run by: ... -->`` is the one its test reads here."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "README.md"


def _pages() -> list[Path]:
    return [*sorted((ROOT / "docs").glob("*.md")), README]


def _headings(lines: list[str]):
    """(index, level, title) of the headings outside code fences."""
    fence = False
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fence = not fence
        elif not fence:
            m = re.match(r"^(#{1,6}) (.*)$", line)
            if m:
                yield i, len(m.group(1)), m.group(2).strip()


def section(title: str) -> str:
    """The text under the heading ``{title}`` (levels 1 to 3) of the first page that has it,
    up to the next heading of the same or a higher level."""
    for page in _pages():
        if not page.is_file():
            continue
        lines = page.read_text(encoding="utf-8").split("\n")
        heads = list(_headings(lines))
        for n, (i, level, t) in enumerate(heads):
            if t == title and level <= 3:
                end = next((j for j, lv, _ in heads[n + 1 :] if lv <= level), len(lines))
                return "\n".join(lines[i + 1 : end]) + "\n"
    raise AssertionError(f"no page of docs/ or README.md has a section '{title}'")


def python_blocks(title: str) -> list[str]:
    """The ```python blocks of a section; there must be at least one."""
    blocks = re.findall(r"^```python\n(.*?)^```", section(title), flags=re.S | re.M)
    if not blocks:
        raise AssertionError(f"section '{title}' has no python example")
    return blocks


def example(title: str) -> str:
    """The section's complete example: its only python block."""
    blocks = python_blocks(title)
    if len(blocks) != 1:
        raise AssertionError(f"section '{title}' should hold one complete example, has {len(blocks)}")
    return blocks[0]
